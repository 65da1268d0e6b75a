"""Chat & Rate tab handlers, called directly with a temp Store and the tiny model."""
from __future__ import annotations

import gradio as gr
import pytest

from storage import InvalidInput
from ui.tabs import chat
from ui.tabs import chat_labels as labels
from ui.tabs import chat_view as cv
from ui.tabs.chat_layout import KEEP_NOTE

GEN = (8, 0.0, 1.0, "")  # max tokens, temperature, top_p, seed (empty: random)
SKIP = gr.skip()


def run(gen):
    """Drain a streaming handler and return its last update."""
    last = None
    for last in gen:
        pass
    return last


def texts(chatbot) -> list[str]:
    """The text of each bubble of a chatbot output (a list, or a gr.Chatbot update)."""
    value = chatbot.value if isinstance(chatbot, gr.Chatbot) else chatbot
    return ["".join(p["text"] for p in m["content"]) if isinstance(m["content"], list) else m["content"]
            for m in value]


def send(services, text, state=None, annotator="alice", gen=GEN, touched=0):
    return run(chat.send_message(services, text, state or chat.empty_state(), "assistant", "active", annotator,
                                 *gen, touched))


def like(services, state, index, liked, annotator="alice", panel=(None, "", "", 0), value=None, request=None):
    return labels.like_reply(services, state, annotator, *panel, gr.LikeData(None, {
        "index": index, "value": value if value is not None else "", "liked": liked}), request=request)


def select(services, state, index, annotator="alice", panel=(None, "", "", 0), request=None):
    return labels.select_reply(services, state, annotator, *panel, gr.SelectData(None, {"index": index, "value": ""}),
                               request=request)


def choose(value, selected=True):
    return gr.SelectData(None, {"index": 0, "value": value, "selected": selected})


def labels_of(services, reply, name="alice"):
    r = services.store.effective_rating(reply, name) or {}
    return r.get("thumb"), r.get("score"), r.get("flags") or [], r.get("note")


def test_send_streams_records_both_messages_and_writes_no_label(services):
    updates = list(chat.send_message(services, "Hello there", chat.empty_state(), "assistant", "active", "alice",
                                     *GEN))
    assert len(updates) >= 3  # the user turn, streamed deltas, the stored reply
    assert updates[0][1]["busy"] is True and all(u[5].interactive is False for u in updates[:1])  # locked
    history, state, _, status = updates[-1][:4]
    assert state["busy"] is False and all(b.interactive for b in updates[-1][5:9])  # unlocked by the reply's end
    assert [m["role"] for m in history] == ["user", "assistant"]  # the public API's answer: plain messages
    user, reply = (services.store.get_message(i) for i in state["ids"])
    assert user.content == "Hello there" and state["reply"] == reply.id and f"Reply **#{reply.id}** stored" in status
    assert reply.policy_id == services.store.active_policy("assistant").id and reply.gen_params["seed"] is None
    assert services.store.count("ratings") == 0
    out = send(services, "And then?", state)  # multi-turn: under the reply shown
    assert len(out[0]) == 4 and services.store.get_message(out[1]["ids"][2]).parent_id == reply.id


@pytest.mark.parametrize("text, problem", [("   ", "Type a message first"), ("x" * 9000, "9,000 characters")])
def test_empty_or_too_long_message_is_refused_and_kept(services, text, problem):
    out = send(services, text)
    assert problem in out[3] and isinstance(out[2], dict)  # the box is left alone: the text stays there
    assert services.store.count("messages") == 0


def test_a_bad_seed_is_refused_and_an_empty_one_is_random():
    assert cv.parse_seed("") is None and cv.parse_seed(None) is None and cv.parse_seed("  ") is None
    assert cv.parse_seed(" 7 ") == 7 and cv.parse_seed(7) == 7 and cv.parse_seed(-3.0) == -3
    for bad in ("seven", "1.5", 1.5, True, "9" * 30):
        with pytest.raises(InvalidInput, match="Seed must be a whole number"):
            cv.parse_seed(bad)


