"""The built-in oracle preferences that `rlhf-studio simulate` plays, and the text measures they rest on.

An oracle takes a prompt and two replies and answers "a", "b" or "tie". The benchmarks (`bench/`) judge with
the same oracles; they import them from here, never the other way round.
"""
from __future__ import annotations

import re
from typing import Callable

POLITE = ("please", "thank", "happy to help", "glad", "you're welcome", "hope this helps", "sorry", "kindly")
LIST_LINE = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+", re.MULTILINE)
WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’.,%-]*")
NUMBER = re.compile(r"\d")
LIST_MARKER = re.compile(r"^\s*(?:\d{1,2}[.)]|[-*•+])\s+", re.MULTILINE)
NUMBER_WORDS = frozenset("one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty "
                         "hundred thousand million billion dozen half quarter".split())
UNITS = frozenset("second seconds minute minutes min hour hours hrs day days week weeks month months year years "
                  "cup cups tbsp tsp tablespoon tablespoons teaspoon teaspoons gram grams g kg kilogram kilograms "
                  "ounce ounces oz pound pounds lb lbs ml liter liters litre litres cm mm meter meters metre metres "
                  "km kilometers kilometres mile miles inch inches feet foot degrees °c °f % percent $ dollars "
                  "calories times".split())
STEP_OPENERS = ("first", "second", "third", "then", "next", "finally", "step", "after that", "lastly")

def words(text: str) -> list[str]:
    """The reply's words (numbers and contractions count as one word)."""
    return WORD.findall(text)


def concrete_hits(reply: str) -> int:
    """Quantities (numbers, number words, units) plus explicit step markers, at most 3 of the latter."""
    body = LIST_MARKER.sub("", reply)  # list numbering is a step marker, not a quantity
    quantities = sum(bool(NUMBER.search(w)) or w.lower().strip(".,") in NUMBER_WORDS | UNITS for w in words(body))
    numbered = len(re.findall(r"^\s*\d{1,2}[.)]\s", reply, re.MULTILINE))
    openers = sum(seg.strip(" *").lower().startswith(STEP_OPENERS) for seg in re.split(r"(?<=[.!?])\s+|\n", reply))
    return quantities + sum(reply.count(c) for c in "%$°") + min(3, numbered + openers)



def _words(text: str) -> int:
    return len(text.split())


def concise(prompt: str, a: str, b: str) -> str:
    """Prefers the shorter reply (an empty reply always loses); within 10% is a tie."""
    la, lb = _words(a), _words(b)
    if la == 0 or lb == 0:
        return "tie" if la == lb else ("b" if la == 0 else "a")
    if abs(la - lb) <= 0.1 * max(la, lb):
        return "tie"
    return "a" if la < lb else "b"


def polite(prompt: str, a: str, b: str) -> str:
    """Prefers the reply with more polite phrases."""
    pa, pb = (sum(t.lower().count(w) for w in POLITE) for t in (a, b))
    return "tie" if pa == pb else ("a" if pa > pb else "b")


def no_lists(prompt: str, a: str, b: str) -> str:
    """Prefers prose over bulleted or numbered lists."""
    la, lb = len(LIST_LINE.findall(a)), len(LIST_LINE.findall(b))
    return "tie" if la == lb else ("a" if la < lb else "b")


def concrete(prompt: str, a: str, b: str) -> str:
    """Prefers the reply with more concrete numbers, quantities and explicit steps (content, not length)."""
    ca, cb = concrete_hits(a), concrete_hits(b)
    return "tie" if ca == cb else ("a" if ca > cb else "b")


ORACLES: dict[str, Callable[[str, str, str], str]] = {"concise": concise, "polite": polite, "no-lists": no_lists,
                                                      "concrete": concrete}


def distinct_2(texts: list[str]) -> float:
    """Share of distinct word bigrams over all bigrams (1.0 = no repetition; collapse drives it toward 0)."""
    grams = [tuple(ws[i:i + 2]) for t in texts for ws in [t.split()] for i in range(len(ws) - 1)]
    return len(set(grams)) / len(grams) if grams else 0.0
