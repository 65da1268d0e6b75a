"""`rlhf-studio bench decide`: does the people's-vote test decide rightly, after how many votes and people, and can
one person settle it?

Simulated annotators vote on candidate-vs-active pairs with a true win rate of 0.5, 0.6 or 0.7: a share of the
votes are ties (``TIE_SHARE`` of the rated votes) and some are *both bad* (``BOTH_BAD``, recorded, not rated);
the candidate wins the rest so that wins + ties / 2 over the rated votes has the true rate. After every vote the
test (``rlhf.analysis.confidence_sequence``'s ``confidence_sequence`` and ``verdicts``, which the app's ``decide`` calls,
with ``gate.decision_alpha`` and ``gate.decision_max_votes``) is asked for its verdict, and the run stops at the
first decision — exactly how the app peeks. Three kinds of rows:

* ``votes``: every vote counts (the rule before issue 33, and what one person's votes look like to it).
* ``team of N``: N people, each vote cast by one of them at random; as in the app (``rlhf.retrain.decisions``) each
  person's first ``gate.decision_votes_per_annotator`` votes count, a verdict needs
  ``gate.decision_min_annotators`` people, and the test runs at ``person_alpha``. ``undecided``: everyone used
  their votes and the test still cannot tell (an admin decides).
* ``adversary``: one person votes for the candidate as often as the API allows (``server.rate_limit_per_minute``
  for a day), alone and ahead of an honest team at 0.5 (where every promotion is wrong).

Goals: at 0.5 wrong decisions (promote or reject) <= 5%; at 0.7 promote >= 90% (for the votes rows); the adversary
alone never settles a decision, and ahead of an honest team at 0.5 its wrong promotions stay <= 5%.
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
TEAMS = (20, 100)
TIE_SHARE = 0.2  # of the rated votes
BOTH_BAD = 0.05  # of all votes
TRIALS, QUICK_TRIALS = 1000, 100


def one_run(rng: np.random.Generator, rate: float, alpha: float, max_votes: int) -> tuple[str, int, int]:
    """(verdict, rated votes, all votes incl. both-bad) of one simulated decision, peeking after every vote."""
    from rlhf.analysis.confidence_sequence import confidence_sequence, verdicts

    p = np.array([rate - TIE_SHARE / 2, TIE_SHARE, 1 - rate - TIE_SHARE / 2])
    outcome = rng.choice(3, size=max_votes, p=p)
    counts = np.stack([np.cumsum(outcome == k) for k in range(3)])  # after each rated vote
    low, high = confidence_sequence(counts[0], counts[1], counts[2], alpha)
    said = verdicts(low, high, np.arange(1, max_votes + 1), max_votes)  # what `decide` says after each vote
    step = int(np.flatnonzero(said != "collecting")[0])
    rated = step + 1
    return str(said[step]), rated, rated + int(rng.binomial(rated, BOTH_BAD / (1 - BOTH_BAD)))


def people_run(rng: np.random.Generator, rate: float, team: int, per_person: int, min_people: int, alpha: float,
               max_votes: int, adversary_votes: int = 0) -> tuple[str, int, int]:
    """(verdict, counted rated votes, people) of one decision under the app's people rules. The adversary (person
    -1) votes ``adversary_votes`` times for the candidate before anyone else; ``team`` honest people follow, each
    vote by one of them at random, until every one of them has used their ``per_person`` votes."""
    from rlhf.analysis.confidence_sequence import confidence_sequence, verdicts

    honest = team * per_person * 8 if team else 0  # enough raw votes for everyone to use up their counted ones
    p = np.array([(rate - TIE_SHARE / 2) * (1 - BOTH_BAD), TIE_SHARE * (1 - BOTH_BAD),
                  (1 - rate - TIE_SHARE / 2) * (1 - BOTH_BAD), BOTH_BAD])  # win, tie, loss, both bad
    who = np.concatenate([np.full(adversary_votes, -1), rng.integers(0, team, size=honest) if team else []])
    what = np.concatenate([np.zeros(adversary_votes, int), rng.choice(4, size=honest, p=p)]).astype(int)
    seen: dict = {}
    kept = np.zeros(len(who), bool)
    for i, person in enumerate(who.tolist()):  # each person's first `per_person` votes count (as the app counts)
        seen[person] = seen.get(person, 0) + 1
        kept[i] = seen[person] <= per_person
    who, what = who[kept], what[kept]
    rated = what < 3
    who, what = who[rated], what[rated]
    if len(what) == 0:
        return "undecided", 0, 0
    counts = np.stack([np.cumsum(what == k) for k in range(3)])
    first = np.zeros(len(who), bool)
    first[np.unique(who, return_index=True)[1]] = True
    people = np.cumsum(first)
    low, high = confidence_sequence(counts[0], counts[1], counts[2], alpha)
    n = np.arange(1, len(what) + 1)
    said = verdicts(low, high, n, max_votes)
    said = np.where(np.isin(said, ("promote", "reject")) & (people < min_people), "collecting", said)
    decided = np.flatnonzero(said != "collecting")
    if len(decided) == 0:
        return "undecided", len(what), int(people[-1])
    step = int(decided[0])
    return str(said[step]), step + 1, int(people[step])


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench decide ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")
    p.add_argument("--trials", type=int, help="simulated decisions per true win rate (default 1000)")


def _row(kind: str, rate: float, runs: list[tuple[str, int, int]], trials: int) -> dict:
    verdicts = [v for v, _, _ in runs]
    share = lambda v: round(verdicts.count(v) / trials, 3)  # noqa: E731
    wrong = share("promote") + share("reject") if rate == 0.5 else share("reject")
    decided = [n for v, n, _ in runs if v not in ("no_difference", "undecided")]
    return {"rows": kind, "true_win_rate": rate, "promote": share("promote"), "reject": share("reject"),
            "no_difference": share("no_difference"), "undecided": share("undecided"), "wrong": round(wrong, 3),
            "median_votes": statistics.median(n for _, n, _ in runs),
            "median_votes_decided": statistics.median(decided) if decided else None,
            "median_people": statistics.median(k for _, _, k in runs)}


def run(config: AppConfig, args: argparse.Namespace, path: Optional[Path] = None) -> dict:
    """Decisions at each true win rate, by votes, by a team, and with the adversary; one JSON line."""
    g = config.gate
    trials = getattr(args, "trials", None) or (QUICK_TRIALS if getattr(args, "quick", False) else TRIALS)
    from rlhf.analysis.confidence_sequence import person_alpha

    per_person, min_people = g.decision_votes_per_annotator, g.decision_min_annotators
    alpha = person_alpha(g.decision_alpha, per_person)  # the level the app's team rules run the test at
    flood = max(1, config.server.rate_limit_per_minute) * 60 * 24  # one person at the rate limit for a day
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    rows = []
    figures = {"trials": trials, "alpha": g.decision_alpha, "team_alpha": round(alpha, 4),
               "max_votes": g.decision_max_votes, "votes_per_person": per_person, "min_people": min_people}
    for rate in RATES:
        runs = [(v, n, 1) for v, n, _ in (one_run(rng, rate, g.decision_alpha, g.decision_max_votes)
                                          for _ in range(trials))]
        rows.append(_row("votes (every vote counts)", rate, runs, trials))
        figures[f"wrong_at_{rate}"] = rows[-1]["wrong"]
        figures[f"promote_at_{rate}"] = rows[-1]["promote"]
        figures[f"median_votes_at_{rate}"] = rows[-1]["median_votes"]
    for team in TEAMS:
        for rate in RATES:
            runs = [people_run(rng, rate, team, per_person, min_people, alpha, g.decision_max_votes)
                    for _ in range(trials)]
            rows.append(_row(f"team of {team}", rate, runs, trials))
            figures[f"team{team}_wrong_at_{rate}"] = rows[-1]["wrong"]
            figures[f"team{team}_promote_at_{rate}"] = rows[-1]["promote"]
    # The adversary alone: its votes are deterministic (all for the candidate), so one run says it all.
    alone = people_run(rng, 0.5, 0, per_person, min_people, alpha, g.decision_max_votes, flood)
    rows.append(_row(f"adversary alone ({flood:,} votes)", 0.5, [alone], 1))
    figures["adversary_alone_settles"] = alone[0] in ("promote", "reject")
    figures["adversary_votes"] = flood
    before = one_run_unanimous(g.decision_alpha, g.decision_max_votes)
    figures["adversary_votes_to_promote_before"] = before
    for team in TEAMS:
        runs = [people_run(rng, 0.5, team, per_person, min_people, alpha, g.decision_max_votes, flood)
                for _ in range(trials)]
        rows.append(_row(f"adversary + team of {team}", 0.5, runs, trials))
        figures[f"adversary_team{team}_wrong_promote"] = rows[-1]["promote"]
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    notes = (f"{trials} simulated decisions per row; {TIE_SHARE:.0%} of rated votes are ties, {BOTH_BAD:.0%} of all "
             f"votes both-bad (recorded, not rated); the test is checked after every vote and stops at its first "
             f"verdict; `no_difference` = {g.decision_max_votes} counted rated votes without one; `undecided` = every "
             f"person used their {per_person} counted votes without one (an admin decides). Teams: each vote by one of "
             f"N people at random, each person's first {per_person} votes count, a verdict needs {min_people} "
             f"people, the test runs at alpha {alpha:.4f} (one person's head start priced in). "
             f"The adversary votes for the candidate {flood:,} times (the rate limit for a day) before anyone else; "
             f"when every vote counted, {before} of its votes promoted alone. `wrong`: promote or reject at 0.5 (no "
             "difference exists), reject above it. Goals: wrong <= 5% at 0.5, promote >= 90% at 0.7 (votes rows); "
             "the adversary never settles alone, and its wrong promotions ahead of a team at 0.5 stay <= 5%.")
    return report("decide", rows, figures, notes, path=path)


def one_run_unanimous(alpha: float, max_votes: int) -> int:
    """How many straight wins promote when every vote counts (what one person could do alone before issue 33)."""
    from rlhf.analysis.confidence_sequence import decide

    return next(n for n in range(1, max_votes + 1) if decide(n, 0, 0, alpha=alpha, max_votes=max_votes).verdict
                == "promote")
