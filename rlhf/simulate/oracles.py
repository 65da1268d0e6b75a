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


CONTRACTION = re.compile(r"\b\w+['’](?:s|re|ll|ve|d|t|m)\b", re.IGNORECASE)
FORMAL = re.compile(r"\b(?:however|therefore|furthermore|moreover|additionally|consequently|thus|hence|"
                    r"in conclusion|it is important to note)\b", re.IGNORECASE)
EXAMPLE = re.compile(r"\b(?:for example|for instance|e\.g\.|such as|imagine|let['’]s say|consider)\b", re.IGNORECASE)
CAREFUL = re.compile(r"\b(?:safe|safely|safety|careful|carefully|caution|consult|doctor|professional|expert|risks?|"
                     r"avoid|warning|harm|harmful|danger|dangerous|make sure|be sure|check with|seek|emergency|"
                     r"side effects|may|might|generally|usually|depends|it['’]s best|recommended)\b", re.IGNORECASE)


def _more(count: Callable[[str], float]) -> Callable[[str, str, str], str]:
    """An oracle preferring the reply where ``count`` is higher (equal counts tie)."""
    def judge(prompt: str, a: str, b: str) -> str:
        ca, cb = count(a), count(b)
        return "tie" if ca == cb else ("a" if ca > cb else "b")
    return judge


def paragraphs(text: str) -> int:
    """Paragraphs: blocks between blank lines (a format preference: airy layout over one block)."""
    return len([p for p in re.split(r"\n\s*\n", text) if p.strip()])


def casual_register(text: str) -> int:
    """Contractions minus twice the formal connectives (a register preference: conversational over formal)."""
    return len(CONTRACTION.findall(text)) - 2 * len(FORMAL.findall(text))


# Four more kinds the first four do not cover (#40): a format, a register, a content and a safety preference.
paragraphed = _more(paragraphs)
casual = _more(casual_register)
examples = _more(lambda t: len(EXAMPLE.findall(t)))
careful = _more(lambda t: len(CAREFUL.findall(t)))

ORACLES: dict[str, Callable[[str, str, str], str]] = {"concise": concise, "polite": polite, "no-lists": no_lists,
                                                      "concrete": concrete, "paragraphed": paragraphed,
                                                      "casual": casual, "examples": examples, "careful": careful}


def distinct_2(texts: list[str]) -> float:
    """Share of distinct word bigrams over all bigrams (1.0 = no repetition; collapse drives it toward 0)."""
    grams = [tuple(ws[i:i + 2]) for t in texts for ws in [t.split()] for i in range(len(ws) - 1)]
    return len(set(grams)) / len(grams) if grams else 0.0
