"""The job kinds the app runs, registered in this one place (no import registers anything by itself).

A new kind is a function ``fn(ctx: JobContext) -> result dict`` in its own module and one line in
``register_builtin_kinds``.
"""
from __future__ import annotations

from typing import Callable

JOB_KINDS: dict[str, Callable] = {}  # kind -> fn(ctx) -> result dict


def register_job_kind(name: str, fn: Callable) -> None:
    """Make ``fn(ctx) -> result dict`` runnable as jobs of kind ``name``."""
    JOB_KINDS[name] = fn


def register_builtin_kinds() -> None:
    """Register every job kind the app ships (what a job process can run)."""
    from rlhf.retrain.pipeline import eval_samples, retrain
    from rlhf.jobs.selftest import selftest

    register_job_kind("retrain", retrain)
    register_job_kind("eval_samples", eval_samples)
    register_job_kind("selftest", selftest)
