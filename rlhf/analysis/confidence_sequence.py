"""People decide what the gate could not: a sequential test on votes between a candidate and the active version.

Each rated vote is an outcome x in {1 (candidate wins), 0.5 (tie), 0 (active wins)}; *both bad* votes are
counted and shown but carry no preference. The win rate p = E[x] gets an always-valid 95% confidence sequence
by betting (Waudby-Smith & Ramdas 2023, "Estimating means of bounded random variables by betting"): for a
candidate mean m, the capital K_t(m) = mean over bets λ of Π_i (1 + λ (x_i − m)) is a non-negative martingale
when p = m, so by Ville's inequality P(sup_t K_t(m) ≥ 1/α) ≤ α. The confidence sequence is every m whose
capital stayed below 1/α; it holds at every vote at once, so checking after each vote (and stopping as soon as
it excludes 0.5) keeps the error rate at α. The bets are a fixed mixture of constant stakes in both directions
(fractions ``BETS`` of the largest stake that cannot go bankrupt), so the capital depends only on the counts of
wins, ties and losses, not on their order.

Verdicts: ``promote`` (the interval lies above 0.5), ``reject`` (below 0.5), ``no_difference`` (``max_votes``
rated votes without either: the active version stays), else ``collecting``.

People, not votes: one person's votes are not independent draws, so the app counts at most ``per_person`` votes of
each person (``rlhf.retrain.decisions``) and runs the test at ``person_alpha``: the level divided by ``head_start``, the
most one person's ``per_person`` one-sided votes multiply the bets' mixed capital at m = 0.5. The capital of the
other people's votes then has to reach 1/alpha on its own, which by Ville's inequality it does with probability at
most alpha under the null: one person voting first and all one way cannot raise the error rate above alpha.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

BETS = (0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8)  # stakes as fractions of the largest safe stake, each sign
GRID = np.linspace(0.0, 1.0, 201)[1:-1]  # candidate means m (0.005 apart; 0.5 is on it)
OUTCOMES = {"a": 1.0, "b": 0.0, "tie": 0.5}


def log_capital(wins, ties, losses, m: np.ndarray = GRID) -> np.ndarray:
    """log K(m) of the bet mixture after ``wins``/``ties``/``losses`` (scalars or arrays; result (..., len(m)))."""
    w, t, l = (np.asarray(v, float)[..., None, None] for v in (wins, ties, losses))
    m = np.asarray(m, float)[:, None]
    c = np.asarray(BETS, float)[None, :]
    up = w * np.log1p(c * (1 - m) / m) + t * np.log1p(c * (0.5 - m) / m) + l * np.log1p(-c)
    down = w * np.log1p(-c) + t * np.log1p(-c * (0.5 - m) / (1 - m)) + l * np.log1p(c * m / (1 - m))
    both = np.concatenate([up, down], axis=-1)
    top = both.max(axis=-1, keepdims=True)
    return (top + np.log(np.exp(both - top).mean(axis=-1, keepdims=True)))[..., 0]


def confidence_sequence(wins, ties, losses, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the always-valid (1 − alpha) interval of the win rate (0, 1 with no votes)."""
    inside = log_capital(wins, ties, losses) < math.log(1.0 / alpha)
    lows = np.where(inside, GRID, np.inf).min(axis=-1)
    highs = np.where(inside, GRID, -np.inf).max(axis=-1)
    empty = ~inside.any(axis=-1)  # cannot happen at the true mean with probability > alpha; keep it defined
    rate = (np.asarray(wins, float) + 0.5 * np.asarray(ties, float)) / np.maximum(
        1, np.asarray(wins) + np.asarray(ties) + np.asarray(losses))
    return np.where(empty, rate, np.maximum(lows - 0.005, 0.0)), np.where(empty, rate, np.minimum(highs + 0.005, 1.0))


def head_start(per_person: int) -> float:
    """The most ``per_person`` one-sided votes of one person multiply the mixed capital at m = 0.5."""
    return float(np.exp(max(0.0, float(log_capital(per_person, 0, 0, np.array([0.5]))[0]))))


def person_alpha(alpha: float, per_person: int) -> float:
    """The level the test runs at so that one person's ``per_person`` counted votes cannot lift its error rate
    above ``alpha`` (see the module docstring)."""
    return alpha / head_start(per_person)


def verdicts(low, high, votes, max_votes: int) -> np.ndarray:
    """The verdict for each (interval, rated votes): promote above 0.5, reject below, no_difference at the cap."""
    low, high, votes = np.asarray(low), np.asarray(high), np.asarray(votes)
    return np.where(low > 0.5, "promote", np.where(high < 0.5, "reject",
                                                    np.where(votes >= max_votes, "no_difference", "collecting")))


@dataclass(frozen=True)
class Decision:
    """Where a candidate-vs-active comparison stands."""

    verdict: str  # collecting | promote | reject | no_difference
    votes: int  # rated votes (wins + ties + losses)
    win_rate: Optional[float]
    low: float
    high: float
    votes_needed: Optional[int]
    wins: int = 0
    ties: int = 0
    losses: int = 0
    both_bad: int = 0

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "votes": self.votes, "win_rate": self.win_rate, "low": self.low,
                "high": self.high, "votes_needed": self.votes_needed, "wins": self.wins, "ties": self.ties,
                "losses": self.losses, "both_bad": self.both_bad}


def decide(wins: int, ties: int, losses: int, both_bad: int = 0, alpha: float = 0.05,
           max_votes: int = 200) -> Decision:
    """The verdict of the sequential test after these votes (ties half a win; both-bad recorded only)."""
    n = wins + ties + losses
    low, high = (float(x) for x in confidence_sequence(wins, ties, losses, alpha))
    rate = (wins + 0.5 * ties) / n if n else None
    verdict = str(verdicts(low, high, n, max_votes))
    needed = votes_needed(wins, ties, losses, alpha, max_votes) if verdict == "collecting" else 0
    return Decision(verdict, n, rate, low, high, needed, wins, ties, losses, both_bad)


def votes_needed(wins: int, ties: int, losses: int, alpha: float, max_votes: int) -> int:
    """Estimated further votes until the test decides, if votes keep coming as they did.

    The outcome shares so far (one pseudo-vote of each kind added) give the expected log-growth per vote of the
    best bet at m = 0.5; the capital must grow to log(1/alpha) plus the mixture's log(number of bets). Capped at
    the votes left before ``max_votes``.
    """
    n = wins + ties + losses
    left = max(0, max_votes - n)
    shares = np.array([wins + 1, ties + 1, losses + 1], float)
    shares /= shares.sum()
    c = np.asarray(BETS, float)
    growth = max(float(shares @ np.log1p(np.outer([1.0, 0.0, -1.0], c))[:, k]) for k in range(len(c)))
    growth = max(growth, max(float(shares @ np.log1p(np.outer([-1.0, 0.0, 1.0], c))[:, k]) for k in range(len(c))))
    target = math.log(1.0 / alpha) + math.log(2 * len(BETS))
    have = max(float(log_capital(wins, ties, losses, np.array([0.5]))[0]), 0.0)
    if growth <= 1e-9:
        return left
    return int(min(left, max(1, math.ceil((target - have) / growth))))
