"""The job kinds the app runs, registered in this one place (no import registers anything by itself).

A new kind is a function ``fn(ctx: JobContext) -> result dict`` in its own module and one line in
``register_builtin_kinds``. Kinds that do not ship with the app (a plugin's, a test's) are named in the config,
``scheduler.job_kinds: {name: "package.module:function"}``: the job process that runs one imports it then.
"""
from __future__ import annotations

from typing import Callable, Mapping

from rlhf.plugins import load_callable

JOB_KINDS: dict[str, Callable] = {}  # kind -> fn(ctx) -> result dict


def register_job_kind(name: str, fn: Callable) -> None:
    """Make ``fn(ctx) -> result dict`` runnable as jobs of kind ``name``."""
    JOB_KINDS[name] = fn


def register_builtin_kinds() -> None:
    """Register every job kind the app ships (what a job process can run)."""
    from rlhf.retrain.pipeline import eval_samples, retrain

    register_job_kind("retrain", retrain)
    register_job_kind("eval_samples", eval_samples)


def job_kind(name: str, configured: Mapping[str, str]) -> Callable:
    """The function of kind ``name``: a registered one, else the import path ``configured`` (the config's
    ``scheduler.job_kinds``) gives it, imported and registered now; ValueError for a kind neither knows."""
    if name not in JOB_KINDS and name in configured:
        register_job_kind(name, load_callable(configured[name], f"scheduler.job_kinds.{name}"))
    if name not in JOB_KINDS:
        raise ValueError(f"unknown job kind {name!r}; known: {sorted(set(JOB_KINDS) | set(configured))}")
    return JOB_KINDS[name]
