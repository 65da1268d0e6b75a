"""The Chat tab's label events: only the reply's owner labels it (as REST decides), a click on a view another tab
changed is refused, a score can be cleared, a note draft stays per reply, people's writes do not wait on each
other (issues #41 item 4 and #42)."""
from __future__ import annotations

import threading

import gradio as gr

from tests.ui.tabs.test_chat_handlers import GEN, choose, labels_of, like, run, select, send
from tests.ui.test_security import team_services
from ui.label_desk import LabelDesk
from ui.tabs import chat
from ui.tabs import chat_labels as labels
from ui.tabs import chat_view as cv
from ui.tabs.chat_labels import NOTE_SLOT
from ui.tabs.chat_layout import KEEP_NOTE

TAB_A, TAB_B = gr.Request(session_hash="tab-a"), gr.Request(session_hash="tab-b")


def test_a_label_for_another_users_reply_is_refused_and_nothing_is_stored(tmp_path, tiny_model_dir, tiny_server):
    services = team_services(tmp_path, tiny_model_dir, tiny_server)
    try:
        store = services.store
        bob, carol = gr.Request(username="bob"), gr.Request(username="carol")
        out = run(chat.send_message(services, "bob's question", chat.empty_state(), "assistant", "active", "", *GEN,
                                    request=bob))
        reply = out[1]["reply"]
        # carol sends bob's reply id in the hidden number of her page: every label event refuses it
        for answer in (labels.label_score(services, "", reply, 0, choose(4), request=carol),
                       labels.label_flag(services, "", reply, 0, choose("Unsafe"), request=carol),
                       labels.save_note(services, "", reply, "carol was here", 0, request=carol),
                       labels.clear_score(services, "", reply, 0, request=carol)):
            assert f"unknown message {reply}" in answer[0] and answer[1] is None  # her panel shows nothing of it
        refused = labels.like_reply(services, out[1], "", None, "", "", 0,
                                    gr.LikeData(None, {"index": 1, "value": "", "liked": True}), request=carol)
        assert f"unknown message {reply}" in refused[7]
        assert store.count("ratings") == 0 and store.count("rating_withdrawals") == 0
        # the owner (and an admin) label it as before
        assert "Score 4 stored" in labels.label_score(services, "", reply, 0, choose(4), request=bob)[0]
        assert "Score 2 stored" in labels.label_score(services, "", reply, 0, choose(2),
                                                      request=gr.Request(username="alice"))[0]
        assert labels_of(services, reply, "bob")[1] == 4 and labels_of(services, reply, "carol") == (None,) * 2 + ([],
                                                                                                              None)
    finally:
        services.store.close()  # the tiny server is shared by the session


def test_a_click_on_a_view_another_tab_changed_is_refused_and_never_applied(services):
    store = services.store
    out = send(services, "Two tabs")
    state, reply = out[1], out[1]["reply"]
    for tab in (TAB_A, TAB_B):  # both tabs show the reply with no labels
        labels.refresh_panel(services, state, "alice", reply, "alice", "", 0, request=tab)
        labels.shown_now(services, request=tab)
    like(services, state, 1, True, request=TAB_A)
    assert labels_of(services, reply)[0] == 1
    # tab B still shows no thumb: its 👎 is refused (it never replaces A's 👍 unseen), its icons show 👍 now
    stale = like(services, state, 1, False, request=TAB_B)
    assert "changed in another tab" in stale[7] and stale[8].feedback_value == ["Like"]
    assert labels_of(services, reply)[0] == 1
    # tab A's 👍 stays lit while tab B (now up to date) turns it into 👎; A's click on its stale lit 👍 (which
    # would take a thumb back) is refused and the 👎 stays
    like(services, state, 1, False, request=TAB_B)
    # A gets the focus by the click on its lit 👍: the re-read is on its way but not shown when the click is made
    labels.refresh_panel(services, state, "alice", reply, "alice", "", 0, request=TAB_A)
    stale = like(services, state, 1, "", request=TAB_A)
    assert "changed in another tab" in stale[7] and labels_of(services, reply)[0] == -1
    labels.shown_now(services, request=TAB_A)
    assert store.count("rating_withdrawals") == 0
    # scores: B scores 5 while A shows none; A's score 3 is refused, its panel shows 5; clicked again, it is stored
    labels.label_score(services, "alice", reply, 0, choose(5), request=TAB_B)
    stale = labels.label_score(services, "alice", reply, 0, choose(3), request=TAB_A)
    assert "changed in another tab" in stale[0] and stale[4].value == 5 and labels_of(services, reply)[1] == 5
    assert "Score 3 stored" in labels.label_score(services, "alice", reply, 0, choose(3), request=TAB_A)[0]
    # flags and notes the same way
    labels.label_flag(services, "alice", reply, 0, choose("Unsafe"), request=TAB_B)
    assert "changed in another tab" in labels.label_flag(services, "alice", reply, 0, choose("Inaccurate"),
                                                         request=TAB_A)[0]
    labels.save_note(services, "alice", reply, "B's note", 0, request=TAB_B)
    assert "changed in another tab" in labels.save_note(services, "alice", reply, "A's note", 0, request=TAB_A)[0]
    assert labels_of(services, reply) == (-1, 3, ["Unsafe"], "B's note")
    # focus: tab A reads the Store again; a note typed there stays in its box
    fresh = labels.refresh_panel(services, state, "alice", reply, "alice", "A's note", 0, request=TAB_A)
    assert fresh[4].value == ["Unsafe"] and fresh[5] == KEEP_NOTE and fresh[7].feedback_value == ["Dislike"]
    labels.shown_now(services, request=TAB_A)
    assert "Note stored" in labels.save_note(services, "alice", reply, "A's note", 0, request=TAB_A)[0]


