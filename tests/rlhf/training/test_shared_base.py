"""A retrain loads the base once: the reward features read it with the policy's LoRA switched off, so they are the
frozen base's features whatever PPO has done to the adapter, and the policy keeps its adapter (and gradients)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhf.config import load_config
from rlhf.base_models import load_causal_lm
from rlhf.training.features import ReplyFeatures
from rlhf.training.ppo.rollout import build_policy

PROMPTS = [[{"role": "user", "content": "Say hi."}], [{"role": "user", "content": "Name a colour."}]]
REPLIES = ["Hello there, friend.", "Blue."]


@pytest.mark.slow
def test_reward_features_on_the_policys_base_are_the_frozen_bases(tiny_model_dir, tokenizer):
    base = load_causal_lm(str(tiny_model_dir), "cpu")
    shared = ReplyFeatures(base.base_model, tokenizer)
    alone = ReplyFeatures.load(str(tiny_model_dir), "cpu")(PROMPTS, REPLIES)
    np.testing.assert_allclose(shared(PROMPTS, REPLIES), alone, rtol=1e-5, atol=1e-5)

    policy = build_policy(str(tiny_model_dir), load_config(env={}).ppo, "cpu", base=base)
    assert policy.policy.get_base_model() is base  # the adapter went on the same weights, no second copy
    with torch.no_grad():  # as if PPO had trained: the adapter now changes the outputs
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.3)
    ids = tokenizer("Hello there", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        with_adapter = policy.policy(input_ids=ids).logits
        with policy.policy.disable_adapter():
            without = policy.policy(input_ids=ids).logits
    assert not torch.allclose(with_adapter, without)

    np.testing.assert_allclose(shared(PROMPTS, REPLIES), alone, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # and the policy is untouched afterwards: adapter on, still trainable
        torch.testing.assert_close(policy.policy(input_ids=ids).logits, with_adapter)
    assert any(p.requires_grad for name, p in policy.named_parameters() if "lora_" in name)
