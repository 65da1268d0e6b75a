"""Training data from what annotators stored: preference pairs, pointwise scores, KTO rows, and the split.

Pure functions over ``Store.feedback_rows(agent)`` (plain dicts, no model, no SQL). Every row carries the
chat ``prompt`` a policy saw (system prompt + the branch before the reply) plus bookkeeping used by the
split: ``context_key`` and ``conversation_ids``.

Rules, in the order they apply:
- feedback from excluded annotators (config list + annotators the Store marks excluded) is left out;
- an annotator's effective rating of a reply is the latest non-null value of each field (``fold_ratings``), and
  a withdrawn thumb or score counts as none (a thumb clicked again is taken back);
  a reply's rating is the mean over its annotators; a reply is "unsafe" when any of them flagged it Unsafe;
- a comparison gives a pair when its winner is ``a`` or ``b`` (an annotator's latest vote on a pair counts);
  ties and ``both_bad`` give none;
- sibling replies (same parent: regenerations) give a pair when their ratings differ: thumbs decide first,
  then scores; only rated vs rated unless ``rated_vs_unrated`` (then a thumbs-up beats an unrated sibling);
- an Unsafe-flagged reply is always the rejected one against an unflagged sibling;
- two replies with the same text (up to whitespace) never form a pair, whatever their votes or ratings say: it
  would teach the reward model that a text is better than itself (``skipped`` collects them with the reason);
- the margin is ``margin_per_score`` times the chosen reply's score lead (0 without two scores).
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Iterable, Optional

from storage.ratings import fold_ratings

UNSAFE = "Unsafe"
SOURCES = ("comparison", "siblings", "unsafe", "rated_vs_unrated")
IDENTICAL = "identical texts: a reply cannot be preferred to itself"


def same_text(a: str, b: str) -> bool:
    """True for two replies that say the same thing word for word (whitespace aside): never a preference pair."""
    return a.split() == b.split()


class NotEnoughData(RuntimeError):
    """Too little usable feedback to train; ``needed`` and ``have`` say how much."""

    def __init__(self, message: str, needed: int = 0, have: int = 0, missing: str = ""):
        super().__init__(message)
        self.needed = needed
        self.have = have
        self.missing = missing or message  # what to add, as a short phrase ("11 more preference pairs ...")


class DataError(ValueError):
    """Feedback rows that contradict each other (a corrupted database or import): names the bad row."""


@dataclass(frozen=True)
class ReplyRating:
    """A reply's rating over its (non-excluded) annotators."""

    thumb: Optional[float]  # mean of -1/+1 thumbs
    score: Optional[float]  # mean of 1..5 scores
    unsafe: bool
    target: Optional[float]  # pointwise target in [0, 1]

    @property
    def rated(self) -> bool:
        return self.thumb is not None or self.score is not None


