"""A regularised linear reward head on frozen reply features, as a small bootstrap ensemble.

Pairs: Bradley–Terry with a linear score r(x) = w·x, i.e. P(chosen ≻ rejected) = σ(w·(x_c − x_r)) (Bradley &
Terry 1952; Ouyang et al. 2022, Eq. 1), fitted as an L2-regularised logistic regression on feature differences
(both orientations, no intercept) with scikit-learn. Scores alone (thumbs, 1–5): ridge regression.
Each member of the ensemble is fitted on a bootstrap resample of the rows; their spread is how unsure the model
is about a comparison (the gate and the vote queue read it). Features are standardised with the training
replies' mean and spread; the ensemble's mean score is scaled to unit spread over those replies, so PPO sees
rewards of a known scale whatever the features.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

DEFAULT_C = 0.05  # inverse L2 strength on standardised features, chosen on the preference benchmark's curves
DEFAULT_MEMBERS = 8


@dataclass
class LinearHead:
    """Standardiser + one weight vector per ensemble member (+ intercepts for score regression)."""

    mean: np.ndarray  # (d,)
    scale: np.ndarray  # (d,)
    weights: np.ndarray  # (members, d)
    bias: np.ndarray  # (members,)
    score_scale: float = 1.0  # divides the ensemble mean so training replies' scores have unit spread

    def member_scores(self, x: np.ndarray) -> np.ndarray:
        """(n, members) raw scores of each member."""
        z = (np.asarray(x, dtype=np.float64) - self.mean) / self.scale
        return z @ self.weights.T.astype(np.float64) + self.bias[None, :] if z.size else np.zeros((0, len(self.bias)))

    def scores(self, x: np.ndarray) -> np.ndarray:
        """(n,) the ensemble's reward: mean member score, scaled to unit spread on the training replies."""
        return self.member_scores(x).mean(axis=1) / self.score_scale

    def preference(self, x_a: np.ndarray, x_b: np.ndarray) -> np.ndarray:
        """(n, members) P(a ≻ b) under each member."""
        diff = self.member_scores(x_a) - self.member_scores(x_b)
        return 1.0 / (1.0 + np.exp(-diff))

    def save(self, path: str | Path) -> None:
        np.savez(path, mean=self.mean, scale=self.scale, weights=self.weights, bias=self.bias,
                 score_scale=np.array(self.score_scale))

    @classmethod
    def load(cls, path: str | Path) -> "LinearHead":
        with np.load(path) as z:
            return cls(z["mean"], z["scale"], z["weights"], z["bias"], float(z["score_scale"]))


def _standardiser(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    return mean, np.where(scale > 1e-6, scale, 1.0)


def _resamples(n: int, members: int, seed: int) -> list[np.ndarray]:
    """Row indices per member: the first member sees every row, the rest a bootstrap resample."""
    rng = np.random.default_rng(seed)
    return [np.arange(n)] + [rng.integers(0, n, n) for _ in range(members - 1)]


def fit_pairs(x_chosen: np.ndarray, x_rejected: np.ndarray, c: float = DEFAULT_C, members: int = DEFAULT_MEMBERS,
              seed: int = 0, weights: Optional[np.ndarray] = None) -> LinearHead:
    """Fit the Bradley–Terry head on pairs of reply features (rows of ``x_chosen`` beat rows of ``x_rejected``)."""
    from sklearn.linear_model import LogisticRegression

    x_chosen, x_rejected = np.asarray(x_chosen, np.float64), np.asarray(x_rejected, np.float64)
    if len(x_chosen) == 0 or x_chosen.shape != x_rejected.shape:
        raise ValueError("fit_pairs needs the same number (>= 1) of chosen and rejected rows")
    mean, scale = _standardiser(np.concatenate([x_chosen, x_rejected]))
    diff = (x_chosen - x_rejected) / scale
    w_rows = np.ones(len(diff)) if weights is None else np.asarray(weights, np.float64)
    coefs = []
    for idx in _resamples(len(diff), members, seed):
        x = np.concatenate([diff[idx], -diff[idx]])
        y = np.concatenate([np.ones(len(idx)), np.zeros(len(idx))])
        model = LogisticRegression(C=c, fit_intercept=False, max_iter=2000)
        model.fit(x, y, sample_weight=np.concatenate([w_rows[idx], w_rows[idx]]))
        coefs.append(model.coef_[0])
    head = LinearHead(mean, scale, np.array(coefs), np.zeros(len(coefs)))
    return _unit_spread(head, np.concatenate([x_chosen, x_rejected]))


def pair_weights(pairs: Sequence[dict]) -> np.ndarray:
    """Per pair: 1 + its margin (a clearer preference counts more)."""
    return np.array([1.0 + max(0.0, float(p.get("margin") or 0.0)) for p in pairs])


def fit_preference_head(x_chosen: np.ndarray, x_rejected: np.ndarray, pairs: Sequence[dict], cfg) -> LinearHead:
    """The reward model's head on preference ``pairs`` (their features given), as the reward config
    (``head_c``, ``ensemble``, ``seed``) and the pairs' margins set it: the one fit the retrain and the vote queue
    share."""
    return fit_pairs(x_chosen, x_rejected, c=cfg.head_c, members=cfg.ensemble, seed=cfg.seed,
                     weights=pair_weights(pairs))


def fit_scores(x: np.ndarray, y: Sequence[float], alpha: float = 1.0 / DEFAULT_C, members: int = DEFAULT_MEMBERS,
               seed: int = 0) -> LinearHead:
    """Fit a ridge head on replies with a [0, 1] score each (ratings without comparisons)."""
    from sklearn.linear_model import Ridge

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) == 0 or len(x) != len(y):
        raise ValueError("fit_scores needs one target per row (>= 1 row)")
    mean, scale = _standardiser(x)
    z = (x - mean) / scale
    coefs, biases = [], []
    for idx in _resamples(len(z), members, seed):
        model = Ridge(alpha=alpha).fit(z[idx], y[idx])
        coefs.append(model.coef_)
        biases.append(float(model.intercept_))
    return _unit_spread(LinearHead(mean, scale, np.array(coefs), np.array(biases)), x)


