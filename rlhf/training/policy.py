"""The retrain's policy step, one seam for its two methods (``retrain.method``):

- ``ppo``: our PPO on the reward model (``rlhf.training.ppo.trainer.train_ppo``): it samples the policy's own
  replies and learns from the reward model's scores of them.
- ``dpo``: TRL's DPOTrainer on the preference pairs the reward model learned from (``rlhf.training.dpo``): no
  sampling, no reward model in the loop (the reward model is still fitted: the gate and the vote queue read it).

Both put a LoRA adapter on the same base, start from the same version, and return what the retrain needs next:
``final_dir`` (the adapter), ``kl`` (KL to the base on the eval prompts, NaN when not measured), ``steps``,
``reward_before``/``reward_after`` (NaN for DPO), ``phase_seconds``, ``history``, ``run_dir`` and ``policy`` (the
trained model in memory, its base shared with the evaluation).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from rlhf.config import AppConfig


def train_policy(config: AppConfig, base_source: str, reward_fn, pairs: Sequence[dict], prompts,
                 eval_prompts: Sequence[list[dict]], run_dir: Path, init_adapter: Optional[str] = None,
                 resume: Optional[Path] = None, on_step: Optional[Callable[[int, dict], None]] = None,
                 device: str = "cpu", base=None, evaluate_before: bool = True):
    """Train the policy with ``config.retrain.method``: PPO on ``reward_fn`` over ``prompts``, or DPO on ``pairs``
    (``{prompt: messages, chosen, rejected}``). ``evaluate_before``: PPO also measures the starting policy on
    ``eval_prompts`` (its ``reward_before``)."""
    config.retrain.check()
    if config.retrain.method == "dpo":
        from rlhf.training.dpo import train_dpo

        return train_dpo(config, base_source, pairs, run_dir, init_adapter=init_adapter,
                         on_step=on_step, device=device, base=base)
    from rlhf.training.ppo.trainer import train_ppo

    return train_ppo(config, base_source, reward_fn, prompts, eval_prompts, run_dir, init_adapter=init_adapter,
                     resume=resume, on_step=on_step, device=device, base=base, evaluate_before=evaluate_before)
