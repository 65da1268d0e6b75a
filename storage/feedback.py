"""Conversations, messages, ratings, comparisons and arena pairs: the Store's feedback half.

Conversations are trees: a regenerated reply is a sibling (same parent) of the reply it replaces.
Every message carries a ``context_key``: a hash of the system prompt and the history before it, so
"answers the same context" is one equality test. Feedback is append-only.
"""
from __future__ import annotations

import hashlib
import json
import math
import uuid
from typing import Any, Iterable, Optional

from storage.errors import Conflict, InvalidInput, NotFound
from storage.records import ArenaPair, Comparison, Conversation, Message, Rating
from storage.util import check_text, dumps, utcnow

FLAGS = ("Inaccurate", "Unsafe", "Off-topic", "Unhelpful")
WINNERS = ("a", "b", "tie", "both_bad")
ROLES = ("user", "assistant")


def context_key(parent_key: Optional[str], parent_role: Optional[str], parent_content: Optional[str],
                system_prompt: str) -> str:
    """Hash of everything a reply at this point sees: system prompt + history (chained through parents)."""
    h = hashlib.sha256()
    if parent_key is None:
        h.update(b"system\x00" + system_prompt.encode())
    else:
        h.update(parent_key.encode() + b"\x00" + parent_role.encode() + b"\x00" + parent_content.encode())
    return h.hexdigest()[:32]


def _check_int(value: Any, what: str, allowed: Iterable[int]) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{what} must be a number in {sorted(allowed)}, got {value!r}")
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value) or not value.is_integer()):
        raise InvalidInput(f"{what} must be a whole number in {sorted(allowed)}, got {value!r}")
    if int(value) not in allowed:
        raise InvalidInput(f"{what} must be one of {sorted(allowed)}, got {value!r}")
    return int(value)


