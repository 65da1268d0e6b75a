"""Background jobs: each runs in its own OS process, reports through the Store, and can be cancelled.

The app's runner (rlhf/jobs/runner.py) claims a queued job and starts ``python -m rlhf.jobs.worker DB JOB_ID``.
That process rebuilds the job's config from the JSON stored with the job, except the settings that name code
(``rlhf.plugins.CODE_KEYS``): those the runner hands over from the running app's own config, so a job row (a
restored database, an old queue) never decides what is imported. It runs in the data dir's ``jobs/`` area, imports
nothing from the data dir (``rlhf.plugins.refuse_imports_under``), heartbeats into the Store,
and ends the job as succeeded, failed or cancelled. It dies with the app (a crash of the app leaves
a 'running' row that the next start sweeps; the job notices within a heartbeat and exits), and it never
takes the UI down with it.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import traceback
from typing import Mapping, Optional

from rlhf.config import AppConfig, from_dict
from rlhf.jobs.context import JobCancelled, JobContext
from rlhf.jobs.kinds import job_kind
from rlhf.plugins import refuse_imports_under, with_app_code
from storage import Job, Store
from storage.paths import DataDir

__all__ = ["config_of", "run_job", "main"]

log = logging.getLogger(__name__)


def config_of(job: Job, fallback: Optional[AppConfig] = None) -> AppConfig:
    """The full config a job runs with (stored with the job at enqueue time), checked again like every config:
    ConfigError names the key of a value that cannot work."""
    if job.config.get("app"):
        return from_dict(job.config["app"])
    return fallback or AppConfig()


def _heartbeat(ctx: JobContext, every: float, stop: threading.Event, parent: int) -> None:
    while not stop.wait(every):
        try:
            if ctx.store.job_progress(ctx.job.id):
                ctx.cancel_event.set()
        except Exception:  # a locked DB for a moment must not kill the job
            log.warning("heartbeat failed", exc_info=True)
        if parent and os.getppid() != parent:  # the app died: no orphan keeps training
            os._exit(3)


def claim_cpu(config: AppConfig, lower_priority: bool = False, threads_file: Optional[str] = None):
    """Take this process's share of the CPU budget (``rlhf.cpu``): torch's thread counts on this (the training)
    thread and, in a job process, its niceness; with ``threads_file`` (the runner's), follow the share the app
    writes there. Returns a line for the job log and the follower (None without one)."""
    from rlhf.cpu import JobThreads, apply_torch_threads, thread_plan

    plan = thread_plan(config)
    if config.device not in ("cpu", "auto"):
        return "CPU budget not applied (device=cuda)", None
    threads = apply_torch_threads(plan.job, interop=1)
    if lower_priority and plan.job_nice:
        os.nice(plan.job_nice)
    line = f"CPU budget: {threads} torch thread(s), nice {os.nice(0)} — {plan.describe()}"
    follower = JobThreads(threads_file, threads).follow() if threads_file else None
    if follower is not None and follower.applied != threads:
        line += f"; now {follower.applied} (nobody is chatting)"
    return line, follower


def run_job(store: Store, job_id: int, code: Mapping[str, dict], parent_pid: int = 0,
            lower_priority: bool = False, threads_file: Optional[str] = None) -> Job:
    """Run one claimed job to its end in this process and record the outcome. ``code``: the running app's code
    settings (``rlhf.plugins.code_settings``), which replace whatever the job's saved config names;
    ``threads_file``: where the app says how many threads the job may use now."""
    job = store.get_job(job_id)
    try:
        config = config_of(job)
        with_app_code(config, code)
    except ValueError as exc:  # e.g. saved before a rule existed: the job fails naming the key, before any work
        store.log_job(job_id, f"config: {exc}", "warning")
        return store.finish_job(job_id, "failed", error=f"{type(exc).__name__}: {exc}")
    # The data dir is where this Store lives now: a job queued before the data dir was moved or restored
    # elsewhere must write its run, reward model and version there, not at the path it was queued with.
    config.data_dir = str(store.root)
    cpu, follower = claim_cpu(config, lower_priority, threads_file)  # leave serving its cores
    ctx = JobContext(store, job, config)
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(ctx, config.retrain.heartbeat_seconds, stop, parent_pid),
                            daemon=True)
    beat.start()
    try:
        fn = job_kind(job.kind, config.scheduler.job_kinds)
        ctx.progress(0.0, "starting", f"{job.kind} job started (pid {os.getpid()})")
        ctx.log(cpu)
        result = fn(ctx) or {}
        if follower is not None and follower.changes:
            ctx.log(f"CPU budget: the job changed its thread count {follower.changes} time(s) as chat came and "
                    f"went; it ended on {follower.applied}")
        return store.finish_job(job_id, "succeeded", result=result)
    except JobCancelled:
        ctx.log("cancelled", "warning")
        return store.finish_job(job_id, "cancelled", error="cancelled by request")
    except Exception as exc:
        ctx.log(traceback.format_exc()[-3000:], "warning")
        return store.finish_job(job_id, "failed", error=f"{type(exc).__name__}: {exc}")
    finally:
        stop.set()
        if follower is not None:
            follower.stop()


def main(argv: list[str]) -> int:
    """``python -m rlhf.jobs.worker DB_PATH JOB_ID PARENT_PID CODE_JSON [THREADS_FILE]``: run one job in this
    process (``CODE_JSON``: the app's ``rlhf.plugins.code_settings``; ``THREADS_FILE``: the app's live thread share
    for the job)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s job %(levelname)s %(name)s: %(message)s")
    db_path, job_id, parent, code = argv[0], int(argv[1]), int(argv[2]), json.loads(argv[3])
    threads_file = argv[4] if len(argv) > 4 else None
    if parent and os.getppid() != parent:
        return 3
    refuse_imports_under(DataDir.of_database(db_path).root)
    store = Store(db_path)
    try:
        job = run_job(store, job_id, code, parent, lower_priority=True, threads_file=threads_file)
    finally:
        store.close()
    return 0 if job.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
