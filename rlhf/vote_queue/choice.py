"""Which vote to ask for next: the pair the reward model is least sure about, with some random pairs mixed in.

Pure functions (numpy only), shared by the app's vote queue (``rlhf.vote_queue.refill`` scores items, the Store
hands them out through ``choose_item``) and by ``rlhf-studio bench reward --active``, which measures them.

The reward model is the linear Bradley–Terry head ensemble (``rlhf.training.reward_head``): every member m gives
P_m(A ≻ B) = σ(w_m·(x_A − x_B)). An item's uncertainty is the binary entropy of the ensemble's mean prediction,
H(p̄) with p̄ = mean_m P_m (in bits, 1 at p̄ = 0.5, 0 when the model is sure): uncertainty sampling on the
predictive distribution (Lewis & Gale 1994; Settles 2009, "Active Learning Literature Survey", §3.1). It is
highest for pairs the members put near 0.5 *and* for pairs on which confident members disagree (their mean
lands near 0.5 too), and needs no calibration beyond the head's own.

A share of the picks is uniformly random: an uncertainty sampler only ever sees its own blind spots, and on
pairs it is sure about it would never learn that it is wrong there (a sampling bias that can freeze a wrong
model: Dasgupta & Hsu 2008); random picks keep the training set an honest sample of the pool. Items that
wait for a second opinion (overlap items, for agreement figures) come first, so agreement gets measured.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

REASONS = {
    "overlap": "second opinion: another annotator voted on this pair (for agreement)",
    "uncertain": "the reward model is least sure about this pair",
    "random": "a random pair (some are, so the model is not only shown its own blind spots)",
    "cold_start": "a random pair (no reward model yet: too few votes)",
    "direct": "voted on directly",
}


def binary_entropy(p: np.ndarray) -> np.ndarray:
    """H(p) in bits, elementwise (0 at p in {0, 1}, 1 at 0.5)."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1 - 1e-12)
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def pair_uncertainty(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p̄, uncertainty) per pair from an (n, members) array of P(A ≻ B): the mean prediction and H(p̄)."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim == 1:
        probs = probs[:, None]
    p_mean = probs.mean(axis=1) if probs.size else np.zeros(len(probs))
    return p_mean, binary_entropy(p_mean)


def choose_item(candidates: Sequence[dict], random_share: float, rng: np.random.Generator
                ) -> Optional[tuple[int, str]]:
    """(item id, reason) of the next item among ``candidates`` (dicts with ``id``, ``uncertainty`` (None when
    unscored), ``votes`` and ``votes_wanted``), or None when there are none.

    Order: an item waiting for its second vote (oldest first); with no scored item, a random one (cold start);
    else with probability ``random_share`` a random one, otherwise the most uncertain (the oldest on a tie).
    """
    if not candidates:
        return None
    waiting = [c for c in candidates if 0 < (c.get("votes") or 0) < c.get("votes_wanted", 1)]
    if waiting:
        return min(waiting, key=lambda c: c["id"])["id"], "overlap"
    scored = [c for c in candidates if c.get("uncertainty") is not None]
    if not scored:
        return candidates[int(rng.integers(len(candidates)))]["id"], "cold_start"
    if rng.random() < random_share:
        return candidates[int(rng.integers(len(candidates)))]["id"], "random"
    best = max(scored, key=lambda c: (c["uncertainty"], -c["id"]))
    return best["id"], "uncertain"


def choose_batch(uncertainty: Optional[np.ndarray], k: int, random_share: float, rng: np.random.Generator,
                 n: Optional[int] = None) -> list[tuple[int, str]]:
    """``k`` distinct indices into a pool (with reasons), picked one at a time by ``choose_item`` from the same
    scores: what the queue hands out between two refits of the head. ``uncertainty`` None = nothing scored yet
    (then ``n`` is the pool size)."""
    size = len(uncertainty) if uncertainty is not None else int(n or 0)
    left = [{"id": i, "uncertainty": None if uncertainty is None else float(uncertainty[i]), "votes": 0,
             "votes_wanted": 1} for i in range(size)]
    picks = []
    for _ in range(min(k, size)):
        index, reason = choose_item(left, random_share, rng)
        picks.append((index, reason))
        left = [c for c in left if c["id"] != index]
    return picks
