"""Preference pairs from the policy's own replies, ranked by the reward model (online DPO's extra data).

The votes say what people prefer among the replies they were shown; the reward model fitted on them generalises
that to replies nobody voted on. Sampling a few replies per training prompt from the version the retrain starts
from and pairing the reward model's best with its worst gives many more pairs than votes, all of them text the
policy itself writes (so learning from them moves its voice little). A pair is kept only where the reward model's
ensemble agrees (``min_confidence`` of its members rank best over worst), both replies end where a sentence ends
and the two texts differ: a reply cut at ``max_new_tokens`` is taken back to its last whole sentence (DPO closes
every reply with the end-of-turn token, so a reply cut mid-sentence would teach stopping there), and one without a
whole sentence joins no pair. This is one round of iterative / online DPO with
the reward model as the judge (Xiong et al. 2024; Guo et al. 2024), the labels coming from the votes through it.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from rlhf.voice import whole_sentences

if TYPE_CHECKING:
    from rlhf.training.generation import Replies


@dataclass
class Ranked:
    """What one sampling round produced: the pairs and why the others were left out."""

    pairs: list[dict]
    prompts: int  # prompts sampled
    replies: int  # replies sampled
    cut: int  # replies cut at max_new_tokens without a whole sentence (left out)
    unsure: int  # prompts whose best and worst the ensemble did not agree on
    alike: int  # prompts with fewer than two distinct whole replies
    trimmed: int = 0  # replies cut at max_new_tokens, taken back to their last whole sentence
    sampled_by: str = ""  # the engine that sampled the replies ("torch": the job's own model)
    tokens: int = 0  # reply tokens sampled

    def summary(self) -> dict:
        return {"ranked_pairs": len(self.pairs), "sampled_prompts": self.prompts, "sampled_replies": self.replies,
                "trimmed_replies": self.trimmed, "cut_replies": self.cut, "unsure_prompts": self.unsure,
                "alike_prompts": self.alike}


def draw_prompts(prompts, n: int, seed: int) -> list[list[dict]]:
    """Up to ``n`` distinct training prompts: a ``PromptBuffer``'s first batch (its seeded walk) or a seeded sample
    of a plain list of message lists."""
    if hasattr(prompts, "batch"):
        drawn = prompts.batch(1, min(n, len(prompts)))
    else:
        drawn = list(prompts)
        random.Random(seed).shuffle(drawn)
    unique: dict[str, list[dict]] = {}
    for chat in drawn:
        unique.setdefault(json.dumps(chat, sort_keys=True), list(chat))
    return list(unique.values())[:n]


def member_scores(scorer, chats: list[list[dict]], texts: list[str]) -> np.ndarray:
    """(n, members) scores: the ensemble's members where the scorer has them, else its one score as one member."""
    members = getattr(scorer, "member_scores", None)
    if members is not None:
        return np.asarray(members(chats, texts), dtype=float).reshape(len(texts), -1)
    return np.asarray(scorer(chats, texts), dtype=float).reshape(-1, 1)


def confidence(best: np.ndarray, worst: np.ndarray) -> float:
    """How sure the reward model is that ``best`` beats ``worst``: the share of ensemble members that say so, or
    for a single scorer its Bradley-Terry probability."""
    if best.size == 1:
        return 1.0 / (1.0 + math.exp(-(float(best[0]) - float(worst[0]))))
    return float(np.mean(best > worst))


