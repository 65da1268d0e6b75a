"""Arena leaderboard: ratings of policy versions from blind pairwise votes.

Pure functions over a votes DataFrame (columns ``policy_a``, ``policy_b``, ``winner``, rows in
chronological order). ``winner`` is "a", "b", "tie" (half a win each) or "both_bad" (kept for
counting, excluded from every rating).

Bradley-Terry uses a small symmetric prior: each policy with votes also plays `prior` virtual games
against a reference player and wins half of them, so all-wins policies stay finite; prior=0 gives
the plain maximum-likelihood fit. The arena's pairing rules (``choose_pair``) are
``rlhf.analysis.arena``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

WINNERS = ("a", "b", "tie", "both_bad")
LEADERBOARD_COLUMNS = [
    "policy_id", "version", "elo", "bt", "ci_low", "ci_high",
    "votes", "wins", "losses", "ties", "both_bad", "win_rate",
    "bt_style", "style_low", "style_high",
]
ELIGIBLE_STATUSES = ("active", "candidate")
_SCORE_A = {"a": 1.0, "b": 0.0, "tie": 0.5}


def votes_frame(rows) -> pd.DataFrame:
    """Build a validated votes DataFrame (policy_a, policy_b, winner) from a list of dicts; when the rows carry
    both replies' text (``text_a``, ``text_b``), those columns too (the style-controlled rating reads them)."""
    a, b, w = [], [], []
    rows = list(rows)
    texts = bool(rows) and all(isinstance(r.get("text_a"), str) and isinstance(r.get("text_b"), str)
                               for r in rows)
    for i, row in enumerate(rows):
        if row.get("winner") not in WINNERS:
            raise ValueError(f"vote {i}: winner must be one of {WINNERS}, got {row.get('winner')!r}")
        if row.get("policy_a") is None or row.get("policy_b") is None:
            raise ValueError(f"vote {i}: policy_a and policy_b are required")
        if int(row["policy_a"]) == int(row["policy_b"]):
            raise ValueError(f"vote {i}: a policy cannot be compared with itself")
        a.append(int(row["policy_a"]))
        b.append(int(row["policy_b"]))
        w.append(row["winner"])
    frame = pd.DataFrame({
        "policy_a": pd.Series(a, dtype="int64"),
        "policy_b": pd.Series(b, dtype="int64"),
        "winner": pd.Series(w, dtype=str),
    })
    if texts:
        frame["text_a"] = [r["text_a"] for r in rows]
        frame["text_b"] = [r["text_b"] for r in rows]
    return frame


def _as_frame(votes) -> pd.DataFrame:
    return votes if isinstance(votes, pd.DataFrame) else votes_frame(votes)


def _policy_ids(votes: pd.DataFrame, policies=None) -> list[int]:
    seen = set(votes["policy_a"].tolist()) | set(votes["policy_b"].tolist())
    return sorted(int(p) for p in seen | set(policies or []))


def _scored(votes: pd.DataFrame) -> pd.DataFrame:
    # both_bad says nothing about which side is better, so it never enters a rating.
    scored = votes[votes["winner"] != "both_bad"]
    return scored.assign(score_a=scored["winner"].map(_SCORE_A).astype(float))


def elo_ratings(votes, k: float = 32.0, initial: float = 1000.0,
                scale: float = 400.0) -> dict[int, float]:
    """Online Elo ratings (Elo 1978), updated vote by vote in chronological order."""
    votes = _as_frame(votes)
    ratings = {p: float(initial) for p in _policy_ids(votes)}
    for row in _scored(votes).itertuples(index=False):
        ra, rb = ratings[row.policy_a], ratings[row.policy_b]
        # Expected score of side a: E_a = 1 / (1 + 10^((R_b - R_a) / scale)).
        expected_a = 1.0 / (1.0 + 10.0 ** ((rb - ra) / scale))
        delta = k * (row.score_a - expected_a)
        ratings[row.policy_a] = ra + delta
        ratings[row.policy_b] = rb - delta
    return ratings


