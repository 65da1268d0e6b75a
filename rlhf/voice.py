"""How a reply sounds, in words: word n-grams, distinct-n over replies, the share of a reply's 3-grams that repeat,
and the phrase it repeats most. One measure for all who ask: PPO's repetition penalty (``rlhf.training.shaping``),
the reward-hacking guard (``rlhf.retrain.guard``, whose length, distinct-2 and repetition rules are here for PPO's
voice check too) and ``bench loop``'s voice figures, so the policy is penalised on
the same measure it is checked on (PPO's novelty term reads ``shared_elsewhere``, distinct-2's loss per reply). Words are ``\w+`` runs (with an inner apostrophe), lower-cased: punctuation
never makes two n-grams differ. ``whole_sentences`` cuts a reply back to its last whole sentence: what a reader
would have voted on, had the reply not been cut at a token limit (online DPO's pairs; PPO's reward and the gate's
judge through ``as_read``)."""
from __future__ import annotations

import re
from typing import Sequence

_WORD = re.compile(r"\w+(?:'\w+)?")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Unique word n-grams over all n-grams of all replies (1.0 when there are none)."""
    grams = [tuple(w[i:i + n]) for w in map(words, texts) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def repetition(text: str, n: int = 3) -> float:
    """Share of the reply's word n-grams that repeat an earlier n-gram of the same reply."""
    w = words(text)
    grams = [tuple(w[i:i + n]) for i in range(len(w) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def distinct_dropped(candidate: float, active: float, max_drop: float) -> bool:
    """Distinct-2 fell by ``max_drop`` or more (rounded to 6 places: a 0.82 → 0.77 drop is 0.05, not 0.0499…)."""
    return round(active - candidate, 6) >= max_drop


def repeats_more(candidate: float, active: float, max_ratio: float, min_rise: float) -> bool:
    """Repeated 3-grams over ``max_ratio`` × the active version's and more than ``min_rise`` above them."""
    return candidate > max_ratio * active and round(candidate - active, 6) > min_rise


def length_ratio(candidate_words: float, active_words: float) -> float:
    """Mean words a reply of the candidate over the active version's, each plus one (so no reply divides by 0)."""
    return (candidate_words + 1.0) / (active_words + 1.0)


def length_changed(candidate_words: float, active_words: float, min_ratio: float, max_ratio: float) -> bool:
    """The mean reply length left [``min_ratio``, ``max_ratio``] × the active version's (``length_ratio``)."""
    return not min_ratio <= length_ratio(candidate_words, active_words) <= max_ratio


def shared_elsewhere(texts: Sequence[str], prompts: Sequence, n: int = 2,
                     others: Sequence[tuple[str, object]] = ()) -> list[float]:
    """Per reply, the share of its word n-grams that a reply to another prompt also uses (0 without n-grams): a
    phrase reused whatever the question, which is what distinct-n over replies loses. Replies to the same prompt
    are not compared, since they may share the answer. ``others``: more (reply, prompt) pairs to compare with,
    earlier replies that are not scored themselves."""
    def grams(text: str) -> list[tuple]:
        w = words(text)
        return [tuple(w[i:i + n]) for i in range(len(w) - n + 1)]

    pool = [(grams(t), p) for t, p in zip(texts, prompts)] + [(grams(t), p) for t, p in others]
    out = []
    for mine, prompt in pool[:len(texts)]:
        elsewhere = {g for theirs, their_prompt in pool if their_prompt != prompt for g in theirs}
        out.append(sum(g in elsewhere for g in mine) / len(mine) if mine else 0.0)
    return out


def most_repeated(text: str, n: int = 3) -> str:
    """The word n-gram the reply repeats most often ('' when none repeats): what a reader hears looping."""
    w = words(text)
    counts: dict = {}
    for i in range(len(w) - n + 1):
        counts[tuple(w[i:i + n])] = counts.get(tuple(w[i:i + n]), 0) + 1
    gram, times = max(counts.items(), key=lambda kv: kv[1], default=((), 0))
    return " ".join(gram) if times > 1 else ""


_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s|$)|\n")


def whole_sentences(text: str) -> str:
    """``text`` up to the end of its last whole sentence (a full stop, ! or ? before a space or the end, or a line
    break); empty when it has none."""
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    return text[:ends[-1]].rstrip() if ends else ""


def as_read(text: str, cut: bool) -> str:
    """What a reward model reads of a reply: one cut at a token limit up to its last whole sentence (the replies
    people vote on are whole, and a fragment reads as a worse reply); as written when it was not cut or has no whole
    sentence."""
    return (whole_sentences(text) or text) if cut else text
