"""The ``rpo`` section (``retrain.method: rpo``): DPO's settings plus the weight of the chosen replies' likelihood."""
from __future__ import annotations

from dataclasses import dataclass

from rlhf.config.fields import ConfigError, opt
from rlhf.config.training import DPOConfig


@dataclass
class RPOConfig(DPOConfig):
    """RPO settings (Pang et al. 2024, "Iterative Reasoning Preference Optimization", eq. 3): DPO's loss plus
    ``nll_weight`` x the mean negative log-likelihood per token of the chosen replies."""
    nll_weight: float = opt(1.0, "Weight of the chosen replies' negative log-likelihood beside the DPO loss (0 = "
                            "plain DPO): it keeps the policy near replies the base itself wrote, so its voice.")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot train (called at load)."""
        super().check()
        if self.nll_weight < 0:
            raise ConfigError(f"rpo.nll_weight must be >= 0, got {self.nll_weight}")
