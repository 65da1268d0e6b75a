"""The vote queue: items (one context, two stored replies) and who was shown which, the Store's queue half.

An item's replies are ordinary messages of a conversation with source ``queue``, so a vote on an item is an
ordinary comparison (``record_comparison``): it trains the reward model and rates the versions like an arena
vote. An assignment is one annotator being shown one item; there is at most one per (item, annotator), so an
item is never shown to the same person twice. Capacity: an item wants ``votes_wanted`` counted votes (2 for the
overlap items that measure agreement); votes and unexpired leases of excluded annotators do not count, so their
items stay open for someone whose vote trains.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable, Optional

from storage.errors import Conflict, InvalidInput, NotFound
from storage.comparisons import WINNERS
from storage.records import Comparison, QueueAssignment, QueueItem
from storage.util import dumps, utcnow

ANONYMOUS = "(anonymous)"
# An assignment that counts toward an item's capacity: not from an excluded annotator, and voted or still leased.
# Parameters: excluded names (JSON list), lease cutoff (ISO time).
_HOLDS = """(SELECT COUNT(*) FROM queue_assignments s LEFT JOIN annotators n ON n.id = s.annotator_id
             WHERE s.item_id = i.id AND COALESCE(n.excluded, 0) = 0
               AND COALESCE(n.name, '') NOT IN (SELECT value FROM json_each(?))
               AND (s.voted IS NOT NULL OR (s.created > ? AND s.skipped IS NULL)))"""
# Counted votes already cast on the item. Parameter: excluded names (JSON list).
_VOTES = """(SELECT COUNT(*) FROM queue_assignments s LEFT JOIN annotators n ON n.id = s.annotator_id
             WHERE s.item_id = i.id AND s.voted IS NOT NULL AND COALESCE(n.excluded, 0) = 0
               AND COALESCE(n.name, '') NOT IN (SELECT value FROM json_each(?)))"""
# Both versions can still be voted on (record_comparison refuses archived and broken ones).
_SERVABLE = """NOT EXISTS (SELECT 1 FROM policies p WHERE p.id IN (i.policy_a_id, i.policy_b_id)
                           AND p.status IN ('archived', 'broken'))"""
_OPEN = f"i.agent_id = ? AND i.expires > ? AND {_SERVABLE} AND i.votes_wanted > {_HOLDS}"


def iso_after(seconds: float) -> str:
    """UTC ISO time ``seconds`` from now (negative: in the past), in ``utcnow``'s format."""
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


# A refused vote's words (REST and the Vote tab show them as they are).
VERDICTS = {"a": "A is better", "b": "B is better", "tie": "a tie", "both_bad": "both bad"}
NEXT = "Vote on the next item instead."

Chooser = Callable[[list[dict]], Optional[tuple[int, str]]]


