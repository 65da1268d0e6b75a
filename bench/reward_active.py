"""`rlhf-studio bench reward --active`: how many votes does the vote queue save?

On the shipped preference pool, a simulated annotator (each planted preference in turn) answers pairs shown
to it one at a time, and the reward head is refit every ``queue.refit_every`` votes. Two ways to choose the
pairs, from the same candidates (every pair of the four replies to each training prompt, ties included: an
annotator who is shown two equally good replies spends a vote and teaches nothing):

- ``active``: the vote queue's own code (``rlhf.vote_queue.choice``): random until the head has
  ``reward.min_pairs`` pairs, then the most uncertain pairs under the current head ensemble, with
  ``queue.random_share`` random ones mixed in;
- ``random``: uniformly random pairs.

After each refit the head is judged on the fixed held-out pairs (prompts never trained on). The figure is the
number of votes (pairs shown) until held-out accuracy first reaches 0.80, per preference and seed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from rlhf.vote_queue.choice import choose_batch, pair_uncertainty
from bench.preferences import PREFERENCES, _flipped, heldout_pairs
from rlhf.simulate.preference_pool import load_pool, split_prompts
from bench.report import report
from rlhf.config import AppConfig

TARGET = 0.80
BUDGET, QUICK_BUDGET = 320, 96
SEEDS = (0, 1, 2)
QUICK_PREFERENCES = ("no_lists", "concrete")
STRATEGIES = ("active", "random")


def candidate_pairs(pool: Sequence[dict], preference: str, prompt_ids: Sequence[str], seed: int) -> list[dict]:
    """Every pair of replies to each prompt, labelled by the planted preference: ``{prompt, a, b, winner}`` with
    winner ``a``, ``b`` or ``tie`` (score gap within the preference's margin); noisy preferences flip a fixed
    share of the non-tied labels per seed, as ``make_pairs`` does."""
    pref = PREFERENCES[preference]
    by_id = {r["prompt_id"]: r for r in pool}
    out = []
    for pid in sorted(set(prompt_ids)):
        rec = by_id[pid]
        scores = [pref.score(rec["prompt"], r) for r in rec["replies"]]
        for i in range(len(scores)):
            for j in range(i + 1, len(scores)):
                if abs(scores[i] - scores[j]) <= pref.margin:
                    winner = "tie"
                else:
                    winner = "a" if scores[i] > scores[j] else "b"
                    if _flipped(pref, seed, pid, i, j):
                        winner = "b" if winner == "a" else "a"
                out.append({"prompt_id": pid, "prompt": rec["prompt"], "a": rec["replies"][i],
                            "b": rec["replies"][j], "winner": winner})
    return out


def annotate(xa: np.ndarray, xb: np.ndarray, winners: Sequence[str], strategy: str, seed: int, budget: int,
             refit_every: int, min_pairs: int, random_share: float, c: Optional[float] = None, members: int = 8):
    """A simulated annotator voting on candidate pairs (features ``xa``/``xb``, answers ``winners``) chosen by
    ``strategy``; yields ``(indices voted on so far, head refit on their non-tie answers)`` after each refit."""
    from rlhf.training.reward_head import DEFAULT_C, fit_pairs

    rng = np.random.default_rng(seed)
    left = np.arange(len(winners))
    taken, chosen, rejected, head = [], [], [], None
    while len(taken) < budget and left.size:
        k = min(refit_every, budget - len(taken))
        if strategy == "active" and head is not None and len(chosen) >= min_pairs:
            _, uncertainty = pair_uncertainty(head.preference(xa[left], xb[left]))
            picks = choose_batch(uncertainty, k, random_share, rng)
        else:
            picks = choose_batch(None, k, 0.0, rng, n=len(left))
        batch = [int(left[i]) for i, _ in picks]
        left = np.delete(left, [i for i, _ in picks])
        for i in batch:
            taken.append(i)
            if winners[i] == "a":
                chosen.append(xa[i]), rejected.append(xb[i])
            elif winners[i] == "b":
                chosen.append(xb[i]), rejected.append(xa[i])
        if chosen:
            head = fit_pairs(np.array(chosen), np.array(rejected), c=c or DEFAULT_C, members=members, seed=seed)
            yield list(taken), head


def run_strategy(feats, cands: list[dict], held: list[dict], strategy: str, seed: int, budget: int, refit_every: int,
                 min_pairs: int, random_share: float, c: Optional[float] = None, members: int = 8) -> list[dict]:
    """One annotation run: ``[{"votes", "pairs", "accuracy"}]`` after each refit of the head."""
    from rlhf.training.reward_head import pair_accuracy

    xa, xb = feats.of(cands, "a"), feats.of(cands, "b")
    held_c, held_r = feats.of(held, "chosen"), feats.of(held, "rejected")
    winners = [c_["winner"] for c_ in cands]
    return [{"votes": len(taken), "pairs": sum(winners[i] != "tie" for i in taken),
             "accuracy": pair_accuracy(head, held_c, held_r)}
            for taken, head in annotate(xa, xb, winners, strategy, seed, budget, refit_every, min_pairs,
                                        random_share, c, members)]


def votes_to(curve: list[dict], target: float = TARGET) -> Optional[int]:
    """Votes at the first refit whose held-out accuracy reaches ``target`` (None: not within the budget)."""
    return next((p["votes"] for p in curve if p["accuracy"] >= target), None)


def compare(feats, pool: list[dict], prefs: Sequence[str], seeds: Sequence[int], budget: int, refit_every: int,
            min_pairs: int, random_share: float, c: Optional[float] = None, members: int = 8) -> dict:
    """Curves and votes-to-0.80 of both strategies: ``{(pref, strategy): {"curves": [...], "needed": [...]}}``."""
    train_ids, _ = split_prompts(pool)
    out = {}
    for pref in prefs:
        held = heldout_pairs(pool, pref)
        for strategy in STRATEGIES:
            runs = [run_strategy(feats, candidate_pairs(pool, pref, train_ids, seed), held, strategy, seed, budget,
                                 refit_every, min_pairs, random_share, c, members) for seed in seeds]
            out[(pref, strategy)] = {"curves": runs, "needed": [votes_to(r) for r in runs]}
        print(f"{pref}: votes to {TARGET:.2f} active {out[(pref, 'active')]['needed']} random "
              f"{out[(pref, 'random')]['needed']}", file=sys.stderr)
    return out


def summarize(results: dict, prefs: Sequence[str], budget: int) -> tuple[list[dict], dict]:
    """Table rows and the contract's figures. A run that never reaches 0.80 counts as the budget (a lower
    bound); ``censored`` says how many did, so a ratio that rests on them can be read as such."""
    rows, per_pref = [], {}
    for pref in prefs:
        means = {}
        for strategy in STRATEGIES:
            needed = results[(pref, strategy)]["needed"]
            means[strategy] = statistics.mean(budget if n is None else n for n in needed)
            curves = results[(pref, strategy)]["curves"]
            at = lambda v: _mean_at(curves, v)  # noqa: E731
            rows.append({"preference": pref, "strategy": strategy, "votes_to_0.80": _fmt_needed(needed),
                         "mean": round(means[strategy], 1), "acc@32": at(32), "acc@64": at(64), "acc@128": at(128),
                         "acc@256": at(256)})
        per_pref[pref] = {"active": round(means["active"], 1), "random": round(means["random"], 1),
                          "ratio": round(means["active"] / means["random"], 3)}
    active = statistics.mean(v["active"] for v in per_pref.values())
    rand = statistics.mean(v["random"] for v in per_pref.values())
    censored = {s: sum(n is None for p in prefs for n in results[(p, s)]["needed"]) for s in STRATEGIES}
    # Mean held-out accuracy over every refit of every run: the whole learning curve, not one crossing.
    mean_accuracy = {s: round(statistics.mean(pt["accuracy"] for p in prefs for c in results[(p, s)]["curves"]
                                              for pt in c), 4) for s in STRATEGIES}
    figures = {"active_pairs_to_080": round(active, 1), "random_pairs_to_080": round(rand, 1),
               "ratio": round(active / rand, 3), "per_preference": per_pref, "censored": censored,
               "mean_accuracy": mean_accuracy}
    return rows, figures


def _mean_at(curves: list[list[dict]], votes: int) -> str:
    accs = [p["accuracy"] for curve in curves for p in curve if p["votes"] == votes]
    return f"{statistics.mean(accs):.3f}" if accs else ""


def _fmt_needed(needed: list[Optional[int]]) -> str:
    return " ".join("–" if n is None else str(n) for n in needed)


def run(config: AppConfig, args: argparse.Namespace, path: Optional[Path] = None, featurize=None) -> dict:
    """Active vs random on every planted preference (``--quick``: two preferences, one seed, a small budget)."""
    from bench.reward import pool_features

    quick = bool(getattr(args, "quick", False))
    only = getattr(args, "preference", None)
    prefs = [only] if only else list(QUICK_PREFERENCES if quick else PREFERENCES)
    seeds = SEEDS[:1] if quick else SEEDS
    budget = QUICK_BUDGET if quick else BUDGET
    q = config.queue
    pool = load_pool()
    if featurize is None:
        from rlhf.base_models import pick_device, resolve_model
        from rlhf.training.features import ReplyFeatures

        source = resolve_model(config.base_model, config.data_path)
        featurize = ReplyFeatures.load(source, pick_device(config.device), config.reward.max_length)
    feats = pool_features(config, featurize, pool)
    results = compare(feats, pool, prefs, seeds, budget, q.refit_every, config.reward.min_pairs, q.random_share,
                      config.reward.head_c, config.reward.ensemble)
    rows, figures = summarize(results, prefs, budget)
    figures.update(seeds=len(seeds), budget=budget, refit_every=q.refit_every, random_share=q.random_share,
                   min_pairs=config.reward.min_pairs,
                   curves={f"{p}/{s}": [[pt["votes"], round(pt["accuracy"], 4)] for pt in _mean_curve(
                       results[(p, s)]["curves"])] for p in prefs for s in STRATEGIES})
    notes = (f"Votes (pairs shown, ties included) until the reward head's held-out accuracy first reaches "
             f"{TARGET:.2f}, per seed (– = not within {budget} votes, counted as {budget}): pairs chosen by the vote "
             f"queue's uncertainty (head ensemble refit every {q.refit_every} votes, random until "
             f"{config.reward.min_pairs} pairs, {q.random_share:.0%} random picks) against uniformly random pairs "
             "from the same candidates. Goal: ratio active / random ≤ 0.6.")
    return report("bench reward --active", rows, figures, notes, path=path)


def _mean_curve(curves: list[list[dict]]) -> list[dict]:
    """The mean accuracy over seeds at each vote count every seed reached."""
    counts = sorted(set.intersection(*[{p["votes"] for p in c} for c in curves])) if curves else []
    return [{"votes": v, "accuracy": statistics.mean(p["accuracy"] for c in curves for p in c if p["votes"] == v)}
            for v in counts]
