"""How `bench loop` judges a trained adapter against the base: the oracle's verdict on sampled replies with the
voice figures (distinct-2, repeated 3-grams, KL), the best-of-pool scale, and the retrain job's own gate on the same
adapter; whether the two agree, and whether a run kept the voice."""
from __future__ import annotations

import json
import random
import statistics
import sys

from rlhf.config import AppConfig

SAMPLES = 2  # sampled replies per held-out prompt and version
REPLY_TOKENS = 64  # as `simulate` asks for while annotating and judging


def chat(system: str, prompt: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]



def gate_verdict(config: AppConfig, model, tokenizer, scorer, judge, evidence, prompts: list[str],
                 system: str) -> dict:
    """What the retrain job's gate would say about adapter ``new`` of ``model`` against the base: the same
    evaluation (replies at ``eval.reply_temperature`` to ``ppo.eval_prompts`` held-out prompts), guard and verdict rule
    (``rlhf.retrain.gate.decide`` on the held-out judge's scores)."""
    from rlhf.retrain.evaluation import evaluate_versions
    from rlhf.retrain.gate import decide, judge_scores
    from rlhf.retrain.guard import run_guard

    chats = [chat(system, p) for p in prompts]
    report = evaluate_versions(model, tokenizer, chats, scorer, "new", None, config.eval.max_new_tokens,
                               seed=config.ppo.seed + config.eval.seed_offset,
                               whole_sentences=config.reward.whole_sentences,
                               reply_temperature=config.eval.reply_temperature)
    cand_text, act_text = [s["reply"] for s in report.samples], [s["reply"] for s in report.active_samples]
    guard = run_guard(model, tokenizer, chats, cand_text, act_text, report.kl_to_base, config.gate)
    cand, act = judge_scores(judge, chats, [s["read"] for s in report.samples],
                             [s["read"] for s in report.active_samples])
    g = decide(cand, act, evidence, report.kl_to_base, config.retrain.min_win_rate, config.retrain.max_kl, guard,
               report.candidate_members, report.active_members)
    for ex in guard["examples"]:  # what tripped it, for a human to read (stderr)
        print(f"[guard {ex['check']}] {ex['prompt'][:60]!r} -> {ex['candidate'][:200]!r}", file=sys.stderr)
    own = g.evidence["reward_model"]
    return {"gate": g.verdict.verdict, "gate_win_rate": round(g.verdict.win_rate, 3),
            "gate_low": round(g.verdict.low, 3), "gate_high": round(g.verdict.high, 3),
            "rm_gate_win_rate": round(own.get("win_rate", float("nan")), 3),
            "judge_accuracy": round(evidence.judge_accuracy or 0.0, 3), "guard": ",".join(guard["tripped"]) or "-",
            **{f"guard_{k}": f"{v['candidate']:.2f}/{v['active']:.2f}" for k, v in guard["checks"].items()}}


_BASE_REPLIES: dict = {}  # (prompts, seed, tokens) -> the base's sampled replies: the same for every run of a process



def base_replies(model, tokenizer, chats: list, seed: int):
    """The base's sampled replies to ``chats`` (cached: they do not depend on what was trained)."""
    from rlhf.retrain.evaluation import generate_replies

    key = (tuple(json.dumps(c) for c in chats), seed, REPLY_TOKENS)
    if key not in _BASE_REPLIES:
        (_BASE_REPLIES[key],) = generate_replies(model, tokenizer, chats, [None], REPLY_TOKENS, 1.0, seed)
    return _BASE_REPLIES[key]



