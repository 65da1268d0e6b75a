"""A retrain reads the feedback once: the dry run asks the retrain's own data preparation, and nothing written
after the snapshot (a conversation, a vote) reaches the reward model, the prompt sets or the counts."""
from __future__ import annotations

import pytest

from rlhf.config import apply_overrides
from rlhf.retrain.data import dry_run
from rlhf.training.data import FeedbackSnapshot
from rlhf.training.prompts import prompt_sets


def seed_pairs(store, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        conv = store.create_conversation("assistant", "ann", messages=[{"role": "user", "content": f"question {i}"}])
        user = store.leaf(conv.id)
        good = store.record_reply(user.id, f"answer {i}, thanks!", 1)
        bad = store.record_reply(user.id, f"answer {i}.", 1)
        store.record_comparison(good.id, bad.id, "a", "ann")


def test_dry_run_agrees_with_the_retrain_under_reward_mode_pairwise(store, app_config):
    """mode=pairwise trains from 2 pairs: with 5 the dry run used to say '11 more pairs needed'."""
    seed_pairs(store, 5)
    pairwise = dry_run(store, app_config, "assistant", {"reward.mode": "pairwise"})
    assert pairwise["ready"] is True and "missing" not in pairwise and pairwise["pairs"] == 5
    auto = dry_run(store, app_config, "assistant")  # auto wants reward.min_pairs (16) votes, 8 decided, or 8 ratings
    assert auto["ready"] is False and "11 more votes or ratings (ties count), 3 of them preference pairs" in \
        auto["missing"]


def test_dry_run_repeats_the_preparations_not_enough_data(store, app_config):
    from rlhf.training.data import NotEnoughData
    from rlhf.training.reward import prepare_data

    seed_pairs(store, 1)
    cfg = apply_overrides(app_config, {"reward.mode": "pairwise"})
    with pytest.raises(NotEnoughData) as exc:
        prepare_data(store.feedback_rows("assistant"), cfg.reward)
    out = dry_run(store, app_config, "assistant", {"reward.mode": "pairwise"})
    assert out["ready"] is False and out["missing"] == exc.value.missing == "1 more preference pairs (comparisons " \
        "or differently rated regenerations)"


def test_nothing_written_after_the_snapshot_reaches_the_training_prompts(store, app_config):
    seed_pairs(store, 3)
    snapshot = FeedbackSnapshot.take(store, "assistant")
    seed_pairs(store, 1, first=100)  # someone chats and votes while the reward model trains
    buffer, held_out = prompt_sets(store, app_config, "assistant", rows=snapshot.rows)
    seen = [m["content"] for s in buffer.adversarial + buffer.normal for m in s.messages] + \
        [m["content"] for p in held_out for m in p]
    assert "question 0" in seen and "question 100" not in seen
    assert snapshot.feedback_count == 3 and snapshot.watermark != store.feedback_watermark("assistant")


def test_the_retrain_trains_ppo_on_the_snapshot_not_on_what_came_later(store, app_config, monkeypatch):
    """The retrain's prompt sets used to be read after the reward model trained: chats from meanwhile leaked in."""
    from rlhf.retrain import pipeline
    from rlhf.jobs.context import JobContext
    from rlhf.training import reward
    from rlhf.training.ppo import trainer

    seed_pairs(store, 3)
    seen = {}

    class Stop(Exception):
        pass

    def reward_model_meanwhile(store_, config, agent, **kwargs):  # the reward phase, while someone chats
        seen["reward_rows"] = kwargs["rows"]
        seed_pairs(store, 1, first=100)
        return reward.RewardResult(0, "unused", "pairwise", 3, 0, None, 0.0, {}, "head",
                                   scorer=lambda p, r: [0.0] * len(r))

    def ppo_captures(config, base_source, scorer, prompts, eval_prompts, run_dir, **kwargs):
        seen["prompts"] = [m["content"] for s in prompts.adversarial + prompts.normal for m in s.messages] + \
            [m["content"] for p in eval_prompts for m in p]
        raise Stop

    monkeypatch.setattr(reward, "train_reward_model", reward_model_meanwhile)
    monkeypatch.setattr(trainer, "train_ppo", ppo_captures)
    job = store.enqueue_job("retrain", "assistant", {"app": app_config.to_dict()})
    with pytest.raises(Stop):
        pipeline.retrain(JobContext(store, job, app_config))
    assert "question 0" in seen["prompts"] and "question 100" not in seen["prompts"]
    assert len(seen["reward_rows"]["comparisons"]) == 3
