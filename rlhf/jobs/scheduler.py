"""The app's background scheduler (APScheduler): drains the job queue and runs the timers the app registers.

APScheduler drops an on-demand trigger while a job runs and never reruns a killed one, so the Store's
jobs table is the queue and APScheduler only *times* things: one interval job drains the queue (woken
at once on enqueue); the rest are what the app's composition root registers (``add_timer``, ``set_cron``): the
retrain's trigger rules, settling people's decisions. It knows no job kind.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from datetime import datetime, timezone
from typing import Callable, Optional

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger

from rlhf.config import AppConfig, job_overrides
from rlhf.jobs.runner import JobRunner
from storage import InvalidInput, Job, Store

log = logging.getLogger(__name__)


def _pin_local_paths(cfg: AppConfig) -> AppConfig:
    """Local files the config names relative to the app's working directory, made absolute: the job process
    works elsewhere (its data dir's jobs area)."""
    for section, key in ((cfg, "base_model"), (cfg.ppo, "prompt_file")):
        value = getattr(section, key)
        if value and not os.path.isabs(value) and os.path.exists(os.path.expanduser(value)):
            setattr(section, key, os.path.abspath(os.path.expanduser(value)))
    return cfg


def _for_agent(cfg: AppConfig, agent, overrides: dict) -> AppConfig:
    """The job's config for ``agent``: its base model (a job trains on the weights that serve the agent) and its own
    chat template, unless the job's overrides name them."""
    from rlhf.base_models import canonical_model

    changes = {}
    if agent.base_model and "base_model" not in overrides \
            and canonical_model(agent.base_model) != canonical_model(cfg.base_model):
        changes["base_model"] = agent.base_model
    if agent.chat_template and "chat_template" not in overrides:
        changes["chat_template"] = agent.chat_template
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _guarded(timer_id: str, fn: Callable[[], object]) -> Callable[[], None]:
    def tick() -> None:
        try:
            fn()
        except Exception:  # a timer job must not die; the next tick tries again
            log.exception("timer %s failed", timer_id)
    return tick


class StudioScheduler:
    """Owns the job runner and the APScheduler; the UI and REST enqueue through it."""

    def __init__(self, store: Store, config: AppConfig, runner: Optional[JobRunner] = None):
        self.store = store
        self.config = config
        self.runner = runner or JobRunner(store, config)
        self._aps: Optional[BackgroundScheduler] = None
        self._lock = threading.Lock()
        self._timers: dict[str, tuple[Callable[[], object], float]] = {}
        self._crons: dict[str, tuple[str, Callable[[], object]]] = {}

    # ---- what the app registers --------------------------------------------------------------
    @staticmethod
    def validate_cron(expr: str) -> str:
        """The crontab expression, stripped, or InvalidInput with the parser's reason."""
        expr = (expr or "").strip()
        if expr:
            try:
                CronTrigger.from_crontab(expr, timezone=timezone.utc)
            except ValueError as exc:
                raise InvalidInput(f"invalid cron expression {expr!r}: {exc}") from None
        return expr

    def add_timer(self, timer_id: str, fn: Callable[[], object], seconds: float) -> None:
        """Run ``fn()`` every ``seconds`` once started (the app's composition root registers what it needs timed,
        e.g. the retrain's trigger rules, settling people's decisions); an error is logged and the next tick tries
        again."""
        if self._aps is not None:
            raise RuntimeError("add timers before the scheduler starts")
        self._timers[timer_id] = (fn, float(seconds))

    def set_cron(self, timer_id: str, expr: str, fn: Callable[[], object]) -> None:
        """Run ``fn()`` on the crontab expression ``expr`` (UTC), replacing the timer of that id; an empty ``expr``
        removes it. Before the start it is kept and scheduled at start; InvalidInput for a bad expression."""
        expr = self.validate_cron(expr)
        self._crons.pop(timer_id, None)
        if expr:
            self._crons[timer_id] = (expr, fn)
        if self._aps is None:
            return
        if self._aps.get_job(timer_id):
            self._aps.remove_job(timer_id)
        if expr:
            self._add_cron(self._aps, timer_id, expr, fn)

    @staticmethod
    def _add_cron(aps: BackgroundScheduler, timer_id: str, expr: str, fn: Callable[[], object]) -> None:
        aps.add_job(_guarded(timer_id, fn), CronTrigger.from_crontab(expr, timezone=timezone.utc), id=timer_id,
                    coalesce=True)

    def next_run(self, timer_id: str) -> Optional[datetime]:
        """When the timer ``timer_id`` runs next (None when the scheduler is not running or has no such timer)."""
        if self._aps is None:
            return None
        job = self._aps.get_job(timer_id)
        return job.next_run_time if job else None

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Sweep interrupted jobs, then start draining the queue and running the registered timers."""
        self.runner.sweep()
        aps = BackgroundScheduler(timezone=timezone.utc)
        aps.add_job(self.runner.tick, "interval", seconds=self.config.scheduler.poll_seconds, id="drain",
                    max_instances=1, coalesce=True, next_run_time=datetime.now(timezone.utc))
        for timer_id, (fn, seconds) in self._timers.items():
            aps.add_job(_guarded(timer_id, fn), "interval", seconds=seconds, id=timer_id, max_instances=1,
                        coalesce=True)
        for timer_id, (expr, fn) in self._crons.items():
            self._add_cron(aps, timer_id, expr, fn)
        self._aps = aps
        aps.start()

    def shutdown(self) -> None:
        """Stop timing and stop the running job (it is recorded as interrupted)."""
        if self._aps is not None:
            self._aps.shutdown(wait=False)
            self._aps = None
        self.runner.shutdown()

    @property
    def running(self) -> bool:
        return self._aps is not None

    def wake(self) -> None:
        """Drain the queue now instead of at the next interval."""
        if self._aps is not None:
            self._aps.modify_job("drain", next_run_time=datetime.now(timezone.utc))

    # ---- enqueue -----------------------------------------------------------------------------
    def enqueue(self, kind: str, agent: Optional[str] = None, overrides: Optional[dict] = None,
                key: Optional[str] = None, **extra) -> Job:
        """Queue a job that carries the full effective config; a duplicate of a queued/running one is returned."""
        try:
            cfg = job_overrides(self.config, overrides or {})
        except ValueError as exc:
            raise InvalidInput(f"config: {exc}") from None
        if agent is not None:
            cfg = _for_agent(cfg, self.store.get_agent(agent), overrides or {})
        job = self.store.enqueue_job(kind, agent, {"app": _pin_local_paths(cfg).to_dict(), **extra}, key=key)
        self.wake()
        return job