def rank_pairs(chats: list[list[dict]], texts: Sequence[Sequence[str]], scores: Sequence[np.ndarray],
               left_out: Sequence[Sequence[bool]], min_confidence: float) -> Ranked:
    """One pair per prompt: the highest and lowest mean-scored of its whole, distinct replies, where the ensemble
    agrees. ``texts[i]``, ``scores[i]`` (replies x members) and ``left_out[i]`` (cut without a whole sentence):
    prompt ``i``'s replies."""
    pairs, unsure, alike, n_left_out = [], 0, 0, 0
    for chat, replies, s, out in zip(chats, texts, scores, left_out):
        n_left_out += sum(out)
        whole = [j for j, text in enumerate(replies) if not out[j] and text.strip()]
        if len({replies[j].strip() for j in whole}) < 2:
            alike += 1
            continue
        mean = s.mean(axis=1)
        best = max(whole, key=lambda j: mean[j])
        worst = min((j for j in whole if replies[j].strip() != replies[best].strip()), key=lambda j: mean[j])
        if confidence(s[best], s[worst]) < min_confidence:
            unsure += 1
            continue
        pairs.append({"prompt": chat, "chosen": replies[best], "rejected": replies[worst], "source": "reward_model"})
    return Ranked(pairs, len(chats), sum(len(r) for r in texts), n_left_out, unsure, alike)


def sample_ranked_pairs(settings, scorer, prompts, replies_to: Callable[[list[list[dict]]], "Replies"]) -> Ranked:
    """Sample ``settings.samples`` replies to each of ``settings.prompts`` training prompts with ``replies_to``
    (``torch_sampler`` or ``served_sampler``: one reply per chat it is given) and rank them with ``scorer``
    (``settings``: the ``online_dpo`` section)."""
    s = settings
    chats = draw_prompts(prompts, s.prompts, s.seed)
    if not chats:
        return Ranked([], 0, 0, 0, 0, 0)
    rows = [chat for chat in chats for _ in range(s.samples)]
    replies = replies_to(rows)
    was_cut = [len(ids) >= s.max_new_tokens for ids in replies.token_ids]
    flat = [whole_sentences(t) if c else t for t, c in zip(replies.texts, was_cut)]
    dropped = [c and not t.strip() for t, c in zip(flat, was_cut)]
    scores = member_scores(scorer, rows, flat)
    k = s.samples
    per = lambda xs: [xs[i * k:(i + 1) * k] for i in range(len(chats))]  # noqa: E731  (prompt i's replies)
    ranked = rank_pairs(chats, per(flat), per(scores), per(dropped), s.min_confidence)
    ranked.trimmed = sum(was_cut) - sum(dropped)
    ranked.sampled_by, ranked.tokens = replies.sampled_by, sum(map(len, replies.token_ids))
    return ranked


def torch_sampler(settings, max_prompt_tokens: int, base, tokenizer, adapter: Optional[str],
                  on_reply: Optional[Callable[[int, int], None]] = None):
    """``replies_to`` of the job's torch model ``base`` with ``adapter`` (None = the base itself; the adapter is taken
    off again afterwards, so ``base`` comes back as it was). ``on_reply(done, total)``: progress."""
    from rlhf.training.generation import generate_replies

    def replies_to(rows):
        model, name = base, None
        if adapter:
            from peft import PeftModel

            model, name = PeftModel.from_pretrained(base, str(adapter), adapter_name="start"), "start"
        try:
            model.eval()
            (replies,) = generate_replies(model, tokenizer, rows, [name], settings.max_new_tokens,
                                          settings.temperature, settings.seed, max_prompt_tokens=max_prompt_tokens,
                                          on_reply=on_reply)
        finally:
            if adapter:
                model.unload()  # the LoRA layers out of the shared base again
        return replies
    return replies_to


def served_sampler(settings, config, tokenizer, adapter: Optional[str], threads: int,
                   on_reply: Optional[Callable[[int, int], None]] = None):
    """``replies_to`` of the serving engine (``rlhf.serving.policy_server.load_server`` of the job's ``config``:
    llama.cpp's batched decode on a CPU) on ``threads`` threads, with ``adapter`` loaded beside the base; the
    engine is started for the sampling and closed after it."""
    from rlhf.serving.policy_server import load_server
    from rlhf.training.generation import served_replies

    def replies_to(rows):
        server = load_server(config, threads=threads, warmup=False)
        try:
            return served_replies(server, tokenizer, rows, adapter, settings.max_new_tokens, settings.temperature,
                                  settings.seed, config.ppo.max_prompt_tokens,
                                  window=min(32, config.serving.queue_size), on_reply=on_reply)
        finally:
            server.close()
    return replies_to
