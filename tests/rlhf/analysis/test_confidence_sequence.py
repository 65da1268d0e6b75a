"""The people's-vote test: an always-valid interval by betting, its verdicts, and how often it errs."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlhf.analysis.confidence_sequence import BETS, confidence_sequence, decide, log_capital, verdicts, votes_needed


def test_log_capital_by_hand_for_one_win():
    # One win at m = 0.5: the up bet of stake c (lambda = 2c) turns 1 into 1 + c, the down bet into 1 - c.
    expected = math.log(np.mean([1 + c for c in BETS] + [1 - c for c in BETS]))
    assert log_capital(1, 0, 0, np.array([0.5]))[0] == pytest.approx(expected)
    # A tie at m = 0.5 is x = m: no bet wins or loses anything.
    assert log_capital(0, 3, 0, np.array([0.5]))[0] == pytest.approx(0.0)


def test_capital_depends_on_counts_not_order_and_is_a_fair_game_at_the_true_mean():
    m = np.array([0.3, 0.5, 0.7])
    assert np.allclose(log_capital(4, 2, 3, m), log_capital(4, 2, 3, m))  # a function of the counts
    # E[1 + lambda (x - m)] = 1 for every bet when E[x] = m: one vote's expected capital is exactly 1.
    for p in (0.3, 0.5, 0.7):
        probs = {"w": p - 0.1, "t": 0.2, "l": 0.9 - p}
        k = sum(pr * math.exp(log_capital(*(1 if o == key else 0 for o in "wtl"), np.array([p]))[0])
                for key, pr in probs.items())
        assert k == pytest.approx(1.0)


def test_interval_narrows_around_the_rate_and_verdicts_follow_it():
    low, high = confidence_sequence(0, 0, 0)
    assert (float(low), float(high)) == (0.0, 1.0)
    d = decide(60, 20, 20)
    assert d.verdict == "promote" and 0.5 < d.low < d.win_rate == 0.7 < d.high
    assert decide(10, 2, 30).verdict == "reject"
    assert decide(5, 2, 3).verdict == "collecting" and d.votes_needed == 0
    assert decide(90, 20, 90, max_votes=200).verdict == "no_difference"
    assert decide(3, 0, 2, both_bad=4).to_dict()["both_bad"] == 4  # recorded, not rated
    assert list(verdicts([0.6, 0.1, 0.2, 0.2], [0.9, 0.4, 0.8, 0.8], [10, 10, 200, 10], 200)) == [
        "promote", "reject", "no_difference", "collecting"]


def test_votes_needed_shrinks_as_evidence_grows_and_stops_at_the_cap():
    early, later = votes_needed(6, 2, 2, 0.05, 200), votes_needed(18, 6, 6, 0.05, 200)
    assert later < early
    assert decide(24, 6, 6).votes_needed is not None
    assert votes_needed(50, 0, 50, 0.05, 120) <= 20  # never more than the votes left


def test_peeking_after_every_vote_keeps_the_error_rate_and_finds_a_clear_winner():
    rng = np.random.default_rng(0)

    def run(rate):
        outcome = rng.choice(3, size=200, p=[rate - 0.1, 0.2, 0.9 - rate])
        counts = np.stack([np.cumsum(outcome == k) for k in range(3)])
        low, high = confidence_sequence(*counts)
        said = verdicts(low, high, np.arange(1, 201), 200)
        return said[np.flatnonzero(said != "collecting")[0]]

    null = [run(0.5) for _ in range(200)]
    assert (null.count("promote") + null.count("reject")) / 200 <= 0.08  # alpha 0.05, plus sampling slack
    clear = [run(0.75) for _ in range(50)]
    assert clear.count("promote") >= 45 and "reject" not in clear
