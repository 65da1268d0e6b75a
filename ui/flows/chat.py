"""The chat flow shared by the Chat tab, the arena and REST: validate → take a slot → generate → record.

Plain functions over a Store and a PolicyServer. The conversation lives in the Store; the model only
ever sees the full state (system prompt + branch history) of the message it answers. A new user turn is
stored together with its reply, in one transaction (``plan_turn`` + ``begin_turn``): a chat refused for want
of a slot, cancelled, abandoned by its client or failed stores nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

from rlhf.config import AppConfig
from rlhf.serving.policy_server import AdapterError, AdapterRef, GenParams, PolicyServer, ReplyStream
from storage import Agent, Conflict, InvalidInput, Message, Policy, Store
from ui.flows.access import Caller
from ui.state.slots import ReplySlots
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


@dataclass(frozen=True)
class Turn:
    """A user turn checked but not stored yet: where it goes (``conversation_id`` None: a new conversation;
    ``parent_id``: the message it follows) and the state the model answers (``system_prompt``, ``history``)."""

    agent: Agent
    messages: list
    conversation_id: Optional[int]
    parent_id: Optional[int]
    annotator: Optional[str]
    source: str
    system_prompt: str
    history: list = field(default_factory=list)


class _DryRun(Exception):
    """Rolls back the write ``plan_turn`` makes to check a turn the Store's way."""


@dataclass
class PendingReply:
    """A reply being generated for ``parent`` (a stored user message), or for ``turn`` (a user turn stored with
    the reply); iterate for text deltas, then ``save()`` to store it once."""

    store: Store
    parent: Optional[Message]
    policy: Policy
    params: GenParams
    stream: ReplyStream
    saved: Optional[Message] = None
    turn: Optional[Turn] = None

    def __iter__(self) -> Iterator[str]:
        return iter(self.stream)

    def keep_turn(self) -> Message:
        """Store the user turn now, before its reply ends (the Chat tab keeps a typed message through a reload, as
        an unanswered turn); ``save`` then stores the reply under it. A turn that cannot be stored stops the reply."""
        if self.turn is not None:
            try:
                self.parent = store_turn(self.store, self.turn)
            except BaseException:
                self.stream.cancel()
                raise
            self.turn = None
        return self.parent

    def save(self) -> Message:
        """Wait for the end of the reply and record it, with its user turn when that is not stored yet, in one
        transaction (idempotent); a cancelled reply is never stored, nor is its turn (Conflict)."""
        if self.saved is None:
            text = self.stream.text()
            if self.stream.cancelled:
                raise Conflict("the reply was cancelled before it ended; nothing was stored")
            with self.store.transaction():
                parent = self.parent if self.turn is None else store_turn(self.store, self.turn)
                saved = self.store.record_reply(parent.id, text, self.policy.id, self.params.to_dict(),
                                                round(self.stream.latency_ms, 1), self.stream.n_tokens)
            self.parent, self.saved = parent, saved
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
    stream = _start(store, server, store.conversation_owner(parent.conversation_id), system_prompt, history,
                    policy, params, slots)
    return PendingReply(store, parent, policy, params, stream)


def _start(store: Store, server: PolicyServer, owner: Optional[str], system_prompt: str, history: list,
           policy: Policy, params: GenParams, slots: Optional[ReplySlots]) -> ReplyStream:
    """The stream of one reply, within ``owner``'s share of ``slots``; a version that cannot be served is marked
    broken (Conflict)."""
    template = store.get_agent(policy.agent_id).chat_template  # the agent's own, or None: the base's
    begin = lambda: server.stream(system_prompt, history, adapter_for(policy), params, template)  # noqa: E731
    try:
        return begin() if slots is None else slots.start(owner, begin)
    except AdapterError as exc:
        store.mark_policy_broken(policy.id, str(exc))
        raise Conflict(f"version {policy.version} cannot be served and was marked broken: {exc}") from exc


def plan_turn(store: Store, agent: Agent, messages: list, conversation_id: Optional[int] = None,
              annotator: Optional[str] = None, source: str = "chat", parent_id: Optional[int] = None) -> Turn:
    """Check a user turn exactly as ``add_user_turn`` would store it, and what the model answers, storing nothing
    (the write is rolled back at once): bad input raises here, before any slot or generation."""
    planned = []
    try:
        with store.transaction():
            user = add_user_turn(store, agent, messages, conversation_id, annotator, source, parent_id)
            branch = store.branch(user.id)
            planned += [store.get_conversation(user.conversation_id).system_prompt, branch]
            raise _DryRun
    except _DryRun:
        pass
    system_prompt, branch = planned
    first = branch[len(branch) - len(messages)]  # the first message of this turn: where it hangs
    return Turn(agent, list(messages), conversation_id, first.parent_id, annotator, source, system_prompt,
                [{"role": m.role, "content": m.content} for m in branch])


def store_turn(store: Store, turn: Turn) -> Message:
    """Store a planned user turn where it was planned (call inside the transaction that stores its reply)."""
    user = add_user_turn(store, turn.agent, turn.messages, turn.conversation_id, turn.annotator, turn.source,
                         turn.parent_id)
    if store.get_conversation(user.conversation_id).system_prompt != turn.system_prompt:
        raise Conflict("the agent's system prompt changed while the reply was generating; nothing was stored: "
                       "send the message again")
    return user


def begin_turn(store: Store, server: PolicyServer, turn: Turn, policy: Policy, params: GenParams,
               slots: Optional[ReplySlots] = None) -> PendingReply:
    """Start generating the reply to a planned turn: the slot first (TooManyReplies beyond the share of the
    conversation's owner, nothing stored), and the turn is stored only with its reply (``PendingReply.save``)."""
    owner = turn.annotator if turn.conversation_id is None else store.conversation_owner(turn.conversation_id)
    stream = _start(store, server, owner, turn.system_prompt, turn.history, policy, params, slots)
    return PendingReply(store, None, policy, params, stream, turn=turn)


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
