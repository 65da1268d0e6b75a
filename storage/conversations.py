"""Conversations and messages: the Store's record of what was said.

Conversations are trees: a regenerated reply is a sibling (same parent) of the reply it replaces.
Every message carries a ``context_key``: a hash of the system prompt and the history before it, so
"answers the same context" is one equality test. What people said about the replies lives beside it:
``storage.ratings`` and ``storage.comparisons``.
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterable, Optional

from storage.errors import InvalidInput, NotFound
from storage.records import Conversation, Message
from storage.util import check_id, check_text, dumps, utcnow

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


class ConversationsMixin:
    """Methods of Store that record and read conversations and their messages."""

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
        check_id(conversation_id, "conversation_id")
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
        check_id(message_id, "message_id")
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
                         [check_id(message_id, "message_id")])
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