def _fit_bt(a, b, s, n, prior, max_iter, tol) -> np.ndarray:
    """Log-strengths of Bradley-Terry (1952) by the MM algorithm (Hunter 2004, eq. 3); NaN if unplayed."""
    wins_matrix = np.zeros((n + 1, n + 1))
    np.add.at(wins_matrix, (a, b), s)
    np.add.at(wins_matrix, (b, a), 1.0 - s)
    played = wins_matrix.sum(axis=0) + wins_matrix.sum(axis=1) > 0
    # Prior: every policy with votes also plays `prior` virtual games against a reference player
    # (index n, strength fixed to 1) and wins half of them. The MAP estimate is the MLE of this
    # augmented game, so it stays finite for all-wins / all-losses policies; prior=0 is the plain MLE.
    wins_matrix[:n, n] = wins_matrix[n, :n] = np.where(played[:n], prior / 2.0, 0.0)
    played[n] = prior > 0 and played[:n].any()
    games = wins_matrix + wins_matrix.T
    wins = wins_matrix.sum(axis=1)
    if np.any(played & ((wins == 0) | (wins == games.sum(axis=1)))):
        raise ValueError("the BT maximum-likelihood estimate does not exist for a policy with "
                         "no wins or no losses (Hunter 2004, Assumption 1); use prior > 0")
    p = np.ones(n + 1)
    for _ in range(max_iter):
        denom = (games / (p[:, None] + p[None, :])).sum(axis=1)
        new = np.where(played, wins / np.where(played, denom, 1.0), 1.0)
        # Strengths are defined up to a common factor: pin the reference player (or, without a
        # prior, the geometric mean) to 1. Updating all players jointly and then rescaling is
        # what keeps MM fast; holding the reference fixed instead converges very slowly.
        new = new / (new[n] if prior > 0 else np.exp(np.log(new[played]).mean()))
        delta = np.max(np.abs(np.log(new) - np.log(p)))
        p = new
        if delta < tol:
            break
    return np.where(played[:n], np.log(p[:n]), np.nan)


def _to_elo_scale(log_p: np.ndarray, scale: float, base: float, anchor: float) -> np.ndarray:
    # Strength p = base^(R / scale), so R = scale * log_base(p); shift so the mean is the anchor.
    ratings = scale * log_p / math.log(base)
    return ratings - np.nanmean(ratings) + anchor if np.any(~np.isnan(ratings)) else ratings


def _encode(votes: pd.DataFrame, ids: list[int]):
    scored = _scored(votes)
    index = {p: i for i, p in enumerate(ids)}
    a = scored["policy_a"].map(index).to_numpy(dtype=int)
    b = scored["policy_b"].map(index).to_numpy(dtype=int)
    return a, b, scored["score_a"].to_numpy(dtype=float)


def bradley_terry(votes, policies=None, scale: float = 400.0, base: float = 10.0,
                  anchor: float = 1000.0, prior: float = 1.0, max_iter: int = 10_000,
                  tol: float = 1e-10) -> dict[int, float]:
    """Bradley-Terry (1952) ratings on the Elo scale, fitted by MM (Hunter 2004), mean = anchor."""
    votes = _as_frame(votes)
    ids = _policy_ids(votes, policies)
    a, b, s = _encode(votes, ids)
    log_p = _fit_bt(a, b, s, len(ids), prior, max_iter, tol)
    ratings = _to_elo_scale(log_p, scale, base, anchor)
    # Policies without a rated vote carry no evidence: they sit at the anchor.
    return {p: float(anchor if np.isnan(r) else r) for p, r in zip(ids, ratings)}


def bootstrap_ci(votes, policies=None, n_boot: int = 200, seed: int = 0, alpha: float = 0.05, *,
                 prior: float = 1.0, scale: float = 400.0, base: float = 10.0,
                 anchor: float = 1000.0, max_iter: int = 10_000,
                 tol: float = 1e-8) -> dict[int, tuple[float, float]]:
    """Percentile bootstrap CI (Efron 1979) of BT ratings, refitting on votes resampled with replacement."""
    votes = _as_frame(votes)
    ids = _policy_ids(votes, policies)
    a, b, s = _encode(votes, ids)
    rng = np.random.default_rng(seed)
    samples = np.full((n_boot, len(ids)), np.nan)
    for i in range(n_boot if len(s) else 0):
        idx = rng.integers(0, len(s), size=len(s))
        log_p = _fit_bt(a[idx], b[idx], s[idx], len(ids), prior, max_iter, tol)
        samples[i] = _to_elo_scale(log_p, scale, base, anchor)
    out = {}
    for j, p in enumerate(ids):
        col = samples[:, j][~np.isnan(samples[:, j])]
        # A policy missing from a resample is left out of that replicate, not set to the anchor.
        low, high = np.quantile(col, [alpha / 2, 1 - alpha / 2]) if len(col) else (np.nan, np.nan)
        out[p] = (float(low), float(high))
    return out