def test_a_bad_seed_stores_nothing(services):
    out = send(services, "Hello", gen=(8, 0.0, 1.0, "0x10"))
    assert "Seed must be a whole number" in out[3] and services.store.count("messages") == 0


def test_a_refused_send_leaves_no_reply_for_the_panel_to_follow(services):
    first = send(services, "Hello")
    refused = send(services, "  ", first[1])
    assert refused[1]["reply"] is None and refused[1]["ids"] == first[1]["ids"]
    assert refused[9:] == (SKIP,) * labels.N_PANEL  # the panel did not move to a reply that never started
    assert labels.follow_reply(services, refused[1], "alice", 5, "alice", "", 0)[:7] == (SKIP,) * 7


def test_the_panel_moves_to_a_reply_as_it_starts_and_fills_in_unless_the_person_clicked_in_it(services):
    store = services.store
    first = send(services, "One")
    a = first[1]["reply"]
    panel = labels.follow_reply(services, first[1], "alice", None, "", "", 0)
    assert panel[7].feedback_value == [None] and panel[0] == a and panel[3].interactive
    # Send moves the panel to the reply being written: scores and flags closed (keys 1-5 do nothing), the note
    # typed for `a` kept as its draft
    page = gr.Request(session_hash="one-page")
    updates = list(chat.send_message(services, "Two", first[1], "assistant", "active", "alice", *GEN, 3, a, "alice",
                                     "typed for a, not saved", request=page))
    start = updates[0][9:]
    assert start[0] is None and start[2] == cv.WRITING and start[5] == ""
    assert start[3].interactive is False and start[4].interactive is False
    assert "click a reply first" in labels.label_score(services, "alice", None, 3, choose(4))[0]  # a key meanwhile
    out = updates[-1]
    b = out[1]["reply"]
    # no click in the panel while it streamed: it fills in with the new reply (a note typed for it stays in the box)
    assert labels.follow_reply(services, out[1], "alice", None, "", "", 3)[0] == b
    typed = labels.follow_reply(services, out[1], "alice", None, "", "typed for b while it streamed", 3)
    assert typed[0] == b and typed[5] == SKIP
    # the person clicked a reply (or a label) in the panel while it streamed: it stays there and says where `b` is
    kept = labels.follow_reply(services, out[1], "alice", a, "alice", "", 4)
    assert kept[:2] == (SKIP, SKIP) and kept[3:7] == (SKIP,) * 4 and f"new reply **#{b}** is in" in kept[2]
    # back on `a`, its draft comes back
    assert select(services, out[1], 1, request=page)[5] == "typed for a, not saved"
    assert store.count("ratings") == 0  # none of this wrote a label


def test_thumbs_are_stored_at_once_idempotent_and_a_second_click_takes_them_back(services):
    out = send(services, "Rate me")
    state, reply = out[1], out[1]["reply"]
    done = like(services, state, 1, True)
    like(services, state, 1, True)  # one click may fire twice: stored once
    assert labels_of(services, reply) == (1, None, [], None) and services.store.count("ratings") == 1
    assert done[0] == reply and "👍 stored" in done[7]
    taken = like(services, state, 1, "")  # the lit icon clicked again
    assert "thumb taken back" in taken[7] and labels_of(services, reply)[0] is None
    assert "no thumb of yours" in like(services, state, 1, "")[7]
    assert services.store.count("rating_withdrawals") == 1
    like(services, state, 1, False)
    assert labels_of(services, reply)[0] == -1


def test_a_label_needs_a_name_and_a_refused_thumb_is_unlit_again(services):
    out = send(services, "Hello", annotator="  ")
    assert "Type your name" in out[3] and services.store.count("messages") == 0
    out = send(services, "Hello")
    refused = like(services, out[1], 1, True, annotator="")
    assert "Type your name" in refused[7] and refused[8].feedback_value == [None]
    assert "Type your name" in labels.label_score(services, "", out[1]["reply"], 0, choose(3))[0]
    assert services.store.count("ratings") == 0


