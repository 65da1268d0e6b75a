"""`bench reward --active` on the shipped pool with cheap stand-in features: candidates, both strategies, the
votes-to-0.80 figure and the report (the real model's run is `rlhf-studio bench reward --active`)."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from bench import reward_active as bench
from bench.preferences import PREFERENCES, heldout_pairs
from rlhf.simulate.preference_pool import load_pool, split_prompts
from bench.reward import PoolFeatures
from tests.bench.test_reward_bench import hashed_words

pytestmark = pytest.mark.slow  # runs the benchmark's quick mode over the whole pool: the full suite only


@pytest.fixture(scope="module")
def pool():
    return load_pool()


def test_candidates_are_every_pair_of_training_replies_with_ties(pool):
    train_ids, held_ids = split_prompts(pool)
    cands = bench.candidate_pairs(pool, "concrete", train_ids, seed=0)
    assert len(cands) == 6 * len(train_ids)  # 4 replies: 6 pairs per prompt
    assert not {c["prompt_id"] for c in cands} & set(held_ids)
    winners = [c["winner"] for c in cands]
    assert {"a", "b", "tie"} == set(winners)
    pref = PREFERENCES["concrete"]
    for c in cands[:30]:
        gap = pref.score(c["prompt"], c["a"]) - pref.score(c["prompt"], c["b"])
        assert c["winner"] == ("tie" if abs(gap) <= pref.margin else "a" if gap > 0 else "b")
    noisy = [c["winner"] for c in bench.candidate_pairs(pool, "concrete_noisy", train_ids, seed=0)]
    flipped = sum(x != y for x, y in zip(winners, noisy)) / sum(w != "tie" for w in winners)
    assert 0.08 < flipped < 0.22  # 15% of the labels flip


def test_both_strategies_learn_and_count_votes_with_ties(pool):
    feats = PoolFeatures(hashed_words, pool)
    train_ids, _ = split_prompts(pool)
    cands = bench.candidate_pairs(pool, "shorter", train_ids, seed=0)
    held = heldout_pairs(pool, "shorter")
    curves = {s: bench.run_strategy(feats, cands, held, s, 0, budget=64, refit_every=8, min_pairs=8,
                                    random_share=0.2, members=4) for s in bench.STRATEGIES}
    for curve in curves.values():
        assert [p["votes"] for p in curve] == list(range(8, 65, 8))
        assert all(p["pairs"] <= p["votes"] for p in curve) and curve[-1]["accuracy"] > 0.7
    # the same seed draws the same random cold start, so both runs agree until the head takes over
    assert curves["active"][0] == curves["random"][0]
    assert bench.votes_to([{"votes": 8, "accuracy": 0.7}, {"votes": 16, "accuracy": 0.81}]) == 16
    assert bench.votes_to([{"votes": 8, "accuracy": 0.7}]) is None


def test_quick_run_reports_the_contract_figures(app_config, tmp_path, capsys):
    path = tmp_path / "BENCHMARKS.md"
    args = argparse.Namespace(quick=True, preference=None, active=True)
    figures = bench.run(app_config, args, path=path, featurize=hashed_words_featurizer())
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == figures
    assert {"active_pairs_to_080", "random_pairs_to_080", "ratio"} <= set(figures)
    assert figures["ratio"] == pytest.approx(figures["active_pairs_to_080"] / figures["random_pairs_to_080"], abs=1e-3)
    assert set(figures["per_preference"]) == set(bench.QUICK_PREFERENCES) and figures["seeds"] == 1
    assert 0 < figures["active_pairs_to_080"] <= bench.QUICK_BUDGET
    text = path.read_text()
    assert "## bench reward --active" in text and "votes_to_0.80" in text


def hashed_words_featurizer():
    """hashed_words with the attributes pool_features names its cache by."""
    def featurize(prompts, replies):
        return hashed_words(prompts, replies)

    featurize.device, featurize.layers = "none", ["hashed-words-64"]
    return featurize


def test_the_pool_cache_is_reused(tmp_path, pool):
    calls = []

    def counting(prompts, replies):
        calls.append(len(replies))
        return hashed_words(prompts, replies)

    first = PoolFeatures(counting, pool[:10], cache_dir=tmp_path, cache_key="k")
    again = PoolFeatures(counting, pool[:10], cache_dir=tmp_path, cache_key="k")
    other = PoolFeatures(counting, pool[:10], cache_dir=tmp_path, cache_key="another model")
    assert sum(calls) == 2 * 40 and np.array_equal(first.matrix, again.matrix)
    assert other.matrix.shape == first.matrix.shape
