"""Style-controlled Bradley–Terry: ratings that do not reward a version for being longer or more formatted.

LMArena's style control (Chiang et al., "Does style matter? Disentangling style and substance in Chatbot Arena",
2024; the ``arena-rank`` package's ``ContextualBradleyTerry``): each vote's log-odds are the rating difference
plus a linear term in style covariates of the two replies,

    logit P(a beats b) = r_a − r_b + β · z(a, b),

where z holds, per feature (reply length in words, markdown headers, list items, bold spans), the normalised
difference (f_a − f_b) / (f_a + f_b) (0 when both are 0), scaled to unit spread over the votes (not centred:
see ``standardise``). The loss is the mean
negative log-likelihood (ties count half a win) plus ½·reg·‖β‖², ratings unpenalised — arena-rank's loss
(``STYLE_REG``). The
ratings are then what is left after style: a version that wins only by writing longer replies keeps its raw BT
lead but not its style-controlled one. ``prior`` adds the same virtual games against a reference player as the
raw fit (``rlhf.analysis.leaderboard``), so a version with only wins stays finite; prior=0 is arena-rank's fit.
"""
from __future__ import annotations

import math
import re
from typing import Optional

import numpy as np

FEATURES = ("length", "headers", "lists", "bold")
# L2 strength on the style coefficients of the *mean* loss. arena-rank's default (1.0) shrinks a style effect to
# about a fifth of its size whatever the number of votes; at 0.01 a few hundred votes measure it (tested against
# arena-rank's own fit at both strengths in tests/rlhf/analysis/test_style.py).
STYLE_REG = 0.01
_HEADER = re.compile(r"^\s{0,3}#{1,6}\s", re.M)
_LIST = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+", re.M)
_BOLD = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")


def style_counts(text: str) -> np.ndarray:
    """(words, markdown headers, list items, bold spans) of a reply."""
    text = text or ""
    return np.array([len(text.split()), len(_HEADER.findall(text)), len(_LIST.findall(text)),
                     len(_BOLD.findall(text))], float)


def style_diffs(texts_a, texts_b) -> np.ndarray:
    """(votes, features): the normalised differences (f_a − f_b) / (f_a + f_b), 0 where both are 0."""
    a = np.array([style_counts(t) for t in texts_a]).reshape(-1, len(FEATURES))
    b = np.array([style_counts(t) for t in texts_b]).reshape(-1, len(FEATURES))
    total = a + b
    return np.divide(a - b, total, out=np.zeros_like(total), where=total > 0)


def standardise(x: np.ndarray, center: bool = True) -> np.ndarray:
    """Columns to spread 1 (and mean 0 with ``center``, as arena-rank normalises features).

    The app scales without centring: in LMArena the sides are random, so a column's mean is ~0 anyway, but here
    vote-queue items may put one version on side a more often; centring would then move that version's average
    style advantage into its rating, the opposite of style control. Unscaled, 0 still means "equal style".
    """
    if not len(x):
        return x
    spread = x.std(axis=0) if center else np.sqrt((x ** 2).mean(axis=0))
    return (x - (x.mean(axis=0) if center else 0.0)) / np.where(spread > 0, spread, 1.0)


def fit(a: np.ndarray, b: np.ndarray, outcome: np.ndarray, features: np.ndarray, n: int, reg: float = 1.0,
        prior: float = 0.0, weights: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """(ratings (n,), coefficients) in natural-log odds units; ratings of unplayed players are NaN.

    ``prior``: each played player also meets a reference (rating 0, no style difference) in ``prior`` virtual
    games with half a win each, weighted like one vote each.
    """
    from scipy.optimize import minimize

    a, b, y = np.asarray(a, int), np.asarray(b, int), np.asarray(outcome, float)
    x = np.asarray(features, float).reshape(len(y), -1)
    w = np.ones(len(y)) if weights is None else np.asarray(weights, float)
    played = np.zeros(n, bool)
    played[a] = played[b] = True
    k = x.shape[1]
    ref = np.flatnonzero(played)  # virtual games: player vs the reference
    m = len(y) + prior * len(ref)

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        r, beta = theta[:n], theta[n:]
        z = r[a] - r[b] + x @ beta
        p = 1.0 / (1.0 + np.exp(-z))
        ll = w * (y * z - np.logaddexp(0.0, z))
        g = w * (y - p)  # d ll / d z
        grad_r = np.zeros(n)
        np.add.at(grad_r, a, -g)
        np.add.at(grad_r, b, g)
        total = -ll.sum()
        if prior > 0:
            zr = r[ref]
            total -= prior * (0.5 * zr - np.logaddexp(0.0, zr)).sum()
            grad_r[ref] -= prior * (0.5 - 1.0 / (1.0 + np.exp(-zr)))
        grad_beta = -(x.T @ g)
        return total / m + 0.5 * reg * beta @ beta, np.concatenate([grad_r / m, grad_beta / m + reg * beta])

    res = minimize(loss, np.zeros(n + k), jac=True, method="L-BFGS-B",
                   options={"maxiter": 2000, "ftol": 1e-13, "gtol": 1e-9})
    r = res.x[:n]
    if prior <= 0:
        r = r - r[played].mean() if played.any() else r  # the loss does not see a common shift
    return np.where(played, r, np.nan), res.x[n:]


def style_ratings(a, b, outcome, texts_a, texts_b, n: int, n_boot: int = 200, seed: int = 0, reg: float = STYLE_REG,
                  prior: float = 1.0, scale: float = 400.0, base: float = 10.0,
                  anchor: float = 1000.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rating, low, high) per player on the Elo scale (mean over played players = anchor), 95% percentile
    bootstrap interval over votes; NaN for players without a rated vote."""
    a, b, y = np.asarray(a, int), np.asarray(b, int), np.asarray(outcome, float)
    x = standardise(style_diffs(texts_a, texts_b), center=False)
    to_elo = lambda r: scale * r / math.log(base)  # noqa: E731

    def centred(r: np.ndarray) -> np.ndarray:
        e = to_elo(r)
        return e - np.nanmean(e) + anchor if np.any(~np.isnan(e)) else e

    if not len(y):
        empty = np.full(n, np.nan)
        return empty, empty.copy(), empty.copy()
    rating = centred(fit(a, b, y, x, n, reg, prior)[0])
    rng = np.random.default_rng(seed)
    samples = np.full((n_boot, n), np.nan)
    for i in range(n_boot):
        idx = rng.integers(0, len(y), len(y))
        samples[i] = centred(fit(a[idx], b[idx], y[idx], x[idx], n, reg, prior)[0])
    low, high = np.full(n, np.nan), np.full(n, np.nan)
    for j in range(n):
        col = samples[:, j][~np.isnan(samples[:, j])]
        if len(col):
            low[j], high[j] = np.quantile(col, [0.025, 0.975])
    return rating, low, high
