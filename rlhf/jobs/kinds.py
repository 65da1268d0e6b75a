"""The job kinds the app runs, registered in this one place (no import registers anything by itself).

A new kind is a function ``fn(ctx: JobContext) -> result dict`` in its own module and one line below.
"""
from __future__ import annotations


def register_builtin_kinds() -> None:
    """Register every job kind the app ships (what a job process can run)."""
    from rlhf.jobs.pipeline import eval_samples, retrain
    from rlhf.jobs.worker import register_job_kind, selftest

    register_job_kind("retrain", retrain)
    register_job_kind("eval_samples", eval_samples)
    register_job_kind("selftest", selftest)
