"""`rlhf-studio bench gate`: does the gate promote candidates when no preference exists, and does it ever reject
one that the annotators would prefer?

Each trial is one retrain's decision, made cheap enough to repeat a hundred times on a 2-core CPU:

1. Votes: ``--votes`` pairs of the shipped pool's real replies on its training prompts, labelled by a planted
   preference (``real``) or by a coin flip (``null``: no preference exists).
2. The retrain's data path: ``rlhf.training.judge.judge_split`` keeps the judge's share of whole prompts out,
   PPO's reward model (the app's head ensemble) is fitted on the rest with its grouped CV figures, the judge on
   the held-out share and measured on PPO's share (``fit_judge``) — the functions the retrain job calls.
3. The candidate: best-of-4 against PPO's reward model, i.e. on each prompt the reply of the base's four pool
   replies that the reward model scores highest (the optimiser of Gao et al. 2023's over-optimisation study;
   ``bench loop`` shows PPO at 64 votes doing about as well as a perfect best-of-4 reranker). The active
   version answers with another of the four. So the candidate is optimised against exactly the reward model
   whose judgement the gate must not take at face value.
4. The verdict: ``rlhf.retrain.gate.decide`` — the retrain job's own rule — on the judge's scores of candidate and
   active replies to ``ppo.eval_prompts`` held-out prompts. The guard needs generated replies and the base model
   and is measured by ``bench loop`` (real PPO) instead; here it is off.
5. Truth: for ``real`` trials the planted preference judges candidate vs active on all 160 held-out prompts
   (ties half): the oracle win rate. Goals: null promoted <= 5% (with its Wilson interval), and real candidates
   with oracle win rate >= 0.65 promoted or sent to people (inconclusive), never rejected.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from bench.report import report
from rlhf.config import AppConfig, ConfigError
from rlhf.training.judge import pairs_for_a_judge

BON_KL = float(np.log(4) - 3 / 4)  # KL of best-of-4 to its base policy (Stiennon et al. 2020, bound)
NULL_TRIALS, REAL_SEEDS = 300, 10
QUICK_NULL, QUICK_SEEDS = 12, 1
VOTES = 128  # pool votes per trial: a judge is set aside from 94 decided pairs (gate.min_judge_pairs 32)


@dataclass
class Setup:
    """What every trial reads: the pool, its reply features, and the prompt split."""

    config: AppConfig
    pool: list
    feats: object  # bench.reward.PoolFeatures
    train_ids: list
    eval_ids: list  # the gate's held-out prompts
    oracle_ids: list  # every held-out prompt

    def __post_init__(self) -> None:
        self.text = {row: reply for (_, reply), row in self.feats.index.items()}
        self.prompt = {r["prompt_id"]: r["prompt"] for r in self.pool}


def trial(setup: Setup, preference: str, seed: int, votes: int, null: bool) -> dict:
    """One retrain's gate decision on pool votes (coin-flip labels when ``null``) -> a result row."""
    from bench.preferences import PREFERENCES, make_pairs
    from rlhf.retrain.gate import Evidence, decide
    from rlhf.training.judge import fit_judge, judge_split
    from rlhf.training.reward_head import cross_validate_pairs, fit_pairs

    config, feats = setup.config, setup.feats
    r, g = config.reward, config.gate
    pairs = make_pairs(setup.pool, preference, setup.train_ids, seed, n=votes)
    if null:
        coin = random.Random(f"null|{seed}")
        pairs = [p if coin.random() < 0.5 else {**p, "chosen": p["rejected"], "rejected": p["chosen"]} for p in pairs]
    xc, xr = feats.of(pairs, "chosen"), feats.of(pairs, "rejected")
    groups = [p["prompt_id"] for p in pairs]
    mine, theirs = judge_split(groups, g.judge_share, g.min_judge_pairs, seed)
    cv = cross_validate_pairs(xc[mine], xr[mine], [groups[i] for i in mine], k=r.cv_folds, c=r.head_c, seed=seed,
                              permutations=r.cv_permutations)
    policy_rm = fit_pairs(xc[mine], xr[mine], c=r.head_c, members=r.ensemble, seed=seed)
    judge, judged = fit_judge(xc, xr, theirs, mine, r.head_c, r.ensemble, seed)
    cand, act = best_of_4(feats, setup.pool, policy_rm, seed)
    eval_ids = setup.eval_ids
    def members(head, side):  # (prompts, members) scores of one side's replies to the gate's prompts
        return None if head is None else head.member_scores(feats.matrix[[side[i] for i in eval_ids]]) / \
            head.score_scale

    verdict = decide(members(judge, cand), members(judge, act), Evidence.from_metrics({**cv, **judged}, prefix=""),
                     BON_KL, config.retrain.min_win_rate, config.retrain.max_kl, None, members(policy_rm, cand),
                     members(policy_rm, act), seed=seed)
    oracle = None
    if not null:
        pref, text, prompt = PREFERENCES[preference], setup.text, setup.prompt
        verdicts = [pref.score(prompt[i], text[cand[i]]) - pref.score(prompt[i], text[act[i]])
                    for i in setup.oracle_ids]
        oracle = float(np.mean([1.0 if d > pref.margin else 0.0 if d < -pref.margin else 0.5 for d in verdicts]))
    own = verdict.evidence["reward_model"]
    return {"kind": "null" if null else "real", "preference": preference, "seed": seed, "pairs": len(pairs),
            "judge_pairs": int(judged["judge_pairs"]), "rm_cv": _r(cv["cv_accuracy"]), "rm_cv_low": _r(cv["cv_low"]),
            "judge_acc": _r(judged["judge_accuracy"]), "judge_low": _r(judged["judge_low"]),
            "rm_win_rate": _r(own.get("win_rate")), "rm_low": _r(own.get("low")),
            "gate": verdict.verdict.verdict, "win_rate": _r(verdict.verdict.win_rate), "low": _r(verdict.verdict.low),
            "high": _r(verdict.verdict.high), "oracle_win_rate": _r(oracle)}