class Feedback:
    """Validated, indexed feedback rows of one agent (raises DataError on rows that do not fit together)."""

    def __init__(self, rows: dict, exclude_annotators: Iterable[str] = ()):
        for key in ("conversations", "messages", "ratings", "comparisons"):
            if not isinstance(rows.get(key), list):
                raise DataError(f"feedback rows lack the list {key!r}")
        self.excluded = set(exclude_annotators) | set(rows.get("excluded_annotators") or [])
        self.conversations = {c["id"]: c for c in rows["conversations"]}
        self.messages = {m["id"]: m for m in rows["messages"]}
        for m in self.messages.values():
            if m.get("role") not in ("user", "assistant"):
                raise DataError(f"message {m['id']} has an unknown role {m.get('role')!r}")
            if m.get("conversation_id") not in self.conversations:
                raise DataError(f"message {m['id']} belongs to unknown conversation {m.get('conversation_id')}")
            if not isinstance(m.get("content"), str) or not isinstance(m.get("context_key"), str):
                raise DataError(f"message {m['id']} has no text content or context_key")
            parent = m.get("parent_id")
            if parent is not None and (parent not in self.messages
                                       or self.messages[parent]["conversation_id"] != m["conversation_id"]):
                raise DataError(f"message {m['id']} has parent {parent}, which is not in its conversation")
        self.children: dict[Optional[int], list[dict]] = {}
        for m in self.messages.values():
            self.children.setdefault(m["parent_id"], []).append(m)
        self.ratings = {mid: self._aggregate(events) for mid, events in self._rating_events(rows["ratings"]).items()}
        self.comparisons = [c for c in rows["comparisons"] if self._check_comparison(c)]
        self._prompts: dict[int, list[dict]] = {}

    def _rating_events(self, ratings: list[dict]) -> dict[int, dict[Optional[str], list]]:
        by_message: dict[int, dict[Optional[str], list]] = {}
        for r in ratings:
            msg = self.messages.get(r.get("message_id"))
            if msg is None:
                raise DataError(f"rating {r.get('id')} refers to unknown message {r.get('message_id')}")
            if msg["role"] != "assistant":
                raise DataError(f"rating {r['id']} rates message {msg['id']}, which is not a reply")
            if r.get("thumb") not in (None, -1, 1) or r.get("score") not in (None, 1, 2, 3, 4, 5):
                raise DataError(f"rating {r['id']} has thumb {r.get('thumb')!r} / score {r.get('score')!r} "
                                "outside -1|1 and 1..5")
            if r.get("flags") is not None and not isinstance(r["flags"], list):
                raise DataError(f"rating {r['id']} has flags {r['flags']!r}; expected a list")
            if r.get("annotator") in self.excluded:
                continue
            by_message.setdefault(msg["id"], {}).setdefault(r.get("annotator"), []).append(SimpleNamespace(**r))
        return by_message

    @staticmethod
    def _aggregate(events: dict[Optional[str], list]) -> ReplyRating:
        states = [fold_ratings(sorted(rows, key=lambda r: r.id)) for rows in events.values()]
        thumbs = [s["thumb"] for s in states if s["thumb"] is not None]
        scores = [s["score"] for s in states if s["score"] is not None]
        unsafe = any(UNSAFE in (s["flags"] or []) for s in states)
        # Pointwise target per annotator: the 1..5 score scaled to [0, 1], else the thumb as 1/0.
        values = [(s["score"] - 1) / 4 if s["score"] is not None else (s["thumb"] + 1) / 2
                  for s in states if s["score"] is not None or s["thumb"] is not None]
        target = 0.0 if unsafe else (sum(values) / len(values) if values else None)
        return ReplyRating(thumb=sum(thumbs) / len(thumbs) if thumbs else None,
                           score=sum(scores) / len(scores) if scores else None, unsafe=unsafe, target=target)

    def _check_comparison(self, c: dict) -> bool:
        for side in ("message_a_id", "message_b_id"):
            msg = self.messages.get(c.get(side))
            if msg is None or msg["role"] != "assistant":
                raise DataError(f"comparison {c.get('id')} refers to {side[8]} = message {c.get(side)}, "
                                "which is not a known reply")
        if c.get("winner") not in ("a", "b", "tie", "both_bad"):
            raise DataError(f"comparison {c.get('id')} has an unknown winner {c.get('winner')!r}")
        return c.get("annotator") not in self.excluded

    def rating(self, message_id: int) -> ReplyRating:
        """The reply's rating (unrated when nobody rated it)."""
        return self.ratings.get(message_id, ReplyRating(None, None, False, None))

    def prompt(self, message_id: int) -> list[dict]:
        """Chat messages a policy saw before this reply: system prompt + the branch history."""
        if message_id not in self._prompts:
            msg = self.messages[message_id]
            chain, seen, parent = [], {message_id}, msg["parent_id"]
            while parent is not None:
                if parent in seen:
                    raise DataError(f"message {message_id} has a cycle in its parent chain at {parent}")
                seen.add(parent)
                chain.append(self.messages[parent])
                parent = self.messages[parent]["parent_id"]
            system = self.conversations[msg["conversation_id"]].get("system_prompt") or ""
            # An empty system prompt is left out, exactly as the serving path builds its prompt.
            head = [{"role": "system", "content": system}] if system else []
            self._prompts[message_id] = head + [{"role": m["role"], "content": m["content"]} for m in chain[::-1]]
        return [dict(m) for m in self._prompts[message_id]]

    def replies(self) -> list[dict]:
        """Every assistant message, oldest first."""
        return [m for m in self.messages.values() if m["role"] == "assistant"]


def _margin(chosen: ReplyRating, rejected: ReplyRating, margin_per_score: float) -> float:
    if chosen.score is None or rejected.score is None:
        return 0.0
    return margin_per_score * max(0.0, chosen.score - rejected.score)


