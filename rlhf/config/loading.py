"""Building a config: defaults < YAML file (``--config FILE``) < environment (``RLHF_*``) < CLI ``--set a.b=v``.

This is the only module that reads ``os.environ``.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from rlhf.config.app import SECTIONS, AppConfig, check
from rlhf.config.fields import ConfigError
from rlhf.config.spaces import apply_spaces_defaults

# Variables that other tools set (Hugging Face Spaces) or that the docs promise, mapped to config keys.
# They apply before the RLHF_<SECTION>_<KEY> form, so the long form wins when both are set.
ENV_ALIASES = {"RLHF_USERS": "server.users", "RLHF_ADMINS": "server.admins", "SPACE_ID": "server.space_id",
               "HF_TOKEN": "server.hf_token", "HF_ENDPOINT": "server.hf_endpoint"}


def _field_map(obj: Any) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(obj)}


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Turn a YAML/env/CLI value into the field's type, or raise ConfigError naming the key."""
    kind = {"int": int, "float": float, "bool": bool, "str": str, "list": list, "dict": dict}.get(
        annotation if isinstance(annotation, str) else getattr(annotation, "__name__", ""), None)
    if isinstance(value, str) and kind is list and not value.strip().startswith("["):
        return [v.strip() for v in value.split(",") if v.strip()]  # 'a, b' or '*' (not YAML: '*' is an alias)
    if isinstance(value, str) and kind is not str:
        try:
            value = yaml.safe_load(value) if value.strip() else ([] if kind is list else value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}: cannot parse {value!r}: {exc}") from None
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            raise TypeError
        if kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if kind is str:
            return "" if value is None else str(value)
        if kind is list:
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list):
                raise TypeError
            return list(value)
        if kind is dict:
            if not isinstance(value, dict):
                raise TypeError
            return dict(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected {kind.__name__ if kind else annotation}, got {value!r}") from None
    return value


def _set(cfg: AppConfig, dotted: str, value: Any) -> None:
    parts = dotted.strip().split(".")
    target: Any = cfg
    for part in parts[:-1]:
        fields = _field_map(target)
        if part not in fields or not dataclasses.is_dataclass(getattr(target, part)):
            raise ConfigError(f"unknown config section {part!r} in {dotted!r}; sections: {', '.join(SECTIONS)}")
        target = getattr(target, part)
    fields = _field_map(target)
    name = parts[-1]
    if name not in fields or dataclasses.is_dataclass(getattr(target, name)):
        raise ConfigError(f"unknown config key {dotted!r}; known: {', '.join(sorted(fields))}")
    setattr(target, name, _coerce(value, fields[name].type, dotted))


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and key in SECTIONS and not prefix:
            out.extend(_flatten(value, dotted + "."))
        else:
            out.append((dotted, value))
    return out


def env_overrides(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """Map ``RLHF_DATA_DIR`` → data_dir and ``RLHF_PPO_MINI_BATCH_SIZE`` → ppo.mini_batch_size."""
    out = [(key, env[name]) for name, key in ENV_ALIASES.items() if env.get(name)]
    top = {f.name for f in dataclasses.fields(AppConfig)} - set(SECTIONS)
    for name, value in sorted(env.items()):
        if not name.startswith("RLHF_"):
            continue
        rest = name[5:].lower()
        if rest in top:
            out.append((rest, value))
            continue
        section, _, key = rest.partition("_")
        if section in SECTIONS and key:
            out.append((f"{section}.{key}", value))
    return out


class ConfigDeprecationWarning(FutureWarning):
    """An old config spelling that still loads (shown by default: the user should update the file)."""


def migrate(cfg: AppConfig, keys: set[str]) -> None:
    """Give old configs the meaning they had, with a warning naming the new spelling. ``keys``: those set."""
    if cfg.ppo.group_size == 1 and cfg.ppo.advantage == "group" and "ppo.advantage" not in keys:
        warnings.warn("ppo.group_size=1 no longer chooses GAE by itself: set ppo.advantage: gae (assumed now)",
                      ConfigDeprecationWarning, stacklevel=3)
        cfg.ppo.advantage = "gae"


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                env: Mapping[str, str] | None = None) -> AppConfig:
    """Build the config from defaults, a YAML file, ``RLHF_*`` env and ``key=value`` overrides."""
    cfg = AppConfig()
    explicit: set[str] = set()  # keys the user set, which the Spaces defaults leave alone
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        tree = yaml.safe_load(p.read_text()) or {}
        if not isinstance(tree, dict):
            raise ConfigError(f"{p}: expected a mapping of sections")
        for dotted, value in _flatten(tree):
            _set(cfg, dotted, value)
            explicit.add(dotted.strip())
    env = os.environ if env is None else env
    for dotted, value in env_overrides(env):
        try:
            _set(cfg, dotted, value)
            explicit.add(dotted)
        except ConfigError as exc:
            if "unknown config" in str(exc):
                continue  # an RLHF_* variable that is not ours (e.g. a typo) is ignored, not fatal
            raise
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        _set(cfg, key, value)
        explicit.add(key.strip())
    migrate(cfg, explicit)
    check(cfg)
    if cfg.server.space_id and env.get("SYSTEM") == "spaces":  # Hugging Face sets SYSTEM=spaces on a real Space
        apply_spaces_defaults(cfg, explicit)
    return cfg


def apply_overrides(cfg: AppConfig, values: Mapping[str, Any]) -> AppConfig:
    """A checked copy of cfg with dotted-key or nested-section values applied (job configs from REST, the
    scheduler's enqueue); ConfigError names the first key that cannot work."""
    new = dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s)) for s in SECTIONS})
    keys = set()
    for dotted, value in _flatten(values):
        _set(new, dotted, value)
        keys.add(dotted.strip())
    migrate(new, keys)
    check(new)
    return new


def override_keys(values: Mapping[str, Any]) -> list[str]:
    """The dotted keys that ``values`` (dotted or nested by section, as ``apply_overrides`` takes them) would set."""
    return [dotted.strip() for dotted, _ in _flatten(values)]


def job_overrides(cfg: AppConfig, values: Mapping[str, Any]) -> AppConfig:
    """``apply_overrides`` for one job's settings (a REST body, the UI): a key that names code to import
    (``rlhf.plugins.CODE_KEYS``) is refused, since code is set only in the app's own config file or environment."""
    from rlhf.plugins import code_keys_in

    code = code_keys_in(override_keys(values))
    if code:
        raise ConfigError(f"{', '.join(code)}: code to import is set only in the app's config file or environment, "
                          "never per job")
    return apply_overrides(cfg, values)


def from_dict(tree: Mapping[str, Any]) -> AppConfig:
    """Rebuild and check a config saved with ``to_dict`` (unknown keys and values that cannot work are errors)."""
    return apply_overrides(AppConfig(), tree)


