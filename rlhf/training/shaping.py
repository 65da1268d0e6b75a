"""Reward shaping: rule terms (length, repetition, polite ending) and extra reward functions by import path.

The PPO score of a reply is ``reward_model(prompt, reply) + sum_i weight_i * term_i(prompt, reply)``,
clipped to ``+-ppo.reward_clip``. Rule terms are the cheap, hand-written shaping used in agent training
(e.g. length and format rewards); extra functions (``ppo.reward_functions = {"pkg.mod:fn": weight}``)
can be anything with the signature ``fn(messages, reply) -> float`` — a verifier that checks a reply's
claims against a database, a unit-test runner, a regex.
"""
from __future__ import annotations

import logging
import math
import re
from collections import deque
from typing import Callable, Optional, Sequence

from rlhf.plugins import load_callable
from rlhf.voice import as_read, repetition, shared_elsewhere

log = logging.getLogger(__name__)

RewardFn = Callable[[list, list], list]  # (prompts, replies) -> scores
POLITE_PHRASES = ("hope this helps", "hope that helps", "let me know", "happy to help", "glad to help",
                  "feel free to", "thank you", "thanks", "good luck", "enjoy", "take care", "have a great",
                  "have a nice", "you're welcome", "you are welcome")
_SENTENCE_END = re.compile(r"[.!?…](?:[\"')\]]|\*\*|`{1,3})*\s*$|`{3}\s*$|[\U0001F300-\U0001FAFF]\s*$")


def length_term(n_tokens: int, target: int) -> float:
    """0 at the target length, falling linearly to -1 at 0 tokens or twice the target."""
    if target <= 0:
        return 0.0
    return -min(abs(n_tokens - target) / target, 1.0)


def repetition_term(reply: str, n: int = 3) -> float:
    """Minus the share of repeated word n-grams (``rlhf.voice.repetition``, the measure the guard checks): 0 for no
    repeats, towards -1 for a reply in a loop."""
    return -repetition(reply, n)


def polite_ending(messages: Sequence[dict], reply: str, finished: bool = True) -> float:
    """0.5 for a complete last sentence (not cut off by the token limit) + 0.5 for a polite closing phrase."""
    text = reply.strip()
    if not text:
        return 0.0
    complete = finished and bool(_SENTENCE_END.search(text))
    tail = text[-160:].lower()
    polite = any(p in tail for p in POLITE_PHRASES)
    return 0.5 * complete + 0.5 * polite


def load_reward_function(path: str) -> Callable[[list, str], float]:
    """Import ``"package.module:function"``; ValueError with the reason when it cannot be used."""
    return load_callable(path, "ppo.reward_functions")


def _finite(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value if math.isfinite(value) else math.nan


class RewardShaper:
    """Combines a reward model (or none) with the configured rule terms and reward functions."""

    def __init__(self, ppo_config, reward_fn: Optional[RewardFn] = None, whole_sentences: bool = True):
        self.cfg = ppo_config
        self.reward_fn = reward_fn
        self.whole_sentences = whole_sentences  # the reward model reads a cut reply's whole sentences (``as_read``)
        # The last ``ppo.novelty_memory`` training steps' (replies, prompts), for the novelty term (not part of a
        # checkpoint: a resumed run starts it empty).
        self.recent: deque = deque(maxlen=ppo_config.novelty_memory)
        self.functions = {path: (load_reward_function(path), float(weight))
                          for path, weight in (ppo_config.reward_functions or {}).items()}
        if reward_fn is None and not self.has_rules():
            raise ValueError("no reward: give a reward model, or set rule weights / ppo.reward_functions")

    def has_rules(self) -> bool:
        """Whether any rule term or extra function contributes."""
        c = self.cfg
        return bool(self.functions) or (c.length_weight != 0 and c.length_target > 0) \
            or c.repetition_weight != 0 or c.polite_weight != 0 or c.relevance_weight != 0 \
            or c.novelty_weight != 0

    def __call__(self, prompts: list[list[dict]], replies: list[str], n_tokens: Sequence[int],
                 finished: Sequence[bool], relevance: Optional[Sequence[float]] = None,
                 training: bool = False) -> tuple[list[float], dict[str, list[float]]]:
        """(clipped total score per reply, each part per reply). A part that fails gives NaN for that reply.

        ``relevance``: each reply's relevance to its prompt (``rlhf.training.ppo.core.relevance``), which the
        caller computes from the reference model; its shortfall below ``ppo.relevance_floor`` costs
        ``ppo.relevance_weight`` per nat. ``training``: a PPO step's rollouts, which the novelty term also compares
        with the last ``ppo.novelty_memory`` steps' and then remembers (an evaluation's replies do neither)."""
        c = self.cfg
        n = len(replies)
        parts: dict[str, list[float]] = {}
        if self.reward_fn is not None:
            read = [as_read(r, not done) for r, done in zip(replies, finished)] if self.whole_sentences \
                else replies
            scores = list(self.reward_fn(prompts, read))
            if len(scores) != n:
                raise ValueError(f"reward model returned {len(scores)} scores for {n} replies")
            parts["rm"] = [_finite(s) for s in scores]
        if c.length_weight != 0 and c.length_target > 0:
            parts["length"] = [c.length_weight * length_term(k, c.length_target) for k in n_tokens]
        if c.repetition_weight != 0:
            parts["repetition"] = [c.repetition_weight * repetition_term(r) for r in replies]
        if c.novelty_weight != 0:
            earlier = [pair for batch in self.recent for pair in zip(*batch)] if training else []
            parts["novelty"] = [-c.novelty_weight * v for v in shared_elsewhere(replies, prompts, others=earlier)]
        if training and self.recent.maxlen:
            self.recent.append((list(replies), list(prompts)))
        if c.polite_weight != 0:
            parts["polite"] = [c.polite_weight * polite_ending(p, r, f)
                               for p, r, f in zip(prompts, replies, finished)]
        if c.relevance_weight != 0:
            if relevance is None or len(relevance) != n:
                raise ValueError("ppo.relevance_weight is set but no relevance score came for each reply")
            # A hinge: only a shortfall below the floor costs. A bonus for relevance itself would pay for short
            # replies, whose few tokens carry the prompt's words (bench loop, #40: replies halved in length).
            parts["relevance"] = [-c.relevance_weight * max(c.relevance_floor - r, 0.0) if math.isfinite(r)
                                  else math.nan for r in map(_finite, relevance)]
        for path, (fn, weight) in self.functions.items():
            values = []
            for p, r in zip(prompts, replies):
                try:
                    values.append(weight * _finite(fn(p, r)))
                except Exception as exc:  # one failing verifier call must not kill the run: the guard decides
                    log.warning("reward function %s failed: %s", path, exc)
                    values.append(math.nan)
            parts[path] = values
        clip = c.reward_clip
        totals = []
        for i in range(n):
            total = sum(part[i] for part in parts.values())
            totals.append(min(max(total, -clip), clip) if clip > 0 and math.isfinite(total) else total)
        return totals, parts
