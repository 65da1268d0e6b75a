"""Conversations, messages, ratings, comparisons and arena pairs: the Store's feedback half.

Conversations are trees: a regenerated reply is a sibling (same parent) of the reply it replaces.
Every message carries a ``context_key``: a hash of the system prompt and the history before it, so
"answers the same context" is one equality test. Feedback is append-only.
"""
from __future__ import annotations

import hashlib
import math
import uuid
from typing import Any, Iterable, Optional

from storage.errors import Conflict, InvalidInput, NotFound
from storage.records import ArenaPair, Comparison, Conversation, Message, Rating, Withdrawal
from storage.util import check_text, dumps, utcnow

FLAGS = ("Inaccurate", "Unsafe", "Off-topic", "Unhelpful")
WINNERS = ("a", "b", "tie", "both_bad")
ROLES = ("user", "assistant")
RATING_FIELDS = ("thumb", "score", "flags", "note")
# A thumb or a score cannot be set to "none" by a new event (flags can be emptied, a note blanked): they are withdrawn.
WITHDRAWABLE = ("thumb", "score")
# A rating event with the fields taken back since (``withdraw_rating``), as a JSON list: what every fold reads.
_RATING = ("r.*, (SELECT json_group_array(w.field) FROM rating_withdrawals w WHERE w.rating_id = r.id) "
           "AS withdrawn")


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

    def conversation_owner(self, conversation_id: int) -> Optional[str]:
        """The name of the annotator who started a conversation (None: nobody, e.g. a vote-queue item)."""
        self.get_conversation(conversation_id)
        row = self._one("""SELECT a.name FROM conversations c JOIN annotators a ON a.id = c.annotator_id
                           WHERE c.id = ?""", [conversation_id])
        return row["name"] if row else None

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
                     gen_params: Optional[dict] = None, latency_ms: Optional[float] = None,
                     n_tokens: Optional[int] = None) -> Message:
        """Store a generated assistant reply to the user message ``parent_id`` (a sibling if one exists);
        ``n_tokens``: how many tokens were generated (a reply that reached max_new_tokens was cut)."""
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
                "gen_params": dumps(gen_params or {}), "latency_ms": latency_ms, "created": utcnow(),
                "n_tokens": None if n_tokens is None else int(n_tokens)})
        return self.get_message(new_id)

    def list_conversations(self, agent: int | str, annotator: Optional[str], sources: Iterable[str] = ("chat", "api"),
                           limit: int = 50) -> list[dict]:
        """One annotator's conversations with an agent, most recently active first: dicts with id, created,
        updated (the newest message), title (the first user turn), turns (user messages), messages, and
        unanswered (the newest message is a user turn without a reply). None or an unknown name: none."""
        agent_id = self.get_agent(agent).id
        if annotator is None or not annotator.strip():
            return []
        row = self._one("SELECT id FROM annotators WHERE name = ?", [annotator.strip()])
        if row is None:
            return []
        sources = list(sources)
        return self._all(f"""
            SELECT c.id, c.created, last.created AS updated, first.content AS title,
                   (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id AND m.role = 'user') AS turns,
                   (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) AS messages,
                   last.role = 'user' AS unanswered
            FROM conversations c
            JOIN messages last ON last.id = (SELECT MAX(id) FROM messages m WHERE m.conversation_id = c.id)
            JOIN messages first ON first.id = (SELECT MIN(id) FROM messages m WHERE m.conversation_id = c.id
                                               AND m.role = 'user')
            WHERE c.annotator_id = ? AND c.agent_id = ? AND c.source IN ({", ".join("?" for _ in sources)})
            ORDER BY last.id DESC LIMIT ?""", [row["id"], agent_id, *sources, int(limit)])

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
                return self.get_rating(current["id"])
            rating_id = self._insert(db, "ratings", {
                "message_id": message_id, "annotator_id": annotator_id, "thumb": thumb, "score": score,
                "flags": dumps(flags) if flags is not None else None, "note": note, "created": utcnow()})
        return self.get_rating(rating_id)

    def _effective(self, message_id: int, annotator_id: Optional[int]) -> Optional[dict]:
        rows = self._all(f"SELECT {_RATING} FROM ratings r WHERE r.message_id = ? AND r.annotator_id IS ? ORDER BY r.id",
                         [message_id, annotator_id])
        return fold_ratings([Rating.from_row(r) for r in rows])

    def _named(self, annotator: Optional[str]) -> tuple[bool, Optional[int]]:
        """(known?, id) of an annotator name without creating it; None or blank is the anonymous one."""
        if annotator is None or not annotator.strip():
            return True, None
        row = self._one("SELECT id FROM annotators WHERE name = ?", [annotator.strip()])
        return (row is not None), (row["id"] if row else None)

    def effective_rating(self, message_id: int, annotator: Optional[str] = None) -> Optional[dict]:
        """An annotator's current rating of a reply (thumb, score, flags, note), or None."""
        known, annotator_id = self._named(annotator)
        return self._effective(message_id, annotator_id) if known else None

    def withdraw_rating(self, message_id: int, annotator: Optional[str] = None,
                        field: str = "thumb") -> Optional[Withdrawal]:
        """Take back an annotator's current thumb (or score) on a reply: an append-only withdrawal event pointing at
        the rating event that set it. With nothing to take back (no such value, or already taken back) nothing is
        stored and None comes back, so a repeated click stores one withdrawal."""
        if field not in WITHDRAWABLE:
            raise InvalidInput(f"field must be one of {list(WITHDRAWABLE)}, got {field!r}")
        msg = self.get_message(message_id)
        if msg.role != "assistant":
            raise InvalidInput(f"message {message_id} is a {msg.role} message; only replies carry ratings")
        known, annotator_id = self._named(annotator)
        if not known:
            return None
        with self._tx() as db:
            row = self._one(f"""SELECT {_RATING} FROM ratings r WHERE r.message_id = ? AND r.annotator_id IS ?
                                AND r.{field} IS NOT NULL ORDER BY r.id DESC LIMIT 1""", [message_id, annotator_id])
            if row is None or field in Rating.from_row(row).withdrawn:
                return None
            withdrawal_id = self._insert(db, "rating_withdrawals",
                                         {"rating_id": row["id"], "field": field, "created": utcnow()})
        return Withdrawal.from_row(self._one("SELECT * FROM rating_withdrawals WHERE id = ?", [withdrawal_id]))

    def ratings_for(self, message_id: int) -> list[Rating]:
        """Every rating event on a message, oldest first (each with the fields withdrawn since)."""
        self.get_message(message_id)
        return [Rating.from_row(r) for r in
                self._all(f"SELECT {_RATING} FROM ratings r WHERE r.message_id = ? ORDER BY r.id", [message_id])]

    def ratings_by(self, message_id: int, annotator: Optional[str]) -> list[Rating]:
        """One annotator's rating events on a message, oldest first (none for None or an unknown name)."""
        self.get_message(message_id)
        if annotator is None or not annotator.strip():
            return []
        return [Rating.from_row(r) for r in self._all(
            f"""SELECT {_RATING} FROM ratings r JOIN annotators a ON a.id = r.annotator_id
               WHERE r.message_id = ? AND a.name = ? ORDER BY r.id""", [message_id, annotator.strip()])]

    def get_rating(self, rating_id: int) -> Rating:
        row = self._one(f"SELECT {_RATING} FROM ratings r WHERE r.id = ?", [_check_id(rating_id, "rating id")])
        if row is None:
            raise NotFound(f"unknown rating {rating_id}")
        return Rating.from_row(row)

    # ---- comparisons and arena pairs --------------------------------------------------------
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


def fold_ratings(rows: list) -> Optional[dict]:
    """Effective rating from append-only events, oldest first: the latest non-null value of each field wins, and a
    value its event has had withdrawn counts as none from that event on. Rows are records or dicts (``withdrawn``:
    the fields taken back). The one fold every reader uses: the rating form, the reward data, the statistics."""
    if not rows:
        return None
    state: dict = {"thumb": None, "score": None, "flags": None, "note": None, "id": None}
    for r in rows:
        get = r.get if isinstance(r, dict) else (lambda key, r=r: getattr(r, key, None))
        withdrawn = get("withdrawn") or ()
        for key in RATING_FIELDS:
            value = get(key)
            if value is not None:
                state[key] = None if key in withdrawn else value
        state["id"] = get("id")
    return state
