"""``retrain.method: rpo``: DPO with a likelihood term on the chosen replies (RPO; Pang et al. 2024, eq. 3),
config section ``rpo``: ``L = L_DPO + nll_weight · (−mean log π(y_w|x) per token)``. The chosen replies are the
base's own sampled replies, so the extra term holds the policy near text it would write while the DPO term moves
it toward the preferred side: DPO's learning with less of its drift in voice. TRL combines the two losses
(``loss_type=[sigmoid, sft]`` with ``loss_weights``); the run itself is ``rlhf.training.dpo``'s."""
from __future__ import annotations

from rlhf.training.methods.dpo import DPO


class RPO(DPO):
    name, title, section = "rpo", "DPO with the chosen replies' likelihood (RPO)", "rpo"
    rate_key, default_rate = "rpo_s_per_pair", 1.1

    def extra_args(self, config) -> dict:
        s = self.settings(config)
        return {"loss_type": [s.loss_type, "sft"], "loss_weights": [1.0, s.nll_weight]}


METHOD = RPO()
