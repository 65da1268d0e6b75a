"""The app-side job runner: claims queued jobs one at a time and runs each in its own OS process."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from rlhf.config import AppConfig
from rlhf.cpu import CpuBudget, JobThreads, THREAD_VARIABLES, thread_env, thread_plan
from rlhf.jobs.worker import config_of
from rlhf.plugins import code_settings
from storage import Job, Store

log = logging.getLogger(__name__)
CANCEL_GRACE_SECONDS = 5.0  # a job that ignores a cancel this long is killed


def pid_alive(pid: Optional[int]) -> bool:
    """True when a process with this id exists (and is not a zombie)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def worker_env(job_config: AppConfig, base: dict, root: str) -> tuple[dict, int]:
    """The job process's environment: ``base`` + our package on the path + its thread-pool sizes from the CPU
    budget (set before its torch loads); and the job's thread count."""
    threads = thread_plan(job_config).job
    env = thread_env(threads, base)
    env["PYTHONPATH"] = root + (os.pathsep + base["PYTHONPATH"] if base.get("PYTHONPATH") else "")
    return env, threads


class JobRunner:
    """Starts at most one job process at a time; reaps it, enforces cancels, records crashes.

    It tells ``budget`` (shared with the serving engines) when a job holds cores, so serving gives them up, and
    tells the job how many it may use now (``rlhf.cpu.JobThreads``: every core while nobody chats).
    """

    def __init__(self, store: Store, config: AppConfig, cancel_grace: float = CANCEL_GRACE_SECONDS,
                 budget: Optional[CpuBudget] = None):
        self.store = store
        self.config = config
        self.cancel_grace = cancel_grace
        self.budget = budget or CpuBudget(thread_plan(config))
        self._proc: Optional[subprocess.Popen] = None
        self._job_id: Optional[int] = None
        self._cancel_seen: Optional[float] = None
        self._threads_file: Optional[Path] = None  # where the running job reads its thread share
        self._threads_shared = 0
        self._threads_lock = threading.Lock()  # the two above: the budget's listener runs on a serving thread
        self._lock = threading.Lock()
        self.budget.listen(self._share_threads)  # a chat started: the job gives serving its cores back now

    def sweep(self) -> list[Job]:
        """At start: jobs left 'running' by a dead process are failed (or re-queued to resume)."""
        swept = self.store.sweep_stale_jobs(pid_alive, self.config.retrain.stale_after_seconds,
                                            resume=self.config.retrain.resume_interrupted)
        for job in swept:
            log.warning("job %s was interrupted by a restart: now %s", job.id, job.status)
        return swept

    def tick(self) -> Optional[int]:
        """One scheduling step: reap or police the running job, else start the next queued one."""
        with self._lock:
            self._reap()
            self._share_threads()  # nobody chatted for a while: the job may take every core
            if self._proc is None:
                job = self.store.claim_job(pid=os.getpid())
                if job is not None:
                    self._start(job)
            return self._job_id

    def _start(self, job: Job) -> None:
        log_file = self.config.paths.job_log(job.id)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        out = open(log_file, "ab")
        root = str(Path(__file__).resolve().parents[2])
        try:
            job_config = config_of(job, self.config)
        except ValueError:  # the worker will fail the job with the reason; its budget is the app's
            job_config = self.config
        env, threads = worker_env(job_config, dict(os.environ), root)
        self.store.log_job(job.id, "job process environment: " + ", ".join(f"{k}={env[k]}" for k in THREAD_VARIABLES))
        # Code comes from this app's config, never the job row; the process works in the data dir's jobs area
        # (not the project root, which may hold ./data) and, with -P, does not put that directory on sys.path.
        with self._threads_lock:
            self._threads_file, self._threads_shared = log_file.with_suffix(".threads"), 0
        self._share_threads()  # every core if nobody chats now, else the job's share
        argv = [sys.executable, "-P", "-m", "rlhf.jobs.worker", os.path.abspath(self.store.path), str(job.id),
                str(os.getpid()), json.dumps(code_settings(self.config)), str(self._threads_file)]
        self._proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      cwd=log_file.parent, env=env, start_new_session=True)
        out.close()
        self.budget.job_started(threads)  # serving drops to its share before the job's torch has loaded
        self._job_id = job.id
        self._cancel_seen = None
        self.store.set_job_pid(job.id, self._proc.pid)
        log.info("job %s (%s) started in process %s", job.id, job.kind, self._proc.pid)

    def _share_threads(self) -> None:
        """Write the running job's thread share to its threads file when it changed (also the budget's listener)."""
        with self._threads_lock:
            if self._threads_file is None:
                return
            threads = self.budget.job_share()
            if threads != self._threads_shared:
                try:
                    JobThreads.write(self._threads_file, threads)
                    self._threads_shared = threads
                except OSError:  # the data dir went away under us: the job keeps its threads
                    log.warning("could not write %s", self._threads_file, exc_info=True)

    def _reap(self) -> None:
        if self._proc is None:
            return
        code = self._proc.poll()
        job = self.store.get_job(self._job_id)
        if code is None:
            if job.cancel_requested:
                self._cancel_seen = self._cancel_seen or time.monotonic()
                if time.monotonic() - self._cancel_seen > self.cancel_grace:
                    self._proc.kill()  # the job ignored the request: stop it hard
                    self._proc.wait(10)
                    self.store.finish_job(job.id, "cancelled", error="cancelled by request (process killed)")
                    self._clear()
            return
        if not job.done:  # died without recording an end: OOM, kill -9, segfault
            reason = f"job process exited with code {code} before finishing"
            self.store.finish_job(job.id, "cancelled" if job.cancel_requested else "failed", error=reason)
        self._clear()

    def _clear(self) -> None:
        self._proc, self._job_id, self._cancel_seen = None, None, None
        with self._threads_lock:
            if self._threads_file is not None:
                self._threads_file.unlink(missing_ok=True)
            self._threads_file, self._threads_shared = None, 0
        self.budget.job_ended()

    def wait(self, job_id: int, timeout: float = 600.0, poll: float = 0.2) -> Job:
        """Tick until ``job_id`` has ended (for the CLI and tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tick()
            job = self.store.get_job(job_id)
            if job.done:
                self.tick()  # reap the process
                return job
            time.sleep(poll)
        raise TimeoutError(f"job {job_id} did not finish in {timeout:.0f} s")

    def shutdown(self) -> None:
        """Stop the running job process (the job is recorded as interrupted)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                job = self.store.get_job(self._job_id)
                if not job.done:
                    self.store.finish_job(job.id, "failed", error="interrupted: the app stopped")
            self._clear()
