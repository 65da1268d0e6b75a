"""Tests for rlhf.analysis.leaderboard: hand-worked ratings and counts."""

import math

import numpy as np
import pandas as pd
import pytest

from rlhf.analysis.leaderboard import (
    LEADERBOARD_COLUMNS,
    bootstrap_ci,
    bradley_terry,
    elo_ratings,
    leaderboard,
    votes_frame,
    win_rate_matrix,
)


def vote(a, b, winner):
    return {"policy_a": a, "policy_b": b, "winner": winner}


def mixed_votes():
    """60 votes over three policies: 3 > 2 > 1 with ties, upsets and both_bad."""
    cycle = [
        vote(1, 2, "b"), vote(2, 3, "b"), vote(1, 3, "b"), vote(1, 2, "a"),
        vote(2, 3, "a"), vote(1, 3, "tie"), vote(2, 1, "a"), vote(3, 2, "a"),
        vote(3, 1, "a"), vote(1, 2, "both_bad"), vote(2, 3, "tie"), vote(3, 1, "b"),
    ]
    return votes_frame(cycle * 5)


# votes_frame


def test_votes_frame_columns_and_dtypes():
    frame = votes_frame([vote(1, 2, "a"), vote(2, 3, "both_bad")])
    assert list(frame.columns) == ["policy_a", "policy_b", "winner"]
    assert frame["policy_a"].tolist() == [1, 2]
    assert frame["winner"].tolist() == ["a", "both_bad"]
    assert frame["policy_a"].dtype == np.int64


def test_votes_frame_empty_has_columns():
    frame = votes_frame([])
    assert list(frame.columns) == ["policy_a", "policy_b", "winner"]
    assert len(frame) == 0


@pytest.mark.parametrize("bad", ["A", "draw", None, ""])
def test_votes_frame_rejects_unknown_winner(bad):
    with pytest.raises(ValueError, match="winner"):
        votes_frame([vote(1, 2, "a"), vote(1, 2, bad)])


def test_votes_frame_rejects_self_comparison():
    with pytest.raises(ValueError, match="itself"):
        votes_frame([vote(4, 4, "a")])


# Elo


def test_elo_hand_worked_three_votes():
    # k=32, start 1000, E_a = 1 / (1 + 10^((R_b - R_a)/400)).
    # Vote 1: 1 beats 2. E_1 = 0.5 -> R_1 = 1000 + 32*0.5 = 1016, R_2 = 984.
    # Vote 2: 1 ties 2. E_1 = 1/(1 + 10^(-32/400)) = 1/(1 + 0.831764) = 0.545922
    #         delta = 32*(0.5 - 0.545922) = -1.469502 -> R_1 = 1014.530498, R_2 = 985.469502.
    # Vote 3: both_bad between 1 and 3 -> skipped, 3 stays at 1000.
    # Vote 4: 3 (side b) beats 2. E_2 = 1/(1 + 10^((1000 - 985.469502)/400))
    #         = 1/(1 + 10^0.036326) = 1/(1 + 1.087233) = 0.479102
    #         delta = 32*(0 - 0.479102) = -15.331236 -> R_2 = 970.138266, R_3 = 1015.331236.
    votes = votes_frame([vote(1, 2, "a"), vote(1, 2, "tie"), vote(1, 3, "both_bad"),
                         vote(2, 3, "b")])
    ratings = elo_ratings(votes)
    assert ratings[1] == pytest.approx(1014.530498, abs=1e-5)
    assert ratings[2] == pytest.approx(970.138266, abs=1e-5)
    assert ratings[3] == pytest.approx(1015.331236, abs=1e-5)


def test_elo_is_zero_sum_and_chronological():
    votes = mixed_votes()
    ratings = elo_ratings(votes, k=16.0, initial=1500.0)
    assert sum(ratings.values()) == pytest.approx(3 * 1500.0)
    reversed_votes = votes.iloc[::-1].reset_index(drop=True)
    assert elo_ratings(reversed_votes, k=16.0, initial=1500.0) != ratings


def test_elo_accepts_list_of_dicts_and_empty():
    assert elo_ratings([vote(1, 2, "a")]) == {1: 1016.0, 2: 984.0}
    assert elo_ratings(votes_frame([])) == {}


# Bradley-Terry