def test_a_click_on_a_view_that_changed_labels_nothing(services):
    out = send(services, "Hello")
    assert "not part of this conversation" in like(services, out[1], 7, True)[7]
    assert "not a stored reply yet" in like(services, {**out[1], "ids": out[1]["ids"][:1] + [None]}, 1, True)[7]
    assert "only replies" in like(services, out[1], 0, True)[7]
    assert "changed while you clicked" in like(services, out[1], 1, True, value=["another text"])[7]
    assert services.store.count("ratings") == 0


def test_score_flags_and_note_are_each_stored_at_once_on_the_panels_reply(services):
    out = send(services, "Explain rain")
    reply = out[1]["reply"]
    assert "click a reply first" in labels.label_score(services, "alice", None, 0, choose(4))[0]
    shown = labels.label_score(services, "alice", reply, 0, choose(4))
    assert "Score 4 stored" in shown[0] and shown[4].value == 4 and labels_of(services, reply) == (None, 4, [], None)
    assert shown[1] == reply  # the panel names the reply the click was stored on
    labels.label_flag(services, "alice", reply, 0, choose("Unsafe"))
    labels.label_flag(services, "alice", reply, 0, choose("Inaccurate"))
    shown = labels.label_flag(services, "alice", reply, 0, choose("Unsafe", selected=False))
    assert shown[5].value == ["Inaccurate"] and labels_of(services, reply) == (None, 4, ["Inaccurate"], None)
    assert "Type a note first" in labels.save_note(services, "alice", reply, "  ", 0)[0]
    stored = labels.save_note(services, "alice", reply, "a note", 5)
    assert "Note stored" in stored[0] and stored[6] == 6  # a click on the panel: counted
    assert "Nothing new" in labels.save_note(services, "alice", reply, "a note ")[0]
    assert "Note cleared" in labels.save_note(services, "alice", reply, "")[0]
    assert labels_of(services, reply) == (None, 4, ["Inaccurate"], "")
    assert services.store.count("ratings") == 6  # one event per click that changed something


def test_moving_the_panel_writes_nothing_and_says_when_a_typed_note_is_left_behind(services):
    store = services.store
    out = send(services, "Tell me a joke")
    first = out[1]["reply"]
    labels.label_score(services, "alice", first, 0, choose(2))
    out = send(services, "Another", out[1])
    second = out[1]["reply"]
    moved = select(services, out[1], 1, panel=(second, "alice", "typed for the second, not saved", 2))
    assert moved[:2] == (first, "alice") and moved[3].value == 2 and moved[6] == 3 and "kept as its draft" in moved[7]
    assert "only replies" in select(services, out[1], 0)[7]
    assert [r.message_id for r in store.ratings_by(first, "alice")] == [first] and not store.ratings_by(second, "alice")


def test_a_new_name_shows_its_own_labels_and_writes_nothing(services):
    out = send(services, "Hello")
    reply = out[1]["reply"]
    labels.label_score(services, "alma", reply, 0, choose(3))
    labels.save_note(services, "alma", reply, "alma's note")
    like(services, out[1], 1, True, annotator="alma")
    renamed = labels.rename(services, out[1], "bert", reply, "alma", "alma's note", 4)
    assert renamed[:3] == (reply, "bert", cv.panel_header(services.store, reply, "bert"))
    assert (renamed[3].value, renamed[4].value, renamed[5:7]) == (None, [], ("", SKIP))
    assert renamed[7].feedback_value == [None]  # bert's thumbs: none lit; and no click counted
    typing = labels.rename(services, out[1], "bert", reply, "alma", "alma typed this, unsaved", 4)
    assert typing[5] == KEEP_NOTE  # a note being typed stays in its box (the page keeps it: NOTE_GATE_JS)
    empty = (SKIP,) * 5 + (KEEP_NOTE, SKIP)
    assert labels.rename(services, out[1], "bert", None, "", "", 0)[:7] == empty  # an empty panel stays
    assert services.store.ratings_by(reply, "bert") == [] and len(services.store.ratings_by(reply, "alma")) == 3


