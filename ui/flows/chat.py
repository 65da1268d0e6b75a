"""The chat flow shared by the Chat tab, the arena and REST: validate → record → generate → record.

Plain functions over a Store and a PolicyServer. The conversation lives in the Store; the model only
ever sees the full state (system prompt + branch history) of the message it answers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from rlhf.config import AppConfig
from rlhf.serving.policy_server import AdapterError, AdapterRef, GenParams, PolicyServer, ReplyStream
from storage import Agent, Conflict, InvalidInput, Message, Policy, Store
from ui.flows.access import Caller
from ui.flows.slots import ReplySlots
from ui.permissions import Forbidden


def gen_params(config: AppConfig, agent: Agent, max_new_tokens=None, temperature=None, top_p=None,
               seed=None) -> GenParams:
    """Request settings over the agent's defaults over the config's; InvalidInput names a bad one."""
    base = {"max_new_tokens": config.serving.max_new_tokens, "temperature": config.serving.temperature,
            "top_p": config.serving.top_p, "seed": None}
    base.update({k: v for k, v in (agent.generation or {}).items() if k in base})
    given = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "seed": seed}
    base.update({k: v for k, v in given.items() if v is not None})
    try:
        return GenParams(**base).validated()
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def resolve_policy(store: Store, agent: Agent, policy_id: Optional[int] = None,
                   caller: Optional[Caller] = None) -> Policy:
    """The version to answer with: the agent's active one, or the one asked for (of this agent, usable). Choosing a
    version is for admins: annotators chat with the version they are given (Forbidden for any other; ``caller``
    None is nobody's, so it is refused too)."""
    active = store.active_policy(agent.id)
    if policy_id is None or policy_id == active.id:
        return active
    if caller is None or not caller.admin:
        raise Forbidden("choosing a version is for admins: annotators chat with the active version "
                        "(leave the version out)")
    policy = store.get_policy(policy_id)
    if policy.agent_id != agent.id:
        raise InvalidInput(f"policy {policy_id} belongs to another agent, not {agent.name!r}")
    if policy.status in ("broken", "archived"):
        raise Conflict(f"policy {policy_id} is {policy.status}" + (f": {policy.error}" if policy.error else ""))
    return policy


def adapter_for(policy: Policy) -> AdapterRef:
    return AdapterRef(policy.id, policy.adapter_path)


@dataclass
class PendingReply:
    """A reply being generated for ``parent``; iterate for text deltas, then ``save()`` to store it once."""

    store: Store
    parent: Message
    policy: Policy
    params: GenParams
    stream: ReplyStream
    saved: Optional[Message] = None

    def __iter__(self) -> Iterator[str]:
        return iter(self.stream)

    def save(self) -> Message:
        """Wait for the end of the reply and record it (idempotent); a cancelled reply is never stored (Conflict)."""
        if self.saved is None:
            text = self.stream.text()
            if self.stream.cancelled:
                raise Conflict("the reply was cancelled before it ended; nothing was stored")
            self.saved = self.store.record_reply(self.parent.id, text, self.policy.id, self.params.to_dict(),
                                                 round(self.stream.latency_ms, 1), self.stream.n_tokens)
        return self.saved


def is_cut(message: Message) -> bool:
    """True for a reply that stopped because it reached its max_new_tokens (not at its natural end)."""
    limit = (message.gen_params or {}).get("max_new_tokens")
    return message.role == "assistant" and message.n_tokens is not None and limit is not None \
        and message.n_tokens >= int(limit)


def begin_reply(store: Store, server: PolicyServer, parent_id: int, policy: Policy,
                params: GenParams, slots: Optional[ReplySlots] = None) -> PendingReply:
    """Start generating a reply to the user message ``parent_id`` with ``policy``; with ``slots``, within the
    conversation owner's share (TooManyReplies beyond it)."""
    parent = store.get_message(parent_id)
    if parent.role != "user":
        raise InvalidInput(f"message {parent_id} is not a user message")
    system_prompt, history = store.state_for(parent_id)
    begin = lambda: server.stream(system_prompt, history, adapter_for(policy), params)  # noqa: E731
    try:
        stream = begin() if slots is None else slots.start(store.conversation_owner(parent.conversation_id), begin)
    except AdapterError as exc:
        store.mark_policy_broken(policy.id, str(exc))
        raise Conflict(f"version {policy.version} cannot be served and was marked broken: {exc}") from exc
    return PendingReply(store, parent, policy, params, stream)


def check_turns(config: AppConfig, messages: list) -> list:
    """The messages of one request, refused (InvalidInput) beyond ``serving.max_messages``."""
    limit = config.serving.max_messages
    if isinstance(messages, list) and len(messages) > limit:
        raise InvalidInput(f"{len(messages)} messages in one request; the limit is {limit} (serving.max_messages)")
    return messages


def add_user_turn(store: Store, agent: Agent, messages: list, conversation_id: Optional[int] = None,
                  annotator: Optional[str] = None, source: str = "chat", parent_id: Optional[int] = None) -> Message:
    """Append ``messages`` (ending with a user turn) to a conversation, new when no id is given; under
    ``parent_id`` when given (the branch being viewed), else after the conversation's newest message."""
    if conversation_id is None:
        conv = store.create_conversation(agent.id, annotator, source=source, messages=messages)
        return store.leaf(conv.id)
    if store.get_conversation(conversation_id).agent_id != agent.id:
        raise InvalidInput(f"conversation {conversation_id} belongs to another agent")
    return store.append_messages(conversation_id, messages, parent_id=parent_id)[-1]


def sibling_parent(store: Store, message_id: int) -> Message:
    """The user message a reply answers (what a regeneration answers again)."""
    msg = store.get_message(message_id)
    if msg.role != "assistant" or msg.parent_id is None:
        raise InvalidInput(f"message {message_id} is not a reply; only replies can be regenerated")
    return store.get_message(msg.parent_id)


def agent_of(store: Store, message: Message) -> Agent:
    return store.get_agent(store.get_conversation(message.conversation_id).agent_id)