def _prefer(a: ReplyRating, b: ReplyRating, rated_vs_unrated: bool) -> Optional[tuple[bool, str]]:
    """(a wins?, source) for two sibling replies, or None when their ratings give no preference."""
    if a.unsafe != b.unsafe:
        return b.unsafe, "unsafe"
    if a.rated and b.rated:
        if a.thumb is not None and b.thumb is not None and a.thumb != b.thumb:
            return a.thumb > b.thumb, "siblings"
        if a.score is not None and b.score is not None and a.score != b.score:
            return a.score > b.score, "siblings"
        return None
    if rated_vs_unrated and not a.unsafe:
        if a.rated and not b.rated and (a.thumb or 0) > 0:
            return True, "rated_vs_unrated"
        if b.rated and not a.rated and (b.thumb or 0) > 0:
            return False, "rated_vs_unrated"
    return None


def _pair(fb: Feedback, chosen: dict, rejected: dict, source: str, margin_per_score: float) -> dict:
    return {"prompt": fb.prompt(chosen["id"]), "chosen": chosen["content"], "rejected": rejected["content"],
            "margin": _margin(fb.rating(chosen["id"]), fb.rating(rejected["id"]), margin_per_score),
            "source": source, "chosen_id": chosen["id"], "rejected_id": rejected["id"],
            "context_key": chosen["context_key"],
            "conversation_ids": sorted({chosen["conversation_id"], rejected["conversation_id"]})}


