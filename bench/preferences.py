"""Planted preferences on the shipped pool: pure text scorers, the pairs they label, and length-only baselines.

The question the pool answers: does a reward model learn what annotators prefer from 16-256 votes? Each planted
preference is a text scorer, and pairs of the pool's replies are labelled by it.

Usable pairs and length-only baselines per preference: ``python -m bench.preference_pool stats``.
"""
from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from rlhf.simulate.oracles import concrete_hits, words
from rlhf.simulate.preference_pool import split_prompts

# ------------------------------------------------------------------------------------------ preferences
LIST_LINE = re.compile(r"^\s*(?:[-*•+]|\d{1,2}[.)]|[a-h][.)]|#+)\s+\S")
FILLER_OPENER = re.compile(  # openers that delay the answer: pleasantries, preambles, self-reference
    r"^(?:sure|certainly|of course|absolutely|great|good question|what a|wow|i|as an ai|as a language|well,|"
    r"hello|hi|hey|oh|ah|thanks?|thank you|okay|ok|let me|let's|let us|so|ready|welcome|to answer|in this|"
    r"when it comes|there (?:are|is) (?:many|several|a few|some|various|no)|it'?s (?:important|essential)|"
    r"it is (?:important|essential)|it depends|that'?s a|that is a|this is a|here'?s|here is|here are|you asked)\b")
WARM = re.compile(  # friendly, polite wording (what "Be warm and friendly." adds to this model's replies)
    r"\b(?:happy|glad|delighted|pleased|welcome|enjoy\w*|fun|love|lovely|wonderful|amazing|fantastic|awesome|"
    r"exciting|excited|hope|hopefully|please|thanks?|appreciate\w*|friend\w*|dear|kind|kindly|cheers|"
    r"good luck|best wishes|take care|feel free|don't worry|no worries|you've got this|congratulations|"
    r"hello|hi|hey|smile\w*|joy\w*|here to help)\b", re.IGNORECASE)
EMOJI = re.compile("[\U0001F300-\U0001FAFF\u2600-\u27BF]")


def first_sentence(text: str) -> str:
    """Text up to the first sentence end, colon or line break."""
    m = re.search(r"[.!?:](?=\s|$)|\n", text.strip())
    return text.strip()[: m.end() if m else None].strip()


def score_shorter(prompt: str, reply: str) -> float:
    """Surface: fewer words is better (log scale, so 10 vs 20 words counts like 50 vs 100)."""
    return -math.log1p(len(words(reply)))


def score_no_lists(prompt: str, reply: str) -> float:
    """Surface: prose beats lists; minus the share of non-empty lines that are bullet/numbered items."""
    lines = [ln for ln in reply.splitlines() if ln.strip()]
    return -sum(bool(LIST_LINE.match(ln)) for ln in lines) / max(1, len(lines))


def score_concrete(prompt: str, reply: str) -> float:
    """Content: concrete numbers, quantities and steps, per square root of length (not just longer)."""
    return concrete_hits(reply) / math.sqrt(max(8, len(words(reply))))


def score_direct(prompt: str, reply: str) -> float:
    """Content: the first sentence answers: no filler opener, no preamble/question, not long, not an echo."""
    first = first_sentence(reply)
    low = first.lower().replace("’", "'")
    q = {w.lower().strip(".,'’") for w in words(prompt) if len(w) > 3}
    fw = [w.lower().strip(".,'’") for w in words(first) if len(w) > 3]
    echo = bool(fw) and sum(w in q for w in fw) / len(fw) >= 0.75 and len(fw) >= 3
    return -(bool(FILLER_OPENER.match(low)) + first.endswith((":", "?")) + echo + 0.5 * (len(words(first)) > 30)
             + (not first))


def warm_hits(reply: str) -> int:
    """Warm words and phrases, exclamation marks and emoji (at most 3 each) in a reply."""
    return len(WARM.findall(reply)) + min(3, reply.count("!")) + min(3, len(EMOJI.findall(reply)))


def score_warm(prompt: str, reply: str) -> float:
    """Tone: warm, polite wording per square root of length, plus a small share of 'you'."""
    ws = [w.lower() for w in words(reply)]
    you = sum(w in ("you", "your", "you're", "you'll", "yourself") for w in ws) / max(1, len(ws))
    return warm_hits(reply) / math.sqrt(max(8, len(ws))) + you


@dataclass(frozen=True)
class Preference:
    """A planted preference: a text scorer, the score gap below which two replies tie, a label flip rate."""
    name: str
    kind: str
    score: Callable[[str, str], float]
    margin: float
    flip: float = 0.0
    balance_length: bool = True  # pick pairs so that length alone cannot predict the label


PREFERENCES: dict[str, Preference] = {p.name: p for p in (
    Preference("shorter", "surface", score_shorter, margin=0.1, balance_length=False),  # >= ~10% fewer words
    Preference("no_lists", "surface", score_no_lists, margin=0.1),
    Preference("concrete", "content", score_concrete, margin=0.25),
    Preference("direct", "content", score_direct, margin=0.5),
    Preference("warm", "tone", score_warm, margin=0.1),
    Preference("concrete_noisy", "content+noise", score_concrete, margin=0.25, flip=0.15),
)}


# ----------------------------------------------------------------------------------------------- pairs
HELDOUT_PAIRS = 200
HELDOUT_SEED = 12345


def _word_count(text: str) -> int:
    """Words in a reply (for length checks)."""
    return len(words(text))


def usable_pairs(record: dict, pref: Preference) -> list[tuple[int, int]]:
    """Reply index pairs (better, worse) whose scores differ by more than the preference's margin."""
    s = [pref.score(record["prompt"], r) for r in record["replies"]]
    out = []
    for i, j in itertools.combinations(range(len(s)), 2):
        if abs(s[i] - s[j]) > pref.margin:
            out.append((i, j) if s[i] > s[j] else (j, i))
    return out


