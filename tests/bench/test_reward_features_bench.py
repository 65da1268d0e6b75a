"""The reward-features benchmark: feature sets built from the default matrix, held-out pairs, the table."""
from __future__ import annotations

import numpy as np

from bench import reward_features


def test_the_sum_set_multiplies_the_averaged_states_by_the_token_count():
    # two depths of width 2, a last-token state of width 2, log1p(tokens)
    default = np.array([[1.0, 2.0, 3.0, 4.0, 9.0, 9.0, np.log1p(3.0)],
                        [0.5, 0.5, 0.5, 0.5, 9.0, 9.0, np.log1p(10.0)]])
    texts = ["may may be", "may be safe", "be safe now", "now"]
    sets = reward_features.feature_sets(np.vstack([default, default]), texts, depths=2)
    assert set(sets) == set(reward_features.FEATURE_SETS)
    assert np.allclose(sets["default"], np.vstack([default, default]))
    assert np.allclose(sets["sum"][0, 7:], [3.0, 6.0, 9.0, 12.0]) and np.allclose(sets["sum"][1, 7:], [5.0] * 4)
    # words in at least 3 replies: "be" (3 replies); "may" is in two
    assert sets["words"].shape == (4, 8) and list(sets["words"][:, -1]) == [1, 1, 1, 0]


def test_held_out_pairs_are_every_decided_pair_and_the_shorter_chosen_ones_are_kept_apart():
    pool = [{"prompt_id": "p1", "prompt": "q", "replies": ["a b c d", "please a", "x y", "please please"]},
            {"prompt_id": "p2", "prompt": "r", "replies": ["please", "z", "z z", "z z z"]}]
    pairs = reward_features.heldout_decided(pool, "polite", ["p1"])
    # polite counts polite phrases: 0, 1, 0, 2 -> every pair but the two zeros is decided
    assert len(pairs) == 5 and all(p["prompt"] == "q" for p in pairs)
    assert {"chosen": "please please", "rejected": "please a", "prompt": "q"} in pairs
    short = reward_features.chosen_shorter(pairs)
    assert all(len(p["chosen"].split()) < len(p["rejected"].split()) for p in short)
    assert {"chosen": "please a", "rejected": "a b c d", "prompt": "q"} in short and len(short) == 2


def test_the_table_shows_the_mean_over_oracles_on_all_and_on_shorter_chosen_pairs():
    rows = [{"oracle": o, "votes": 16, "features": f, "accuracy": a, "accuracy_chosen_shorter": s}
            for o, f, a, s in [("a", "default", 0.7, 0.6), ("b", "default", 0.9, 0.8),
                               ("a", "sum", 0.8, 0.5), ("b", "sum", 1.0, 0.7)]]
    out = reward_features.table(rows)
    assert "| 16 | default | 0.800 / 0.700 | 0.70 / 0.60 | 0.90 / 0.80 |" in out
    assert "| 16 | sum | 0.900 / 0.600 |" in out
