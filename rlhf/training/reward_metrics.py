"""How a reward model is measured: pairwise accuracy and margin, pointwise error and rank correlation."""
from __future__ import annotations

import math
from typing import Callable

from rlhf.training import reward_head


def pair_metrics(scorer: Callable, pairs: list[dict], prefix: str) -> dict:
    """Pairwise accuracy (ties count half), mean margin r_c − r_r, and the rewards' mean/std."""
    if not pairs:
        return {f"{prefix}_accuracy": None, f"{prefix}_margin": None}
    scores = scorer([p["prompt"] for p in pairs] * 2, [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
    chosen, rejected = scores[:len(pairs)], scores[len(pairs):]
    diffs = [c - r for c, r in zip(chosen, rejected)]
    mean = sum(scores) / len(scores)
    return {f"{prefix}_accuracy": sum(1.0 if d > 0 else 0.5 if d == 0 else 0.0 for d in diffs) / len(diffs),
            f"{prefix}_margin": sum(diffs) / len(diffs), f"{prefix}_reward_mean": mean,
            f"{prefix}_reward_std": math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))}


def point_metrics(scorer: Callable, points: list[dict], prefix: str) -> dict:
    """MSE against the [0, 1] targets and Spearman rank correlation (None when either side is constant)."""
    if not points:
        return {f"{prefix}_mse": None, f"{prefix}_spearman": None}
    import pandas as pd

    pred = scorer([p["prompt"] for p in points], [p["completion"] for p in points])
    target = [p["score"] for p in points]
    # Spearman's rho = Pearson's r of the (tie-averaged) ranks; pandas' method="spearman" would need scipy.
    rho = pd.Series(pred).rank().corr(pd.Series(target).rank()) if len(points) > 1 else float("nan")
    return {f"{prefix}_mse": sum((a - b) ** 2 for a, b in zip(pred, target)) / len(points),
            f"{prefix}_spearman": None if rho is None or math.isnan(rho) else float(rho)}


def heldout_metrics(scorer: Callable, data) -> dict:
    """Held-out metrics of a scorer on ``RewardData`` (pairs always, scores in pointwise mode), no namespace."""
    m = pair_metrics(scorer, data.pairs_eval, "eval")
    if data.mode == "pointwise":
        m.update(point_metrics(scorer, data.points_eval, "eval"))
    m["mean"], m["std"] = m.get("eval_reward_mean"), m.get("eval_reward_std")  # the scale PPO will see
    return m


def split_interval(held: dict, n: int) -> dict:
    """One held-out split's accuracy with its Wilson interval, in the cross-validation's keys."""
    acc = held.get("eval_accuracy")
    if acc is None or n == 0:
        return {"cv_accuracy": None, "cv_low": None, "cv_high": None, "cv_folds": 0, "cv_pairs": 0}
    low, high = reward_head.wilson_interval(acc * n, n)
    return {"cv_accuracy": acc, "cv_low": low, "cv_high": high, "cv_folds": 1, "cv_pairs": n}