def test_regenerate_answers_the_panels_reply_again_and_alternatives_move_without_writing(services):
    store = services.store
    out = send(services, "Tell me a joke")
    first = out[1]["reply"]
    out = send(services, "Another", out[1])
    second = out[1]["reply"]
    out = run(chat.regenerate_reply(services, out[1], "active", "alice", 8, 1.0, 1.0, "3", first))
    again = out[1]["reply"]
    assert "Alternative 2 stored" in out[3] and [m.id for m in store.siblings(again)] == [first, again]
    assert len(out[0]) == 2  # the new alternative's branch
    back = chat.show_alternative(services, -1, out[1], "assistant", "alice", again, "alice", "", 1)
    assert back[9] == first and back[15] == 2 and back[1]["ids"][-1] == second and len(back[0].value) == 4
    assert "No other alternative" in chat.show_alternative(services, -1, back[1], "assistant", "alice", first,
                                                           "alice", "")[3]
    assert store.count("ratings") == 0


def test_new_conversation_is_refused_while_a_reply_streams(services):
    out = send(services, "First conversation")
    refused = chat.new_conversation(services, {**out[1], "busy": True}, "assistant", "alice")
    assert chat.BUSY in refused[3] and refused[1] == SKIP
    fresh = chat.new_conversation(services, out[1], "assistant", "alice")
    assert fresh[1] == chat.empty_state() and fresh[0].value == [] and fresh[9] is None
    assert chat.BUSY in run(chat.regenerate_reply(services, {**out[1], "busy": True}, "active", "alice", *GEN))[3]


def test_a_message_sent_on_an_emptied_chat_starts_a_new_conversation(services):
    """The trash icon empties the page's chat at once; its event may reach the state after the next message. The
    page's chat goes with the message: shown empty, the message starts a new conversation."""
    store = services.store
    first = send(services, "alpha")
    shown = first[0].value if isinstance(first[0], gr.Chatbot) else first[0]
    assert shown  # the chat as the page shows it after a reply

    def send_on(page_chat, text):
        return run(chat.send_message(services, text, first[1], "assistant", "active", "alice", *GEN, 0, None, "", "",
                                     page_chat))

    kept = send_on(shown, "beta")  # the page shows the conversation: it goes on
    assert kept[1]["conversation_id"] == first[1]["conversation_id"]
    fresh = send_on([], "gamma")  # the state still names the old conversation; the page shows none
    assert fresh[1]["conversation_id"] != first[1]["conversation_id"]
    assert [m.content for m in store.branch(fresh[1]["ids"][-1])][:1] == ["gamma"]


def test_new_conversation_and_going_back_to_an_old_one(services):
    store = services.store
    out = send(services, "First conversation")
    conv = out[1]["conversation_id"]
    like(services, out[1], 1, True)
    out2 = send(services, "Second conversation", chat.empty_state())
    assert out2[1]["conversation_id"] != conv
    listed = out2[4]["choices"] if isinstance(out2[4], dict) else out2[4].choices
    assert [c[1] for c in listed] == [out2[1]["conversation_id"], conv]
    back = chat.open_conversation(services, conv, out2[1], "assistant", "alice", None, "", "")
    assert back[1]["conversation_id"] == conv and len(back[0].value) == 2
    assert back[0].feedback_value == ["Like"]  # the stored thumb is lit again
    other = chat.open_conversation(services, conv, out2[1], "assistant", "mallory", None, "", "")
    assert "someone else" in other[3]
    # an unanswered last turn (the page was reloaded mid-reply) is marked and answered by Regenerate
    agent = store.get_agent("assistant")
    store.append_messages(conv, [{"role": "user", "content": "left without a reply"}])
    back = chat.open_conversation(services, conv, out2[1], "assistant", "alice", None, "", "")
    assert "no reply yet" in back[3] and texts(back[0])[-1] == cv.UNANSWERED and back[9] is None
    assert back[0].feedback_value == ["Like", None]
    assert "unanswered" in cv.conversation_choices(store.list_conversations(agent.id, "alice"))[0][0]
    answered = run(chat.regenerate_reply(services, back[1], "active", "alice", *GEN, None))
    reply = store.get_message(answered[1]["reply"])
    assert store.get_message(reply.parent_id).content == "left without a reply" and "Answered" in answered[3]