def _flipped(pref: Preference, seed: int, pid: str, a: int, b: int) -> bool:
    """Whether this pair's label is flipped: a fixed coin per (seed, prompt, reply pair)."""
    return pref.flip > 0 and random.Random(f"{seed}|{pid}|{min(a, b)}|{max(a, b)}").random() < pref.flip


def _pick(cands: list[tuple[int, int]], replies: list[str], want_shorter: Optional[bool]) -> tuple[int, int]:
    """The first candidate whose chosen reply is shorter (or not) as wanted, else the first one."""
    for a, b in cands:
        if want_shorter is None or (_word_count(replies[a]) < _word_count(replies[b])) == want_shorter:
            return a, b
    return cands[0]


def make_pairs(pool: Sequence[dict], preference: str, prompt_ids: Sequence[str], seed: int,
               n: Optional[int] = None, max_per_prompt: Optional[int] = None,
               balance: Optional[bool] = None) -> list[dict]:
    """Labelled pairs ``{prompt_id, prompt, chosen, rejected}``, deterministic given (seed, prompt ids).

    Rounds over the prompts in a seeded order take one new reply pair per prompt each, until ``n``
    pairs (``None``: one round) or ``max_per_prompt`` rounds. Ties (score gap <= margin) are skipped.
    With length balancing the pick alternates between pairs whose chosen reply is shorter and longer,
    so length alone cannot predict the label. Noisy preferences flip a fixed share of labels.
    """
    pref = PREFERENCES[preference]
    balance = pref.balance_length if balance is None else balance
    by_id = {r["prompt_id"]: r for r in pool}
    rng = random.Random(seed)
    ids = sorted(set(prompt_ids))
    cands = {pid: usable_pairs(by_id[pid], pref) for pid in ids}
    for pid in ids:
        rng.shuffle(cands[pid])
    rounds = max_per_prompt or (1 if n is None else max(map(len, cands.values()), default=0))
    pairs: list[dict] = []
    shorter = 0
    for _ in range(rounds):
        order = [pid for pid in ids if cands[pid]]
        rng.shuffle(order)
        for pid in order:
            if n is not None and len(pairs) >= n:
                return pairs
            replies = by_id[pid]["replies"]
            a, b = _pick(cands[pid], replies, (2 * shorter <= len(pairs)) if balance else None)
            cands[pid].remove((a, b))
            shorter += _word_count(replies[a]) < _word_count(replies[b])
            if _flipped(pref, seed, pid, a, b):
                a, b = b, a
            pairs.append({"prompt_id": pid, "prompt": by_id[pid]["prompt"], "chosen": replies[a],
                          "rejected": replies[b]})
    return pairs


def heldout_pairs(pool: Sequence[dict], preference: str, n: int = HELDOUT_PAIRS) -> list[dict]:
    """The fixed held-out pairs of a preference (at most 2 per held-out prompt)."""
    _, heldout = split_prompts(pool)
    return make_pairs(pool, preference, heldout, seed=HELDOUT_SEED, n=n, max_per_prompt=2)


# ------------------------------------------------------------------------------------------------ stats
def length_feature(pair: dict) -> float:
    """Difference of log word counts, chosen minus rejected."""
    return math.log1p(_word_count(pair["chosen"])) - math.log1p(_word_count(pair["rejected"]))


def fit_length_model(pairs: Sequence[dict], l2: float = 1e-3, steps: int = 50) -> float:
    """Weight w of P(chosen) = sigmoid(w * dlogwords), by Newton's method on the pairwise log-likelihood."""
    xs = [length_feature(p) for p in pairs]
    w = 0.0
    for _ in range(steps):
        sig = [1 / (1 + math.exp(-w * x)) for x in xs]
        grad = sum((1 - s) * x for s, x in zip(sig, xs)) - l2 * w
        hess = -sum(s * (1 - s) * x * x for s, x in zip(sig, xs)) - l2
        w -= grad / hess
    return w


def length_accuracy(w: float, pairs: Sequence[dict]) -> float:
    """Share of pairs the length-only model gets right (a zero margin counts half)."""
    margins = [w * length_feature(p) for p in pairs]
    return sum(1.0 if m > 0 else 0.5 if m == 0 else 0.0 for m in margins) / max(1, len(margins))


def chosen_shorter(pairs: Sequence[dict]) -> float:
    """Share of pairs whose chosen reply has fewer words."""
    return sum(_word_count(p["chosen"]) < _word_count(p["rejected"]) for p in pairs) / max(1, len(pairs))


def preference_stats(pool: Sequence[dict], preference: str, balance: Optional[bool] = None) -> dict:
    """Usable pairs in train/held-out, chosen-is-shorter share and length-only accuracy on held-out."""
    pref = PREFERENCES[preference]
    train, held = split_prompts(pool)
    by_id = {r["prompt_id"]: r for r in pool}
    test = make_pairs(pool, preference, held, seed=HELDOUT_SEED, n=HELDOUT_PAIRS, max_per_prompt=2, balance=balance)
    fit = make_pairs(pool, preference, train, seed=0, n=256, balance=balance)
    return {"preference": preference, "kind": pref.kind,
            "usable_train": sum(len(usable_pairs(by_id[i], pref)) for i in train),
            "usable_heldout": sum(len(usable_pairs(by_id[i], pref)) for i in held),
            "train_pairs": len(fit), "heldout_pairs": len(test), "chosen_shorter": chosen_shorter(test),
            "length_acc": length_accuracy(fit_length_model(fit), test)}


