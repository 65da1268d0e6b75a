"""Chat & Rate tab handlers, called directly with a temp Store and the tiny model."""
from __future__ import annotations

import gradio as gr
import pytest

from ui.tabs import chat
from ui.tabs import chat_view as cv

GEN = (8, 0.0, 1.0, None)  # max tokens, temperature, top_p, seed
EMPTY_FORM = (None, None, [], "")  # form_for, score, flags, note


def run(gen):
    """Drain a streaming handler and return its last update."""
    last = None
    for last in gen:
        pass
    return last


def send(services, text, state=None, annotator="alice", form=EMPTY_FORM, gen=GEN):
    return run(chat.send_message(services, text, state or chat.empty_state(), "assistant", None, annotator, *gen,
                                 *form))


def form_of(out) -> tuple:
    """(form_for, score, flags, note) as a handler left the form."""
    return tuple(out[4:8])


def like(services, out, index, liked, annotator="alice"):
    return chat.like_reply(services, out[1], annotator, *form_of(out), "assistant",
                           gr.LikeData(None, {"index": index, "value": "", "liked": liked}))


def select(services, out, index):
    return chat.select_reply(services, out[1], "alice", *form_of(out), "assistant",
                             gr.SelectData(None, {"index": index, "value": ""}))


def test_send_streams_and_records_both_messages(services):
    updates = list(chat.send_message(services, "Hello there", chat.empty_state(), "assistant", None, "alice", *GEN))
    assert len(updates) >= 3  # the user turn, streamed deltas, the stored reply
    assert updates[0][2] == "" and all(isinstance(u[2], dict) for u in updates[1:])  # cleared once, then untouched
    history, state, _, status = updates[-1][:4]
    assert [m["role"] for m in history] == ["user", "assistant"]
    user, reply = (services.store.get_message(i) for i in state["ids"])
    assert user.content == "Hello there" and reply.content in history[1]["content"]
    assert reply.policy_id == services.store.active_policy("assistant").id
    assert reply.n_tokens is not None and "Selected reply" in status
    assert services.store.get_conversation(user.conversation_id).annotator_id is not None
    # multi-turn: the next message continues the same conversation, under the reply shown
    out = send(services, "And then?", state)
    assert len(out[0]) == 4 and out[1]["conversation_id"] == state["conversation_id"]
    assert services.store.get_message(out[1]["ids"][2]).parent_id == reply.id


@pytest.mark.parametrize("text, problem", [("   ", "Type a message first"), ("x" * 9000, "9,000 characters")])
def test_empty_or_too_long_message_is_refused_and_kept(services, text, problem):
    out = send(services, text)
    assert problem in out[3] and isinstance(out[2], dict)  # the box is left alone: the text stays there
    assert services.store.count("messages") == 0


def test_a_name_is_needed_for_every_label_in_local_mode(services):
    out = send(services, "Hello", annotator="  ")
    assert "Type your name" in out[3] and services.store.count("messages") == 0
    out = send(services, "Hello")
    for status in (like(services, out, 1, True, annotator="")[3],
                   chat.save_rating(services, out[1], "", 3, [], "", out[1]["selected"])):
        assert "Type your name" in status
    assert services.store.count("ratings") == 0


def test_a_reply_that_reached_max_new_tokens_is_marked_cut(services):
    out = send(services, "Talk for a long time", gen=(4, 1.0, 1.0, 7))
    reply = services.store.get_message(out[1]["selected"])
    if reply.n_tokens < 4:
        pytest.skip("the tiny model happened to end by itself")
    assert "4-token limit" in out[0][-1]["content"] and "✂️" in out[0][-1]["content"]
    short = send(services, "Short please", gen=(64, 0.0, 1.0, None))
    assert "token limit" not in short[0][-1]["content"] or \
        services.store.get_message(short[1]["selected"]).n_tokens >= 64


def test_regenerate_keeps_both_replies_and_acts_on_the_selected_one(services):
    out = send(services, "Tell me a joke")
    first = out[1]["ids"][-1]
    out = send(services, "Another", out[1])
    second = out[1]["ids"][-1]
    out = select(services, out, 1)  # back to the first reply
    assert out[1]["selected"] == first and out[4] == first
    out = run(chat.regenerate_reply(services, out[1], None, "alice", 8, 1.0, 1.0, 3, *form_of(out)))
    again = out[1]["selected"]
    assert "Alternative 2" in out[3] and [m.id for m in services.store.siblings(again)] == [first, again]
    assert len(out[0]) == 2  # the new alternative's branch
    back = chat.show_alternative(services, -1, out[1], "assistant", "alice", *form_of(out))
    assert back[1]["selected"] == first and back[1]["ids"][-1] == second and len(back[0]) == 4
    assert "No other alternative" in chat.show_alternative(services, -1, back[1], "assistant", "alice",
                                                           *form_of(back))[3]


