"""A real retrain job for benchmarks: a throwaway Store seeded with votes from the shipped preference pool, the
retrain run by the app's own job runner (its own process, the CPU budget's threads), timed phase by phase.

``bench train`` reports its phase split; ``bench serve --during-retrain`` serves chat while it runs.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from rlhf.config import AppConfig, apply_overrides

AGENT = "assistant"
# A short retrain for --quick runs and tests (tiny model): every phase runs, in seconds.
QUICK = {"reward.epochs": 1, "reward.min_pairs": 4, "reward.batch_size": 4, "reward.max_length": 128,
         "reward.cv_folds": 2, "reward.ensemble": 2, "ppo.steps": 1, "ppo.batch_size": 4, "ppo.mini_batch_size": 2,
         "ppo.max_new_tokens": 8, "ppo.eval_prompts": 4, "ppo.save_every": 0}


def seed_votes(store, n_pairs: int, preference: str = "shorter", seed: int = 0, agent: str = AGENT) -> int:
    """``n_pairs`` comparisons of real SmolLM2 replies (the shipped pool), labelled by a planted preference."""
    from bench.preferences import make_pairs
    from rlhf.simulate.preference_pool import load_pool, split_prompts

    pool = load_pool()
    train_ids, _ = split_prompts(pool)
    pairs = make_pairs(pool, preference, train_ids, seed, n=n_pairs)
    base = store.active_policy(store.get_agent(agent).id).id
    for pair in pairs:
        conv = store.create_conversation(agent, "bench", messages=[{"role": "user", "content": pair["prompt"]}])
        user = store.leaf(conv.id)
        chosen = store.record_reply(user.id, pair["chosen"], base)
        rejected = store.record_reply(user.id, pair["rejected"], base)
        store.record_comparison(chosen.id, rejected.id, "a", "bench")
    return len(pairs)


def retrain_config(config: AppConfig, data_dir: Path, quick: bool, overrides: Optional[dict] = None) -> AppConfig:
    """The app config pointed at a throwaway data dir (the converted base model is reused, not copied)."""
    from rlhf.base_models import resolve_model

    source = resolve_model(config.base_model, config.data_path)
    if Path(source).exists():  # a converted base under a relative data dir: the job process has its own cwd
        source = str(Path(source).resolve())
    values = {"data_dir": str(data_dir), "base_model": source, "scheduler.enabled": False,
              **(QUICK if quick else {}), **(overrides or {})}
    return apply_overrides(config, values)


class RetrainRun:
    """One retrain job in its own process: ``start()``, then ``wait()`` for the timings."""

    def __init__(self, config: AppConfig, n_pairs: int = 64, label: str = "retrain"):
        from rlhf.jobs.runner import JobRunner
        from storage import Store

        config.data_path.mkdir(parents=True, exist_ok=True)
        self.config, self.label = config, label
        self.store = Store(config.db_path)
        self.store.ensure_default_agent(config.base_model)
        self.pairs = seed_votes(self.store, n_pairs)
        self.runner = JobRunner(self.store, config)
        self.job_id: Optional[int] = None
        self.started = 0.0

    def start(self) -> None:
        self.job_id = self.store.enqueue_job("retrain", AGENT, {"app": self.config.to_dict(), "reason": "bench"}).id
        self.started = time.perf_counter()
        self.runner.tick()

    def running(self) -> bool:
        """Tick the runner; True while the job has not ended."""
        self.runner.tick()
        return not self.store.get_job(self.job_id).done

    def wait(self, timeout: float = 3600.0) -> dict:
        """Block until the job ends; its wall time, status and the phase split of the job result."""
        job = self.runner.wait(self.job_id, timeout=timeout, poll=0.5)
        wall = time.perf_counter() - self.started
        result = job.result or {}
        phases = {k: round(v, 2) for k, v in result.get("phase_seconds", {}).items()}
        out = {"status": job.status, "error": job.error, "seconds": round(wall, 1), "pairs": self.pairs,
               "phase_seconds": phases, "ppo_phase_seconds": result.get("ppo_phase_seconds", {}),
               "eval_share": result.get("eval_share"), "eval_share_with_ppo": result.get("eval_share_with_ppo")}
        self.runner.shutdown()
        self.store.close()
        return out
