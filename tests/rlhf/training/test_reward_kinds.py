"""Reward-model kinds are one interface and a registry: a new kind is one class, registered, and nothing else."""
from __future__ import annotations

import json

import pytest

from rlhf.config import apply_overrides
from rlhf.training import reward_kinds
from rlhf.training.reward import load_reward_model, methods, train_reward_model


class LengthKind:
    """A made-up kind: longer replies score higher, times a factor fitted as the share of pairs it orders right."""

    name, format = "length", 99

    def fit(self, data, cfg, ctx, report):
        pairs = data.pairs_train + data.pairs_eval
        right = sum(len(p["chosen"]) > len(p["rejected"]) for p in pairs) / len(pairs)
        scorer = lambda prompts, replies: [right * len(r) for r in replies]  # noqa: E731
        return reward_kinds.Fitted(scorer, {"eval_accuracy": right}, {"format": self.format}, state=right)

    def save(self, fitted, directory):
        (directory / "length.json").write_text(json.dumps({"factor": fitted.state}))

    def load(self, directory, meta, source, device, load_in_4bit, batch_size):
        factor = json.loads((directory / "length.json").read_text())["factor"]
        return lambda prompts, replies: [factor * len(r) for r in replies]


def test_a_registered_kind_trains_saves_and_loads_through_the_app(store, app_config, monkeypatch):
    kind = LengthKind()
    monkeypatch.setitem(reward_kinds.REWARD_KINDS, kind.name, kind)  # gone again after the test
    reward_kinds.register_reward_kind(kind)
    assert "length" in methods()
    for i in range(6):
        conv = store.create_conversation("assistant", "ann", messages=[{"role": "user", "content": f"q {i}"}])
        user = store.leaf(conv.id)
        long = store.record_reply(user.id, f"a long answer number {i}", 1)
        short = store.record_reply(user.id, "short", 1)
        store.record_comparison(long.id, short.id, "a", "ann")
    config = apply_overrides(app_config, {"reward.method": "length", "reward.mode": "pairwise"})
    result = train_reward_model(store, config, "assistant")
    assert result.method == "length" and result.metrics["reward/eval_accuracy"] == 1.0
    assert json.loads(open(result.path + "/meta.json").read())["format"] == 99
    scorer = load_reward_model(result.path, device="cpu")
    assert scorer([[]], ["abc"]) == result.scorer([[]], ["abc"]) == [3.0]


def test_formats_and_names_are_unique_and_unknown_kinds_are_clear_errors():
    assert {k.name: k.format for k in reward_kinds.REWARD_KINDS.values()} == {"head": 2, "lora": 1}
    with pytest.raises(ValueError, match="format 2 is taken"):
        reward_kinds.register_reward_kind(type("Clash", (), {"name": "clash", "format": 2})())
    with pytest.raises(ValueError, match="unknown reward model kind 'nope'; known: head, lora"):
        reward_kinds.reward_kind("nope")