def build_pairs(rows: dict, exclude_annotators: Iterable[str] = (), margin_per_score: float = 0.25,
                rated_vs_unrated: bool = False, skipped: Optional[list] = None) -> list[dict]:
    """Preference pairs ``{prompt, chosen, rejected, margin, source, ...}``. A pair the votes or ratings would give
    but the rules refuse (two identical texts) goes to ``skipped`` when given, as ``{chosen_id, rejected_id,
    source, reason}``."""
    fb = Feedback(rows, exclude_annotators)
    pairs, covered = [], set()
    skipped = [] if skipped is None else skipped

    def add(chosen: dict, rejected: dict, source: str) -> None:
        if same_text(chosen["content"], rejected["content"]):
            skipped.append({"chosen_id": chosen["id"], "rejected_id": rejected["id"], "source": source,
                            "reason": IDENTICAL})
        else:
            pairs.append(_pair(fb, chosen, rejected, source, margin_per_score))

    # Comparisons: the rows are the ones that count (an annotator's latest vote per pair of replies), as
    # Store.feedback_rows hands them out: the same votes the leaderboard and the exports count.
    for c in sorted(fb.comparisons, key=lambda c: c["id"]):
        if c["winner"] not in ("a", "b"):
            continue
        a, b = fb.messages[c["message_a_id"]], fb.messages[c["message_b_id"]]
        if a["context_key"] != b["context_key"]:
            continue  # an arena pair answering different states is no preference over one prompt
        chosen, rejected = (a, b) if c["winner"] == "a" else (b, a)
        source = "comparison"
        if fb.rating(chosen["id"]).unsafe and not fb.rating(rejected["id"]).unsafe:
            chosen, rejected, source = rejected, chosen, "unsafe"
        add(chosen, rejected, source)
        covered.add(frozenset((a["id"], b["id"])))
    # Siblings: regenerations of the same parent whose ratings differ.
    for parent_id, children in sorted(fb.children.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        replies = sorted((m for m in children if m["role"] == "assistant"), key=lambda m: m["id"])
        for a, b in itertools.combinations(replies, 2):
            if frozenset((a["id"], b["id"])) in covered:
                continue  # an explicit comparison already speaks for this pair
            verdict = _prefer(fb.rating(a["id"]), fb.rating(b["id"]), rated_vs_unrated)
            if verdict is not None:
                a_wins, source = verdict
                add(a if a_wins else b, b if a_wins else a, source)
    return pairs


def feedback_votes(rows: dict, exclude_annotators: Iterable[str] = ()) -> int:
    """Comparisons (ties and both-bad included) and ratings of the annotators not excluded: the feedback a
    retrain's minimum counts."""
    fb = Feedback(rows, exclude_annotators)
    return len(fb.comparisons) + sum(1 for r in rows["ratings"] if r.get("annotator") not in fb.excluded)


def build_pointwise(rows: dict, exclude_annotators: Iterable[str] = ()) -> list[dict]:
    """Rows ``{prompt, completion, score}`` with score in [0, 1] (1..5 scaled, thumbs 1/0, Unsafe 0)."""
    fb = Feedback(rows, exclude_annotators)
    out = []
    for m in fb.replies():
        r = fb.rating(m["id"])
        if r.target is None:
            continue
        out.append({"prompt": fb.prompt(m["id"]), "completion": m["content"], "score": r.target,
                    "message_id": m["id"], "context_key": m["context_key"], "conversation_ids": [m["conversation_id"]]})
    return out


def build_kto(rows: dict, exclude_annotators: Iterable[str] = ()) -> list[dict]:
    """Rows ``{prompt, completion, label}`` from thumbs (mean thumb > 0 is desirable; Unsafe never is)."""
    fb = Feedback(rows, exclude_annotators)
    out = []
    for m in fb.replies():
        r = fb.rating(m["id"])
        if r.unsafe:
            label = False
        elif r.thumb is None or r.thumb == 0:
            continue
        else:
            label = r.thumb > 0
        out.append({"prompt": fb.prompt(m["id"]), "completion": m["content"], "label": label,
                    "message_id": m["id"], "context_key": m["context_key"], "conversation_ids": [m["conversation_id"]]})
    return out


def count_sources(pairs: list[dict]) -> dict[str, int]:
    """Pairs per source (comparison, siblings, unsafe, rated_vs_unrated)."""
    return {s: sum(1 for p in pairs if p.get("source") == s) for s in SOURCES}


def _components(rows: list[dict]) -> dict[int, set[int]]:
    """Conversations joined when rows link them (a cross-conversation pair, or the same context)."""
    parent: dict = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for row in rows:
        nodes = [("c", c) for c in row["conversation_ids"]] + [("k", row["context_key"])]
        for node in nodes[1:]:
            parent[find(node)] = find(nodes[0])
    groups: dict = {}
    for node in list(parent):
        if node[0] == "c":
            groups.setdefault(find(node), set()).add(node[1])
    return {min(convs): convs for convs in groups.values()}


def split_by_conversation(rows: list[dict], eval_fraction: float = 0.2, seed: int = 0) -> tuple[list, list]:
    """(train, held-out) rows: whole conversations go to one side, and no context lands on both.

    Conversations that share a context (or a pair) form one group. Groups are ranked by a seeded hash of their
    first conversation id, so the split is deterministic and a conversation keeps its side as data grows;
    held-out groups are taken in rank order up to ``eval_fraction`` of the conversations (at least one group
    when there are two or more, never all of them).
    """
    if not rows or eval_fraction <= 0:
        return list(rows), []
    groups = _components(rows)
    if len(groups) < 2:
        return list(rows), []
    rank = sorted(groups, key=lambda g: hashlib.sha256(f"{seed}:{g}".encode()).hexdigest())
    total = sum(len(c) for c in groups.values())
    target = max(1, round(eval_fraction * total))
    held: set[int] = set()
    n_held = 0
    for g in rank[:-1]:
        if n_held + len(groups[g]) <= target:
            held.add(g)
            n_held += len(groups[g])
    if not held:  # every group is bigger than the target: hold out the smallest one
        held.add(min(rank[:-1], key=lambda g: len(groups[g])))
    held_convs = set().union(*(groups[g] for g in held))
    train = [r for r in rows if not set(r["conversation_ids"]) & held_convs]
    held_out = [r for r in rows if set(r["conversation_ids"]) & held_convs]
    return train, held_out


def group_labels(rows: list[dict]) -> list[str]:
    """One label per row: rows whose conversations share a context (or a pair) get the same label.

    Cross-validation folds by these labels, so no context is on both sides of a fold.
    """
    groups = _components(rows)
    owner = {conv: g for g, convs in groups.items() for conv in convs}
    return [str(owner[row["conversation_ids"][0]]) if row.get("conversation_ids") else f"k:{row['context_key']}"
            for row in rows]


@dataclass(frozen=True)
class FeedbackSnapshot:
    """One read of an agent's feedback: the watermark and the rows it covers (``Store.feedback_snapshot``). A
    retrain takes it once and hands these rows to the reward model, the prompt sets and the counts."""

    watermark: dict
    rows: dict

    @classmethod
    def take(cls, store, agent: int | str) -> "FeedbackSnapshot":
        return cls(*store.feedback_snapshot(agent))

    @property
    def feedback_count(self) -> int:
        """Ratings + comparisons the snapshot covers."""
        return len(self.rows["ratings"]) + len(self.rows["comparisons"])
