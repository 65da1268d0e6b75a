"""Tests for rlhf.analysis.arena: which versions may meet in the arena, and which two meet next."""
from collections import Counter

import numpy as np
import pytest

from rlhf.analysis.arena import choose_pair, pair_candidates
from tests.ui.test_views import V0, V1, V2, comp, pol
from rlhf.analysis import arena as pairing


def test_pair_candidates_skip_archived_and_rate_only_rated_versions():
    table = pairing.board([comp(2, 1, "a"), comp(1, 2, "both_bad")], [V0, V1, V2, pol(4, 3)], n_boot=0)
    cands = {c["policy_id"]: c for c in pair_candidates(table)}
    assert set(cands) == {1, 2, 4}  # v2 is archived
    assert cands[2]["rating"] > cands[1]["rating"] and cands[4]["rating"] is None
    assert cands[1]["votes"] == 2 and cands[4]["status"] == "candidate"


def versions(overrides=None):
    rows = [
        {"policy_id": 1, "version": 1, "status": "archived", "votes": 0, "rating": 900.0},
        {"policy_id": 2, "version": 2, "status": "active", "votes": 1000, "rating": 1000.0},
        {"policy_id": 3, "version": 3, "status": "candidate", "votes": 0, "rating": None},
        {"policy_id": 4, "version": 4, "status": "candidate", "votes": 1000, "rating": 1000.0},
        {"policy_id": 5, "version": 5, "status": "broken", "votes": 0, "rating": None},
    ]
    for row in rows:
        row.update((overrides or {}).get(row["policy_id"], {}))
    return rows


def test_choose_pair_never_same_never_archived_or_broken():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        a, b = choose_pair(versions(), rng)
        assert a != b and {a, b} <= {2, 3, 4}


def test_choose_pair_needs_two_eligible():
    rows = versions({3: {"status": "archived"}, 4: {"status": "broken"}})
    with pytest.raises(ValueError, match="at least 2"):
        choose_pair(rows, np.random.default_rng(0))


def test_choose_pair_newest_vs_active_and_random_sides():
    rng = np.random.default_rng(1)
    draws = [choose_pair(versions(), rng, newest_prob=1.0) for _ in range(400)]
    assert {frozenset(d) for d in draws} == {frozenset({2, 4})}  # 5 is newer but broken
    assert 150 < sum(d[0] == 4 for d in draws) < 250


def test_choose_pair_newest_is_active_pairs_with_next_most_recent():
    rows = versions({2: {"status": "candidate"}, 4: {"status": "active"}})
    draws = {frozenset(choose_pair(rows, np.random.default_rng(s), newest_prob=1.0))
             for s in range(50)}
    assert draws == {frozenset({3, 4})}


@pytest.mark.parametrize("newest_prob", [0.7, 0.3])
def test_choose_pair_newest_frequency(newest_prob):
    # Versions 2 and 4 have 1000 votes each, 3 has none, so the weighted branch picks {2, 4}
    # with probability ~1/1000: the observed rate is newest_prob up to sampling noise (sd ~0.008).
    rng = np.random.default_rng(2)
    draws = [frozenset(choose_pair(versions(), rng, newest_prob=newest_prob)) for _ in range(3000)]
    assert np.mean([d == {2, 4} for d in draws]) == pytest.approx(newest_prob, abs=0.03)


def test_choose_pair_favours_few_votes_and_close_ratings():
    rng = np.random.default_rng(3)
    rows = versions({3: {"votes": 0, "rating": 1000.0}, 2: {"votes": 100}, 4: {"votes": 100}})
    draws = [choose_pair(rows, rng, newest_prob=0.0) for _ in range(2000)]
    assert np.mean([3 in d for d in draws]) > 0.9
    # Equal votes: the two close ratings (1000, 1010) meet far more than either meets 1600.
    rows = versions({2: {"votes": 5}, 3: {"votes": 5, "rating": 1010.0},
                       4: {"votes": 5, "rating": 1600.0}})
    counts = Counter(frozenset(choose_pair(rows, rng, newest_prob=0.0)) for _ in range(2000))
    assert counts[frozenset({2, 3})] > 2 * max(counts[frozenset({2, 4})], counts[frozenset({3, 4})])


def test_choose_pair_deterministic_for_seed():
    first = [choose_pair(versions(), np.random.default_rng(7)) for _ in range(5)]
    again = [choose_pair(versions(), np.random.default_rng(7)) for _ in range(5)]
    assert first == again


def test_a_candidate_the_gate_could_not_call_meets_the_active_version_first():
    versions = [{"policy_id": 1, "version": 0, "status": "active", "votes": 5, "rating": 0.0},
                {"policy_id": 2, "version": 1, "status": "candidate", "votes": 0, "rating": None, "needs_votes": True},
                {"policy_id": 3, "version": 2, "status": "candidate", "votes": 9, "rating": 0.1}]
    rng = np.random.default_rng(0)
    pairs = {frozenset(choose_pair(versions, rng)) for _ in range(30)}
    assert pairs == {frozenset({1, 2})}  # always, not only with newest_prob
    versions[1]["needs_votes"] = False
    assert len({frozenset(choose_pair(versions, rng)) for _ in range(60)}) > 1
