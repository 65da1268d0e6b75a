"""``retrain.method: dpo``: TRL's DPOTrainer on the preference pairs the reward model learned from
(``rlhf.training.dpo``, config section ``dpo``): no sampling, no reward model in the loop (the reward model is
still fitted: the gate and the vote queue read it)."""
from __future__ import annotations

import math

from rlhf.training.methods.base import PolicyMethod


class DPO(PolicyMethod):
    name, title, section = "dpo", "DPO on the preference pairs", "dpo"
    rate_key, default_rate = "dpo_s_per_pair", 1.0

    def units(self, config, pairs, steps=None):
        return max(pairs, 1) * self.settings(config).epochs

    def total_steps(self, config, pairs):
        s = self.settings(config)
        return max(1, math.ceil(math.ceil(pairs / s.batch_size) * s.epochs))

    def train(self, config, base_source, reward_fn, pairs, prompts, eval_prompts, run_dir, init_adapter=None,
              resume=None, on_step=None, device="cpu", base=None, evaluate_before=True):
        from rlhf.training.dpo import train_dpo

        return train_dpo(config, base_source, pairs, run_dir, init_adapter=init_adapter, on_step=on_step,
                         device=device, base=base, settings=self.settings(config), method=self.name,
                         trl_args=self.extra_args(config))

    def extra_args(self, config) -> dict:
        """TRL DPOConfig keys beyond the ones every DPO run sets (none for plain DPO)."""
        return {}

    def result_metrics(self, trained, pairs):
        return {f"{self.section}/pairs": pairs}


METHOD = DPO()
