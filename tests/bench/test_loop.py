"""`bench loop` on the tiny model: oracle-labelled pool votes, the head reward model, PPO, the oracle's verdict."""
from __future__ import annotations

import argparse
import json
import math

import pytest

from bench import loop, verdict
from rlhf.simulate.preference_pool import load_pool, split_prompts
from rlhf.simulate.oracles import ORACLES
from rlhf.config import apply_overrides

pytestmark = pytest.mark.slow  # trains PPO


def test_oracle_pairs_follow_the_oracle_and_stay_on_train_prompts():
    pool = load_pool()
    train_ids, held_ids = split_prompts(pool)
    pairs = loop.oracle_pairs(pool, "no-lists", train_ids, 40, seed=3)
    assert len(pairs) == 40 and not {p["prompt_id"] for p in pairs} & set(held_ids)
    assert len({p["prompt_id"] for p in pairs}) == 40  # one pair per prompt
    assert all(ORACLES["no-lists"](p["prompt"], p["chosen"], p["rejected"]) == "a" for p in pairs)
    assert pairs == loop.oracle_pairs(pool, "no-lists", train_ids, 40, seed=3)  # deterministic


def test_quick_loop_reports_the_verdict(app_config, tmp_path, capsys):
    config = apply_overrides(app_config, {"ppo.steps": 1, "ppo.batch_size": 1, "ppo.group_size": 2,
                                          "ppo.mini_batch_size": 2,
                                          "ppo.max_new_tokens": 8, "ppo.save_every": 0, "reward.cv_folds": 2,
                                          "ppo.eval_prompts": 4})
    args = argparse.Namespace(quick=True, oracle="concrete", votes=12, methods="ppo,dpo")
    figures = loop.run(config, args, path=tmp_path / "BENCHMARKS.md")
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == figures
    runs = {"concrete/ppo/0", "concrete/dpo/0"}  # the same votes, both methods
    assert figures["votes"] == 12 and set(figures["oracle_win_rate"]) == runs
    assert 0.0 <= figures["min_win_rate"] <= 1.0 and all(0.0 <= figures["distinct_2"][r] <= 1.0 for r in runs)
    assert all(0.0 <= figures["repetition"][r] <= 1.0 and math.isfinite(figures["kl"][r]) for r in runs)
    assert all(figures["train_s"][r] > 0 for r in runs) and set(figures["keeps_voice"]) == runs
    assert 0.5 <= figures["best_of_pool"]["concrete"] <= 1.0
    assert all(figures["gate"][r] in ("promote", "inconclusive", "reject") for r in runs)
    assert figures["gate_agrees"] == all(verdict.agrees(figures["gate"][r], figures["oracle_win_rate"][r]) for r in runs)
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## loop" in text and "| concrete | dpo |" in text and "base_repetition" in text


def test_quick_active_loop_compares_queue_votes_with_random_votes(app_config, tmp_path, capsys):
    config = apply_overrides(app_config, {"ppo.steps": 1, "ppo.batch_size": 1, "ppo.group_size": 2,
                                          "ppo.mini_batch_size": 2, "ppo.max_new_tokens": 8, "ppo.save_every": 0,
                                          "reward.cv_folds": 2, "ppo.eval_prompts": 4, "reward.min_pairs": 4,
                                          "queue.refit_every": 4})
    figures = loop.run(config, argparse.Namespace(quick=True, oracle="concrete", votes=16, active=True),
                       path=tmp_path / "BENCHMARKS.md")
    assert set(figures["active_win_rate"]) == set(figures["random_win_rate"]) == {"concrete"}
    assert "## loop --active" in (tmp_path / "BENCHMARKS.md").read_text()


def test_queue_pairs_follow_the_oracle_spend_ties_and_differ_by_strategy(app_config):
    import numpy as np

    pool = load_pool()
    train_ids, _ = split_prompts(pool)
    ids = train_ids[:40]

    def featurize(prompts, replies):  # cheap text features: digits, words, list lines, a constant
        return np.array([[sum(ch.isdigit() for ch in r), len(r.split()) / 10, r.count("\n- "), 1.0]
                         for r in replies], dtype=np.float32)

    config = apply_overrides(app_config, {"reward.min_pairs": 4, "queue.refit_every": 4})
    got = {s: loop.queue_pairs(config, featurize, pool, "concrete", ids, 24, s, "sys") for s in ("active", "random")}
    for pairs in got.values():
        assert 0 < len(pairs) <= 24 and {p["prompt_id"] for p in pairs} <= set(ids)
        assert all(ORACLES["concrete"](p["prompt"], p["chosen"], p["rejected"]) == "a" for p in pairs)
    assert got["active"] != got["random"]
    assert got["active"] == loop.queue_pairs(config, featurize, pool, "concrete", ids, 24, "active", "sys")


