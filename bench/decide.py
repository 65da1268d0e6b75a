"""`rlhf-studio bench decide`: does the people's-vote test decide rightly, and after how many votes?

Simulated annotators vote on candidate-vs-active pairs with a true win rate of 0.5, 0.6 or 0.7: a share of the
votes are ties (``TIE_SHARE`` of the rated votes) and some are *both bad* (``BOTH_BAD``, recorded, not rated);
the candidate wins the rest so that wins + ties / 2 over the rated votes has the true rate. After every vote the
test (``rlhf.analysis.decision``'s ``confidence_sequence`` and ``verdicts``, which the app's ``decide`` calls,
with ``gate.decision_alpha`` and ``gate.decision_max_votes``) is asked for its verdict, and the run stops at the
first decision — exactly how the app peeks. Goals: at 0.5 wrong decisions (promote or reject) <= 5%; at 0.7 promote >= 90%; median votes reported.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Optional

import numpy as np

from bench.report import report
from rlhf.config import AppConfig

RATES = (0.5, 0.6, 0.7)
TIE_SHARE = 0.2  # of the rated votes
BOTH_BAD = 0.05  # of all votes
TRIALS, QUICK_TRIALS = 1000, 100


def one_run(rng: np.random.Generator, rate: float, alpha: float, max_votes: int) -> tuple[str, int, int]:
    """(verdict, rated votes, all votes incl. both-bad) of one simulated decision, peeking after every vote."""
    from rlhf.analysis.decision import confidence_sequence, verdicts

    p = np.array([rate - TIE_SHARE / 2, TIE_SHARE, 1 - rate - TIE_SHARE / 2])
    outcome = rng.choice(3, size=max_votes, p=p)
    counts = np.stack([np.cumsum(outcome == k) for k in range(3)])  # after each rated vote
    low, high = confidence_sequence(counts[0], counts[1], counts[2], alpha)
    said = verdicts(low, high, np.arange(1, max_votes + 1), max_votes)  # what `decide` says after each vote
    step = int(np.flatnonzero(said != "collecting")[0])
    rated = step + 1
    return str(said[step]), rated, rated + int(rng.binomial(rated, BOTH_BAD / (1 - BOTH_BAD)))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench decide ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")
    p.add_argument("--trials", type=int, help="simulated decisions per true win rate (default 1000)")


def run(config: AppConfig, args: argparse.Namespace, path: Optional[Path] = None) -> dict:
    """Decisions at each true win rate; one row per rate, one JSON line."""
    g = config.gate
    trials = getattr(args, "trials", None) or (QUICK_TRIALS if getattr(args, "quick", False) else TRIALS)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    rows, figures = [], {"trials": trials, "alpha": g.decision_alpha, "max_votes": g.decision_max_votes}
    for rate in RATES:
        runs = [one_run(rng, rate, g.decision_alpha, g.decision_max_votes) for _ in range(trials)]
        verdicts = [v for v, _, _ in runs]
        share = lambda v: round(verdicts.count(v) / trials, 3)  # noqa: E731
        wrong = share("promote") + share("reject") if rate == 0.5 else share("reject")
        decided = [n for v, n, _ in runs if v != "no_difference"]
        rows.append({"true_win_rate": rate, "promote": share("promote"), "reject": share("reject"),
                     "no_difference": share("no_difference"), "wrong": round(wrong, 3),
                     "median_votes": statistics.median(n for _, n, _ in runs),
                     "median_votes_decided": statistics.median(decided) if decided else None,
                     "median_votes_with_both_bad": statistics.median(n for _, _, n in runs)})
        figures[f"wrong_at_{rate}"] = round(wrong, 3)
        figures[f"promote_at_{rate}"] = share("promote")
        figures[f"median_votes_at_{rate}"] = rows[-1]["median_votes"]
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    notes = (f"{trials} simulated decisions per true win rate; {TIE_SHARE:.0%} of rated votes are ties, "
             f"{BOTH_BAD:.0%} of all votes both-bad (recorded, not rated); the test is checked after every vote and "
             f"stops at its first verdict; `no_difference` = {g.decision_max_votes} rated votes without one. "
             "`wrong`: promote or reject at 0.5 (no difference exists), reject above it. Goals: wrong <= 5% at 0.5, "
             "promote >= 90% at 0.7.")
    return report("decide", rows, figures, notes, path=path)
