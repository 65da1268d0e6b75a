"""Whose conversation is it, and what may a caller see of a reply (no Gradio, no FastAPI).

A conversation belongs to the user who started it: only they (and admins) read its messages, continue it,
regenerate its replies, rate them or compare them. Someone else gets the same 404 as for an id that does not
exist, so ids say nothing about other people's data. A vote-queue item belongs to nobody: the annotators it was
shown to may read it (that is how they vote on it). In single-user local mode everyone is the one user.

A *blind* reply keeps its version, latency and generation settings to itself: an arena reply until its round
is voted on (for everyone), a vote-queue reply until the caller voted on its item (admins see through). Its
``created`` is its question's (when a reply was stored would tell how long it took to generate).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from storage import ArenaPair, Conversation, Message, NotFound, Store
from ui.permissions import current_user, is_admin
from ui.services import Services

BLIND_FIELDS = {"policy_id": None, "latency_ms": None, "gen_params": {}, "n_tokens": None}


@dataclass(frozen=True)
class Caller:
    """Who is asking: their name (None when anonymous) and whether they see everything (admins, local mode)."""

    name: Optional[str]
    admin: bool


def caller_of(services: Services, request: Any) -> Caller:
    """The caller of a REST or Gradio request (local mode: an admin without a name)."""
    if services.auth is None:
        return Caller(None, True)
    return Caller(current_user(services, request), is_admin(services, request))


def owns(store: Store, caller: Caller, conversation_id: int) -> bool:
    """True when ``caller`` may act on the conversation: admins, and the user who started it."""
    return caller.admin or (caller.name is not None and store.conversation_owner(conversation_id) == caller.name)


def conversation_for(store: Store, caller: Caller, conversation_id: int) -> Conversation:
    """A conversation the caller may continue; NotFound (as for an unknown id) for anyone else's."""
    conv = store.get_conversation(conversation_id)
    if not owns(store, caller, conv.id):
        raise NotFound(f"unknown conversation {conversation_id}")
    return conv


def message_for(store: Store, caller: Caller, message_id: int, reading: bool = False) -> Message:
    """A message of the caller's own conversation (``reading``: also of a vote-queue item shown to them);
    NotFound for anyone else's."""
    msg = store.get_message(message_id)
    if owns(store, caller, msg.conversation_id):
        return msg
    if reading and caller.name is not None:
        item = store.queue_item_of(msg.id)
        if item is not None and store.queue_assignment(item.id, caller.name) is not None:
            return msg
    raise NotFound(f"unknown message {message_id}")


def pair_for(store: Store, caller: Caller, pair_id: str) -> ArenaPair:
    """An arena round the caller played (admins: any); NotFound for anyone else's."""
    pair = store.get_arena_pair(pair_id)
    if not owns(store, caller, store.get_message(pair.message_a_id).conversation_id):
        raise NotFound(f"unknown arena pair {pair_id!r}")
    return pair


def is_blind(store: Store, caller: Caller, msg: Message) -> bool:
    """True while the caller may not learn which version wrote a reply (see the module docstring)."""
    if msg.role != "assistant":
        return False
    if store.is_blind(msg.id):
        return True
    item = store.queue_item_of(msg.id)
    if item is None or caller.admin:
        return False
    assignment = store.queue_assignment(item.id, caller.name)
    return assignment is None or assignment.voted is None


def shown_message(store: Store, caller: Caller, msg: Message) -> dict:
    """A message as the caller may see it: blind replies without version, latency and generation settings."""
    out = {k: v for k, v in msg.to_dict().items() if k != "context_key"}
    if is_blind(store, caller, msg):
        out.update(BLIND_FIELDS)
        if msg.parent_id is not None:
            out["created"] = store.get_message(msg.parent_id).created
    return out
