"""Style-controlled Bradley–Terry: checked against arena-rank's ContextualBradleyTerry, and it sees through length."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlhf.analysis.leaderboard import leaderboard
from rlhf.analysis.style import fit, standardise, style_counts, style_diffs


def dataset():
    """300 votes among 3 players: player 0 is truly better, and longer / more headed replies also win."""
    rng = np.random.default_rng(7)
    rows = []
    for _ in range(300):
        a, b = rng.choice(3, 2, replace=False)
        la, lb = int(rng.integers(5, 80)), int(rng.integers(5, 80))
        ha, hb = int(rng.integers(0, 3)), int(rng.integers(0, 3))
        z = 0.4 * (a == 0) - 0.4 * (b == 0) + 1.5 * (la - lb) / (la + lb) + 0.3 * (ha - hb)
        u, p = rng.random(), 1 / (1 + np.exp(-z))
        winner = "tie" if abs(u - p) < 0.08 else ("a" if u < p else "b")
        ta = " ".join(["word"] * la) + "".join(f"\n# h{k}" for k in range(ha))
        tb = " ".join(["word"] * lb) + "".join(f"\n# h{k}" for k in range(hb))
        rows.append((int(a), int(b), winner, ta, tb))
    return rows


# arena-rank 0.1.1 (ContextualBradleyTerry, ContextualPairDataset.from_pandas(reweighted=False), default scale,
# base and init_rating) on dataset() with our style_diffs as its feature columns, run once in a separate
# environment (its jax pin changes numpy, so it is not a dependency): Elo-scale ratings and coefficients.
ARENA_RANK = {1.0: ([1059.4882627917048, 971.1696389703367, 969.3420982379585],
                    [0.10020099832685547, 0.044134871710569464, 0.0, 0.0]),
              0.01: ([1058.5881270722175, 972.3534073546265, 969.0584655731561],
                     [0.5222173334166852, 0.20729651434468047, 0.0, 0.0])}


@pytest.mark.parametrize("reg", [1.0, 0.01])
def test_the_fit_matches_arena_rank(reg):
    rows = dataset()
    a, b = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    y = np.array([{"a": 1.0, "b": 0.0, "tie": 0.5}[r[2]] for r in rows])
    x = standardise(style_diffs([r[3] for r in rows], [r[4] for r in rows]))
    ratings, beta = fit(a, b, y, x, 3, reg=reg, prior=0.0)
    ratings_ref, beta_ref = ARENA_RANK[reg]
    assert 400 * ratings / math.log(10) + 1000 == pytest.approx(ratings_ref, abs=0.01)
    assert beta == pytest.approx(beta_ref, abs=1e-4)


def test_style_counts():
    text = "# Title\nSome **bold** words\n- one\n- two\n1. three\n__also bold__"
    assert style_counts(text).tolist() == [13, 1, 3, 2]
    assert style_diffs(["a b c"], [""]).tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_a_version_that_wins_only_by_length_loses_its_lead_under_style_control():
    rng = np.random.default_rng(3)
    votes = []
    for i in range(240):
        long_side = rng.random() < 0.8  # version 2 writes the longer reply 80% of the time
        len2, len1 = (60, 15) if long_side else (15, 60)
        p2 = 1 / (1 + np.exp(-2.5 * (len2 - len1) / (len2 + len1)))  # voters like length, nothing else
        winner = "a" if rng.random() < p2 else "b"
        votes.append({"policy_a": 2, "policy_b": 1, "winner": winner, "text_a": "w " * len2, "text_b": "w " * len1})
    table = leaderboard(votes, [{"policy_id": 1, "version": 1}, {"policy_id": 2, "version": 2}], n_boot=30)
    row = {int(r.policy_id): r for r in table.itertuples()}
    assert row[2].bt - row[1].bt > 100  # raw BT: version 2 looks much better
    assert abs(row[2].bt_style - row[1].bt_style) < 60  # style-controlled: about even
    assert row[2].style_low <= row[2].bt_style <= row[2].style_high
    no_text = leaderboard([{k: v for k, v in votes[0].items() if not k.startswith("text")}],
                          [{"policy_id": 1, "version": 1}, {"policy_id": 2, "version": 2}], n_boot=5)
    assert no_text["bt_style"].isna().all()
