"""The Store's part of an annotator's day (issue 23): guidelines, token counts, the conversation list, skips."""
from __future__ import annotations

import pytest

from storage import InvalidInput, Store


def test_guidelines_are_stored_per_agent(store: Store):
    assert store.get_agent("assistant").guidelines == ""
    agent = store.update_agent("assistant", guidelines="Prefer **short**, correct replies.")
    assert agent.guidelines == "Prefer **short**, correct replies." and agent.to_dict()["guidelines"]
    assert store.update_agent("assistant", system_prompt="Be brief.").guidelines.startswith("Prefer")
    with pytest.raises(InvalidInput):
        store.update_agent("assistant", guidelines="x" * (store.max_text_chars + 1))


def test_a_reply_keeps_its_token_count(store: Store):
    conv = store.create_conversation("assistant", "ann", messages=[{"role": "user", "content": "hi"}])
    reply = store.record_reply(store.leaf(conv.id).id, "hello", None, {"max_new_tokens": 4}, 1.0, n_tokens=4)
    assert reply.n_tokens == 4
    assert store.record_reply(reply.parent_id, "hey", None).n_tokens is None


def test_the_conversation_list_is_each_annotators_own_newest_first(store: Store):
    def chat(who, text, source="chat"):
        conv = store.create_conversation("assistant", who, source=source,
                                         messages=[{"role": "user", "content": text}])
        return conv.id, store.leaf(conv.id)

    first, turn = chat("ann", "first question")
    store.record_reply(turn.id, "an answer", None)
    second, _ = chat("ann", "second question")  # never answered
    chat("bob", "not ann's")
    chat("ann", "an arena round", source="arena")
    rows = store.list_conversations("assistant", "ann")
    assert [r["id"] for r in rows] == [second, first]
    assert (rows[0]["title"], rows[0]["turns"], rows[0]["unanswered"]) == ("second question", 1, 1)
    assert (rows[1]["title"], rows[1]["messages"], rows[1]["unanswered"]) == ("first question", 2, 0)
    store.append_messages(first, [{"role": "user", "content": "and then?"}])
    assert [r["id"] for r in store.list_conversations("assistant", "ann")] == [first, second]
    assert store.list_conversations("assistant", None) == [] == store.list_conversations("assistant", "nobody")


def test_feedback_volume_per_minute(store: Store):
    conv = store.create_conversation("assistant", "ann", messages=[{"role": "user", "content": "hi"}])
    reply = store.record_reply(store.leaf(conv.id).id, "hello", None)
    store.record_rating(reply.id, "ann", thumb=1)
    (hour,) = store.feedback_volume("assistant")
    (minute,) = store.feedback_volume("assistant", per="minute")
    assert len(hour["hour"]) == 13 and len(minute["hour"]) == 16 and minute["n"] == 1
    with pytest.raises(InvalidInput):
        store.feedback_volume("assistant", per="second")
