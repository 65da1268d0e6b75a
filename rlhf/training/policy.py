"""The retrain's policy step: the method ``retrain.method`` names (``rlhf.training.methods``: PPO on the reward
model, DPO on the preference pairs, ...), each a LoRA adapter on the same base from the same version, returning what
the retrain needs next: ``final_dir`` (the adapter), ``kl`` (KL to the base on the eval prompts, NaN when not
measured), ``steps``, ``reward_before``/``reward_after`` (NaN without a reward model in the loop),
``phase_seconds``, ``history``, ``run_dir`` and ``policy`` (the trained model in memory, its base shared with the
evaluation).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from rlhf.config import AppConfig


def train_policy(config: AppConfig, base_source: str, reward_fn, pairs: Sequence[dict], prompts,
                 eval_prompts: Sequence[list[dict]], run_dir: Path, init_adapter: Optional[str] = None,
                 resume: Optional[Path] = None, on_step: Optional[Callable[[int, dict], None]] = None,
                 device: str = "cpu", base=None, evaluate_before: bool = True):
    """Train the policy with ``config.retrain.method`` on ``reward_fn`` over ``prompts`` or on ``pairs``
    (``{prompt: messages, chosen, rejected}``), whichever the method learns from. ``evaluate_before``: a method
    with a reward model in the loop also measures the starting policy on ``eval_prompts``."""
    from rlhf.training.methods import get_method

    config.retrain.check()
    return get_method(config.retrain.method).train(
        config, base_source, reward_fn, pairs, prompts, eval_prompts, run_dir, init_adapter=init_adapter,
        resume=resume, on_step=on_step, device=device, base=base, evaluate_before=evaluate_before)
