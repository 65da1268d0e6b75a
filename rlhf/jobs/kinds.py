"""The job kinds a job process can run, as ``name -> "module:function"`` tables: the app's own
(``rlhf.registry.JOB_KINDS``, import paths, so this package imports nothing of what it runs), extended by those the
server's config names (``scheduler.job_kinds``). A kind's module is imported when a job of its kind runs.
"""
from __future__ import annotations

from typing import Callable, Mapping

from rlhf.plugins import load_callable
from rlhf.registry import JOB_KINDS


def job_kinds(configured: Mapping[str, str]) -> dict[str, str]:
    """Every kind's import path: the config's ``scheduler.job_kinds`` extend the built-in table (a built-in kind
    cannot be replaced)."""
    return {**configured, **JOB_KINDS}


def job_kind(name: str, configured: Mapping[str, str]) -> Callable:
    """The function ``fn(ctx) -> result dict`` of kind ``name``, imported now; ValueError for a kind neither table
    knows, or naming the config key when its import path cannot be used."""
    table = job_kinds(configured)
    if name not in table:
        raise ValueError(f"unknown job kind {name!r}; known: {sorted(table)}")
    return load_callable(table[name], f"job kind {name}" if name in JOB_KINDS else f"scheduler.job_kinds.{name}")
