"""The reward-hacking guard: does the candidate still answer, or did it learn to please the reward model?

Candidate and active replies to the same held-out prompts are compared on five checks (thresholds in
``gate.*``); any tripped check keeps the candidate from being promoted automatically (people decide):

- ``length``: mean words of the candidate over the active one's, outside [min_length_ratio, max_length_ratio].
- ``distinct``: distinct-2 (unique word bigrams / all bigrams over every reply; Li et al. 2016) fell by
  ``max_distinct_drop`` or more: the policy says the same things to every prompt.
- ``repetition``: the mean share of word 3-grams that repeat an earlier 3-gram of the same reply is over
  ``max_repetition_ratio`` times the active version's, and more than ``max_repetition_rise`` above it: loops. A
  ratio, because repetition is rare in a fluent reply: 0.037 → 0.110 (3×) is a voice annotators hear, yet only a
  0.07 rise.
- ``off_prompt``: the share of replies that do not address their prompt rose by more than
  ``max_off_prompt_rise``. Relevance is the base model's own judgement: the pointwise mutual information of
  reply and prompt, [log p(reply | its prompt) − log p(reply | another prompt)] / reply tokens. An answer to
  "What is the square root of 144?" is far likelier after that question than after another one; "I'm sorry
  for any misunderstanding, can you please assist me with a question?" is as likely after any question, so
  its relevance is near 0 (below ``min_relevance``).
- ``kl``: KL to base above ``guard_max_kl``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from rlhf.voice import distinct_dropped, distinct_n, length_changed, most_repeated, repeats_more, repetition, words

CHECKS = ("length", "distinct", "repetition", "off_prompt", "kl")
SHOWN_FIRST = ("off_prompt", "repetition", "distinct", "length", "kl")  # whose examples speak most plainly
EXAMPLES = 3
def prompt_text(prompt) -> str:
    """The last user turn of a chat prompt (or the prompt itself when it is text)."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
    return users[-1] if users else ""