def _unit_spread(head: LinearHead, x_train: np.ndarray) -> LinearHead:
    spread = float(np.std(head.member_scores(x_train).mean(axis=1)))
    head.score_scale = spread if spread > 1e-9 else 1.0
    return head


def pair_accuracy(head: LinearHead, x_chosen: np.ndarray, x_rejected: np.ndarray) -> float:
    """Share of pairs the ensemble orders right (ties count half)."""
    d = head.scores(x_chosen) - head.scores(x_rejected)
    return float(np.mean(np.where(d > 0, 1.0, np.where(d == 0, 0.5, 0.0)))) if len(d) else float("nan")


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (Wilson 1927): honest at small n, never outside [0, 1]."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def grouped_folds(groups: Sequence[str], k: int, seed: int = 0) -> list[np.ndarray]:
    """Row indices of each of ``k`` folds; all rows of one group (conversation context) land in one fold."""
    keys = sorted(set(groups))
    rng = np.random.default_rng(seed)
    rng.shuffle(keys)
    fold_of = {g: i % k for i, g in enumerate(keys)}
    return [np.array([i for i, g in enumerate(groups) if fold_of[g] == f], dtype=int) for f in range(k)]


def cross_validate_pairs(x_chosen: np.ndarray, x_rejected: np.ndarray, groups: Sequence[str], k: int = 5,
                         c: float = DEFAULT_C, seed: int = 0, permutations: int = 0) -> dict:
    """k-fold accuracy grouped by context: every pair is judged once by a head (one member) that never saw its
    context. ``permutations`` > 0: the interval comes from a label-shuffle null (``permutation_interval``), which
    knows the folds share pairs; 0: a Wilson interval, which treats the judged pairs as independent (it is not)."""
    n = len(groups)
    k = max(2, min(k, len(set(groups))))
    grams = _fold_grams(np.asarray(x_chosen, np.float64), np.asarray(x_rejected, np.float64),
                        grouped_folds(groups, k, seed))
    judged = sum(len(fold) for _, fold, _ in grams)
    if judged == 0:
        return {"cv_accuracy": None, "cv_low": None, "cv_high": None, "cv_folds": 0, "cv_pairs": 0}
    accuracy = float(_cv_correct(grams, np.ones((1, n)), c)[0]) / judged
    out = {"cv_accuracy": accuracy, "cv_folds": k, "cv_pairs": judged}
    if permutations <= 0:
        low, high = wilson_interval(accuracy * judged, judged)
        return {**out, "cv_low": low, "cv_high": high, "cv_permutations": 0}
    signs = np.random.default_rng(seed + 1).choice([-1.0, 1.0], (permutations, n))
    null = _cv_correct(grams, signs, c) / judged
    return {**out, **permutation_interval(accuracy, null), "cv_permutations": permutations}