def _r(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(float(x), 3)


def best_of_4(feats, pool: list[dict], head, seed: int) -> tuple[dict, dict]:
    """Per prompt id, the row (in ``feats.matrix``) of the candidate's reply — the reward model's favourite of the
    pool's four — and of the active version's: one of the other three, seeded."""
    rng = random.Random(f"active|{seed}")
    cand, act = {}, {}
    for rec in pool:
        rows = [feats.index[(rec["prompt"], reply)] for reply in rec["replies"]]
        best = int(np.argmax(head.scores(feats.matrix[rows])))
        cand[rec["prompt_id"]] = rows[best]
        act[rec["prompt_id"]] = rng.choice([row for k, row in enumerate(rows) if k != best] or rows)
    return cand, act


def summarise(rows: list[dict]) -> dict:
    """The benchmark's figures: counts, the null promote rate with its 95% Wilson interval, the real outcomes."""
    from rlhf.training.reward_head import wilson_interval

    null = [r for r in rows if r["kind"] == "null"]
    real = [r for r in rows if r["kind"] == "real"]
    preferred = [r for r in real if (r["oracle_win_rate"] or 0) >= 0.65]
    promoted = sum(r["gate"] == "promote" for r in null)
    low, high = wilson_interval(promoted, len(null))
    count = lambda rs, v: sum(r["gate"] == v for r in rs)  # noqa: E731
    return {"null_trials": len(null), "null_promoted": promoted, "null_promoted_rate": _r(promoted / max(1, len(null))),
            "null_promoted_low": _r(low), "null_promoted_high": _r(high),
            "null_rejected": count(null, "reject"), "real_trials": len(real), "real_promoted": count(real, "promote"),
            "real_inconclusive": count(real, "inconclusive"), "real_rejected": count(real, "reject"),
            "preferred_trials": len(preferred), "preferred_promoted": count(preferred, "promote"),
            "preferred_to_people": count(preferred, "inconclusive"), "preferred_rejected": count(preferred, "reject"),
            "null_rm_would_promote": sum((r["rm_low"] or 0) > 0.5 for r in null)}


def table(rows: list[dict]) -> list[dict]:
    """One row per (kind, preference): verdict counts and mean figures over the trials (the report's table)."""
    out = []
    groups = [("null", None)] + [("real", p) for p in dict.fromkeys(r["preference"] for r in rows
                                                                    if r["kind"] == "real")]
    for kind, pref in groups:
        rs = [r for r in rows if r["kind"] == kind and (pref is None or r["preference"] == pref)]
        if rs:
            mean = lambda k: _r(np.mean([r[k] for r in rs if r[k] is not None])) if any(  # noqa: E731
                r[k] is not None for r in rs) else None
            out.append({"kind": kind, "votes_from": "coin flips" if kind == "null" else pref, "trials": len(rs),
                        "promote": sum(r["gate"] == "promote" for r in rs),
                        "to_people": sum(r["gate"] == "inconclusive" for r in rs),
                        "reject": sum(r["gate"] == "reject" for r in rs),
                        "old_gate_promotes": sum((r["rm_low"] or 0) > 0.5 for r in rs),
                        "rm_cv": mean("rm_cv"), "judge_acc": mean("judge_acc"), "judge_win_rate": mean("win_rate"),
                        "rm_win_rate": mean("rm_win_rate"), "oracle_win_rate": mean("oracle_win_rate"),
                        "oracle_min": _r(min(r["oracle_win_rate"] for r in rs)) if kind == "real" else None})
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench gate ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")
    p.add_argument("--votes", type=int, help=f"pool votes per trial (default {VOTES})")
    p.add_argument("--trials", type=int, help="null trials (default 300)")


def run(config: AppConfig, args: argparse.Namespace, path: Optional[Path] = None) -> dict:
    """Null and real trials through the gate's decision; one table, one JSON line."""
    from tqdm import tqdm

    from bench.preferences import PREFERENCES
    from rlhf.simulate.preference_pool import load_pool, split_prompts
    from bench.reward import pool_features
    from rlhf.base_models import pick_device, resolve_model
    from rlhf.training.features import ReplyFeatures

    quick = bool(getattr(args, "quick", False))
    votes = getattr(args, "votes", None) or VOTES
    fewest = pairs_for_a_judge(config.gate.judge_share, config.gate.min_judge_pairs)
    if fewest is None:
        raise ConfigError("bench gate measures the held-out judge: gate.judge_share must be above 0")
    if votes < fewest:
        raise ConfigError(f"--votes must be at least {fewest} to set a judge aside (gate.min_judge_pairs "
                          f"{config.gate.min_judge_pairs} at gate.judge_share {config.gate.judge_share}), got {votes}")
    n_null, seeds = (QUICK_NULL, QUICK_SEEDS) if quick else (NULL_TRIALS, REAL_SEEDS)
    n_null = getattr(args, "trials", None) or n_null
    t0 = time.perf_counter()
    source = resolve_model(config.base_model, config.data_path)
    featurize = ReplyFeatures.load(source, pick_device(config.device), config.reward.max_length)
    pool = load_pool()
    train_ids, held_ids = split_prompts(pool)
    setup = Setup(config, pool, pool_features(config, featurize, pool), train_ids,
                  held_ids[-config.ppo.eval_prompts:], held_ids)
    prefs = list(PREFERENCES)
    plan = [(prefs[i % len(prefs)], i, True) for i in range(n_null)] + \
           [(p, s, False) for s in range(seeds) for p in prefs]
    rows = [trial(setup, pref, seed, votes, null)
            for pref, seed, null in tqdm(plan, desc="gate trials", file=sys.stderr, unit="trial")]
    figures = {**summarise(rows), "votes": votes, "seconds": round(time.perf_counter() - t0, 1)}
    notes = (f"Model `{config.base_model}`; {votes} pool votes per trial; PPO's reward model on "
             f"{1 - config.gate.judge_share:.0%} of the prompts, the judge on the rest (`gate.judge_share` "
             f"{config.gate.judge_share}); candidate = best-of-4 against PPO's reward model, active = another of the "
             f"pool's four replies; verdict = `rlhf.retrain.gate.decide` on the judge's scores over "
             f"{len(setup.eval_ids)} held-out prompts (`retrain.min_win_rate` {config.retrain.min_win_rate}); oracle "
             "win rate on all 160 held-out prompts. `rm_win_rate`/`rm_low`: what the old gate (PPO's own reward model) "
             "measured; `old_gate_promotes` / `null_rm_would_promote` count trials whose old lower bound was above "
             "0.5 (the old rule's promote). Rows: verdict counts and means per vote source. Goals: null "
             "promoted <= 5%; real candidates with oracle win rate >= 0.65 promoted or sent to people, never rejected.")
    return report("gate", table(rows), figures, notes, path=path)