class QueueMixin:
    """Methods of Store for the vote queue."""

    def _open_params(self, agent_id: int, lease_seconds: float, excluded: Iterable[str]) -> list:
        return [agent_id, utcnow(), dumps(sorted(set(excluded))), iso_after(-lease_seconds)]

    # ---- items -------------------------------------------------------------------------------
    def create_queue_item(self, agent: int | str, history: list[dict], replies: list[dict], source: str = "starter",
                          overlap_every: int = 0, ttl_seconds: float = 86400.0) -> QueueItem:
        """Store a context and its two replies (``{content, policy_id, gen_params?, latency_ms?, n_tokens?}``: with
        ``n_tokens`` a reply cut at its token limit is marked ✂️ like a chat reply) as a queue item, in one
        transaction. Every ``overlap_every``-th item of the agent wants a second annotator's vote."""
        agent_rec = self.get_agent(agent)
        if not isinstance(replies, list) or len(replies) != 2:
            raise InvalidInput("a queue item needs exactly two replies")
        with self._tx() as db:
            conv = self.create_conversation(agent_rec.id, None, source="queue", messages=history)
            user = self.leaf(conv.id)
            a, b = (self.record_reply(user.id, r["content"], r.get("policy_id"), r.get("gen_params"),
                                      r.get("latency_ms"), r.get("n_tokens")) for r in replies)
            n = self._one("SELECT COUNT(*) AS n FROM queue_items WHERE agent_id = ?", [agent_rec.id])["n"] + 1
            item_id = self._insert(db, "queue_items", {
                "agent_id": agent_rec.id, "context_key": a.context_key, "message_a_id": a.id, "message_b_id": b.id,
                "policy_a_id": a.policy_id, "policy_b_id": b.policy_id, "source": source,
                "votes_wanted": 2 if overlap_every and n % overlap_every == 0 else 1, "created": utcnow(),
                "expires": iso_after(ttl_seconds)})
        return self.get_queue_item(item_id)

    def get_queue_item(self, item_id: int) -> QueueItem:
        if isinstance(item_id, bool) or not isinstance(item_id, int):
            raise InvalidInput(f"item_id must be an integer id, got {item_id!r}")
        row = self._one("SELECT * FROM queue_items WHERE id = ?", [item_id])
        if row is None:
            raise NotFound(f"unknown queue item {item_id}")
        return QueueItem.from_row(row)

    def queue_item_context(self, item: QueueItem) -> tuple[str, list[dict]]:
        """(system prompt, history) both replies of an item answer."""
        system, history = self.state_for(item.message_a_id)
        return system, history[:-1]

    def queue_context_keys(self, agent: int | str, policy_ids: tuple) -> set[str]:
        """Context keys of the agent's items whose two replies came from these versions (in either order)."""
        a, b = policy_ids
        rows = self._all("""SELECT DISTINCT context_key FROM queue_items WHERE agent_id = ? AND
                            ((policy_a_id IS ? AND policy_b_id IS ?) OR (policy_a_id IS ? AND policy_b_id IS ?))""",
                         [self.get_agent(agent).id, a, b, b, a])
        return {r["context_key"] for r in rows}

    def open_queue_items(self, agent: int | str, lease_seconds: float, exclude_annotators: Iterable[str] = (),
                         fresh_only: bool = False) -> list[QueueItem]:
        """Items that still take a vote (not expired, versions servable, capacity left), oldest first;
        ``fresh_only``: only those nobody has been shown yet."""
        fresh = " AND NOT EXISTS (SELECT 1 FROM queue_assignments s WHERE s.item_id = i.id)" if fresh_only else ""
        rows = self._all(f"SELECT i.* FROM queue_items i WHERE {_OPEN}{fresh} ORDER BY i.id",
                         self._open_params(self.get_agent(agent).id, lease_seconds, exclude_annotators))
        return [QueueItem.from_row(r) for r in rows]

    def set_queue_scores(self, scores: Iterable[tuple[int, float, float]], scored_pairs: int) -> None:
        """Store (item id, P(A ≻ B), uncertainty) from a reward head that learned from ``scored_pairs`` pairs."""
        with self._tx() as db:
            for item_id, p_a, uncertainty in scores:
                db.execute("UPDATE queue_items SET p_a = ?, uncertainty = ?, scored_pairs = ? WHERE id = ?",
                           [float(p_a), float(uncertainty), int(scored_pairs), int(item_id)])

    # ---- assignments and votes ---------------------------------------------------------------
    def next_queue_item(self, agent: int | str, annotator: Optional[str], choose: Chooser, lease_seconds: float,
                        exclude_annotators: Iterable[str] = ()) -> Optional[tuple[QueueItem, QueueAssignment]]:
        """The item to show ``annotator`` now, or None when nothing is left for them.

        The annotator's own unvoted item while its lease lasts comes back (a reload shows the same item);
        otherwise ``choose(candidates)`` picks among open items they were never shown (dicts with ``id``,
        ``uncertainty``, ``p_a``, ``votes``, ``votes_wanted``, ``created``) and returns (item id, reason). Runs
        in one write transaction, so two annotators never take the last slot of an item together.
        """
        agent_id = self.get_agent(agent).id
        annotator_id = self.annotator_id(annotator)
        excluded = sorted(set(exclude_annotators))
        with self._tx() as db:
            held = self._one(f"""SELECT s.* FROM queue_assignments s JOIN queue_items i ON i.id = s.item_id
                                 WHERE i.agent_id = ? AND s.annotator_id IS ? AND s.voted IS NULL
                                   AND s.skipped IS NULL AND s.created > ?
                                   AND i.expires > ? AND {_SERVABLE} ORDER BY s.id LIMIT 1""",
                             [agent_id, annotator_id, iso_after(-lease_seconds), utcnow()])
            if held is not None:
                assignment = QueueAssignment.from_row(held)
                return self.get_queue_item(assignment.item_id), assignment
            candidates = self._all(
                f"""SELECT i.id, i.uncertainty, i.p_a, i.votes_wanted, i.created, {_VOTES} AS votes
                    FROM queue_items i WHERE {_OPEN} AND NOT EXISTS (
                        SELECT 1 FROM queue_assignments s WHERE s.item_id = i.id AND s.annotator_id IS ?)
                    ORDER BY i.id""",
                [dumps(excluded)] + self._open_params(agent_id, lease_seconds, excluded) + [annotator_id])
            picked = choose(candidates) if candidates else None
            if picked is None:
                return None
            item_id, reason = picked
            if item_id not in {c["id"] for c in candidates}:
                raise ValueError(f"the chooser picked item {item_id}, which is not a candidate")
            assignment_id = self._insert(db, "queue_assignments", {
                "item_id": item_id, "annotator_id": annotator_id, "reason": reason, "created": utcnow()})
        row = self._one("SELECT * FROM queue_assignments WHERE id = ?", [assignment_id])
        return self.get_queue_item(item_id), QueueAssignment.from_row(row)

    def vote_queue_item(self, item_id: int, winner: str, annotator: Optional[str], lease_seconds: float,
                        exclude_annotators: Iterable[str] = (), retry: bool = True) -> Comparison:
        """Record ``annotator``'s vote on an item as a comparison of its two replies.

        Only the item on the annotator's screen takes their vote: an item never shown to them (``next_queue_item``),
        one they skipped, an expired one, or one they already voted on with another answer is refused (Conflict,
        saying what was stored) and stores nothing. ``retry``: the same vote sent again (a client's retry) returns
        the first; without it, any second vote is refused (a page that votes twice on one item shows a stale pair).
        """
        if winner not in WINNERS:
            raise InvalidInput(f"winner must be one of {list(WINNERS)}, got {winner!r}")
        item = self.get_queue_item(item_id)
        annotator_id = self.annotator_id(annotator)
        with self._tx() as db:
            row = self._one("SELECT * FROM queue_assignments WHERE item_id = ? AND annotator_id IS ?",
                            [item.id, annotator_id])
            if row is not None and row["comparison_id"] is not None:
                first = Comparison.from_row(self._one("SELECT * FROM comparisons WHERE id = ?", [row["comparison_id"]]))
                if retry and first.winner == winner:
                    return first
                raise Conflict(f"You already voted on item #{item.id}: {VERDICTS[first.winner]} (stored as comparison "
                               f"#{first.id}). That vote counts; this one was not stored. {NEXT}")
            if item.expires <= utcnow():
                raise Conflict(f"Item #{item.id} expired at {item.expires}; nothing was stored. {NEXT}")
            if row is not None and row["skipped"] is not None:
                raise Conflict(f"You skipped item #{item.id}; nothing was stored. {NEXT}")
            if row is None:
                is_open = self._one(f"SELECT i.id FROM queue_items i WHERE i.id = ? AND {_OPEN}",
                                    [item.id] + self._open_params(item.agent_id, lease_seconds, exclude_annotators))
                state = "open" if is_open is not None else \
                    "closed (it has the votes it needs, or a version of it was archived)"
                raise Conflict(f"Item #{item.id} was not shown to you and is {state}: items are voted by the "
                               f"annotators they are shown to; nothing was stored. {NEXT}")
            comparison = self.record_comparison(item.message_a_id, item.message_b_id, winner, annotator,
                                                queue_item_id=item.id)
            db.execute("UPDATE queue_assignments SET comparison_id = ?, voted = ? WHERE id = ?",
                       [comparison.id, utcnow(), row["id"]])
        return comparison

    def queue_item_of(self, message_id: int) -> Optional[QueueItem]:
        """The vote-queue item whose conversation holds a message (its context or a reply), or None."""
        row = self._one("""SELECT i.* FROM queue_items i JOIN messages a ON a.id = i.message_a_id
                           JOIN messages m ON m.conversation_id = a.conversation_id WHERE m.id = ? LIMIT 1""",
                        [message_id])
        return QueueItem.from_row(row) if row else None

    def queue_assignment(self, item_id: int, annotator: Optional[str]) -> Optional[QueueAssignment]:
        """The assignment of an item to ``annotator`` (None = the anonymous annotator), or None when never shown."""
        row = self._one("""SELECT s.* FROM queue_assignments s LEFT JOIN annotators n ON n.id = s.annotator_id
                           WHERE s.item_id = ? AND n.name IS ?""", [item_id, (annotator or "").strip() or None])
        return QueueAssignment.from_row(row) if row else None

    def skip_queue_item(self, item_id: int, annotator: Optional[str]) -> QueueAssignment:
        """``annotator`` passes on an item they were shown: it goes to others at once and never back to them
        (a skip after their vote changes nothing)."""
        item = self.get_queue_item(item_id)
        annotator_id = self.annotator_id(annotator)
        with self._tx() as db:
            row = self._one("SELECT * FROM queue_assignments WHERE item_id = ? AND annotator_id IS ?",
                            [item.id, annotator_id])
            if row is None:
                raise Conflict(f"queue item {item.id} was never shown to this annotator; nothing to skip")
            if row["voted"] is None and row["skipped"] is None:
                db.execute("UPDATE queue_assignments SET skipped = ? WHERE id = ?", [utcnow(), row["id"]])
        return QueueAssignment.from_row(self._one("SELECT * FROM queue_assignments WHERE id = ?", [row["id"]]))

    def queue_left(self, agent: int | str, annotator: Optional[str], lease_seconds: float,
                   exclude_annotators: Iterable[str] = ()) -> int:
        """Items ``annotator`` can still vote on now: their held one plus open items they were never shown."""
        agent_id = self.get_agent(agent).id
        annotator_id = self.annotator_id(annotator)
        held = self._one(f"""SELECT COUNT(*) AS n FROM queue_assignments s JOIN queue_items i ON i.id = s.item_id
                             WHERE i.agent_id = ? AND s.annotator_id IS ? AND s.voted IS NULL AND s.skipped IS NULL
                               AND s.created > ? AND i.expires > ? AND {_SERVABLE}""",
                         [agent_id, annotator_id, iso_after(-lease_seconds), utcnow()])["n"]
        fresh = self._one(f"""SELECT COUNT(*) AS n FROM queue_items i WHERE {_OPEN} AND NOT EXISTS (
                                 SELECT 1 FROM queue_assignments s WHERE s.item_id = i.id AND s.annotator_id IS ?)""",
                          self._open_params(agent_id, lease_seconds, exclude_annotators) + [annotator_id])["n"]
        return held + fresh

    def queue_assignments(self, item_id: int) -> list[QueueAssignment]:
        """Who was shown an item (and their comparison, once voted), oldest first."""
        self.get_queue_item(item_id)
        return [QueueAssignment.from_row(r) for r in
                self._all("SELECT * FROM queue_assignments WHERE item_id = ? ORDER BY id", [item_id])]

    # ---- figures -----------------------------------------------------------------------------
    def queue_stats(self, agent: int | str, lease_seconds: float, exclude_annotators: Iterable[str] = ()) -> dict:
        """Counts of an agent's queue: items made, open (take a vote), fresh (open, never shown), scored (open,
        with an uncertainty), expired, and votes per annotator name; all read at one moment."""
        with self.reading():
            return self._queue_stats(self.get_agent(agent).id, lease_seconds, exclude_annotators)

    def _queue_stats(self, agent_id: int, lease_seconds: float, exclude_annotators: Iterable[str]) -> dict:
        params = self._open_params(agent_id, lease_seconds, exclude_annotators)
        open_ = self._one(f"""SELECT COUNT(*) AS n, COUNT(i.uncertainty) AS scored,
                              SUM(NOT EXISTS (SELECT 1 FROM queue_assignments s WHERE s.item_id = i.id)) AS fresh
                              FROM queue_items i WHERE {_OPEN}""", params)
        total = self._one("""SELECT COUNT(*) AS n, SUM(expires <= ?) AS expired FROM queue_items
                             WHERE agent_id = ?""", [utcnow(), agent_id])
        votes = self._all("""SELECT COALESCE(n.name, ?) AS annotator, COUNT(*) AS votes FROM queue_assignments s
                             JOIN queue_items i ON i.id = s.item_id LEFT JOIN annotators n ON n.id = s.annotator_id
                             WHERE i.agent_id = ? AND s.voted IS NOT NULL GROUP BY n.name ORDER BY n.name""",
                          [ANONYMOUS, agent_id])
        return {"items": total["n"], "ready": open_["n"], "fresh": open_["fresh"] or 0, "scored": open_["scored"],
                "expired": total["expired"] or 0, "votes": {r["annotator"]: r["votes"] for r in votes}}