def permutation_interval(accuracy: float, null: np.ndarray, level: float = 0.95) -> dict:
    """The accuracy's interval from the null of the same cross-validation on label-shuffled votes (each pair's
    chosen/rejected swapped by a coin; Good 2005, ch. 3): ``[acc − (q_hi − ½), acc + (½ − q_lo)]`` with q the
    null's quantiles. It holds ½ exactly when the observed accuracy lies inside the null's central ``level``, so on
    coin-flip votes it holds chance with that probability whatever the folds' dependence and bias (a CV of noise
    centres below ½); ``cv_p_value`` is the share of the null at least as accurate (Phipson & Smyth 2010)."""
    q_lo, q_hi = np.quantile(null, [(1 - level) / 2, (1 + level) / 2])
    low = min(accuracy, max(0.0, accuracy - (q_hi - 0.5)))
    high = max(accuracy, min(1.0, accuracy + (0.5 - q_lo)))
    p_value = (1 + int(np.sum(null >= accuracy))) / (len(null) + 1)
    return {"cv_low": float(low), "cv_high": float(high), "cv_p_value": float(p_value),
            "cv_null_mean": float(np.mean(null)), "cv_chance": bool(low <= 0.5 <= high)}


def _fold_grams(x_chosen: np.ndarray, x_rejected: np.ndarray, folds: list[np.ndarray]) -> list[tuple]:
    """Per fold: (train rows, test rows, Gram matrix of every pair's standardised difference against the training
    pairs'), standardised as ``fit_pairs`` does on the fold's training replies. A coin-flip of a pair's orientation
    flips its row's sign only, so one Gram per fold serves every permutation."""
    n, diff, out = len(x_chosen), x_chosen - x_rejected, []
    for fold in folds:
        train = np.setdiff1d(np.arange(n), fold)
        if len(fold) == 0 or len(train) == 0:
            continue
        _, scale = _standardiser(np.concatenate([x_chosen[train], x_rejected[train]]))
        z = diff / scale
        out.append((train, fold, z @ z[train].T))
    return out


def _kernel_logistic(gram: np.ndarray, c: float, iters: int = 100) -> np.ndarray:
    """The coefficients ``a`` (w = Σ a_i z_i) of ``fit_pairs``' one-member fit in its representer form, for a stack
    of Gram matrices (P, m, m) at once: sklearn's objective C·Σ log-loss + ½‖w‖² over both orientations of each
    pair is 2C·Σ log(1 + e^{−f_i}) + ½ aᵀKa with f = Ka, stationary where a = 2C·σ(−f); Newton on that equation
    (m × m, however many features)."""
    a = np.zeros(gram.shape[:2])
    eye = np.eye(gram.shape[1])
    for _ in range(iters):
        f = np.einsum("pij,pj->pi", gram, a)
        p = 1.0 / (1.0 + np.exp(f))  # σ(−f)
        jac = eye + 2 * c * (p * (1 - p))[:, :, None] * gram
        step = np.linalg.solve(jac, (a - 2 * c * p)[:, :, None])[:, :, 0]
        a -= step
        if np.max(np.abs(step)) < 1e-12:
            break
    return a


def _cv_correct(grams: list[tuple], signs: np.ndarray, c: float) -> np.ndarray:
    """(P,) pairs judged right over the folds (ties half), each row of ``signs`` (P, n) multiplying the pairs'
    orientations (a row of ones: the votes as cast)."""
    correct = np.zeros(len(signs))
    for train, fold, gram in grams:
        s = signs[:, train]
        a = _kernel_logistic(gram[train][None] * s[:, :, None] * s[:, None, :], c)
        f = signs[:, fold] * ((s * a) @ gram[fold].T)
        correct += np.sum(np.where(f > 0, 1.0, np.where(f == 0, 0.5, 0.0)), axis=1)
    return correct


def verdict_text(cv_accuracy: Optional[float], cv_low: Optional[float], cv_high: Optional[float]) -> str:
    """What the app says about a reward model's accuracy: a figure only when the interval excludes chance."""
    if cv_accuracy is None:
        return "not measured"
    if cv_low is not None and cv_high is not None and cv_low <= 0.5 <= cv_high:
        return f"not enough data to tell ({cv_accuracy:.2f}, 95% interval {cv_low:.2f}–{cv_high:.2f} includes 0.5)"
    return f"{cv_accuracy:.2f} (95% interval {cv_low:.2f}–{cv_high:.2f})"