def test_bt_two_players_closed_form():
    # A beats B 3 times, loses once. MLE: p_A/p_B = 3, so R_A - R_B = 400*log10(3) = 190.8485;
    # the mean is the anchor, so R_A = 1000 + 95.4243 and R_B = 1000 - 95.4243.
    votes = votes_frame([vote(1, 2, "a")] * 3 + [vote(2, 1, "a")])
    ratings = bradley_terry(votes, prior=0.0)
    assert ratings[1] == pytest.approx(1095.4243, abs=1e-3)
    assert ratings[2] == pytest.approx(904.5757, abs=1e-3)
    # Natural-log scale with scale=1, base=e: the difference is log(3).
    natural = bradley_terry(votes, prior=0.0, scale=1.0, base=math.e, anchor=0.0)
    assert natural[1] - natural[2] == pytest.approx(math.log(3), abs=1e-8)


def test_bt_prior_shrinks_towards_anchor():
    votes = votes_frame([vote(1, 2, "a")] * 3 + [vote(2, 1, "a")])
    gap = bradley_terry(votes)[1] - bradley_terry(votes)[2]
    assert 150.0 < gap < 190.8485
    assert bradley_terry(votes, prior=10.0)[1] - bradley_terry(votes, prior=10.0)[2] < gap


def test_bt_all_wins_stays_finite_with_prior():
    # One vote, A beats B, prior=1: by symmetry theta_A = t = -theta_B (natural log strengths,
    # reference player at 0). A's score equation: 1 win + 0.5 prior win = sigma(2t) + sigma(t).
    sigma = lambda x: 1.0 / (1.0 + math.exp(-x))  # noqa: E731
    lo, hi = 0.0, 20.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sigma(2 * mid) + sigma(mid) < 1.5 else (lo, mid)
    expected_gap = 2 * lo * 400 / math.log(10)
    ratings = bradley_terry([vote(1, 2, "a")], prior=1.0)
    assert math.isfinite(ratings[1]) and math.isfinite(ratings[2])
    assert ratings[1] - ratings[2] == pytest.approx(expected_gap, abs=1e-4)


def test_bt_without_prior_raises_when_mle_does_not_exist():
    with pytest.raises(ValueError, match="prior"):
        bradley_terry([vote(1, 2, "a"), vote(1, 2, "a")], prior=0.0)


def test_bt_ties_count_half():
    # 1 win + 2 ties for A is 2 points to 1: same as 2 wins and 1 loss, so p_A/p_B = 2.
    with_ties = votes_frame([vote(1, 2, "a"), vote(1, 2, "tie"), vote(2, 1, "tie")])
    decisive = votes_frame([vote(1, 2, "a"), vote(1, 2, "a"), vote(1, 2, "b")])
    tied = bradley_terry(with_ties, prior=0.0)
    assert tied[1] - tied[2] == pytest.approx(400 * math.log10(2), abs=1e-4)
    assert tied == pytest.approx(bradley_terry(decisive, prior=0.0))


def test_bt_satisfies_score_equations():
    # At the MLE each policy's points equal its expected points:
    # W_i = sum_j N_ij / (1 + 10^((R_j - R_i)/400))  (Hunter 2004, eq. 2 with ties as half wins).
    votes = mixed_votes()
    ratings = bradley_terry(votes, prior=0.0)
    rated = votes[votes["winner"] != "both_bad"]
    for i in ratings:
        points = expected = 0.0
        for row in rated.itertuples():
            if i not in (row.policy_a, row.policy_b):
                continue
            j = row.policy_b if row.policy_a == i else row.policy_a
            score_a = {"a": 1.0, "b": 0.0, "tie": 0.5}[row.winner]
            points += score_a if row.policy_a == i else 1.0 - score_a
            expected += 1.0 / (1.0 + 10 ** ((ratings[j] - ratings[i]) / 400))
        assert points == pytest.approx(expected, abs=1e-6)


def test_bt_mean_is_anchor_and_unvoted_policy_gets_anchor():
    ratings = bradley_terry(mixed_votes(), policies=[1, 2, 3, 9], anchor=1500.0)
    assert ratings[9] == 1500.0
    assert np.mean(list(ratings.values())) == pytest.approx(1500.0)
    assert ratings[3] > ratings[2] > ratings[1]


