"""Publishing a policy version atomically: directory first (temp name + rename), then ONE Store transaction.

A crash before the rename leaves only a ``.tmp-*`` directory (removed at the next start); a crash
between the rename and the insert leaves a complete directory no row points to (kept, logged, and replaced
by the next publish of that name). A half-written version is never listed or served. The start-up clean-up
removes only temp dirs: a directory a row points to is never touched, so a copied or restored data dir
keeps every version.
"""
from __future__ import annotations

import json
import logging
import shutil
import uuid
from pathlib import Path
from typing import Optional

from rlhf.serving.adapter_patterns import check_adapter
from rlhf.config import AppConfig
from rlhf.files import atomic_dir, is_temp_dir
from rlhf.retrain import bundle
from rlhf.retrain.model_card import write_card
from rlhf.serving.interface import AdapterError
from storage import Policy, Store

log = logging.getLogger(__name__)


def policies_root(config: AppConfig) -> Path:
    return config.paths.policies


def name_base(adapter_dir: Path, base_model: str, data_dir: Path) -> dict:
    """Make an adapter name its base by hub id when it has one (a shipped or hub base), as other tools expect.

    Returns what the app keeps about the base in ``version.json``: the name shown to the world and the local
    path the adapter was trained on (relative to the data dir when under it). The app never loads a base from
    the adapter's config: serving and training pass their own local base model."""
    from rlhf.base_models import hub_id_of
    from storage.paths import to_stored

    path = adapter_dir / "adapter_config.json"
    cfg = json.loads(path.read_text())
    local = cfg.get("base_model_name_or_path") or None
    hub = hub_id_of(base_model, local, data_dir)
    if hub and hub != local:
        cfg["base_model_name_or_path"] = hub
        path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return {"base_model": hub or local, "base_model_on_hub": hub is not None,
            "base_model_path": to_stored(local, data_dir) if local else None}


def publish_version(store: Store, config: AppConfig, agent: str, adapter_dir: str | Path, parent_id: Optional[int],
                    promote: bool, job_id: Optional[int] = None, reward_model_id: Optional[int] = None,
                    data_snapshot: Optional[dict] = None, run_config: Optional[dict] = None,
                    metrics: Optional[dict] = None, name: Optional[str] = None) -> Policy:
    """Copy a PEFT adapter into the data dir under a temp name, rename it, register the version, write its card."""
    src = Path(adapter_dir)
    if not (src / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{src} is not a PEFT adapter directory (no adapter_config.json)")
    root = config.paths.agent_policies(agent)
    root.mkdir(parents=True, exist_ok=True)
    name = name or (f"job{job_id}" if job_id is not None else uuid.uuid4().hex[:12])
    final = root / name
    orphan = final.exists() and not referenced(store, final)  # a publish that died between rename and insert
    if final.exists() and not orphan:
        raise FileExistsError(f"{final} already exists")
    agent_rec = store.get_agent(agent)
    base, template = agent_rec.base_model, agent_rec.chat_template or config.chat_template
    with atomic_dir(final, replace=orphan) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        about_base = name_base(tmp, base, config.data_path)
        bundled = _bundle(tmp, base, template, config)
        (tmp / "version.json").write_text(json.dumps({"agent": agent, "parent_id": parent_id, "job_id": job_id,
                                                      "reward_model_id": reward_model_id, **about_base,
                                                      "bundle": bundled}, indent=1))
    try:
        policy = store.register_policy_version(agent, str(final), parent_id=parent_id, promote=promote,
                                               reward_model_id=reward_model_id, job_id=job_id,
                                               data_snapshot=data_snapshot, config=run_config, metrics=metrics)
    except Exception:
        shutil.rmtree(final, ignore_errors=True)
        raise
    try:
        write_card(store, policy)  # after the insert: the card names the version and reads its facts
    except Exception:  # the version is published and served; a card can be written again (download, push)
        log.warning("version %s published, but its model card could not be written", policy.id, exc_info=True)
    return policy


def _bundle(folder: Path, base: str, template: str, config: AppConfig) -> dict:
    """The tokenizer (with the agent's chat template, ``template``; "" = the base's) and GGUF LoRA beside the adapter
    (``rlhf.retrain.bundle``); a failure is logged, and the version still publishes (a download adds what is
    missing)."""
    from rlhf.base_models import resolve_model

    try:
        return bundle.complete(folder, resolve_model(base, config.data_path), template or None)
    except Exception as exc:  # a tokenizer or config that does not load: the trained adapter is still worth keeping
        log.warning("version in %s published without its tokenizer/GGUF LoRA: %s", folder, exc)
        return {"tokenizer": False, "gguf_lora": False, "error": f"{type(exc).__name__}: {exc}"}


def referenced(store: Store, path: Path) -> bool:
    """True when a policy or reward-model row points at ``path``."""
    return path.resolve() in referenced_dirs(store)


def referenced_dirs(store: Store) -> set[Path]:
    """Every directory a policy or reward-model row points to (resolved)."""
    paths = [p.adapter_path for p in store.list_policies()] + [rm.path for rm in store.list_reward_models()]
    return {Path(p).resolve() for p in paths if p}


def clean_leftovers(store: Store, config: AppConfig) -> list[Path]:
    """At start: remove the temp dirs (``rlhf.files.is_temp_dir``) a killed publish or training left, and nothing else.

    A directory a row points to is never removed, whatever its name. A complete version directory that no row
    points to (a publish that died between its rename and its insert) is kept and logged: it may be data."""
    keep = referenced_dirs(store)
    removed = []
    for parent in leftover_parents(config):
        for d in sorted(parent.iterdir()):
            if not d.is_dir() or d.resolve() in keep:
                continue
            if is_temp_dir(d):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
                log.warning("removed %s: a temp dir left by an interrupted write", d)
            elif parent.parent == policies_root(config):
                log.warning("%s is not a registered version (a publish interrupted before its insert?); kept", d)
    return removed


def leftover_parents(config: AppConfig) -> list[Path]:
    """The directories whose children a publish or a reward-model training writes (temp dir + rename)."""
    roots = [config.paths.reward_models]
    policies = policies_root(config)
    if policies.is_dir():
        roots += [d for d in policies.iterdir() if d.is_dir() and not is_temp_dir(d)]
    return [r for r in roots if r.is_dir()]


def check_adapters(store: Store) -> list[Policy]:
    """Mark versions whose adapter directory is missing or unreadable, or whose module patterns cannot be matched
    safely (``rlhf.serving.adapter_patterns``), as broken (the app serves the rest)."""
    broken = []
    for p in store.list_policies():
        if p.adapter_path is None or p.status == "broken":
            continue
        cfg = Path(p.adapter_path) / "adapter_config.json"
        reason = None
        if not cfg.is_file():
            reason = f"adapter directory missing or incomplete: {cfg} not found"
        else:
            try:
                json.loads(cfg.read_text())
            except (OSError, ValueError) as exc:
                reason = f"adapter_config.json unreadable: {exc}"
            if reason is None and not any(Path(p.adapter_path).glob("adapter_model.*")):
                reason = f"adapter weights missing in {p.adapter_path}"
            if reason is None:
                try:
                    check_adapter(Path(p.adapter_path))  # its patterns, before anything loads it
                except AdapterError as exc:
                    reason = str(exc)
        if reason:
            broken.append(store.mark_policy_broken(p.id, reason))
            log.warning("policy %s marked broken: %s", p.id, reason)
    return broken
