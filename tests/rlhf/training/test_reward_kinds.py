"""Reward-model kinds are one interface and a table of import paths: a new kind is one module and one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.config import AppConfig, ConfigError, apply_overrides
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


LENGTH = LengthKind()


def test_a_registered_kind_trains_saves_and_loads_through_the_app(store, app_config, monkeypatch):
    monkeypatch.setitem(reward_kinds.REWARD_KINDS, "length", f"{__name__}:LENGTH")  # gone again after the test
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


CLASH = type("Clash", (), {"name": "clash", "format": 2})()


def test_formats_and_names_are_unique_and_unknown_kinds_are_clear_errors(monkeypatch):
    assert {name: (k.name, k.format) for name, k in zip(reward_kinds.REWARD_KINDS, reward_kinds.all_kinds())} == \
        {"head": ("head", 2), "lora": ("lora", 1)}
    with pytest.raises(ValueError, match="unknown reward model kind 'nope'; known: head, lora"):
        reward_kinds.reward_kind("nope")
    with pytest.raises(ConfigError, match="reward.method must be one of auto, head, lora, got 'hed'"):
        apply_overrides(AppConfig(), {"reward.method": "hed"})
    monkeypatch.setitem(reward_kinds.REWARD_KINDS, "clash", f"{__name__}:CLASH")
    with pytest.raises(ValueError, match="format 2 is taken"):
        reward_kinds.kind_for_format(1)


def test_the_table_imports_nothing_heavy():
    """The config check reads the table: importing it (and the config) loads no kind's module, nor torch."""
    import subprocess
    import sys

    code = ("import sys, rlhf.config, rlhf.training.reward_kinds; "
            "print([m for m in ('torch', 'rlhf.training.reward_head_kind', 'rlhf.training.reward_lora') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[3])).stdout.strip()
    assert out == "[]"
