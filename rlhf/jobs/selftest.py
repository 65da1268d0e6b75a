"""A fast diagnostic job kind (steps with progress and metrics; told to fail or hang by its config, for tests)."""
from __future__ import annotations

import time

from rlhf.jobs.context import JobContext


def selftest(ctx: JobContext) -> dict:
    """A fast diagnostic job: steps with progress and metrics; can be told to fail or hang (for tests)."""
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