def relevance(model, tokenizer, prompts: list[list[dict]], replies: Sequence[str], batch_size: int = 4,
              max_prompt_tokens: Optional[int] = None) -> list[float]:
    """Per reply: [log p_base(reply | its prompt) − log p_base(reply | the next prompt)] / reply tokens."""
    from rlhf.retrain.evaluation import sequence_logprobs
    from rlhf.prompting import encode_prompt

    if len(prompts) < 2:
        return [float("nan")] * len(replies)
    ids = [encode_prompt(tokenizer, p, max_prompt_tokens) for p in prompts]
    reply_ids = [list(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies]
    other = [ids[(i + 1) % len(ids)] for i in range(len(ids))]
    own = sequence_logprobs(model, ids, reply_ids, None, batch_size)
    away = sequence_logprobs(model, other, reply_ids, None, batch_size)
    return [(a - b) / len(r) if r else 0.0 for a, b, r in zip(own, away, reply_ids)]


def _check(value: float, active: float, limit, tripped: bool) -> dict:
    return {"candidate": round(float(value), 4), "active": round(float(active), 4), "limit": limit,
            "tripped": bool(tripped)}


def guard_report(prompts: list, candidate: Sequence[str], active: Sequence[str], kl_to_base: float, cfg,
                 relevance_candidate: Optional[Sequence[float]] = None,
                 relevance_active: Optional[Sequence[float]] = None) -> dict:
    """``{"tripped": [check, ...], "checks": {check: {candidate, active, limit, tripped}}, "examples": [...]}``.

    ``cfg``: the ``gate`` config section. Relevance scores are optional (without them ``off_prompt`` is skipped).
    """
    cand_words = [len(words(t)) for t in candidate]
    act_words = [len(words(t)) for t in active]
    w_c, w_a = float(np.mean(cand_words or [0])), float(np.mean(act_words or [0]))
    checks = {"length": _check(w_c, w_a, [cfg.min_length_ratio, cfg.max_length_ratio],
                               bool(candidate) and length_changed(w_c, w_a, cfg.min_length_ratio,
                                                                  cfg.max_length_ratio))}
    d_c, d_a = distinct_n(candidate), distinct_n(active)
    checks["distinct"] = _check(d_c, d_a, cfg.max_distinct_drop, distinct_dropped(d_c, d_a, cfg.max_distinct_drop))
    rep_c, rep_a = [repetition(t) for t in candidate], [repetition(t) for t in active]
    mean_c, mean_a = float(np.mean(rep_c or [0])), float(np.mean(rep_a or [0]))
    checks["repetition"] = _check(mean_c, mean_a, [cfg.max_repetition_ratio, cfg.max_repetition_rise],
                                  repeats_more(mean_c, mean_a, cfg.max_repetition_ratio, cfg.max_repetition_rise))
    rel_c = np.asarray(relevance_candidate if relevance_candidate is not None else [], float)
    rel_a = np.asarray(relevance_active if relevance_active is not None else [], float)
    if rel_c.size and rel_a.size and np.isfinite(rel_c).all() and np.isfinite(rel_a).all():
        off_c, off_a = float(np.mean(rel_c < cfg.min_relevance)), float(np.mean(rel_a < cfg.min_relevance))
        checks["off_prompt"] = _check(off_c, off_a, cfg.max_off_prompt_rise, off_c - off_a > cfg.max_off_prompt_rise)
    checks["kl"] = _check(kl_to_base, 0.0, cfg.guard_max_kl, kl_to_base > cfg.guard_max_kl)
    tripped = [name for name in CHECKS if checks.get(name, {}).get("tripped")]
    shown = [name for name in SHOWN_FIRST if name in tripped]  # the plainest check's examples first
    return {"tripped": tripped, "checks": checks,
            "examples": [row for check in shown
                         for row in examples(prompts, candidate, active, check, rel_c, rep_c, cand_words)]}


def examples(prompts: list, candidate: Sequence[str], active: Sequence[str], check: Optional[str],
             rel: np.ndarray, rep: Sequence[float], n_words: Sequence[int], n: int = EXAMPLES) -> list[dict]:
    """The ``n`` replies that show the tripped check best (lowest relevance, most repetitive, most common bigrams,
    most extreme length); none when nothing tripped."""
    if check is None or not candidate:
        return []
    if check == "off_prompt" and rel.size:
        order = np.argsort(rel)
    elif check == "repetition":
        order = np.argsort(-np.asarray(rep))
    elif check == "distinct":
        counts: dict = {}
        for w in map(words, candidate):
            for g in set(zip(w, w[1:])):
                counts[g] = counts.get(g, 0) + 1
        order = np.argsort([-sum(counts.get(g, 0) for g in set(zip(w, w[1:]))) / max(1, len(w))
                            for w in map(words, candidate)])
    elif check == "length":
        centre = np.mean(n_words)
        order = np.argsort(n_words) if centre < np.mean([len(words(t)) for t in active]) else np.argsort(n_words)[::-1]
    else:
        order = np.arange(len(candidate))
    out = []
    for i in [int(i) for i in order[:n]]:
        row = {"check": check, "prompt": prompt_text(prompts[i]), "candidate": candidate[i], "active": active[i]}
        if check == "off_prompt" and rel.size:
            row["relevance"] = round(float(rel[i]), 3)
        if check == "repetition":
            row["repeated"] = most_repeated(candidate[i])
        out.append(row)
    return out


def run_guard(model, tokenizer, prompts: list[list[dict]], candidate: Sequence[str], active: Sequence[str],
              kl_to_base: float, cfg, max_prompt_tokens: Optional[int] = None) -> dict:
    """The guard with relevance measured by ``model``'s base (adapters off); ``cfg``: the ``gate`` section."""
    if not cfg.guard:
        return {"tripped": [], "checks": {}, "examples": [], "off": True}
    rel_c = relevance(model, tokenizer, prompts, candidate, max_prompt_tokens=max_prompt_tokens)
    rel_a = relevance(model, tokenizer, prompts, active, max_prompt_tokens=max_prompt_tokens)
    return guard_report(prompts, candidate, active, kl_to_base, cfg, rel_c, rel_a)