def test_a_score_can_be_cleared(services):
    out = send(services, "Score me")
    reply = out[1]["reply"]
    labels.label_score(services, "alice", reply, 0, choose(4))
    cleared = labels.clear_score(services, "alice", reply, 0)
    assert "Score taken back" in cleared[0] and cleared[4].value is None and labels_of(services, reply)[1] is None
    assert "No score of yours" in labels.clear_score(services, "alice", reply, 0)[0]
    assert services.store.count("rating_withdrawals") == 1  # append-only: the score event stays


def test_a_note_draft_stays_with_its_reply(services):
    out = send(services, "First")
    first = out[1]["reply"]
    out = send(services, "Second", out[1])
    second = out[1]["reply"]
    moved = select(services, out[1], 1, panel=(second, "alice", "about the second", 1), request=TAB_A)
    assert moved[0] == first and moved[5] == "" and "kept as its draft" in moved[7]
    back = select(services, out[1], 3, panel=(first, "alice", "about the first", 2), request=TAB_A)
    assert back[0] == second and back[5] == "about the second"
    labels.save_note(services, "alice", second, "about the second", 3, request=TAB_A)
    again = select(services, out[1], 3, panel=(first, "alice", "about the first", 4), request=TAB_A)
    assert again[5] == "about the second" and labels_of(services, second)[3] == "about the second"
    assert select(services, out[1], 1, panel=(second, "alice", "about the second", 5), request=TAB_A)[5] == \
        "about the first"
    assert labels_of(services, first)[3] is None  # a draft is never stored by moving


def test_the_marked_bubble_is_the_panels_reply_or_the_one_being_written(services):
    assert 'data-index="3"' in cv.mark_html(7, [4, 5, 6, 7]) and "reply #7" in cv.mark_html(7, [4, 5, 6, 7])
    assert 'data-index="1"' in cv.mark_html(None, [4, None], writing=True)
    assert cv.mark_html(None, [4, None]) == cv.mark_html(9, [4, 5]) == '<span data-index="-1"></span>'
    assert labels.mark(services, {"ids": [4, None], "busy": True}, None) == cv.mark_html(None, [4, None], writing=True)


def test_the_mark_follows_the_panel_the_server_pointed_not_a_page_value_one_step_behind(services):
    """A Send's update changes the conversation and the panel's reply together; the page can fire the marker's event
    for the conversation while it still holds the old reply (seen in Chromium on a loaded machine: the outline
    stayed on the old reply while the panel said "the new reply")."""
    first = send(services, "Hello")
    ids = first[1]["ids"]
    sending = chat.send_message(services, "And again", first[1], "assistant", "active", "alice", *GEN, 0,
                                request=TAB_A)
    state = next(sending)[1]  # the first update: the reply being written, the panel on it
    writing = cv.mark_html(None, state["ids"], writing=True)
    assert labels.mark(services, state, ids[-1], request=TAB_A) == writing  # the page's stale value: the old reply
    assert labels.mark(services, state, None, request=TAB_A) == writing
    run(sending)
    assert labels.mark(services, {"ids": ids}, ids[-1], request=TAB_B) == cv.mark_html(ids[-1], ids)  # never pointed


