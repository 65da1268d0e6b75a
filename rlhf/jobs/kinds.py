"""The job kinds a job process can run: the app's own (``rlhf.registry.JOB_KINDS``, import paths, so this package
imports nothing of what it runs) and those the server's config names (``scheduler.job_kinds``), each imported when
a job of its kind runs.
"""
from __future__ import annotations

from typing import Callable, Mapping

from rlhf.plugins import load_callable
from rlhf.registry import JOB_KINDS as BUILTIN

JOB_KINDS: dict[str, Callable] = {}  # kind -> fn(ctx) -> result dict


def register_job_kind(name: str, fn: Callable) -> None:
    """Make ``fn(ctx) -> result dict`` runnable as jobs of kind ``name``."""
    JOB_KINDS[name] = fn


def register_builtin_kinds() -> None:
    """Register every job kind the app ships (what a job process can run), imported from its table."""
    for name, path in BUILTIN.items():
        if name not in JOB_KINDS:
            register_job_kind(name, load_callable(path, f"job kind {name}"))


def job_kind(name: str, configured: Mapping[str, str]) -> Callable:
    """The function of kind ``name``: a registered one, else the import path ``configured`` (the config's
    ``scheduler.job_kinds``) gives it, imported and registered now; ValueError for a kind neither knows."""
    if name not in JOB_KINDS and name in configured:
        register_job_kind(name, load_callable(configured[name], f"scheduler.job_kinds.{name}"))
    if name not in JOB_KINDS:
        raise ValueError(f"unknown job kind {name!r}; known: {sorted(set(JOB_KINDS) | set(configured))}")
    return JOB_KINDS[name]