def test_thumbs_and_flags_from_the_chatbot_icons_tick_the_form(services):
    out = send(services, "Rate me")
    reply_id = out[1]["ids"][1]
    like(services, out, 1, True)
    like(services, out, 1, True)  # one click may fire twice: stored once
    like(services, out, 1, "Unsafe")
    after = like(services, out, 1, "Off-topic")
    ratings = services.store.ratings_for(reply_id)
    assert [r.thumb for r in ratings] == [1, None, None]
    assert ratings[-1].flags == ["Off-topic", "Unsafe"]
    assert "👍" in after[3] and "Unsafe" in after[3] and after[6] == ["Off-topic", "Unsafe"]
    assert "⚠️" in like(services, out, 0, True)[3] or "not part" in like(services, out, 0, True)[3]
    assert services.store.count("ratings") == 3


def test_the_form_shows_and_saves_the_reply_it_belongs_to(services):
    store = services.store
    out = send(services, "Explain rain")
    first = out[4]
    assert chat.save_rating(services, out[1], "alice", None, [], "  ", first).startswith("Choose a score")
    assert "Saved" in chat.save_rating(services, out[1], "alice", 4, ["Inaccurate"], "a note", first)
    # the next reply: an empty form for it; the first reply keeps its own rating
    out = send(services, "And snow?", out[1], form=(first, 4, ["Inaccurate"], "a note"))
    second = out[4]
    assert second != first and form_of(out) == (second, None, [], "")
    # unsaved changes are saved to the reply they were typed for when the form moves on
    moved = select(services, out[:4] + (second, 2, [], "typed for the second") + out[8:], 1)
    assert "unsaved rating of reply" in moved[3] and form_of(moved) == (first, 4, ["Inaccurate"], "a note")
    assert store.effective_rating(second, "alice")["note"] == "typed for the second"
    assert store.effective_rating(first, "alice")["note"] == "a note"
    assert chat.save_rating(services, chat.empty_state(), "alice", 3, [], "") == "Select a reply first."


def test_select_reply_picks_only_assistant_messages(services):
    out = send(services, "Pick me")
    assert "Select a reply" in select(services, out, 0)[3]
    assert select(services, out, 1)[1]["selected"] == out[1]["ids"][1]


def test_new_conversation_and_going_back_to_an_old_one(services):
    store = services.store
    out = send(services, "First conversation")
    conv = out[1]["conversation_id"]
    fresh = chat.new_conversation(services, out[1], "assistant", "alice", *form_of(out))
    assert fresh[1] == chat.empty_state() and fresh[0] == []
    out2 = send(services, "Second conversation", fresh[1])
    assert out2[1]["conversation_id"] != conv
    listed = out2[9]["choices"] if isinstance(out2[9], dict) else out2[9].choices
    assert [c[1] for c in listed] == [out2[1]["conversation_id"], conv]
    back = chat.open_conversation(services, conv, out2[1], "assistant", "alice", *form_of(out2))
    assert back[1]["conversation_id"] == conv and len(back[0]) == 2
    other = chat.open_conversation(services, conv, out2[1], "assistant", "mallory", *form_of(out2))
    assert "someone else" in other[3]
    # an unanswered last turn (the page was reloaded mid-reply) is marked and answered by Regenerate
    agent = store.get_agent("assistant")
    store.append_messages(conv, [{"role": "user", "content": "left without a reply"}])
    back = chat.open_conversation(services, conv, out2[1], "assistant", "alice", *form_of(out2))
    assert "no reply yet" in back[3] and back[0][-1]["content"] == cv.UNANSWERED and back[1]["selected"] is None
    assert "unanswered" in cv.conversation_choices(store.list_conversations(agent.id, "alice"))[0][0]
    answered = run(chat.regenerate_reply(services, back[1], None, "alice", *GEN, *form_of(back)))
    reply = store.get_message(answered[1]["selected"])
    assert store.get_message(reply.parent_id).content == "left without a reply" and "Answered" in answered[3]


def test_version_choices_offer_servable_versions(services, tmp_path):
    store = services.store
    (tmp_path / "v1").mkdir()
    v1 = store.register_policy_version("assistant", str(tmp_path / "v1"), parent_id=1, promote=False)
    choices, active = chat.version_choices(store, "assistant")
    assert [c[1] for c in choices] == [v1.id, 1] and active == 1
    store.archive_policy(v1.id)
    assert [c[1] for c in chat.version_choices(store, "assistant")[0]] == [1]


def test_form_changes_by_hand():
    stored = {"score": 4, "flags": ["Unsafe"], "note": "ok", "thumb": 1}
    assert cv.form_changes(stored, 4, ["Unsafe"], "ok") == {}
    assert cv.form_changes(stored, 5, [], "ok ") == {"score": 5, "flags": []}
    assert cv.form_changes(None, None, [], "") == {}
    assert cv.form_changes(None, 2, ["Off-topic", "Off-topic"], "n") == {"score": 2, "flags": ["Off-topic"],
                                                                          "note": "n"}
    label = cv.conversation_label({"title": "a  very\nlong " + "x" * 80, "turns": 1, "updated": "2026-01-02T03:04:05",
                                   "unanswered": 1})
    assert label.startswith("a very long") and "…" in label and "1 turn ·" in label and label.endswith("unanswered")