def test_both_bad_excluded_from_ratings():
    votes = mixed_votes()
    extra = pd.concat([votes, votes_frame([vote(3, 1, "both_bad")] * 7)], ignore_index=True)
    assert bradley_terry(extra) == pytest.approx(bradley_terry(votes))
    assert elo_ratings(extra) == pytest.approx(elo_ratings(votes))
    assert win_rate_matrix(extra).equals(win_rate_matrix(votes))


# Bootstrap


def test_bootstrap_ci_contains_estimate_and_is_deterministic():
    votes = mixed_votes()
    point = bradley_terry(votes)
    ci = bootstrap_ci(votes, n_boot=100, seed=3)
    for policy, (low, high) in ci.items():
        assert low < point[policy] < high
    assert bootstrap_ci(votes, n_boot=100, seed=3) == ci
    assert bootstrap_ci(votes, n_boot=100, seed=4) != ci


def test_bootstrap_ci_narrows_with_more_votes_and_nan_without_votes():
    few = bootstrap_ci(mixed_votes().iloc[:24], n_boot=100)
    many = bootstrap_ci(pd.concat([mixed_votes()] * 4, ignore_index=True), n_boot=100,
                        policies=[7])
    assert many[1][1] - many[1][0] < few[1][1] - few[1][0]
    assert all(math.isnan(x) for x in many[7])


# Win-rate matrix


def test_win_rate_matrix_entries():
    # 1 vs 2: 1 wins twice, one tie -> 2.5/3 for 1, 0.5/3 for 2. 2 vs 3: 3 wins once.
    # 1 and 3 only met in a both_bad vote, which does not count -> NaN. 9 never voted -> NaN row.
    votes = votes_frame([vote(1, 2, "a"), vote(2, 1, "b"), vote(1, 2, "tie"),
                         vote(2, 3, "b"), vote(1, 3, "both_bad")])
    matrix = win_rate_matrix(votes, policies=[9])
    assert list(matrix.index) == [1, 2, 3, 9] and list(matrix.columns) == [1, 2, 3, 9]
    assert matrix.loc[1, 2] == pytest.approx(2.5 / 3)
    assert matrix.loc[2, 1] == pytest.approx(0.5 / 3)
    assert matrix.loc[3, 2] == 1.0 and matrix.loc[2, 3] == 0.0
    assert math.isnan(matrix.loc[1, 3]) and math.isnan(matrix.loc[1, 1])
    assert matrix.loc[9].isna().all()


# Leaderboard


def test_leaderboard_columns_counts_and_sorting():
    votes = pd.concat([mixed_votes(), votes_frame([vote(3, 4, "both_bad")])], ignore_index=True)
    policies = [{"policy_id": p, "version": p * 10} for p in [1, 2, 3, 4, 5]]
    table = leaderboard(votes, policies, n_boot=50)
    assert list(table.columns) == LEADERBOARD_COLUMNS == [
        "policy_id", "version", "elo", "bt", "ci_low", "ci_high",
        "votes", "wins", "losses", "ties", "both_bad", "win_rate", "bt_style", "style_low", "style_high"]
    assert table["bt"].is_monotonic_decreasing
    assert table["policy_id"].tolist()[0] == 3
    row = table.set_index("policy_id").loc[1]
    # Policy 1 in each cycle of 12 votes, counted by hand:
    # (1,2,b) L, (1,3,b) L, (1,2,a) W, (1,3,tie) T, (2,1,a) L, (3,1,a) L, (1,2,both_bad) BB,
    # (3,1,b) W -> 2 W, 4 L, 1 T, 1 BB per cycle, times 5.
    assert (row["wins"], row["losses"], row["ties"], row["both_bad"]) == (10, 20, 5, 5)
    assert row["votes"] == 40
    assert row["win_rate"] == pytest.approx((10 + 2.5) / 35)
    assert row["version"] == 10
    only_bad = table.set_index("policy_id").loc[4]
    assert (only_bad["votes"], only_bad["both_bad"], only_bad["bt"]) == (1, 1, 1000.0)
    assert math.isnan(only_bad["win_rate"])
    unvoted = table.set_index("policy_id").loc[5]
    assert unvoted["votes"] == 0 and unvoted["elo"] == 1000.0


def test_leaderboard_empty_votes():
    table = leaderboard(votes_frame([]), [{"policy_id": 1, "version": 1}])
    assert table["votes"].tolist() == [0] and table["bt"].tolist() == [1000.0]
