"""When the app retrains an agent by itself: each agent's trigger rule (a feedback threshold and an optional cron).

The rules are the retrain's, the timing is the scheduler's: the app's composition root builds ``RetrainTriggers``
and ``install``s it, which registers the threshold check as a scheduler timer and each agent's cron as a scheduler
cron; both enqueue a ``retrain`` job through the scheduler. ``rlhf/jobs`` knows nothing of this module.
"""
from __future__ import annotations

import functools
import logging
from datetime import datetime, timezone
from typing import Callable, Optional, Protocol

from rlhf.config import AppConfig
from rlhf.config.jobs import RetrainRule as Rule
from storage import Job, Store

__all__ = ["Rule", "RetrainTriggers", "should_trigger"]

log = logging.getLogger(__name__)
CHECK_TIMER = "trigger"  # the scheduler timer that evaluates every agent's threshold rule


def should_trigger(rule: Rule, new_feedback: int, minutes_since_last: Optional[float]) -> bool:
    """The threshold rule: enough new feedback and enough time since the last retrain (None = never)."""
    if not rule.enabled or new_feedback < rule.min_new_feedback:
        return False
    return minutes_since_last is None or minutes_since_last >= rule.min_interval_minutes


class Timers(Protocol):
    """What the triggers ask of the app's scheduler (``rlhf.jobs.scheduler.StudioScheduler``)."""

    def add_timer(self, timer_id: str, fn: Callable[[], object], seconds: float) -> None: ...

    def set_cron(self, timer_id: str, expr: str, fn: Callable[[], object]) -> None: ...

    def validate_cron(self, expr: str) -> str: ...

    def next_run(self, timer_id: str) -> Optional[datetime]: ...

    def enqueue(self, kind: str, agent: Optional[str] = None, overrides: Optional[dict] = None,
                key: Optional[str] = None, **extra) -> Job: ...


class RetrainTriggers:
    """Every agent's retrain trigger rule: stored in the Store, checked on the scheduler's timers."""

    def __init__(self, store: Store, config: AppConfig, scheduler: Timers):
        self.store = store
        self.config = config
        self.scheduler = scheduler

    def install(self) -> RetrainTriggers:
        """Register the threshold check and every agent's cron with the scheduler (before it starts)."""
        self.scheduler.add_timer(CHECK_TIMER, self.check_triggers, self.config.scheduler.check_minutes * 60)
        for agent in self.store.list_agents():
            self._schedule_cron(agent.name, self.rule(agent.name))
        return self

    # ---- rules -------------------------------------------------------------------------------
    def rule(self, agent: str) -> Rule:
        """The agent's stored rule, or the config defaults when none was saved yet."""
        row = self.store.get_scheduler_rule(agent)
        if row is None:
            return self.config.scheduler.default_rule()
        return Rule(bool(row["enabled"]), row["min_new_feedback"], row["min_interval_minutes"], row["cron"])

    def update_rule(self, agent: str, rule: Rule) -> Rule:
        """Store an agent's rule (it survives restarts) and reschedule its cron trigger."""
        cron = self.scheduler.validate_cron(rule.cron)
        self.store.set_scheduler_rule(agent, rule.enabled, rule.min_new_feedback, rule.min_interval_minutes, cron)
        saved = self.rule(agent)
        self._schedule_cron(agent, saved)
        return saved

    def _schedule_cron(self, agent: str, rule: Rule) -> None:
        enqueue = functools.partial(self.scheduler.enqueue, "retrain", agent, reason="cron")
        self.scheduler.set_cron(f"cron:{agent}", rule.cron if rule.enabled else "", enqueue)

    # ---- the threshold check -----------------------------------------------------------------
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
                queued.append(self.scheduler.enqueue("retrain", agent.name, reason="threshold"))
                log.info("threshold rule enqueued retrain job %s for %s", queued[-1].id, agent.name)
        return queued

    def next_check(self) -> Optional[datetime]:
        """When the threshold rule is evaluated next (None when the scheduler is not running)."""
        return self.scheduler.next_run(CHECK_TIMER)