def test_the_voice_goal_allows_005_less_distinct_2_and_002_more_repetition():
    row = {"distinct_2": 0.80, "base_distinct_2": 0.85, "repetition": 0.05, "base_repetition": 0.03}
    assert verdict.keeps_voice(row)
    assert not verdict.keeps_voice({**row, "distinct_2": 0.79}) and not verdict.keeps_voice({**row, "repetition": 0.06})


def test_a_sweep_runs_each_value_and_plots_the_trade_off(app_config, tmp_path):
    from bench.plot import tradeoff_svg

    runs = loop._runs(app_config, argparse.Namespace(sweep="ppo.kl_init=0.05,0.2", seeds="0,1", methods=None))
    assert [(labels["knob"], cfg.ppo.kl_init, cfg.ppo.seed) for labels, cfg in runs] == [
        ("ppo.kl_init=0.05", 0.05, 0), ("ppo.kl_init=0.05", 0.05, 1), ("ppo.kl_init=0.2", 0.2, 0),
        ("ppo.kl_init=0.2", 0.2, 1)]
    assert loop.parse_sweep(None) == (None, [None])
    with pytest.raises(Exception, match="--sweep expects"):
        loop.parse_sweep("ppo.kl_init")
    rows = [{"oracle": "polite", "knob": f"ppo.kl_init={v}", "distinct_2": d, "base_distinct_2": 0.85,
             "oracle_win_rate": w} for v, d, w in ((0.05, 0.7, 0.72), (0.2, 0.84, 0.66))]
    svg = tradeoff_svg(rows, tmp_path / "curve.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<circle") == 2 and "0.2" in svg and "polite" in svg


def test_win_rates_count_ties_half_and_leave_them_out_of_the_decisive_rate():
    assert verdict.win_rates(["a", "a", "b", "tie"]) == {"oracle_win_rate": 0.625, "decisive_win_rate": 0.667,
                                                     "tie_share": 0.25}
    assert verdict.win_rates(["tie", "tie"]) == {"oracle_win_rate": 0.5, "decisive_win_rate": None, "tie_share": 1.0}


def test_the_gate_agrees_when_it_never_rejects_clear_winners_and_never_promotes_losers():
    assert verdict.agrees("promote", 0.7) and verdict.agrees("inconclusive", 0.6)  # people may decide a winner
    assert not verdict.agrees("reject", 0.65)
    assert verdict.agrees("inconclusive", 0.55) and verdict.agrees("promote", 0.55)  # between: either is fine
    assert not verdict.agrees("promote", 0.5) and verdict.agrees("reject", 0.4) and verdict.agrees("inconclusive", 0.5)


def test_a_perfect_reranker_scales_each_oracle():
    pool = load_pool()
    _, held_ids = split_prompts(pool)
    ceilings = {name: verdict.best_of_pool(pool, name, held_ids) for name in ORACLES}
    assert all(0.5 <= c <= 1.0 for c in ceilings.values())
    # polite ties most pairs of the base's replies: even the best of four rarely beats a random one
    assert ceilings["polite"] < 0.6 < ceilings["concise"]


@pytest.mark.parametrize("oracle, votes, eval_prompts, message", [
    ("kind", 16, None, "--oracle must be one of"), ("concrete", 0, None, "--votes must be at least 4"),
    ("concrete", -3, None, "--votes must be at least 4"), ("concrete", 16, 0, "--eval-prompts must be in"),
    ("concrete", 16, 161, "--eval-prompts must be in")])
def test_bad_arguments_are_refused_before_any_work(app_config, oracle, votes, eval_prompts, message):
    from rlhf.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        loop.run(app_config, argparse.Namespace(quick=True, oracle=oracle, votes=votes, eval_prompts=eval_prompts))
