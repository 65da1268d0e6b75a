"""Chat & Rate tab handlers, called directly with a temp Store and the tiny model."""
from __future__ import annotations

import gradio as gr

from ui.tabs import chat

GEN = (8, 0.0, 1.0, None)  # max tokens, temperature, top_p, seed


def run(gen):
    """Drain a streaming handler and return its last update."""
    last = None
    for last in gen:
        pass
    return last


def send(services, text, state=None, annotator="alice"):
    return run(chat.send_message(services, text, state or chat.empty_state(), "assistant", None, annotator, *GEN))


def like(services, state, index, liked):
    return chat.like_reply(services, state, "alice", gr.LikeData(None, {"index": index, "value": "", "liked": liked}))


def test_send_streams_and_records_both_messages(services):
    updates = list(chat.send_message(services, "Hello there", chat.empty_state(), "assistant", None, "alice", *GEN))
    assert len(updates) >= 2  # streamed, not one final update
    history, state, box, status = updates[-1]
    assert box == "" and [m["role"] for m in history] == ["user", "assistant"]
    user, reply = (services.store.get_message(i) for i in state["ids"])
    assert user.content == "Hello there" and reply.content == history[1]["content"]
    assert reply.policy_id == services.store.active_policy("assistant").id
    assert services.store.get_conversation(user.conversation_id).annotator_id is not None
    # multi-turn: the next message continues the same conversation
    history, state2, _, _ = send(services, "And then?", state)
    assert len(history) == 4 and state2["conversation_id"] == state["conversation_id"]


def test_empty_message_is_refused_and_nothing_stored(services):
    history, state, box, status = send(services, "   ")
    assert "empty" in status and history == [] and services.store.count("messages") == 0


def test_regenerate_keeps_both_replies_as_siblings(services):
    _, state, _, _ = send(services, "Tell me a joke")
    first = state["ids"][-1]
    history, state, status = run(chat.regenerate_reply(services, state, None, "alice", 8, 1.0, 1.0, 3))
    second = state["ids"][-1]
    assert second != first and "Alternative 2" in status
    assert [m.id for m in services.store.siblings(second)] == [first, second]
    assert len(history) == 2


def test_thumbs_and_flags_from_the_chatbot_icons(services):
    _, state, _, _ = send(services, "Rate me")
    reply_id = state["ids"][1]
    like(services, state, 1, True)
    like(services, state, 1, True)  # one click may fire twice: stored once
    like(services, state, 1, "Unsafe")
    _, status = like(services, state, 1, "Off-topic")
    ratings = services.store.ratings_for(reply_id)
    assert [r.thumb for r in ratings] == [1, None, None]
    assert ratings[-1].flags == ["Off-topic", "Unsafe"]
    assert "👍" in status and "Unsafe" in status
    _, status = like(services, state, 0, True)  # the user's own message cannot be rated
    assert "⚠️" in status and services.store.count("ratings") == 3


def test_score_note_and_flags_for_the_selected_reply(services):
    _, state, _, _ = send(services, "Explain rain")
    assert "Select a reply first" not in chat.save_rating(services, state, "alice", 4, ["Inaccurate"], "a note")
    assert "Choose a score" in chat.save_rating(services, state, "alice", None, [], "  ")
    rating = services.store.effective_rating(state["ids"][1], "alice")
    assert (rating["score"], rating["flags"], rating["note"]) == (4, ["Inaccurate"], "a note")
    assert chat.save_rating(services, chat.empty_state(), "alice", 3, [], "") == "Select a reply first."


def test_select_reply_picks_only_assistant_messages(services):
    _, state, _, _ = send(services, "Pick me")
    state2, status = chat.select_reply(services, state, "alice", gr.SelectData(None, {"index": 0, "value": ""}))
    assert state2 == state and "Select a reply" in status
    state3, status = chat.select_reply(services, state, "alice", gr.SelectData(None, {"index": 1, "value": ""}))
    assert state3["selected"] == state["ids"][1]


def test_version_choices_offer_servable_versions(services, tmp_path):
    store = services.store
    (tmp_path / "v1").mkdir()
    v1 = store.register_policy_version("assistant", str(tmp_path / "v1"), parent_id=1, promote=False)
    choices, active = chat.version_choices(store, "assistant")
    assert [c[1] for c in choices] == [v1.id, 1] and active == 1
    store.archive_policy(v1.id)
    assert [c[1] for c in chat.version_choices(store, "assistant")[0]] == [1]
