"""The gate's judge: a reward head fitted on votes that PPO's reward model never saw (sample splitting).

PPO maximises its reward model, so that model's verdict on the trained policy is biased upward wherever it is
wrong (Goodhart; Gao et al. 2023, "Scaling laws for reward model overoptimization"). The judge is a second
linear head on the same frozen features, fitted on a held-out share of whole conversations; PPO never optimised
against it. Its own accuracy is measured on the other share (pairs it never saw), with a Wilson interval, so the
gate knows whether the judge can be told from chance at all. Under the symmetric-noise model
``judged = (1 - a) + (2a - 1) * true`` (a = the judge's pair accuracy > 0.5) a judge's win rate is pulled toward
0.5, never past it: a judged win rate above a threshold is a conservative figure for the true one.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from rlhf.training import reward_head

JUDGE_FILE = "judge.npz"
NO_JUDGE = {"judge_accuracy": None, "judge_low": None, "judge_high": None, "judge_pairs": 0, "judge_test_pairs": 0}


def judge_split(groups: Sequence[str], share: float, min_pairs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (policy's, judge's): whole groups (conversation contexts) go to the judge, in a seeded order,
    until it holds ``share`` of the rows. When either side would hold fewer than ``min_pairs`` rows, the judge
    gets none (the policy's reward model keeps every row)."""
    n = len(groups)
    everything = np.arange(n)
    if share <= 0 or n < 2 * min_pairs:
        return everything, np.zeros(0, dtype=int)
    keys = sorted(set(groups))
    rng = np.random.default_rng(seed + 7919)  # not the CV folds' order
    rng.shuffle(keys)
    size = {k: 0 for k in keys}
    for g in groups:
        size[g] += 1
    chosen, taken = set(), 0
    for key in keys:
        if taken >= share * n:
            break
        chosen.add(key)
        taken += size[key]
    judge = np.array([i for i, g in enumerate(groups) if g in chosen], dtype=int)
    if len(judge) < min_pairs or n - len(judge) < min_pairs:
        return everything, np.zeros(0, dtype=int)
    return np.setdiff1d(everything, judge), judge


def pairs_for_a_judge(share: float, min_pairs: int) -> Optional[int]:
    """The fewest pairs, one per conversation, from which ``judge_split`` sets a judge's share aside (None when
    ``share`` is 0: never)."""
    if share <= 0:
        return None
    n = 2 * min_pairs
    while len(judge_split([str(i) for i in range(n)], share, min_pairs)[1]) == 0:
        n += 1
    return n


def fit_judge(x_chosen: np.ndarray, x_rejected: np.ndarray, judge_rows: np.ndarray, test_rows: np.ndarray,
              c: float, members: int, seed: int = 0,
              weights: Optional[np.ndarray] = None) -> tuple[Optional[reward_head.LinearHead], dict]:
    """The judge head on ``judge_rows`` and its accuracy on ``test_rows`` (pairs it never saw) with a 95% Wilson
    interval; (None, NO_JUDGE) when there are no judge rows."""
    if len(judge_rows) == 0 or len(test_rows) == 0:
        return None, dict(NO_JUDGE)
    w = None if weights is None else np.asarray(weights)[judge_rows]
    head = reward_head.fit_pairs(x_chosen[judge_rows], x_rejected[judge_rows], c=c, members=members, seed=seed + 1,
                                 weights=w)
    acc = reward_head.pair_accuracy(head, x_chosen[test_rows], x_rejected[test_rows])
    low, high = reward_head.wilson_interval(acc * len(test_rows), len(test_rows))
    return head, {"judge_accuracy": acc, "judge_low": low, "judge_high": high, "judge_pairs": int(len(judge_rows)),
                  "judge_test_pairs": int(len(test_rows))}

