"""The ``selftest`` job kind: steps with progress and metrics, told to fail or hang by the job's config.

It does not ship with the app: a test that runs it names it in the config (``with_selftest``), and the job
process imports it from here through ``scheduler.job_kinds`` like any kind a plugin adds.
"""
from __future__ import annotations

import os
import sys
import time

from rlhf.config import AppConfig, apply_overrides
from rlhf.jobs.context import JobContext

SELFTEST = {"selftest": "tests.support.job_kinds:selftest",  # scheduler.job_kinds entries
            "whereami": "tests.support.job_kinds:whereami", "threads": "tests.support.job_kinds:threads"}


def selftest(ctx: JobContext) -> dict:
    """A fast job: ``steps`` steps with progress and metrics; ``fail_at`` a step, or ``hang`` ignoring cancel."""
    opts = ctx.job.config.get("selftest", {})
    steps = int(opts.get("steps", 3))
    for step in range(1, steps + 1):
        time.sleep(float(opts.get("sleep", 0.05)))
        ctx.metrics(step, {"selftest/value": step * 1.5})
        ctx.progress(step / steps, "work", f"step {step}/{steps}")
        if opts.get("fail_at") == step:
            raise RuntimeError(f"asked to fail at step {step}")
    if opts.get("hang"):
        while True:  # ignores cancel on purpose: the runner must kill it
            time.sleep(0.2)
    return {"steps": steps}


def threads(ctx: JobContext) -> dict:
    """Module forwards every 20 ms until ``stop_file`` exists, recording torch's thread count (a metric per change):
    what a job's training thread runs with as the app's budget changes."""
    import torch
    from pathlib import Path

    stop = Path(ctx.job.config["threads"]["stop_file"])
    layer, seen, step = torch.nn.Linear(8, 8), None, 0
    while not stop.exists() and step < 3000:
        layer(torch.zeros(1, 8))
        step += 1
        if torch.get_num_threads() != seen:
            seen = torch.get_num_threads()
            ctx.metrics(step, {"threads/torch": seen})
        time.sleep(0.02)
    return {"steps": step}


def whereami(ctx: JobContext) -> dict:
    """Where the job process works and imports from, its data dir, and the code settings its config holds."""
    return {"cwd": os.getcwd(), "sys_path": list(sys.path), "job_kinds": ctx.config.scheduler.job_kinds,
            "reward_functions": ctx.config.ppo.reward_functions, "data_dir": str(ctx.data_dir)}


def with_selftest(config: AppConfig) -> AppConfig:
    """``config`` whose job processes can run the ``selftest`` kind."""
    return apply_overrides(config, {"scheduler.job_kinds": {**config.scheduler.job_kinds, **SELFTEST}})