def _check_id(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{what} must be an integer id, got {value!r}")
    return value


class FeedbackMixin:
    """Methods of Store that record and read conversations and feedback."""

    # ---- conversations and messages ----------------------------------------------------------
    def create_conversation(self, agent: int | str, annotator: Optional[str] = None, source: str = "chat",
                            messages: Optional[list[dict]] = None) -> Conversation:
        """A new conversation that snapshots the agent's system prompt, with optional first messages.

        Conversation and messages are written in one transaction: bad messages leave nothing behind.
        """
        agent_rec = self.get_agent(agent)
        clean = self._check_messages(messages) if messages is not None else None
        with self._tx() as db:
            annotator_id = self.annotator_id(annotator)
            conv_id = self._insert(db, "conversations", {
                "agent_id": agent_rec.id, "annotator_id": annotator_id, "system_prompt": agent_rec.system_prompt,
                "source": source, "created": utcnow()})
            if clean:
                self._append(conv_id, clean, None)
        return self.get_conversation(conv_id)

    def get_conversation(self, conversation_id: int) -> Conversation:
        _check_id(conversation_id, "conversation_id")
        row = self._one("SELECT * FROM conversations WHERE id = ?", [conversation_id])
        if row is None:
            raise NotFound(f"unknown conversation {conversation_id}")
        return Conversation.from_row(row)

    def get_message(self, message_id: int) -> Message:
        _check_id(message_id, "message_id")
        row = self._one("SELECT * FROM messages WHERE id = ?", [message_id])
        if row is None:
            raise NotFound(f"unknown message {message_id}")
        return Message.from_row(row)

    def conversation_messages(self, conversation_id: int) -> list[Message]:
        """Every message of a conversation (all branches), oldest first."""
        self.get_conversation(conversation_id)
        rows = self._all("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", [conversation_id])
        return [Message.from_row(r) for r in rows]

    def leaf(self, conversation_id: int) -> Optional[Message]:
        """The most recent message: a conversation continues from there."""
        row = self._one("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id DESC LIMIT 1",
                        [conversation_id])
        return Message.from_row(row) if row else None

    def branch(self, message_id: int) -> list[Message]:
        """The branch from the conversation's first message down to this one."""
        rows = self._all("""
            WITH RECURSIVE up(id, parent_id, depth) AS (
                SELECT id, parent_id, 0 FROM messages WHERE id = ?
                UNION ALL
                SELECT m.id, m.parent_id, up.depth + 1 FROM messages m JOIN up ON m.id = up.parent_id)
            SELECT messages.* FROM up JOIN messages ON messages.id = up.id ORDER BY up.depth DESC""",
                         [_check_id(message_id, "message_id")])
        if not rows:
            raise NotFound(f"unknown message {message_id}")
        return [Message.from_row(r) for r in rows]

    def state_for(self, message_id: int) -> tuple[str, list[dict]]:
        """(system prompt, history up to and including ``message_id``): what a policy answers."""
        msgs = self.branch(message_id)
        conv = self.get_conversation(msgs[0].conversation_id)
        return conv.system_prompt, [{"role": m.role, "content": m.content} for m in msgs]

    def siblings(self, message_id: int) -> list[Message]:
        """Replies to the same parent (regenerations), including this one, oldest first."""
        msg = self.get_message(message_id)
        rows = self._all("SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS ? AND role = ? "
                         "ORDER BY id", [msg.conversation_id, msg.parent_id, msg.role])
        return [Message.from_row(r) for r in rows]

    def _check_messages(self, messages: Any) -> list[tuple[str, str]]:
        if not isinstance(messages, list) or not messages:
            raise InvalidInput("messages must be a non-empty list")
        clean = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise InvalidInput(f"messages[{i}] must be an object with role and content")
            role = m.get("role")
            if role not in ROLES:
                raise InvalidInput(f"messages[{i}].role must be 'user' or 'assistant', got {role!r}")
            clean.append((role, check_text(m.get("content"), f"messages[{i}].content", self.max_text_chars)))
        if clean[-1][0] != "user":
            raise InvalidInput("the last message must be a user message")
        return clean

    def append_messages(self, conversation_id: int, messages: list[dict],
                        parent_id: Optional[int] = None) -> list[Message]:
        """Append user (and client-side assistant) messages in one transaction; must end with a user turn.

        ``parent_id`` None continues from the conversation's most recent message (from beside it when that is a
        user turn that never got its reply).
        """
        self.get_conversation(conversation_id)
        clean = self._check_messages(messages)
        with self._tx():
            ids = self._append(conversation_id, clean, parent_id)
        return [self.get_message(i) for i in ids]

    def _append(self, conversation_id: int, clean: list[tuple[str, str]], parent_id: Optional[int]) -> list[int]:
        conv = self.get_conversation(conversation_id)
        if parent_id is None:
            parent = self.leaf(conversation_id)
            if parent is not None and parent.role == "user" and clean[0][0] == "user":
                # That turn never got its reply (the model was busy, the version broke): the new turn goes
                # beside it, so one failed reply does not block the conversation for good.
                parent = self.get_message(parent.parent_id) if parent.parent_id is not None else None
        else:
            parent = self.get_message(parent_id)
            if parent.conversation_id != conversation_id:
                raise InvalidInput(f"message {parent_id} is not in conversation {conversation_id}")
        ids = []
        for role, content in clean:
            if parent is not None and parent.role == role:
                raise InvalidInput(f"a {role} message cannot follow another {role} message")
            key = context_key(parent.context_key if parent else None, parent.role if parent else None,
                              parent.content if parent else None, conv.system_prompt)
            new_id = self._insert(self.db, "messages", {
                "conversation_id": conversation_id, "parent_id": parent.id if parent else None, "role": role,
                "content": content, "context_key": key, "created": utcnow()})
            ids.append(new_id)
            parent = self.get_message(new_id)
        return ids

    def record_reply(self, parent_id: int, content: str, policy_id: Optional[int],
                     gen_params: Optional[dict] = None, latency_ms: Optional[float] = None) -> Message:
        """Store a generated assistant reply to the user message ``parent_id`` (a sibling if one exists)."""
        parent = self.get_message(parent_id)
        if parent.role != "user":
            raise InvalidInput(f"message {parent_id} is not a user message; replies answer user messages")
        if not isinstance(content, str) or "\x00" in content:
            raise InvalidInput("reply content must be a string without NUL bytes")
        conv = self.get_conversation(parent.conversation_id)
        key = context_key(parent.context_key, parent.role, parent.content, conv.system_prompt)
        with self._tx() as db:
            new_id = self._insert(db, "messages", {
                "conversation_id": parent.conversation_id, "parent_id": parent_id, "role": "assistant",
                "content": content, "context_key": key, "policy_id": policy_id,
                "gen_params": dumps(gen_params or {}), "latency_ms": latency_ms, "created": utcnow()})
        return self.get_message(new_id)

    # ---- ratings -----------------------------------------------------------------------------
    def record_rating(self, message_id: int, annotator: Optional[str] = None, thumb: Any = None,
                      score: Any = None, flags: Any = None, note: Any = None) -> Rating:
        """Append a rating event (None = field unchanged). A repeat that changes nothing stores nothing."""
        msg = self.get_message(message_id)
        if msg.role != "assistant":
            raise InvalidInput(f"message {message_id} is a {msg.role} message; only replies can be rated")
        if thumb is None and score is None and flags is None and note is None:
            raise InvalidInput("a rating needs at least one of thumb, score, flags, note")
        if thumb is not None:
            thumb = _check_int(thumb, "thumb", (-1, 1))
        if score is not None:
            score = _check_int(score, "score", range(1, 6))
        if flags is not None:
            if not isinstance(flags, (list, tuple)) or not all(isinstance(f, str) for f in flags):
                raise InvalidInput("flags must be a list of strings")
            unknown = [f for f in flags if f not in FLAGS]
            if unknown:
                raise InvalidInput(f"unknown flags {unknown}; allowed: {list(FLAGS)}")
            flags = sorted(set(flags))
        if note is not None:
            note = check_text(note, "note", self.max_text_chars, allow_empty=True)
        annotator_id = self.annotator_id(annotator)
        event = {"thumb": thumb, "score": score, "flags": flags, "note": note}
        with self._tx() as db:
            current = self._effective(message_id, annotator_id)
            if current is not None and all(v is None or current.get(k) == v for k, v in event.items()):
                return Rating.from_row(self._one("SELECT * FROM ratings WHERE id = ?", [current["id"]]))
            rating_id = self._insert(db, "ratings", {
                "message_id": message_id, "annotator_id": annotator_id, "thumb": thumb, "score": score,
                "flags": dumps(flags) if flags is not None else None, "note": note, "created": utcnow()})
        return Rating.from_row(self._one("SELECT * FROM ratings WHERE id = ?", [rating_id]))

    def _effective(self, message_id: int, annotator_id: Optional[int]) -> Optional[dict]:
        rows = self._all("SELECT * FROM ratings WHERE message_id = ? AND annotator_id IS ? ORDER BY id",
                         [message_id, annotator_id])
        return fold_ratings([Rating.from_row(r) for r in rows])

    def effective_rating(self, message_id: int, annotator: Optional[str] = None) -> Optional[dict]:
        """An annotator's current rating of a reply (thumb, score, flags, note), or None."""
        annotator_id = None
        if annotator is not None and annotator.strip():
            row = self._one("SELECT id FROM annotators WHERE name = ?", [annotator.strip()])
            if row is None:
                return None
            annotator_id = row["id"]
        return self._effective(message_id, annotator_id)

    def ratings_for(self, message_id: int) -> list[Rating]:
        """Every rating event on a message, oldest first."""
        self.get_message(message_id)
        return [Rating.from_row(r) for r in
                self._all("SELECT * FROM ratings WHERE message_id = ? ORDER BY id", [message_id])]

    def ratings_by(self, message_id: int, annotator: Optional[str]) -> list[Rating]:
        """One annotator's rating events on a message, oldest first (none for None or an unknown name)."""
        self.get_message(message_id)
        if annotator is None or not annotator.strip():
            return []
        return [Rating.from_row(r) for r in self._all(
            """SELECT r.* FROM ratings r JOIN annotators a ON a.id = r.annotator_id
               WHERE r.message_id = ? AND a.name = ? ORDER BY r.id""", [message_id, annotator.strip()])]

    def get_rating(self, rating_id: int) -> Rating:
        row = self._one("SELECT * FROM ratings WHERE id = ?", [_check_id(rating_id, "rating id")])
        if row is None:
            raise NotFound(f"unknown rating {rating_id}")
        return Rating.from_row(row)

    # ---- comparisons and arena pairs --------------------------------------------------------
    def record_comparison(self, message_a_id: int, message_b_id: int, winner: str,
                          annotator: Optional[str] = None, pair_id: Optional[str] = None) -> Comparison:
        """Store a preference between two replies to the same context (one vote per arena pair)."""
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
        if pair_id is None:
            pair = self._one("SELECT id FROM arena_pairs WHERE (message_a_id = ? AND message_b_id = ?) OR "
                             "(message_a_id = ? AND message_b_id = ?)", [a.id, b.id, b.id, a.id])
            if pair is not None:
                raise Conflict(f"these replies are arena pair {pair['id']}; vote with POST /arena/{pair['id']}/vote")
        annotator_id = self.annotator_id(annotator)
        with self._tx() as db:
            if pair_id is not None:
                existing = self._one("SELECT * FROM comparisons WHERE pair_id = ?", [pair_id])
            else:
                existing = self._one(
                    "SELECT * FROM comparisons WHERE message_a_id = ? AND message_b_id = ? AND annotator_id IS ? "
                    "ORDER BY id DESC LIMIT 1", [a.id, b.id, annotator_id])
                if existing and existing["winner"] != winner:
                    existing = None  # a changed mind is a new event
            if existing:
                return Comparison.from_row(existing)
            comp_id = self._insert(db, "comparisons", {
                "message_a_id": a.id, "message_b_id": b.id, "policy_a_id": a.policy_id, "policy_b_id": b.policy_id,
                "winner": winner, "annotator_id": annotator_id, "pair_id": pair_id, "created": utcnow()})
        return Comparison.from_row(self._one("SELECT * FROM comparisons WHERE id = ?", [comp_id]))

    def list_comparisons(self, agent: int | str | None = None, with_text: bool = False) -> list[Comparison]:
        """Comparisons (optionally of one agent's conversations), oldest first; ``with_text`` adds both replies'
        text (``text_a``, ``text_b``: the leaderboard's style control reads them)."""
        text = ", m.content AS text_a, mb.content AS text_b" if with_text else ""
        where, params = ("WHERE v.agent_id = ?", [self.get_agent(agent).id]) if agent is not None else ("", [])
        rows = self._all(f"""SELECT c.*{text} FROM comparisons c JOIN messages m ON m.id = c.message_a_id
                             JOIN messages mb ON mb.id = c.message_b_id
                             JOIN conversations v ON v.id = m.conversation_id {where} ORDER BY c.id""", params)
        return [Comparison.from_row(r) for r in rows]

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


def fold_ratings(rows: list[Rating]) -> Optional[dict]:
    """Effective rating from append-only events: the latest non-null value of each field wins."""
    if not rows:
        return None
    state: dict = {"thumb": None, "score": None, "flags": None, "note": None, "id": None}
    for r in rows:
        for key in ("thumb", "score", "flags", "note"):
            value = getattr(r, key)
            if value is not None:
                state[key] = value
        state["id"] = r.id
    return state


class FeedbackExportMixin:
    """Read-only views of an agent's feedback for the data builders (training, exports, stats)."""

    def feedback_watermark(self, agent: int | str) -> dict:
        """Highest rating and comparison ids of an agent: a snapshot of 'the feedback used so far'."""
        agent_id = self.get_agent(agent).id
        r = self._one("""SELECT COALESCE(MAX(r.id), 0) AS m FROM ratings r JOIN messages m ON m.id = r.message_id
                         JOIN conversations c ON c.id = m.conversation_id WHERE c.agent_id = ?""", [agent_id])
        c = self._one("""SELECT COALESCE(MAX(x.id), 0) AS m FROM comparisons x JOIN messages m ON m.id = x.message_a_id
                         JOIN conversations c ON c.id = m.conversation_id WHERE c.agent_id = ?""", [agent_id])
        return {"rating_id": r["m"], "comparison_id": c["m"]}

    def count_feedback_since(self, agent: int | str, watermark: Optional[dict]) -> int:
        """Ratings + comparisons of an agent newer than a watermark (None = all)."""
        if not watermark:
            watermark = {"rating_id": 0, "comparison_id": 0}
        agent_id = self.get_agent(agent).id
        r = self._one("""SELECT COUNT(*) AS n FROM ratings r JOIN messages m ON m.id = r.message_id
                         JOIN conversations c ON c.id = m.conversation_id WHERE c.agent_id = ? AND r.id > ?""",
                      [agent_id, watermark.get("rating_id", 0)])["n"]
        x = self._one("""SELECT COUNT(*) AS n FROM comparisons x JOIN messages m ON m.id = x.message_a_id
                         JOIN conversations c ON c.id = m.conversation_id WHERE c.agent_id = ? AND x.id > ?""",
                      [agent_id, watermark.get("comparison_id", 0)])["n"]
        return r + x

    def feedback_volume(self, agent: int | str) -> list[dict]:
        """Ratings and comparisons of an agent per UTC hour: dicts with hour ('YYYY-MM-DDTHH'), kind, n."""
        agent_id = self.get_agent(agent).id
        # created is an ISO string, so its first 13 characters are the hour bucket.
        return self._all("""
            SELECT hour, kind, COUNT(*) AS n FROM (
                SELECT substr(r.created, 1, 13) AS hour, 'ratings' AS kind FROM ratings r
                JOIN messages m ON m.id = r.message_id JOIN conversations c ON c.id = m.conversation_id
                WHERE c.agent_id = ?
                UNION ALL
                SELECT substr(x.created, 1, 13), 'comparisons' FROM comparisons x
                JOIN messages m ON m.id = x.message_a_id JOIN conversations c ON c.id = m.conversation_id
                WHERE c.agent_id = ?)
            GROUP BY hour, kind ORDER BY hour, kind""", [agent_id, agent_id])

    def feedback_rows(self, agent: int | str, until: Optional[dict] = None) -> dict:
        """Everything the data builders need for one agent, as plain rows (dicts).

        Keys: conversations, messages, ratings, comparisons (each a list of dicts, annotator by name, JSON
        decoded) and excluded_annotators (names). ``until`` (a watermark) freezes the snapshot.
        """
        agent_id = self.get_agent(agent).id
        until = until or {"rating_id": 2**62, "comparison_id": 2**62}
        conversations = self._all("""SELECT c.id, c.system_prompt, c.source, c.created, a.name AS annotator
                                     FROM conversations c LEFT JOIN annotators a ON a.id = c.annotator_id
                                     WHERE c.agent_id = ? ORDER BY c.id""", [agent_id])
        messages = self._all("""SELECT m.id, m.conversation_id, m.parent_id, m.role, m.content, m.context_key,
                                m.policy_id, m.created FROM messages m JOIN conversations c ON c.id = m.conversation_id
                                WHERE c.agent_id = ? ORDER BY m.id""", [agent_id])
        ratings = self._all("""SELECT r.id, r.message_id, a.name AS annotator, r.thumb, r.score, r.flags, r.note,
                               r.created FROM ratings r JOIN messages m ON m.id = r.message_id
                               JOIN conversations c ON c.id = m.conversation_id
                               LEFT JOIN annotators a ON a.id = r.annotator_id
                               WHERE c.agent_id = ? AND r.id <= ? ORDER BY r.id""", [agent_id, until["rating_id"]])
        for r in ratings:
            r["flags"] = json.loads(r["flags"]) if r["flags"] is not None else None
        comparisons = self._all("""SELECT x.id, x.message_a_id, x.message_b_id, x.policy_a_id, x.policy_b_id, x.winner,
                                   a.name AS annotator, x.pair_id, x.created FROM comparisons x
                                   JOIN messages m ON m.id = x.message_a_id
                                   JOIN conversations c ON c.id = m.conversation_id
                                   LEFT JOIN annotators a ON a.id = x.annotator_id
                                   WHERE c.agent_id = ? AND x.id <= ? ORDER BY x.id""",
                                [agent_id, until["comparison_id"]])
        excluded = [r["name"] for r in self._all("SELECT name FROM annotators WHERE excluded = 1")]
        return {"conversations": conversations, "messages": messages, "ratings": ratings,
                "comparisons": comparisons, "excluded_annotators": excluded}
