"""Comparisons and arena pairs: which of two replies to the same context a person preferred. Append-only; the
one query every reader goes through (``_counted_comparisons``) keeps each person's latest vote per pair of replies."""
from __future__ import annotations

import uuid
from typing import Optional

from storage.errors import Conflict, InvalidInput, NotFound
from storage.records import ArenaPair, Comparison
from storage.util import utcnow

WINNERS = ("a", "b", "tie", "both_bad")


class ComparisonsMixin:
    """Methods of Store that record and read comparisons and arena rounds."""

    def record_comparison(self, message_a_id: int, message_b_id: int, winner: str,
                          annotator: Optional[str] = None, pair_id: Optional[str] = None,
                          queue_item_id: Optional[int] = None) -> Comparison:
        """Store a preference between two replies to the same context (one vote per arena pair).

        Append-only: a changed mind is a new row, and an annotator's latest vote on a pair of replies (in either
        order) is the one that counts (``list_comparisons``); repeating the counted verdict stores nothing. A reply
        of an arena round or a vote-queue item is compared only inside its own pair or item (``pair_id`` /
        ``queue_item_id``, set by ``vote_arena_pair`` and ``vote_queue_item``): paired with anything else it would
        tell a voter which version wrote it, or vote twice.
        """
        if winner not in WINNERS:
            raise InvalidInput(f"winner must be one of {list(WINNERS)}, got {winner!r}")
        a, b = self.get_message(message_a_id), self.get_message(message_b_id)
        if a.id == b.id:
            raise InvalidInput("a comparison needs two different messages")
        for m in (a, b):
            if m.role != "assistant":
                raise InvalidInput(f"message {m.id} is not a reply; only replies can be compared")
        if pair_id is None and a.context_key != b.context_key:
            raise InvalidInput(f"messages {a.id} and {b.id} answer different contexts; compare replies to the "
                               "same conversation state (siblings or identical histories)")
        for m in (a, b):
            if m.policy_id is not None:
                status = self.get_policy(m.policy_id).status
                if status in ("archived", "broken"):
                    raise Conflict(f"message {m.id} comes from a version that is {status}; votes on it are closed")
        if pair_id is None and queue_item_id is None:
            self._refuse_paired(a.id, b.id)
        annotator_id = self.annotator_id(annotator)
        with self._tx() as db:
            if pair_id is not None:
                existing = self._one("SELECT * FROM comparisons WHERE pair_id = ?", [pair_id])
            else:
                existing = self._one(
                    """SELECT * FROM comparisons WHERE annotator_id IS ? AND ((message_a_id = ? AND message_b_id = ?)
                       OR (message_a_id = ? AND message_b_id = ?)) ORDER BY id DESC LIMIT 1""",
                    [annotator_id, a.id, b.id, b.id, a.id])
                if existing and _verdict(existing, a.id) != _verdict({"message_a_id": a.id, "winner": winner}, a.id):
                    existing = None  # a changed mind is a new event (and the one that counts)
            if existing:
                return Comparison.from_row(existing)
            comp_id = self._insert(db, "comparisons", {
                "message_a_id": a.id, "message_b_id": b.id, "policy_a_id": a.policy_id, "policy_b_id": b.policy_id,
                "winner": winner, "annotator_id": annotator_id, "pair_id": pair_id, "created": utcnow()})
        return Comparison.from_row(self._one("SELECT * FROM comparisons WHERE id = ?", [comp_id]))

    def _refuse_paired(self, a_id: int, b_id: int) -> None:
        """Conflict when a reply belongs to an arena round or a vote-queue item (they are voted there only)."""
        for mid in (a_id, b_id):
            pair = self._one("""SELECT p.id, c.id AS voted FROM arena_pairs p
                                LEFT JOIN comparisons c ON c.pair_id = p.id
                                WHERE p.message_a_id = ? OR p.message_b_id = ? LIMIT 1""", [mid, mid])
            if pair is not None and (pair["voted"] is None or {a_id, b_id} == set(self._pair_messages(pair["id"]))):
                raise Conflict(f"reply {mid} belongs to arena pair {pair['id']}: it is compared only with its other "
                               f"side, by voting on the round (POST /api/v1/arena/{pair['id']}/vote)")
            item = self._one("SELECT id FROM queue_items WHERE message_a_id = ? OR message_b_id = ? LIMIT 1",
                             [mid, mid])
            if item is not None:
                raise Conflict(f"reply {mid} is part of vote-queue item {item['id']}: it is compared only with its "
                               f"other reply, by voting on the item (POST /api/v1/queue/{item['id']}/vote)")

    def _pair_messages(self, pair_id: str) -> tuple[int, int]:
        row = self._one("SELECT message_a_id, message_b_id FROM arena_pairs WHERE id = ?", [pair_id])
        return row["message_a_id"], row["message_b_id"]

    def _counted_comparisons(self, agent_id: Optional[int] = None, until_id: int = 2**62,
                             with_text: bool = False) -> list[dict]:
        """THE comparisons that count, the one query every reader goes through (leaderboard, reward-model data,
        exports, quality stats): per annotator (the anonymous one counts as one person) and unordered pair of
        replies, the latest vote with id <= ``until_id``; oldest first, with the annotator's name, ``blind`` (1 for
        a vote cast on an arena round or a vote-queue item: the voter neither chose the versions nor saw them)
        and (``with_text``) both replies' text as ``text_a``, ``text_b``."""
        where, params = "x.id <= ?", [until_id]
        text, joins = ("", "") if not with_text else (
            ", ma.content AS text_a, mb.content AS text_b",
            "\n            JOIN messages ma ON ma.id = k.message_a_id JOIN messages mb ON mb.id = k.message_b_id")
        if agent_id is not None:
            where += """ AND x.message_a_id IN (SELECT m.id FROM messages m JOIN conversations v
                                                ON v.id = m.conversation_id WHERE v.agent_id = ?)"""
            params.append(agent_id)
        return self._all(f"""
            SELECT k.*, a.name AS annotator{text},
                   (k.pair_id IS NOT NULL OR k.id IN (SELECT q.comparison_id FROM queue_assignments q
                                                      WHERE q.comparison_id IS NOT NULL)) AS blind FROM (
                SELECT x.*, ROW_NUMBER() OVER (
                    PARTITION BY COALESCE(x.annotator_id, 0), MIN(x.message_a_id, x.message_b_id),
                                 MAX(x.message_a_id, x.message_b_id)
                    ORDER BY x.id DESC) AS vote_rank
                FROM comparisons x WHERE {where}) k
            LEFT JOIN annotators a ON a.id = k.annotator_id{joins}
            WHERE k.vote_rank = 1 ORDER BY k.id""", params)

    def list_comparisons(self, agent: int | str | None = None, history: bool = False,
                         with_text: bool = False) -> list[Comparison]:
        """The comparisons that count (an annotator's latest vote per pair of replies), optionally of one agent's
        conversations, oldest first; ``history=True``: every vote ever cast, superseded ones included;
        ``with_text`` adds both replies' text (``text_a``, ``text_b``: the leaderboard's style control reads them)."""
        agent_id = None if agent is None else self.get_agent(agent).id
        if not history:
            return [Comparison.from_row(r) for r in self._counted_comparisons(agent_id, with_text=with_text)]
        text = ", m.content AS text_a, mb.content AS text_b" if with_text else ""
        where, params = ("WHERE v.agent_id = ?", [agent_id]) if agent_id is not None else ("", [])
        rows = self._all(f"""SELECT c.*{text} FROM comparisons c JOIN messages m ON m.id = c.message_a_id
                             JOIN messages mb ON mb.id = c.message_b_id
                             JOIN conversations v ON v.id = m.conversation_id {where} ORDER BY c.id""", params)
        return [Comparison.from_row(r) for r in rows]

    def vote_mark(self) -> int:
        """The newest comparison's id (0 before any): votes are append-only, so it changes with every vote cast."""
        return self._one("SELECT COALESCE(MAX(id), 0) AS mark FROM comparisons")["mark"]

    def create_arena_pair(self, agent: int | str, message_a_id: int, message_b_id: int) -> ArenaPair:
        """Remember which two replies an arena round showed (policies stay hidden until the vote)."""
        agent_id = self.get_agent(agent).id
        self.get_message(message_a_id), self.get_message(message_b_id)
        pair_id = uuid.uuid4().hex
        with self._tx() as db:
            self._insert(db, "arena_pairs", {"id": pair_id, "agent_id": agent_id, "message_a_id": message_a_id,
                                             "message_b_id": message_b_id, "created": utcnow()})
        return self.get_arena_pair(pair_id)

    def get_arena_pair(self, pair_id: str) -> ArenaPair:
        if not isinstance(pair_id, str):
            raise InvalidInput("pair_id must be a string")
        row = self._one("SELECT * FROM arena_pairs WHERE id = ?", [pair_id])
        if row is None:
            raise NotFound(f"unknown arena pair {pair_id!r}")
        return ArenaPair.from_row(row)

    def vote_arena_pair(self, pair_id: str, winner: str, annotator: Optional[str] = None) -> Comparison:
        """Record the vote of an arena round; voting twice returns the first vote."""
        pair = self.get_arena_pair(pair_id)
        row = self._one("SELECT * FROM comparisons WHERE pair_id = ?", [pair_id])
        if row is not None:
            return Comparison.from_row(row)
        return self.record_comparison(pair.message_a_id, pair.message_b_id, winner, annotator, pair_id=pair_id)

    def is_blind(self, message_id: int) -> bool:
        """True while a reply belongs to an arena pair nobody has voted on (its version stays hidden)."""
        row = self._one("""SELECT p.id FROM arena_pairs p LEFT JOIN comparisons c ON c.pair_id = p.id
                           WHERE (p.message_a_id = ? OR p.message_b_id = ?) AND c.id IS NULL LIMIT 1""",
                        [message_id, message_id])
        return row is not None

    def arena_vote(self, pair_id: str) -> Optional[Comparison]:
        """The vote cast on an arena pair, or None while it is still blind."""
        self.get_arena_pair(pair_id)
        row = self._one("SELECT * FROM comparisons WHERE pair_id = ?", [pair_id])
        return Comparison.from_row(row) if row else None


def _verdict(row: dict, first_id: int) -> str:
    """A vote's winner seen from the reply ``first_id`` (a vote stored the other way round is mirrored)."""
    if row["message_a_id"] == first_id:
        return row["winner"]
    return {"a": "b", "b": "a"}.get(row["winner"], row["winner"])
