"""A refused or abandoned chat stores nothing (#41 item 9): the slot is taken first, and a new user turn is stored
together with its reply, in one transaction."""
from __future__ import annotations

import pytest

from rlhf.serving.policy_server import GenParams
from storage import Conflict, InvalidInput
from ui.flows import chat as chatflow
from ui.state.slots import ReplySlots, TooManyReplies

HI = [{"role": "user", "content": "hi"}]
LONG = GenParams(max_new_tokens=400, temperature=1.0, seed=1)


def counts(store) -> tuple:
    return store.count("conversations"), store.count("messages")


def start(services, messages=HI, slots=None, params=GenParams(max_new_tokens=3, temperature=0),
          conversation_id=None):
    store = services.store
    agent = store.get_agent("assistant")
    turn = chatflow.plan_turn(store, agent, messages, conversation_id, "bob", source="api")
    return chatflow.begin_turn(store, services.server, turn, store.active_policy(agent.id), params, slots)


def test_a_turn_is_planned_without_storing_and_stored_with_its_reply(services):
    store = services.store
    pending = start(services)
    assert counts(store) == (0, 0)  # generating: nothing stored yet
    reply = pending.save()
    assert counts(store) == (1, 2) and store.get_message(reply.parent_id).content == "hi"
    assert pending.save() is reply  # once
    follow = start(services, [{"role": "user", "content": "and then?"}], conversation_id=reply.conversation_id)
    second = follow.save()
    assert [m.content for m in store.branch(second.parent_id)] == ["hi", reply.content, "and then?"]


def test_a_chat_refused_for_want_of_a_slot_stores_nothing(services):
    store, slots = services.store, ReplySlots(1)
    first = start(services, slots=slots, params=LONG)
    try:
        with pytest.raises(TooManyReplies):
            start(services, slots=slots)
        assert counts(store) == (0, 0)
    finally:
        first.stream.cancel()


def test_an_abandoned_chat_stores_nothing(services):
    store = services.store
    pending = start(services, params=LONG)
    pending.stream.cancel()  # the client hung up
    with pytest.raises(Conflict, match="nothing was stored"):
        pending.save()
    assert counts(store) == (0, 0)


def test_bad_input_is_refused_before_anything_starts(services):
    store = services.store
    with pytest.raises(InvalidInput):
        start(services, [{"role": "assistant", "content": "no user turn"}])
    assert counts(store) == (0, 0) and services.server.idle()


def test_the_chat_tab_may_keep_its_turn_before_the_reply_ends(services):
    """What the Chat tab does (a typed message survives a reload mid-reply), still after the slot was taken."""
    store = services.store
    pending = start(services)
    user = pending.keep_turn()
    assert counts(store) == (1, 1) and user.content == "hi"
    reply = pending.save()
    assert reply.parent_id == user.id and counts(store) == (1, 2)
