"""The reward benchmark's learning-curve code on a slice of the shipped pool, with cheap stand-in features."""
from __future__ import annotations

import math
import zlib

import numpy as np

from bench import reward as bench
from bench.preferences import PREFERENCES, heldout_pairs, make_pairs
from rlhf.simulate.preference_pool import load_pool, split_prompts


def hashed_words(prompts, replies, dim: int = 64) -> np.ndarray:
    """Bag of hashed words + log length: a stand-in for the model's features (no model needed)."""
    out = np.zeros((len(replies), dim + 1), np.float32)
    for row, reply in enumerate(replies):
        for word in reply.lower().split():
            out[row, zlib.crc32(word.encode()) % dim] += 1.0
        out[row, dim] = math.log1p(len(reply.split()))
    return out


def test_pool_features_index_every_reply_once():
    pool = load_pool()[:20]
    feats = bench.PoolFeatures(hashed_words, pool, batch=16)
    n = len({(r["prompt"], x) for r in pool for x in r["replies"]})
    assert feats.matrix.shape == (n, 65)
    pair = {"prompt": pool[0]["prompt"], "chosen": pool[0]["replies"][0], "rejected": pool[0]["replies"][1]}
    np.testing.assert_array_equal(feats.of([pair], "chosen")[0], hashed_words([None], [pair["chosen"]])[0])


def test_learning_curve_shapes_and_the_length_baseline_on_the_length_preference():
    pool = load_pool()
    train_ids, held_ids = split_prompts(pool)
    held = heldout_pairs(pool, "shorter")
    assert len(held) >= 200 and not {p["prompt_id"] for p in held} & set(train_ids)
    curve = bench.learning_curve(bench.length_fit(), pool, "shorter", train_ids, held, (16, 32), seeds=(0, 1))
    assert set(curve) == {16, 32} and all(len(v) == 2 for v in curve.values())
    assert min(curve[32]) >= 0.9  # a length model solves the length preference...
    concrete = heldout_pairs(pool, "concrete")
    lengths = bench.learning_curve(bench.length_fit(), pool, "concrete", train_ids, concrete, (32,), seeds=(0,))
    assert lengths[32][0] <= 0.7  # ...and not the content one: the benchmark is not a length benchmark


def test_training_pairs_never_use_held_out_prompts():
    pool = load_pool()
    train_ids, held_ids = split_prompts(pool)
    for pref in PREFERENCES:
        pairs = make_pairs(pool, pref, train_ids, seed=1, n=64)
        assert len(pairs) == 64 and {p["prompt_id"] for p in pairs} <= set(train_ids)


def test_accuracy_counts_ties_half():
    assert bench.accuracy(np.array([1.0, -1.0, 0.0, 2.0])) == 0.625
