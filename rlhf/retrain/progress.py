"""A retrain's progress and timing: each phase's share of the progress bar, the seconds each phase took, and the
throughput this machine measured (for the next retrain's time estimate)."""
from __future__ import annotations

import time
from typing import Optional

from rlhf.config import AppConfig
from rlhf.jobs.context import JobContext
from storage import Store

# Phase shares of a retrain's wall time (for the progress bar), measured on the default config; the policy phase is
# named after its method (retrain.method) and takes POLICY_PHASE.
RETRAIN_PHASES = {"data": (0.0, 0.01), "reward": (0.01, 0.25), "eval": (0.87, 0.99), "publish": (0.99, 1.0),
                  "done": (1.0, 1.0)}
POLICY_PHASE = (0.25, 0.87)
# Throughput on a 2-core CPU with SmolLM2-135M, used until this machine has measured its own (each method's own
# rate: its ``rate_key`` and ``default_rate``).
DEFAULT_RATES = {"reward_s_per_pair": 1.5, "eval_s": 45.0, "overhead_s": 30.0}


def measured_rates(store: Store, agent: str) -> dict:
    """Seconds per pair / per unit of a method's work from this machine's last successful retrain, else defaults."""
    for job in store.list_jobs(agent, limit=100):
        if job.kind == "retrain" and job.status == "succeeded" and job.result.get("rates"):
            return {**DEFAULT_RATES, **job.result["rates"]}
    return dict(DEFAULT_RATES)


def estimate_minutes(rates: dict, pairs: int, config: AppConfig) -> float:
    """Expected wall minutes of a retrain with these settings."""
    from rlhf.training.methods import get_method

    method = get_method(config.retrain.method)
    reward_s = rates["reward_s_per_pair"] * max(pairs, 1) * config.reward.epochs
    policy_s = rates.get(method.rate_key, method.default_rate) * method.units(config, pairs)
    return round((reward_s + policy_s + rates["eval_s"] + rates["overhead_s"]) / 60.0, 1)


class Phases:
    """Maps each phase's own 0–1 progress onto the job's overall progress bar and times the phases."""

    def __init__(self, ctx: JobContext):
        self.ctx = ctx
        self.started: dict[str, float] = {}
        self.seconds: dict[str, float] = {}

    def enter(self, name: str, message: str = "") -> None:
        now = time.perf_counter()
        for previous, t0 in self.started.items():
            self.seconds.setdefault(previous, now - t0)
        self.started[name] = now
        self.ctx.progress(RETRAIN_PHASES.get(name, POLICY_PHASE)[0], name, message or f"{name} started")

    def report(self, name: str, fraction: float, message: Optional[str] = None) -> None:
        lo, hi = RETRAIN_PHASES.get(name, POLICY_PHASE)
        self.ctx.progress(lo + (hi - lo) * max(0.0, min(1.0, fraction)), name, message)


def retrain_rates(seconds: dict, cfg: AppConfig, pairs_train: int, pairs: int, policy_steps: int) -> dict:
    """The throughput a finished retrain measured (``measured_rates`` reads it back for the next estimate)."""
    from rlhf.training.methods import get_method

    method = get_method(cfg.retrain.method)
    return {"reward_s_per_pair": seconds["reward"] / max(1.0, pairs_train * cfg.reward.epochs),
            "eval_s": seconds["eval"],
            method.rate_key: seconds[method.name] / max(1.0, method.units(cfg, pairs, policy_steps))}


def phase_split(seconds: dict, ppo_seconds: dict) -> dict:
    """Seconds per retrain phase, PPO's own split, and the share of the wall time spent in the eval phase (and
    with PPO's own before/after evaluations added, which the ppo phase contains)."""
    total = sum(seconds.values())
    evaluating = seconds.get("eval", 0.0) + ppo_seconds.get("eval", 0.0)
    share = lambda x: round(x / total, 4) if total else 0.0  # noqa: E731
    return {"phase_seconds": {k: round(v, 3) for k, v in seconds.items()},
            "ppo_phase_seconds": {k: round(v, 3) for k, v in ppo_seconds.items()},
            "seconds": round(total, 3), "eval_share": share(seconds.get("eval", 0.0)),
            "eval_share_with_ppo": share(evaluating)}
