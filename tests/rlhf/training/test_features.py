"""One reward-features function: the vote queue scores a pair on exactly the features the retrain's reward model
(and the gate's judge) read, under the same prompt budget (``ppo.max_prompt_tokens``), also for a long prompt."""
from __future__ import annotations

import numpy as np

from rlhf.config import apply_overrides
from rlhf.vote_queue.refill import QueueRefill
from rlhf.retrain.reward import shared_base
from rlhf.training.features import reply_features, reward_features
from rlhf.training.tokens import encode_with_reply
from storage import Store

OLD = "Tell me everything about the history of tea, its trade routes, its rituals and its chemistry. " * 4
LONG = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": OLD},
        {"role": "assistant", "content": "Tea began in China and travelled along many routes. " * 3},
        {"role": "user", "content": "And coffee?"}]
PROMPTS = [LONG, LONG, [{"role": "user", "content": "Hi."}]]
REPLIES = ["Coffee came from Ethiopia.", "No idea.", "Hello!"]


def test_the_queue_and_the_retrain_read_a_reply_under_a_long_prompt_alike(app_config, tiny_model_dir, tokenizer):
    cfg = apply_overrides(app_config, {"ppo.max_prompt_tokens": 64, "reward.max_length": 512})
    ids, _ = encode_with_reply(tokenizer, LONG, REPLIES[0], 512)
    assert len(ids) > 128  # the prompt is far over the budget: the budget decides what is read

    store = Store(cfg.db_path)
    try:
        queue = QueueRefill(store, cfg, lambda agent: None).features()(PROMPTS, REPLIES)
    finally:
        store.close()
    _, retrain = shared_base(cfg, str(tiny_model_dir), "cpu")  # the reward model's features in a retrain
    gate = reward_features(cfg, "cpu")  # the gate's judge when the job shares no base
    np.testing.assert_allclose(queue, retrain(PROMPTS, REPLIES), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(queue, gate(PROMPTS, REPLIES), rtol=1e-5, atol=1e-5)

    unbudgeted = reply_features(str(tiny_model_dir), "cpu", cfg.reward.max_length)(PROMPTS, REPLIES)
    assert not np.allclose(queue[0], unbudgeted[0], atol=1e-3)  # what the queue read before: another input
    np.testing.assert_allclose(queue[2], unbudgeted[2], rtol=1e-5, atol=1e-5)  # a short prompt fits either way
