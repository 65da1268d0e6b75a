"""The per-module patterns of a PEFT LoRA adapter (``rank_pattern``, ``alpha_pattern``), checked and matched with
bounds.

PEFT and the llama.cpp converter treat each key of those maps as a regular expression and search module names with
``(^|\\.)<pattern>$``. An adapter comes from outside (an import, a restored archive), so a pattern may not compile
(``re.error``) or may backtrack for minutes on one module name, stalling whatever loads it. ``check_adapter`` looks
at every pattern once, before anything loads the adapter: its length, that Python's ``re`` compiles it, and that
``re`` (what PEFT matches with) gets through every pattern against each of the adapter's module names within
``CHECK_SECONDS``, in a child process that is killed past it (``re`` cannot be interrupted in-process). Anything else
is an ``AdapterError`` naming the pattern. ``module_matches`` is a bounded match for code of ours that applies the
patterns (``scaling``: a module's alpha / r, as the llama.cpp converter needs): the ``regex`` package with a timeout.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable

import regex

from rlhf.serving.interface import AdapterError

PATTERN_KEYS = ("rank_pattern", "alpha_pattern")
MAX_PATTERN_CHARS = 256
MAX_PATTERNS = 1024
MATCH_SECONDS = 0.05  # per module name: a sane pattern takes microseconds
CHECK_SECONDS = 5.0  # every pattern against every module name with Python's re, child process included
_RE_CHILD = ("import json, re, sys\n"
             "job = json.load(sys.stdin)\n"
             "for p in job['patterns']:\n"
             "    r = re.compile(r'(^|\\.)' + p + '$')\n"
             "    for k in job['keys']:\n"
             "        r.search(k)\n")


def _anchored(pattern: str) -> str:
    return rf"(^|\.){pattern}$"


def module_matches(pattern: str, module_key: str) -> bool:
    """Whether ``pattern`` names ``module_key`` the way PEFT reads it; AdapterError when it does not compile or takes
    longer than ``MATCH_SECONDS``."""
    check_pattern(pattern)
    try:
        return regex.search(_anchored(pattern), module_key, timeout=MATCH_SECONDS) is not None
    except TimeoutError:
        raise AdapterError(f"adapter pattern {pattern!r} takes too long to match {module_key!r} (over "
                           f"{MATCH_SECONDS * 1000:.0f} ms): refused") from None
    except regex.error as exc:
        raise AdapterError(f"adapter pattern {pattern!r} is not a valid regular expression: {exc}") from None


def check_pattern(pattern) -> None:
    """AdapterError unless ``pattern`` is a string of at most ``MAX_PATTERN_CHARS`` that Python's ``re`` compiles."""
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN_CHARS:
        raise AdapterError(f"adapter pattern {str(pattern)[:80]!r} must be a string of 1-{MAX_PATTERN_CHARS} "
                           "characters")
    try:
        re.compile(_anchored(pattern))
    except re.error as exc:
        raise AdapterError(f"adapter pattern {pattern!r} is not a valid regular expression: {exc}") from None


def check_patterns(config: dict, module_keys: Iterable[str]) -> None:
    """Every ``rank_pattern`` / ``alpha_pattern`` entry of an adapter config: a bounded pattern mapping to a positive
    number, and quick to match against each of ``module_keys``; AdapterError naming the first that is not."""
    keys = list(module_keys)
    every = []
    for field in PATTERN_KEYS:
        patterns = config.get(field) or {}
        if not isinstance(patterns, dict):
            raise AdapterError(f"adapter_config.json: {field} must map patterns to numbers, got "
                               f"{type(patterns).__name__}")
        if len(patterns) > MAX_PATTERNS:
            raise AdapterError(f"adapter_config.json: {field} has {len(patterns)} patterns (at most {MAX_PATTERNS})")
        for pattern, value in patterns.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise AdapterError(f"adapter_config.json: {field}[{pattern!r}] must be a positive number, got "
                                   f"{value!r}")
            for key in keys:
                module_matches(pattern, key)
            every.append(pattern)
    if every and keys:
        _re_in_time(every, keys)


def _re_in_time(patterns: list[str], keys: list[str]) -> None:
    """AdapterError unless Python's ``re`` matches every pattern against every key within ``CHECK_SECONDS``."""
    import subprocess
    import sys

    try:
        subprocess.run([sys.executable, "-c", _RE_CHILD], input=json.dumps({"patterns": patterns, "keys": keys}),
                       text=True, capture_output=True, timeout=CHECK_SECONDS, check=True)
    except subprocess.TimeoutExpired:
        raise AdapterError(f"adapter patterns {', '.join(repr(p) for p in patterns)[:300]} take over "
                           f"{CHECK_SECONDS:.0f} s to match the adapter's {len(keys)} module names with Python's re "
                           "(what PEFT uses): refused") from None
    except subprocess.CalledProcessError as exc:
        raise AdapterError(f"adapter patterns could not be matched: {exc.stderr.strip()[-300:]}") from None


def module_keys(adapter_dir: Path) -> list[str]:
    """The module names an adapter's weights belong to (``...q_proj`` of ``...q_proj.lora_A.weight``)."""
    adapter_dir = Path(adapter_dir)
    st, binary = adapter_dir / "adapter_model.safetensors", adapter_dir / "adapter_model.bin"
    try:
        if st.is_file():
            from safetensors import safe_open

            with safe_open(str(st), "np") as f:
                names = list(f.keys())
        elif binary.is_file():
            import torch

            names = list(torch.load(str(binary), map_location="cpu", weights_only=True, mmap=True))
        else:
            return []
    except Exception as exc:  # a truncated or foreign file: loading it would fail the same way
        raise AdapterError(f"cannot read the weight names in {adapter_dir}: {type(exc).__name__}: {exc}") from exc
    return sorted({re.sub(r"\.lora_(?:A|B|embedding_A|embedding_B)(?:\.[^.]+)?\.weight$", "", n) for n in names})


def check_adapter(adapter_dir: Path) -> None:
    """Check an adapter directory's patterns against its own module names (AdapterError naming the problem)."""
    path = Path(adapter_dir) / "adapter_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"cannot read {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{path} is not a JSON object")
    if any(config.get(k) for k in PATTERN_KEYS):
        check_patterns(config, module_keys(Path(adapter_dir)))


def scaling(config: dict, module_key: str, rank: int) -> float:
    """PEFT's scaling of one module: alpha / r (alpha / sqrt(r) with rsLoRA), honouring ``alpha_pattern`` with the
    bounded match (the last matching pattern wins, as in the converter)."""
    alpha = config.get("lora_alpha", 8)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if module_matches(pattern, module_key):
            alpha = value
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
