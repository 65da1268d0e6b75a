"""The arena's pairing rules: which versions may meet, and which two meet next.

``board`` is the leaderboard of an agent's versions from its stored comparisons (the one table REST, the Arena tab,
the dashboard and the pairing read); ``pair_candidates`` turns it into the versions that may be paired (servable
ones, rated only once they have rated votes; open decisions marked); ``choose_pair`` picks the next pair from them:

1. a candidate the retrain gate left to people (``needs_votes``) meets the active version first, until their
   votes decide;
2. otherwise, with probability ``newest_prob``, the newest version meets the active one (or the next most
   recent when the newest is itself active);
3. otherwise any two, weighted towards versions with few votes and close ratings (the most informative games).

Sides are random. Pure functions; ``choose_pair`` takes a ``numpy.random.Generator``.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from rlhf.analysis.leaderboard import ELIGIBLE_STATUSES, leaderboard
from storage import Comparison, Policy

BOOTSTRAP_ROUNDS = 200


def rated_votes(comparisons: Iterable[Comparison]) -> list[dict]:
    """Vote rows for ``leaderboard``: comparisons between two different, known versions."""
    return [{"policy_a": c.policy_a_id, "policy_b": c.policy_b_id, "winner": c.winner,
             **({"text_a": c.text_a, "text_b": c.text_b} if c.text_a is not None and c.text_b is not None else {})}
            for c in comparisons
            if c.policy_a_id is not None and c.policy_b_id is not None and c.policy_a_id != c.policy_b_id]


def board(comparisons: Iterable[Comparison], policies: list[Policy], n_boot: int = BOOTSTRAP_ROUNDS,
          seed: int = 0) -> pd.DataFrame:
    """Leaderboard of an agent's versions (Elo, BT, bootstrap CI, counts) with a ``status`` column."""
    table = leaderboard(rated_votes(comparisons), [{"policy_id": p.id, "version": p.version} for p in policies],
                        n_boot=n_boot, seed=seed)
    table.insert(2, "status", table["policy_id"].map({p.id: p.status for p in policies}))
    return table


def pair_candidates(table: pd.DataFrame, waiting: frozenset = frozenset()) -> list[dict]:
    """Versions ``choose_pair`` may pick: servable ones, rated only once they have rated
    votes; ``waiting`` ids (open decisions) are marked ``needs_votes``: paired with the active version first."""
    out = []
    for row in table.itertuples(index=False):
        if row.status not in ELIGIBLE_STATUSES:
            continue
        rated = row.wins + row.losses + row.ties > 0
        out.append({"policy_id": int(row.policy_id), "version": int(row.version), "status": row.status,
                    "votes": int(row.votes), "rating": float(row.bt) if rated else None,
                    "needs_votes": int(row.policy_id) in waiting})
    return out


def _pair_weight(va: dict, vb: dict, scale: float) -> float:
    # Few votes -> more weight: each side counts 1 / (1 + votes).
    weight = 1.0 / (1.0 + va["votes"]) / (1.0 + vb["votes"])
    if va.get("rating") is None or vb.get("rating") is None:
        return weight  # unknown rating: treat as an even match, the most informative kind
    # Close ratings -> more weight: 4 p (1 - p) is the (normalised) Fisher information of one BT
    # comparison with win probability p; it is 1 for an even match and falls off with the gap.
    p = 1.0 / (1.0 + 10.0 ** ((vb["rating"] - va["rating"]) / scale))
    return weight * 4.0 * p * (1.0 - p)


def choose_pair(versions: list[dict], rng: np.random.Generator, newest_prob: float = 0.7,
                scale: float = 400.0) -> tuple[int, int]:
    """Pick the next arena pair (policy_id_a, policy_id_b) in random order; rng is a numpy Generator."""
    eligible = [v for v in versions if v["status"] in ELIGIBLE_STATUSES]
    if len(eligible) < 2:
        raise ValueError(f"choose_pair needs at least 2 active or candidate versions, "
                         f"got {len(eligible)} (archived and broken versions are never shown)")
    if len({v["policy_id"] for v in eligible}) != len(eligible):
        raise ValueError("choose_pair got the same policy_id twice")
    by_recency = sorted(eligible, key=lambda v: v["version"], reverse=True)
    waiting = [v for v in by_recency if v.get("needs_votes") and v["status"] != "active"]
    actives = [v for v in by_recency if v["status"] == "active"]
    if waiting and actives:  # the gate could not tell: the arena's votes decide, against the active version first
        pair = (waiting[0]["policy_id"], actives[0]["policy_id"])
    elif rng.random() < newest_prob:
        newest = by_recency[0]
        actives = [v for v in by_recency[1:] if v["status"] == "active"]
        # Newest vs the active version; if the newest is itself active (or none is active),
        # newest vs the next most recent eligible version.
        partner = actives[0] if actives and newest["status"] != "active" else by_recency[1]
        pair = (newest["policy_id"], partner["policy_id"])
    else:
        pairs = [(x, y) for i, x in enumerate(eligible) for y in eligible[i + 1:]]
        weights = np.array([_pair_weight(x, y, scale) for x, y in pairs])
        weights = weights if weights.sum() > 0 else np.ones(len(pairs))
        x, y = pairs[rng.choice(len(pairs), p=weights / weights.sum())]
        pair = (x["policy_id"], y["policy_id"])
    return pair if rng.random() < 0.5 else (pair[1], pair[0])
