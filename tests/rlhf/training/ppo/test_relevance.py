"""ppo.relevance_weight's measure, read from the rollout's tensors, equals the guard's off-prompt measure
(``rlhf.retrain.guard.relevance``), which reads the same replies from their text on its own right-padded rows."""
from __future__ import annotations

import pytest
import torch

from rlhf.config import load_config
from rlhf.retrain.guard import relevance as guard_relevance
from rlhf.training.ppo.rollout import Rollout, build_policy, encode_prompts, reply_relevance, score_tokens

pytestmark = pytest.mark.slow  # loads a model

PROMPTS = [[{"role": "user", "content": q}] for q in ("Name a colour.", "How do I boil an egg?",
                                                      "What is the capital of France?")]
REPLIES = ["Blue, like the sky.", "Put it in boiling water for eight minutes.", "Paris"]


def rollout_of(tokenizer, prompt_ids, replies) -> Rollout:
    """The replies as a rollout batch: prompts left-padded, responses right-padded (as ``generate`` lays them)."""
    reply_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]
    width = max(map(len, reply_ids))
    response = torch.full((len(replies), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(replies), width))
    for row, ids in enumerate(reply_ids):
        response[row, :len(ids)] = torch.tensor(ids)
        mask[row, :len(ids)] = 1
    enc = tokenizer.pad({"input_ids": prompt_ids}, padding=True, return_tensors="pt", padding_side="left")
    return Rollout(torch.cat([enc["input_ids"], response], 1), torch.cat([enc["attention_mask"], mask.long()], 1),
                   response, mask, list(replies), [True] * len(replies))


def test_the_rollouts_relevance_is_the_guards_and_ignores_the_adapter(tiny_model_dir, tokenizer):
    policy = build_policy(str(tiny_model_dir), load_config(env={}).ppo, "cpu")
    with torch.no_grad():  # as if PPO had trained: the reference (adapter off) must not see it
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.3)
    prompt_ids = encode_prompts(tokenizer, PROMPTS, 384)
    ro = rollout_of(tokenizer, prompt_ids, REPLIES)
    ref, _ = score_tokens(policy, ro, 1.0, 2, reference=True, with_values=False)
    ours = reply_relevance(policy, tokenizer, ro, prompt_ids, ref, 1.0, 2, group_size=1)
    theirs = guard_relevance(policy.policy, tokenizer, PROMPTS, REPLIES)
    assert ours == pytest.approx(theirs, abs=1e-4)
    assert all(abs(v) > 1e-3 for v in ours)  # the prompt matters to the tiny model too: not a trivial 0 = 0
    # A batch of one prompt has no other prompt: every reply scores 0, not noise.
    one = rollout_of(tokenizer, prompt_ids[:1] * 2, REPLIES[:2])
    ref1, _ = score_tokens(policy, one, 1.0, 2, reference=True, with_values=False)
    assert reply_relevance(policy, tokenizer, one, prompt_ids[:1] * 2, ref1, 1.0, 2, group_size=2) == [0.0, 0.0]
