"""Speed anchors for `bench serve`: llama.cpp on the very GGUF the app ships, next to the app's own engine.

``make setup`` builds llama-cpp-python into the app's venv (``make bench-anchors`` into ``.venv-anchors``, for an
older setup); when it and the shipped GGUF exist, ``bench serve`` runs ``llama_anchor.py`` with it as a
subprocess (same prompt token ids, greedy, same max tokens, the same CPU threads as the serving engine) and
measures the app's engines in-process the same way, so the rows compare decode engines, not web stacks.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Optional

from bench.report import ROOT

ANCHOR_VENV = ROOT / ".venv-anchors"


def anchor_python() -> Optional[Path]:
    """A python that has llama-cpp-python: this one (``make setup`` builds it), else ``.venv-anchors``."""
    import sys

    from rlhf.serving.llama_cpp.spec import llama_cpp_installed

    if llama_cpp_installed():
        return Path(sys.executable)
    python = ANCHOR_VENV / "bin" / "python"
    return python if python.exists() else None


def shipped_gguf(base_model: str) -> Optional[Path]:
    """The GGUF file of a shipped base model (None for other models or when its package is missing)."""
    from rlhf.base_models import shipped_gguf as find

    return find(base_model)


def app_greedy(server, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """The app engine's greedy replies, one request at a time (batch 1), and its mean decode tokens/s
    (tokens after the first over the time from first to last token)."""
    from rlhf.serving.policy_server import AdapterRef, GenParams

    replies, rates = [], []
    for ids in prompts:
        stream = server.stream_ids(list(ids), AdapterRef(0), GenParams(max_new_tokens=max_tokens, temperature=0))
        stream.text()
        replies.append(list(stream.token_ids))
        if stream.n_tokens > 1 and stream.first_token_at and stream.finished_at > stream.first_token_at:
            rates.append((stream.n_tokens - 1) / (stream.finished_at - stream.first_token_at))
    return replies, (sum(rates) / len(rates) if rates else 0.0)


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """How alike two engines' greedy replies are: identical replies, and the mean shared leading tokens."""
    same = sum(1 for x, y in zip(a, b) if x == y)
    prefix = []
    for x, y in zip(a, b):
        n = next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
        prefix.append(n / max(1, max(len(x), len(y))))
    return {"identical": same, "of": len(a), "shared_prefix": sum(prefix) / len(prefix) if prefix else 0.0}


def llama_cpp(server, prompts: list[list[int]], gguf: Optional[Path], threads: int, levels: list[int],
              per_user: int, max_tokens: int, timeout: float = 1800.0, ceiling: Optional[list[int]] = None,
              app: bool = True) -> Optional[dict]:
    """llama.cpp's rows on ``gguf`` (and its batched decode ceiling at each of ``ceiling`` sequences per call), and
    with ``app`` the app's batch-1 greedy figures on the same prompts; None when no anchor is built."""
    python = anchor_python()
    if python is None or gguf is None:
        return None
    spec = {"gguf": str(gguf), "threads": threads, "max_tokens": max_tokens, "prompts": prompts,
            "levels": levels, "per_user": per_user, "ceiling": list(ceiling or [])}
    t0 = time.perf_counter()
    for safe in (False, True):  # as the app does: a native fault (a signal) at load or decode -> the safe load
        done = subprocess.run([str(python), str(Path(__file__).with_name("llama_anchor.py"))],
                              input=json.dumps({**spec, "safe": safe}), capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode >= 0:
            break
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp anchor failed: {done.stderr[-2000:]}")
    anchor = json.loads(done.stdout.strip().splitlines()[-1])
    anchor["safe_load"] = safe
    anchor["seconds"] = time.perf_counter() - t0
    if app:
        app_replies, app_decode = app_greedy(server, prompts, max_tokens)
        anchor["app_decode_tokens_per_s"] = app_decode
        anchor["agreement"] = agreement(app_replies, anchor["greedy"])
    return anchor
