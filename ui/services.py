"""What the handlers get injected: config, the Store, the policy server, and the background machinery."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from rlhf.base_models import canonical_model, needs_conversion
from rlhf.config import AppConfig
from rlhf.serving.policy_server import PolicyServer, load_server
from storage import Conflict, Store
from ui.downloads import PrivateDownloads
from ui.feedback_stats import FeedbackStats
from ui.state.leaderboard import Leaderboards
from ui.state.slots import ReplySlots
from ui.label_desk import LabelDesk

if TYPE_CHECKING:  # built by ui.webapp when the app runs; heavy (APScheduler, sign-in, the queue's model work)
    from rlhf.jobs.scheduler import StudioScheduler
    from rlhf.retrain.triggers import RetrainTriggers
    from rlhf.vote_queue.refill import QueueRefill


@dataclass
class Services:
    """Everything a UI or REST handler may use. Built once in ``ui.webapp.build_services``."""

    config: AppConfig
    store: Store
    server: PolicyServer
    scheduler: Optional[StudioScheduler] = None  # when running
    triggers: Optional[RetrainTriggers] = None  # each agent's automatic-retrain rule, checked on the scheduler's timers
    auth: Optional[Any] = None  # ui.auth.Auth when users are configured (it reads Services: not imported here)
    refill: Optional[QueueRefill] = None  # when the vote queue refills in the background
    servers: dict = field(default_factory=dict)  # base model (hub id if shipped) -> its PolicyServer
    leaderboards: Optional[Leaderboards] = None  # made from the Store when not given
    replies: Optional[ReplySlots] = None  # replies generating per person (server.max_replies_per_user)
    feedback_stats: Optional[FeedbackStats] = None  # the Data tab's statistics, once per change of the feedback
    labels: LabelDesk = field(default_factory=LabelDesk)  # what each open Chat page shows; one write per person
    downloads: PrivateDownloads = field(default_factory=PrivateDownloads)  # exports offered once to an admin
    _servers_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.leaderboards is None:
            self.leaderboards = Leaderboards(self.store, self.config.server.leaderboard_refit_seconds)
        if self.feedback_stats is None:
            self.feedback_stats = FeedbackStats(self.store)
        if self.replies is None:  # local mode is one person: no cap
            server = self.config.server
            self.replies = ReplySlots(0 if server.local_mode else server.max_replies_per_user)

    def server_for(self, agent, load: bool = True) -> Optional[PolicyServer]:
        """The PolicyServer for an agent's base model: the app's own (a shipped name and its hub id are the same
        model), or one loaded (once) on first use. ``load=False``: only a server already in memory, else None (the
        vote queue's refill never loads a model)."""
        base = canonical_model(getattr(agent, "base_model", None) or "")
        if not base or base in (canonical_model(self.config.base_model), canonical_model(self.server.model_name)):
            return self.server
        with self._servers_lock:
            if base not in self.servers:
                if not load:
                    return None
                if needs_conversion(agent.base_model, self.config.data_path):  # minutes: a job's work, not a request's
                    raise Conflict(self.preparing(agent))
                try:
                    self.servers[base] = load_server(dataclasses.replace(self.config, base_model=agent.base_model),
                                                     [agent.system_prompt])
                    if self.scheduler is not None:  # the same CPU budget as the app's own server
                        self.servers[base].use_budget(self.scheduler.runner.budget)
                except Exception as exc:  # a missing or broken model dir: the request fails, the app stays up
                    raise Conflict(f"agent {agent.name!r}: base model {agent.base_model!r} cannot be loaded: "
                                   f"{exc}") from exc
            return self.servers[base]

    def preparing(self, agent) -> str:
        """Why ``agent`` cannot chat yet: its base model is being converted by a ``prepare_base`` job (one is queued
        here when none is), or that job failed."""
        job = prepare_job(self.store, agent.id)
        if (job is None or job.status in ("succeeded", "cancelled")) and self.scheduler is not None:
            job = self.scheduler.enqueue("prepare_base", agent.name, reason="first chat")
        if job is None:
            return f"agent {agent.name!r}: its base model is not prepared yet and no job can prepare it here"
        if job.status == "failed":
            return (f"agent {agent.name!r}: preparing its base model failed (job #{job.id}): {job.error}. Fix the "
                    "base model file, then chat again to retry")
        return (f"agent {agent.name!r}: its base model is being prepared (job #{job.id}, {job.status}, "
                f"{job.progress:.0%}): chat once it is done (the Training tab shows its progress)")

    def close(self) -> None:
        self.leaderboards.close()
        if self.refill is not None:
            self.refill.stop()
        if self.scheduler is not None:
            self.scheduler.shutdown()
        for server in self.servers.values():
            server.close()
        self.server.close()
        self.store.close()


def prepare_job(store, agent_id: int):
    """The agent's latest ``prepare_base`` job (its base model's conversion), or None."""
    return next((j for j in store.list_jobs(agent_id) if j.kind == "prepare_base"), None)


def bind(fn: Callable, *args: Any) -> Callable:
    """``functools.partial`` that Gradio can introspect.

    Gradio reads a handler's signature and type hints to inject ``gr.Request`` / ``gr.LikeData`` and to
    tell streaming (generator) handlers apart; a bare partial hides both.
    """
    inner = functools.partial(fn, *args)
    if inspect.isgeneratorfunction(fn):
        def bound(*a, **k):
            yield from inner(*a, **k)
    else:
        def bound(*a, **k):
            return inner(*a, **k)
    functools.update_wrapper(bound, fn)
    sig = inspect.signature(fn)
    bound.__signature__ = sig.replace(parameters=list(sig.parameters.values())[len(args):])
    return bound