def win_rate_matrix(votes, policies=None) -> pd.DataFrame:
    """Share of rated games the row policy won against the column policy (ties half); NaN if never met."""
    votes = _as_frame(votes)
    ids = _policy_ids(votes, policies)
    a, b, s = _encode(votes, ids)
    wins = np.zeros((len(ids), len(ids)))
    np.add.at(wins, (a, b), s)
    np.add.at(wins, (b, a), 1.0 - s)
    games = wins + wins.T
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(games > 0, wins / games, np.nan)
    return pd.DataFrame(rate, index=pd.Index(ids, name="policy_id"), columns=pd.Index(ids))


def _outcome_counts(votes: pd.DataFrame, ids: list[int]) -> pd.DataFrame:
    side_a = votes["winner"].map({"a": "wins", "b": "losses", "tie": "ties", "both_bad": "both_bad"})
    side_b = votes["winner"].map({"a": "losses", "b": "wins", "tie": "ties", "both_bad": "both_bad"})
    long = pd.DataFrame({
        "policy_id": pd.concat([votes["policy_a"], votes["policy_b"]], ignore_index=True),
        "outcome": pd.concat([side_a, side_b], ignore_index=True),
    })
    counts = pd.crosstab(long["policy_id"], long["outcome"])
    counts = counts.reindex(index=ids, columns=["wins", "losses", "ties", "both_bad"], fill_value=0)
    return counts.fillna(0).astype("int64")


def leaderboard(votes, policies, *, n_boot: int = 200, seed: int = 0) -> pd.DataFrame:
    """Leaderboard of policy versions (Elo, BT, bootstrap CI, vote counts), sorted by BT descending."""
    votes = _as_frame(votes)
    ids = [int(p["policy_id"]) for p in policies]
    elo = elo_ratings(votes)
    bt = bradley_terry(votes, policies=ids)
    ci = bootstrap_ci(votes, policies=ids, n_boot=n_boot, seed=seed)
    counts = _outcome_counts(votes, ids)
    table = pd.DataFrame({
        "policy_id": pd.Series(ids, dtype="int64"),
        "version": [p["version"] for p in policies],
        "elo": [elo.get(p, 1000.0) for p in ids],
        "bt": [bt[p] for p in ids],
        "ci_low": [ci[p][0] for p in ids],
        "ci_high": [ci[p][1] for p in ids],
    })
    for col in ["wins", "losses", "ties", "both_bad"]:
        table[col] = counts[col].to_numpy()
    table["votes"] = table[["wins", "losses", "ties", "both_bad"]].sum(axis=1)
    rated = table["wins"] + table["losses"] + table["ties"]
    table["win_rate"] = (table["wins"] + 0.5 * table["ties"]) / rated.where(rated > 0)
    table["bt_style"], table["style_low"], table["style_high"] = style_columns(votes, ids, n_boot, seed)
    table = table.sort_values(["bt", "policy_id"], ascending=[False, True], kind="stable")
    return table[LEADERBOARD_COLUMNS].reset_index(drop=True)


def style_columns(votes: pd.DataFrame, ids: list[int], n_boot: int = 200, seed: int = 0):
    """Style-controlled BT rating and its 95% bootstrap interval per policy (``rlhf.analysis.style``); NaN when
    the votes carry no reply text or a policy has no rated vote."""
    from rlhf.analysis.style import style_ratings

    nan = [float("nan")] * len(ids)
    if "text_a" not in votes.columns:
        return nan, list(nan), list(nan)
    everyone = _policy_ids(votes, ids)
    a, b, s = _encode(votes, everyone)
    scored = votes[votes["winner"] != "both_bad"]
    rating, low, high = style_ratings(a, b, s, scored["text_a"].tolist(), scored["text_b"].tolist(), len(everyone),
                                      n_boot=n_boot, seed=seed)
    at = {p: i for i, p in enumerate(everyone)}
    return ([float(rating[at[p]]) for p in ids], [float(low[at[p]]) for p in ids],
            [float(high[at[p]]) for p in ids])
