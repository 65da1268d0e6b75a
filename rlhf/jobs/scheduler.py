"""The app's background scheduler (APScheduler): drains the job queue and triggers retrains by rule.

APScheduler drops an on-demand trigger while a job runs and never reruns a killed one, so the Store's
jobs table is the queue and APScheduler only *times* things: one interval job drains the queue (woken
at once on enqueue), one evaluates each agent's trigger rule, and per-agent cron jobs enqueue retrains.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Optional

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger

from rlhf.config import AppConfig, job_overrides
from rlhf.jobs.runner import JobRunner
from storage import InvalidInput, Job, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    """When to retrain an agent automatically."""

    enabled: bool
    min_new_feedback: int
    min_interval_minutes: float
    cron: str = ""


def should_trigger(rule: Rule, new_feedback: int, minutes_since_last: Optional[float]) -> bool:
    """The threshold rule: enough new feedback and enough time since the last retrain (None = never)."""
    if not rule.enabled or new_feedback < rule.min_new_feedback:
        return False
    return minutes_since_last is None or minutes_since_last >= rule.min_interval_minutes


def validate_cron(expr: str) -> str:
    """The expression, or InvalidInput with the parser's reason."""
    expr = (expr or "").strip()
    if expr:
        try:
            CronTrigger.from_crontab(expr, timezone=timezone.utc)
        except ValueError as exc:
            raise InvalidInput(f"invalid cron expression {expr!r}: {exc}") from None
    return expr


def _pin_local_paths(cfg: AppConfig) -> AppConfig:
    """Local files the config names relative to the app's working directory, made absolute: the job process
    works elsewhere (its data dir's jobs area)."""
    for section, key in ((cfg, "base_model"), (cfg.ppo, "prompt_file")):
        value = getattr(section, key)
        if value and not os.path.isabs(value) and os.path.exists(os.path.expanduser(value)):
            setattr(section, key, os.path.abspath(os.path.expanduser(value)))
    return cfg


class StudioScheduler:
    """Owns the job runner and the APScheduler; the UI and REST enqueue through it."""

    def __init__(self, store: Store, config: AppConfig, runner: Optional[JobRunner] = None):
        self.store = store
        self.config = config
        self.runner = runner or JobRunner(store, config)
        self._aps: Optional[BackgroundScheduler] = None
        self._lock = threading.Lock()
        self._timers: dict[str, tuple[Callable[[], object], float]] = {}

    def add_timer(self, timer_id: str, fn: Callable[[], object], seconds: float) -> None:
        """Run ``fn()`` every ``seconds`` once started (the app's composition root registers what it needs timed,
        e.g. settling people's decisions); an error is logged and the next tick tries again."""
        if self._aps is not None:
            raise RuntimeError("add timers before the scheduler starts")
        self._timers[timer_id] = (fn, float(seconds))

    @staticmethod
    def _guarded(timer_id: str, fn: Callable[[], object]) -> Callable[[], None]:
        def tick() -> None:
            try:
                fn()
            except Exception:  # a timer job must not die; the next tick tries again
                log.exception("timer %s failed", timer_id)
        return tick

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Sweep interrupted jobs, then start draining the queue and checking trigger rules."""
        self.runner.sweep()
        aps = BackgroundScheduler(timezone=timezone.utc)
        aps.add_job(self.runner.tick, "interval", seconds=self.config.scheduler.poll_seconds, id="drain",
                    max_instances=1, coalesce=True, next_run_time=datetime.now(timezone.utc))
        aps.add_job(self.check_triggers, "interval", minutes=self.config.scheduler.check_minutes, id="trigger",
                    max_instances=1, coalesce=True)
        for timer_id, (fn, seconds) in self._timers.items():
            aps.add_job(self._guarded(timer_id, fn), "interval", seconds=seconds, id=timer_id, max_instances=1,
                        coalesce=True)
        self._aps = aps
        for agent in self.store.list_agents():
            self._schedule_cron(agent.name, self.rule(agent.name))
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
        job = self.store.enqueue_job(kind, agent, {"app": _pin_local_paths(cfg).to_dict(), **extra}, key=key)
        self.wake()
        return job

    # ---- rules -------------------------------------------------------------------------------
    def rule(self, agent: str) -> Rule:
        """The agent's stored rule, or the config defaults when none was saved yet."""
        row = self.store.get_scheduler_rule(agent)
        if row is None:
            s = self.config.scheduler
            return Rule(s.auto_retrain, s.min_new_feedback, s.min_interval_minutes, s.cron)
        return Rule(bool(row["enabled"]), row["min_new_feedback"], row["min_interval_minutes"], row["cron"])

    def update_rule(self, agent: str, rule: Rule) -> Rule:
        """Store an agent's rule (it survives restarts) and reschedule its cron trigger."""
        cron = validate_cron(rule.cron)
        self.store.set_scheduler_rule(agent, rule.enabled, rule.min_new_feedback, rule.min_interval_minutes, cron)
        saved = self.rule(agent)
        self._schedule_cron(agent, saved)
        return saved

    def _schedule_cron(self, agent: str, rule: Rule) -> None:
        if self._aps is None:
            return
        job_id = f"cron:{agent}"
        if self._aps.get_job(job_id):
            self._aps.remove_job(job_id)
        if rule.enabled and rule.cron:
            self._aps.add_job(self.enqueue, CronTrigger.from_crontab(rule.cron, timezone=timezone.utc),
                              id=job_id, args=["retrain", agent], kwargs={"reason": "cron"}, coalesce=True)

    def last_retrain(self, agent: str) -> Optional[Job]:
        """The agent's most recent retrain job (any status)."""
        return next((j for j in self.store.list_jobs(agent, limit=200) if j.kind == "retrain"), None)

    def new_feedback(self, agent: str) -> int:
        """Ratings + comparisons since the data snapshot of the agent's newest trained version."""
        trained = [p for p in self.store.list_policies(agent) if p.data_snapshot]
        return self.store.count_feedback_since(agent, trained[-1].data_snapshot if trained else None)

    def check_triggers(self) -> list[Job]:
        """Enqueue a retrain for every agent whose rule fires now."""
        queued = []
        now = datetime.now(timezone.utc)
        for agent in self.store.list_agents():
            last = self.last_retrain(agent.name)
            minutes = None if last is None else (now - datetime.fromisoformat(last.created)).total_seconds() / 60
            if should_trigger(self.rule(agent.name), self.new_feedback(agent.name), minutes):
                queued.append(self.enqueue("retrain", agent.name, reason="threshold"))
                log.info("threshold rule enqueued retrain job %s for %s", queued[-1].id, agent.name)
        return queued

    def next_check(self) -> Optional[datetime]:
        """When the trigger rule is evaluated next (None when the scheduler is not running)."""
        if self._aps is None:
            return None
        job = self._aps.get_job("trigger")
        return job.next_run_time if job else None
