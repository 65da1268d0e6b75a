"""The retrain's reward step: fit and register a reward model on the job's feedback snapshot, on the one copy of
the base the job loads (``shared_base``) when it can share it."""
from __future__ import annotations

from typing import Optional

from rlhf.config import AppConfig
from rlhf.jobs.context import JobContext
from rlhf.retrain.progress import Phases


def shared_base(cfg: AppConfig, base_source: str, device: str):
    """(causal LM, reward features on its decoder) for a job that shares one base between the reward model, PPO's
    policy and reference, and the evaluation; (None, None) when the two would load it differently (4-bit)."""
    from rlhf.base_models import load_causal_lm, load_tokenizer
    from rlhf.training.features import reward_features

    if cfg.reward.load_in_4bit or cfg.ppo.load_in_4bit:  # k-bit training prepares (casts) the base it gets
        return None, None
    base = load_causal_lm(base_source, device)
    return base, reward_features(cfg, device, base_source, model=base.base_model, tokenizer=load_tokenizer(base_source, cfg.chat_template))


def train_reward_phase(ctx: JobContext, phases: Phases, agent: str, device: str, snapshot, features=None):
    """Train and register the reward model on the snapshot's rows; returns (result, scorer). The scorer is the
    fitted one, in memory (same weights and features as its saved directory): the base is not loaded again."""
    from rlhf.training.reward import load_reward_model, train_reward_model

    def progress(fraction: float, phase: str = "reward", metrics: Optional[dict] = None) -> None:
        phases.report("reward", fraction, phase)
        if metrics:
            ctx.metrics(int(metrics.get("step", 0)), {k: v for k, v in metrics.items() if k != "step"})

    rm = train_reward_model(ctx.store, ctx.config, agent, job_id=ctx.job_id, progress=progress,
                            rows=snapshot.rows, snapshot=snapshot.watermark, features=features)
    s = rm.summary()
    ctx.log(f"reward model {rm.reward_model_id} ({rm.method}, {rm.mode}): {rm.pairs_train + rm.pairs_eval} pairs, "
            f"cross-validated accuracy {s['verdict']}")
    scorer = rm.scorer or load_reward_model(rm.path, device=device, load_in_4bit=ctx.config.reward.load_in_4bit,
                                            data_dir=ctx.config.paths)
    return rm, scorer