def verdict(model, tokenizer, oracle: str, prompts: list[str], system: str, samples: int = SAMPLES) -> dict:
    """The oracle's win rate of adapter ``new`` of ``model`` over the base on ``prompts`` (ties half), with
    the voice figures of the same sampled replies: mean words, distinct-2 and repeated 3-grams (the guard's
    measures, ``rlhf.retrain.guard``), and KL(new || base) in nats per reply on them."""
    from rlhf.retrain.evaluation import generate_replies, sequence_logprobs
    from rlhf.voice import distinct_n, repetition
    from rlhf.simulate.oracles import ORACLES

    judge = ORACLES[oracle]
    chats = [chat(system, p) for p in prompts]
    verdicts, new_texts, base_texts, kls = [], [], [], []
    for s in range(samples):
        seed = 10_000 + 1000 * s
        base = base_replies(model, tokenizer, chats, seed)
        (new,) = generate_replies(model, tokenizer, chats, ["new"], REPLY_TOKENS, 1.0, seed)
        verdicts += [judge(prompt, a, b) for prompt, a, b in zip(prompts, new.texts, base.texts)]
        new_texts += new.texts
        base_texts += base.texts
        # KL on the judged replies: E_y~new[log new(y) - log base(y)] (the gate's estimator, evaluation.py)
        lp_new = sequence_logprobs(model, new.prompt_ids, new.token_ids, "new")
        lp_base = sequence_logprobs(model, new.prompt_ids, new.token_ids, None)
        kls += [a - b for a, b in zip(lp_new, lp_base)]

    for prompt, reply in list(zip(prompts, new_texts))[:3]:  # a few replies for a human to read (stderr)
        print(f"[{oracle}] {prompt[:60]!r} -> {reply[:300]!r}", file=sys.stderr)

    def words(texts):
        return round(statistics.mean(len(t.split()) for t in texts), 1) if texts else 0.0

    def rep(texts):
        return round(statistics.mean(repetition(t) for t in texts), 3) if texts else 0.0

    return {**win_rates(verdicts), "mean_words": words(new_texts), "base_mean_words": words(base_texts),
            "distinct_2": round(distinct_n(new_texts), 3), "base_distinct_2": round(distinct_n(base_texts), 3),
            "repetition": rep(new_texts), "base_repetition": rep(base_texts),
            "kl": round(statistics.mean(kls), 2) if kls else float("nan"),
            "empty": sum(1 for t in new_texts if not t.split())}



def win_rates(verdicts: list[str]) -> dict:
    """Win rate with ties as half a win, and among the decisive verdicts only (``None`` when all tie)."""
    wins, losses = verdicts.count("a"), verdicts.count("b")
    score = wins + 0.5 * (len(verdicts) - wins - losses)
    return {"oracle_win_rate": round(score / max(1, len(verdicts)), 3),
            "decisive_win_rate": round(wins / (wins + losses), 3) if wins + losses else None,
            "tie_share": round(1 - (wins + losses) / max(1, len(verdicts)), 3)}



def best_of_pool(pool: list[dict], oracle: str, prompt_ids, seed: int = 0) -> float:
    """What picking the oracle's favourite of the pool's base replies would score against a random one of them
    (ties half) on ``prompt_ids``: the win rate of an ideal best-of-n reranker, a scale for the oracle's."""
    from rlhf.simulate.oracles import ORACLES

    judge, rng, allowed = ORACLES[oracle], random.Random(seed), set(prompt_ids)
    verdicts = []
    for rec in sorted((r for r in pool if r["prompt_id"] in allowed), key=lambda r: r["prompt_id"]):
        best = rec["replies"][0]
        for reply in rec["replies"][1:]:
            best = reply if judge(rec["prompt"], reply, best) == "a" else best
        verdicts.append(judge(rec["prompt"], best, rng.choice(rec["replies"])))
    return win_rates(verdicts)["oracle_win_rate"]



def agrees(gate: str, oracle_win_rate: float) -> bool:
    """The gate's goal: never promote when the oracle's win rate is <= 0.5, and never reject (promote or send it to
    people's votes) when it is >= 0.6."""
    if oracle_win_rate >= 0.6:
        return gate != "reject"
    return gate != "promote" if oracle_win_rate <= 0.5 else True


DISTINCT_SLACK, REPETITION_SLACK = 0.05, 0.02  # the voice goals (#35): distinct-2 and repeated 3-grams vs the base



def keeps_voice(row: dict) -> bool:
    """The voice goal of a run: distinct-2 within 0.05 of the base's and repeated 3-grams at most the base's + 0.02
    (the same sampled replies of both)."""
    return (row["distinct_2"] >= row["base_distinct_2"] - DISTINCT_SLACK - 1e-9
            and row["repetition"] <= row["base_repetition"] + REPETITION_SLACK + 1e-9)


def guard_voice(method_metrics: dict, gate_view: bool) -> bool | None:
    """Whether the weights a PPO run published pass the voice rules of the gate's guard (distinct-2, repeated
    3-grams, length against the base's replies), as its voice check read them on the very replies the guard reads
    (``gate_view``: ``ppo.voice_check_gate`` was on). None when the run does not say: another method, or the check
    did not read the gate's replies. A version these rules fail is refused, and the team keeps the base."""
    if not gate_view or "ppo/reward_after" not in method_metrics:
        return None
    if method_metrics.get("voice_watch/by") != "check":
        return True  # the check passed the final weights (a watch's stop was checked too)
    return method_metrics.get("voice_watch/passes") == "every view"


def published_win(row: dict) -> float | None:
    """The win rate over the base of what the team gets: the run's, or 0.5 when the guard's voice rules refuse it
    (the base stays); None when the row does not say whether they would (``guard_voice``)."""
    passes = row.get("guard_voice")
    return None if passes is None else (row["oracle_win_rate"] if passes else 0.5)
