"""`rlhf-studio bench train --quick`: our PPO beside TRL's RLOOTrainer, PPO's rollouts beside the serving
engine's batched decode, and one whole retrain job; the figures it prints are the ones it writes."""
from __future__ import annotations

import argparse
import json

import pytest

from bench import train as bench_train


@pytest.mark.slow  # trains and starts a retrain job: not in `make test-fast`
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


def test_the_retrain_job_runs_the_app_config_not_the_trainers(app_config, tmp_path, monkeypatch):
    """The trainers compare 4 steps; the whole retrain job is timed with the config the app retrains with."""
    from rlhf.config import apply_overrides

    app = apply_overrides(app_config, {"ppo.steps": 13, "ppo.save_every": 3})
    seen = {}
    step = {"step_s": 1.0, "phases": {"generate": 0.5, "score": 0.1, "reference": 0.2, "update": 0.2},
            "response_len": 10.0}

    def ours(config, *args):
        seen["ours"] = config.ppo
        return step

    monkeypatch.setattr(bench_train, "run_ours", ours)
    monkeypatch.setattr(bench_train, "run_rloo", lambda *a: step)
    monkeypatch.setattr(bench_train, "run_anchor", lambda *a: {"tokens_per_s": 20.0, "engine": "llama_cpp"})

    def retrain(config, quick):
        seen["job"] = config.ppo
        return {"seconds": 9.0, "pairs": 64, "peak_rss_mb": None, "phase_seconds": {"ppo": 9.0},
                "ppo_phase_seconds": {}, "eval_share": 0.1, "eval_share_with_ppo": 0.2, "ppo_steps": config.ppo.steps}

    monkeypatch.setattr(bench_train, "run_retrain", retrain)
    figures = bench_train.run(app, argparse.Namespace(quick=False, users=None), path=tmp_path / "B.md")
    assert (seen["ours"].steps, seen["ours"].save_every) == (4, 0)
    assert (seen["job"].steps, seen["job"].save_every) == (13, 3) and figures["retrain_ppo_steps"] == 13
