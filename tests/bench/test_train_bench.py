"""`rlhf-studio bench train --quick`: our PPO beside TRL's RLOOTrainer, PPO's rollouts beside the serving
engine's batched decode, and one whole retrain job; the figures it prints are the ones it writes."""
from __future__ import annotations

import argparse
import json

import pytest

from bench import train as bench_train

pytestmark = pytest.mark.slow  # trains and starts a retrain job: not in `make test-fast`


def test_train_bench_quick_compares_with_rloo(app_config, tmp_path, capsys):
    path = tmp_path / "BENCHMARKS.md"
    figures = bench_train.run(app_config, argparse.Namespace(quick=True, users=None), path=path)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == figures
    assert figures["ppo_samples_per_s"] > 0 and figures["rloo_samples_per_s"] > 0
    assert figures["ratio"] == pytest.approx(figures["ppo_samples_per_s"] / figures["rloo_samples_per_s"], rel=1e-2)
    assert set(figures["phase_split"]) == {"generate", "score", "reference", "update"}
    assert figures["rollout_tokens_per_s"] > 0 and figures["anchor_tokens_per_s"] > 0  # PPO's rollouts vs llama.cpp
    assert figures["anchor_engine"] == "llama_cpp"
    assert figures["rollout_vs_anchor"] == pytest.approx(
        figures["rollout_tokens_per_s"] / figures["anchor_tokens_per_s"], rel=0.05)
    assert sum(figures["phase_split"].values()) == pytest.approx(1.0, abs=0.01)
    assert set(figures["retrain_phase_seconds"]) >= {"data", "reward", "ppo", "eval", "publish"}
    assert 0 < figures["eval_share"] < figures["eval_share_with_ppo"] < 1 and figures["retrain_seconds"] > 0
    text = path.read_text()
    assert "## train" in text and "TRL RLOOTrainer" in text and "ours (PPO)" in text and "eval phase" in text