def test_version_choices_follow_the_active_version_and_pin_others(services, tmp_path):
    store = services.store
    (tmp_path / "v1").mkdir()
    v1 = store.register_policy_version("assistant", str(tmp_path / "v1"), parent_id=1, promote=False)
    choices, default = chat.version_choices(store, "assistant")
    assert default == chat.ACTIVE and [c[1] for c in choices] == [chat.ACTIVE, v1.id, 1]
    assert choices[0][0] == "Active version (now v0)"
    store.promote_policy(v1.id)  # an open page follows: the default choice says (and sends) the new one
    assert chat.refresh_versions(services, "assistant", chat.ACTIVE).value == chat.ACTIVE
    assert chat.version_choices(store, "assistant")[0][0][0] == "Active version (now v1)"
    assert chat.refresh_versions(services, "assistant", 1).value == 1  # a pinned version stays pinned
    store.promote_policy(1)
    store.archive_policy(v1.id)
    assert [c[1] for c in chat.version_choices(store, "assistant")[0]] == [chat.ACTIVE, 1]
    assert chat.refresh_versions(services, "assistant", v1.id).value == chat.ACTIVE


def test_open_pages_pick_up_new_guidelines(services):
    store = services.store
    version, guide = chat.follow_store(services, "assistant", chat.ACTIVE, "old text")
    assert "No guidelines" in guide
    store.update_agent("assistant", guidelines="Be kind; flag anything unsafe.")
    assert chat.follow_store(services, "assistant", chat.ACTIVE, guide)[1] == "Be kind; flag anything unsafe."
    assert chat.follow_store(services, "assistant", chat.ACTIVE, "Be kind; flag anything unsafe.")[1] == SKIP


def test_identical_alternatives_are_named_in_the_status(services):
    store = services.store
    out = send(services, "Same again", gen=(8, 1.0, 1.0, "7"))
    first = out[1]["reply"]
    again = run(chat.regenerate_reply(services, out[1], "active", "alice", 8, 1.0, 1.0, "7", first))
    twin = again[1]["reply"]
    assert store.get_message(twin).content == store.get_message(first).content  # a fixed seed repeats the reply
    assert "word for word the same text as alternative 1" in again[3]
    assert cv.same_text_note(store, first) != "" and cv.toggled_flags(["Unsafe"], "Unsafe", False) == []


def test_view_helpers_by_hand(services):
    store = services.store
    out = send(services, "Hello")
    reply = out[1]["reply"]
    assert cv.thumbs_shown(store, out[1]["ids"], "alice") == [None]
    assert cv.thumbs_shown(store, out[1]["ids"] + [None], None) == [None, None]
    assert cv.panel_values(store, reply, None) == (None, [], "")
    assert "type your name" in cv.panel_header(store, reply, None) and "#" in cv.panel_header(store, reply, "a")
    assert not cv.unsaved_note(store, reply, "alice", "  ") and cv.unsaved_note(store, reply, "alice", "x")
    label = cv.conversation_label({"title": "a  very\nlong " + "x" * 80, "turns": 1, "updated": "2026-01-02T03:04:05",
                                   "unanswered": 1})
    assert label.startswith("a very long") and "…" in label and "1 turn ·" in label and label.endswith("unanswered")


def test_a_reply_that_reached_max_new_tokens_is_marked_cut(services):
    out = send(services, "Talk for a long time", gen=(4, 1.0, 1.0, "7"))
    reply = services.store.get_message(out[1]["reply"])
    if reply.n_tokens < 4:
        pytest.skip("the tiny model happened to end by itself")
    assert "4-token limit" in texts(out[0])[-1] and "✂️" in texts(out[0])[-1]
    assert "cut at its token limit" in out[3]
