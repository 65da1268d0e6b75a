"""The ``online_dpo`` section (``retrain.method: online_dpo``): DPO's settings plus how many of the policy's own
replies are sampled and how sure the reward model must be before a pair of them joins the votes."""
from __future__ import annotations

from dataclasses import dataclass

from rlhf.config.fields import ConfigError, one_of, opt
from rlhf.config.training import DPOConfig


@dataclass
class OnlineDPOConfig(DPOConfig):
    """Online DPO settings: one round of sampling the starting version's replies, the reward model's best and worst
    of each prompt's replies as a new pair where its ensemble agrees, then DPO on the votes plus those pairs."""
    prompts: int = opt(64, "Training prompts sampled per round (the retrain's prompt set, drawn without repeats).")
    samples: int = opt(4, "Replies sampled per prompt; the reward model's best and worst of them form the pair.")
    max_new_tokens: int = opt(96, "Longest sampled reply; a reply cut there joins no pair (it would teach stopping "
                              "mid-sentence).")
    temperature: float = opt(1.0, "Sampling temperature of the replies.")
    sample_with: str = opt("torch", "torch | serving: what samples the replies: the job's own torch model (one "
                           "batch of all of them), or the serving engine with the starting version's LoRA (the "
                           "tokens people are served; llama.cpp on a CPU, 0.75-0.84x torch's speed here: bench rollouts).")
    min_confidence: float = opt(0.8, "Share of the reward model's ensemble members that must rank best over worst "
                                "for the pair to be used (1 = all of them).")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot train (called at load)."""
        super().check()
        if self.prompts < 1 or self.samples < 2 or self.max_new_tokens < 1:
            raise ConfigError("online_dpo.prompts and online_dpo.max_new_tokens must be >= 1, online_dpo.samples "
                              ">= 2")
        one_of("online_dpo.sample_with", self.sample_with, ("serving", "torch"))
        if self.temperature <= 0 or not 0.5 <= self.min_confidence <= 1:
            raise ConfigError("online_dpo.temperature must be > 0 and online_dpo.min_confidence in [0.5, 1]")