def test_switching_agent_while_a_reply_streams_says_what_to_do(services):
    out = send(services, "Hello")
    busy = {**out[1], "busy": True}
    refused = chat.switch_agent(services, busy, "helper", "alice")
    assert "is still being written" in refused[3] and "pick **helper** again" in refused[3]
    assert refused[-1] == "assistant" and refused[1] == gr.skip()  # the pick goes back; the conversation stays
    assert chat.switch_agent(services, out[1], "assistant", "alice")[1] == chat.empty_state()


def test_different_peoples_label_writes_do_not_wait_for_each_other_and_ones_own_keep_their_order():
    desk, order, other_done = LabelDesk(), [], threading.Event()

    def other_person():
        with desk.turn("bob"):
            order.append("bob")
        other_done.set()

    with desk.turn("alice"):
        threading.Thread(target=other_person).start()
        assert other_done.wait(30), "bob's write waited for alice's"  # a bound for a hang, not a timing goal
        queued = threading.Thread(target=lambda: desk.turn("alice").__enter__() or order.append("alice 2"))
        queued.start()
        order.append("alice 1")
    queued.join(30)
    assert order == ["bob", "alice 1", "alice 2"]


def test_label_events_are_not_one_queue_for_the_whole_server(services):
    from ui.app import build_ui

    demo = build_ui(services)
    writes = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") in
              ("like_reply", "select_reply", "label_score", "clear_score", "label_flag", "save_note")]
    assert len(writes) == 6 and all(f.concurrency_limit is None for f in writes)


def test_a_reread_on_its_way_never_moves_the_panel_back_from_a_clicked_reply(services):
    state = send(services, "first question")[1]
    state = send(services, "second question", state)[1]
    first, second = state["ids"][1], state["ids"][3]
    assert state["reply"] == second
    labels.refresh_panel(services, state, "alice", second, "alice", "", 0, request=TAB_A)
    labels.shown_now(services, request=TAB_A)
    # the page gets the focus back (a re-read of the panel's reply, #second, is asked for) and the person clicks
    # the first reply at once: the click's answer comes first, the re-read's after it
    moved = select(services, state, 1, panel=(second, "alice", "", 0), request=TAB_A)
    assert moved[0] == first
    late = labels.refresh_panel(services, state, "alice", second, "alice", "", 0, request=TAB_A)
    assert late[:labels.N_PANEL] == (gr.skip(),) * 5 + (KEEP_NOTE, gr.skip())  # the panel stays on the clicked reply
    assert late[-1] != gr.skip()  # the thumb icons are still read again
    # a re-read of the reply the panel is on reads it, and another tab of the same person is its own page
    assert labels.refresh_panel(services, state, "alice", first, "alice", "", 0, request=TAB_A)[0] == first
    assert labels.refresh_panel(services, state, "alice", second, "alice", "", 0, request=TAB_B)[0] == second


def test_a_reread_answered_after_a_click_is_followed_by_the_panel_going_back_to_the_click(services):
    """The walk's race: the re-read (asked for as the page got the focus) was read before the click on another reply
    but reached the page after the click's answer, so the page's panel named the old reply. The step after the
    re-read sees the page's panel and moves it to where the click pointed it."""
    state = send(services, "first question")[1]
    state = send(services, "second question", state)[1]
    first, second = state["ids"][1], state["ids"][3]
    reread = labels.refresh_panel(services, state, "alice", second, "alice", "", 0, request=TAB_A)
    assert reread[0] == second  # read before the click: it names the second reply
    moved = select(services, state, 1, panel=(second, "alice", "", 0), request=TAB_A)
    assert moved[0] == first
    # the re-read's answer lands last: the page's panel shows the second reply; the step after it moves it back
    after = labels.shown_now(services, "alice", second, request=TAB_A)
    assert after[0] == first and f"#{first}" in after[2]
    assert after[NOTE_SLOT] == ""  # the first reply's note, through the page's note gate (a note typed since stays)
    # in the usual order (the click's answer last) the page already shows the first reply: nothing to move, and
    # the note gate leaves the box as it is (the walk found a late answer putting the stored note over a typed one)
    still = labels.shown_now(services, "alice", first, request=TAB_A)
    assert still[NOTE_SLOT] == KEEP_NOTE
    assert all(out == gr.skip() for k, out in enumerate(still) if k != NOTE_SLOT)
