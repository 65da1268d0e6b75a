"""No wrong or lost labels in the Chat tab, clicked in a real browser (Debian Chromium + Playwright against
`python app.py` on the tiny model). Each test plays one thing an annotator does and checks what the Store holds.

1. the label panel always shows the clicked reply's own labels, each stored on that reply at its click;
2. a message typed or sent while a reply streams is kept and sent;
3. the chat's trash icon starts a new conversation;
4. a reload mid-reply keeps the conversation (listed, its unanswered turn marked and answerable);
5. in local mode a label needs a name (asked once, remembered in the browser), never "(anonymous)";
6. a flag ticked in the panel is stored on the panel's reply; Regenerate answers that reply again and the
   earlier alternative stays viewable;
7. a new API token's copy button copies the token alone (no stray line).
The six wrong-label paths of issue 34 have their own module, ``test_label_cases``.
"""
from __future__ import annotations

import re

import pytest

from tests.e2e.app_process import wait_until
from tests.e2e.browser import (MESSAGE_BOX, NAME_BOX, SLOW, bot_bubbles, chat_status, launched_chromium, open_app,
                               open_tab, panel_on, save_note, score_reply, send_chat, set_max_tokens, status_text,
                               tick_flag, user_bubbles)
from tests.e2e.chat_support import LONG, EngineHeld, one_reply_at_a_time, rating, replies_to, user_message

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir):
    yield from one_reply_at_a_time(tmp_path_factory.mktemp("labels"), tiny_model_dir)


@pytest.fixture(scope="module")
def chromium():
    yield from launched_chromium()


def test_a_new_api_tokens_copy_button_copies_the_token_alone(studio, chromium, tmp_path):
    from playwright.sync_api import expect

    _, store = studio
    context = chromium.new_context(viewport={"width": 1400, "height": 1000},
                                   permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    try:
        page.goto(studio[0].url + "/", timeout=SLOW)
        open_tab(page, "Data")
        page.get_by_role("button", name="API tokens (admin)").click()
        page.get_by_label("User", exact=True).fill("bob")
        page.get_by_role("button", name="Create token").click()
        box = page.locator("#new-token textarea, #new-token input").first
        expect(box).to_have_value(re.compile(r"^rlhf_\S+$"), timeout=SLOW)
        page.locator("#new-token button").first.click()  # the box's copy button
        copied = page.evaluate("navigator.clipboard.readText()")
        assert copied == box.input_value() and store.token_owner(copied) == "bob"
    finally:
        page.screenshot(path=str(tmp_path / "token.png"), full_page=True)
        context.close()


@pytest.fixture
def page_of(studio, chromium, tmp_path):
    """``page_of(name)``: a fresh page on the app (own local storage); a screenshot when the test fails."""
    pages = []

    def make(name=None):
        pages.append(open_app(chromium, studio[0].url, name))
        return pages[-1]

    yield make
    for i, page in enumerate(pages):
        page.screenshot(path=str(tmp_path / f"page{i}.png"), full_page=True)
        page.context.close()


def test_the_panel_shows_and_stores_the_clicked_replys_own_labels(studio, page_of):
    from playwright.sync_api import expect

    _, store = studio
    page = page_of("rita")
    score = lambda n: page.get_by_role("radio", name=str(n), exact=True)  # noqa: E731
    note = page.get_by_label("Note", exact=True)
    first = send_chat(page, "first question")
    score_reply(page, 2)
    save_note(page, "note on the first reply")

    second = send_chat(page, "second question")  # a new reply: an empty panel
    expect(score(2)).not_to_be_checked()
    expect(note).to_have_value("")
    score_reply(page, 4)

    page.get_by_role("button", name="Regenerate").click()
    third = int(chat_status(page, r"Alternative 2 stored as reply #(\d+)").group(1))
    panel_on(page, third)
    expect(score(4)).not_to_be_checked()
    score_reply(page, 5)

    bot_bubbles(page).first.click()  # back to the first reply: its own labels come back
    panel_on(page, first)
    expect(score(2)).to_be_checked()
    expect(note).to_have_value("note on the first reply")

    assert rating(store, first, "rita") == (None, 2, [], "note on the first reply")
    assert rating(store, second, "rita") == (None, 4, [], None)
    assert rating(store, third, "rita") == (None, 5, [], None)


def test_a_message_typed_or_sent_while_a_reply_streams_is_kept_and_sent(studio, page_of):
    from playwright.sync_api import expect

    app, store = studio
    page = page_of("sam")
    set_max_tokens(page, LONG)
    box = page.get_by_placeholder(MESSAGE_BOX)
    with EngineHeld(app):  # the stopped engine holds the turn: it is in flight while the box is typed in
        box.fill("a long first answer please")
        box.press("Enter")
        status_text(page, "Generating")
        box.fill("typed while it streams")  # not sent: must still be there afterwards
    chat_status(page, r"Reply #\d+ stored")
    expect(box).to_have_value("typed while it streams")

    # Enter while a reply is in flight: the message goes out when the reply ends. The stopped engine holds the
    # browser's turn back, so Enter lands before its reply on any machine, however fast or loaded.
    long_one, follow_up = "a long answer please", "sent while it streams"
    with EngineHeld(app):
        box.fill(long_one)
        box.press("Enter")
        status_text(page, "Generating")
        box.fill(follow_up)
        box.press("Enter")
        asked = wait_until(lambda: user_message(store, long_one), SLOW / 1000, "the first message")
        assert not replies_to(store, asked.id) and user_message(store, follow_up) is None
    sent = wait_until(lambda: user_message(store, follow_up), SLOW / 1000, "the message sent while streaming")
    answer = wait_until(lambda: replies_to(store, sent.id), SLOW / 1000, "the reply to it")
    (long_reply,) = replies_to(store, asked.id)
    assert sent.parent_id == long_reply.id and sent.conversation_id == asked.conversation_id
    chat_status(page, rf"Reply #{answer[0].id} stored")
    expect(box).to_have_value("")
    expect(user_bubbles(page)).to_have_count(3)


def test_the_trash_icon_starts_a_new_conversation(studio, page_of):
    """Also when the trash's own event reaches the server after the next message is sent: held here for a while,
    the message waits for it and goes to a new conversation (it once went to the conversation just left)."""
    from playwright.sync_api import expect

    _, store = studio
    page = page_of("tess")
    before = send_chat(page, "alpha")
    held, holding = [], [True]
    page.route("**/gradio_api/queue/join*", lambda route: held.append(route) if holding[0] else route.continue_())
    page.get_by_role("button", name="Clear", exact=True).click()
    expect(user_bubbles(page)).to_have_count(0)
    trash_event = '{"data":[null,"assistant","tess",'  # new_conversation's inputs: (state, agent, name, ...)
    wait_until(lambda: page.wait_for_timeout(50) or any((r.request.post_data or "").startswith(trash_event)
                                                         for r in held), SLOW / 1000, "the trash's event, held")
    holding[0] = False  # the trash's event (and any other sent since the click) stays held; what follows goes through
    box = page.get_by_placeholder(MESSAGE_BOX)
    box.fill("beta")
    box.press("Enter")
    page.wait_for_timeout(1500)
    assert user_message(store, "beta") is None  # the message waits for the trash's event
    for route in held:
        route.continue_()
    after = int(chat_status(page, r"Reply #(?!%d\b)(\d+) stored" % before).group(1))
    panel_on(page, after)
    old, new = store.get_message(before), store.get_message(after)
    assert new.conversation_id != old.conversation_id
    assert [m.content for m in store.branch(after)][:1] == ["beta"]
    expect(user_bubbles(page)).to_have_count(1)


def test_a_reload_mid_reply_keeps_the_conversation_and_marks_the_unanswered_turn(studio, page_of):
    from playwright.sync_api import expect

    app, store = studio
    page = page_of("rhea")
    send_chat(page, "a turn that gets its reply")
    box = page.get_by_placeholder(MESSAGE_BOX)
    with EngineHeld(app):  # the turn below cannot get its reply before the reload, on any machine
        box.fill("a turn interrupted by a reload")
        box.press("Enter")
        status_text(page, "Generating")
        page.reload()
        expect(page.get_by_placeholder(NAME_BOX)).to_have_value("rhea")  # the name is remembered
    turn = user_message(store, "a turn interrupted by a reload")
    assert turn is not None
    # One reply decodes at a time, first come first served: once a turn sent after the reload is answered, a reply
    # the reload failed to cancel would have been answered before it. None must be.
    with app.client() as http:
        http.post("/chat", json={"messages": [{"role": "user", "content": "after the reload"}], "max_new_tokens": 4,
                                 "annotator": "after-the-reload"}).raise_for_status()
    assert not replies_to(store, turn.id)
    page.get_by_role("combobox", name="Your conversations").click()
    page.get_by_role("option", name=re.compile("a turn that gets its reply.*unanswered")).click()
    expect(user_bubbles(page)).to_have_count(2)
    status_text(page, "no reply yet")
    page.get_by_role("button", name="Regenerate").click()  # answers the unanswered turn
    reply = int(chat_status(page, r"Answered: reply #(\d+) stored").group(1))
    assert [m.id for m in replies_to(store, turn.id)] == [reply]


def test_labels_need_a_name_in_local_mode(studio, page_of):
    from playwright.sync_api import expect

    _, store = studio
    page = page_of(None)  # a first visit: no name yet
    box = page.get_by_placeholder(MESSAGE_BOX)
    box.fill("who am I?")
    box.press("Enter")
    status_text(page, "Type your name")
    expect(box).to_have_value("who am I?")  # nothing lost: the message waits in the box
    assert user_message(store, "who am I?") is None

    page.get_by_placeholder(NAME_BOX).fill("nina")
    box.press("Enter")
    reply = int(chat_status(page, r"Reply #(\d+) stored").group(1))
    page.get_by_role("button", name="Like", exact=True).last.click()
    chat_status(page, rf"👍 stored on reply #{reply}\b")
    assert rating(store, reply, "nina")[0] == 1
    assert rating(store, reply, None) == (None, None, [], None)  # nothing anonymous
    page.reload()
    expect(page.get_by_placeholder(NAME_BOX)).to_have_value("nina", timeout=SLOW)  # the page loads its events first


def test_a_name_changed_just_before_a_reload_is_the_one_remembered(studio, page_of):
    """The name is saved in the browser at the keystroke, not after a round trip to a queue that may be busy: with
    every queued request held, a changed name still survives a reload (the labels after it go under it)."""
    from playwright.sync_api import expect

    page = page_of(None)
    saved = "() => localStorage.getItem('rlhf-studio-annotator')"  # encrypted, with a new IV each time it is saved
    held = []
    page.route("**/gradio_api/queue/join*", lambda route: held.append(route))  # the server hears nothing from here on
    for name in ("rover", "walker2"):
        before = page.evaluate(saved)
        page.get_by_placeholder(NAME_BOX).fill(name)
        wait_until(lambda: page.evaluate(saved) != before, SLOW / 1000, f"the browser to save {name!r} (no server)")
    page.unroute_all(behavior="ignoreErrors")  # the held requests die with the page
    page.reload()
    expect(page.get_by_placeholder(NAME_BOX)).to_have_value("walker2", timeout=SLOW)


def test_a_flag_ticked_in_the_panel_and_regenerate_act_on_the_panels_reply(studio, page_of):
    from playwright.sync_api import expect

    _, store = studio
    page = page_of("fay")
    first = send_chat(page, "one")
    tick_flag(page, "Unsafe")
    expect(page.get_by_role("checkbox", name="Unsafe")).to_be_checked()
    assert rating(store, first, "fay")[2] == ["Unsafe"]

    second = send_chat(page, "two")
    expect(page.get_by_role("checkbox", name="Unsafe")).not_to_be_checked()  # the new reply's own (empty) flags
    bot_bubbles(page).first.click()
    panel_on(page, first)
    expect(page.get_by_role("checkbox", name="Unsafe")).to_be_checked()
    page.get_by_role("button", name="Regenerate").click()
    again = int(chat_status(page, r"Alternative 2 stored as reply #(\d+)").group(1))
    panel_on(page, again)
    assert [m.id for m in store.siblings(again)] == [first, again]
    assert store.get_message(second).parent_id != store.get_message(again).parent_id
    expect(user_bubbles(page)).to_have_count(1)  # the new alternative's branch: "one" and its new reply

    page.get_by_role("button", name="Previous alternative").click()  # the earlier one, with its follow-up
    panel_on(page, first)
    expect(user_bubbles(page)).to_have_count(2)
    expect(user_bubbles(page).last).to_contain_text("two")


def test_an_over_long_message_is_refused_whole_and_kept_not_cut(studio, page_of):
    from playwright.sync_api import expect

    _, store = studio
    page = page_of("lena")
    box = page.get_by_placeholder(MESSAGE_BOX)
    long_text = "word " * 4000  # 20,000 characters; the limit is 8,000
    box.fill(long_text)
    expect(box).to_have_value(long_text)  # the browser keeps all of it
    box.press("Enter")
    status_text(page, r"Your message is 20,000 characters; the limit is 8,000")
    expect(box).to_have_value(long_text)
    assert user_message(store, long_text) is None and user_message(store, long_text[:8000]) is None
    box.fill("   ")
    box.press("Enter")
    status_text(page, "Type a message first")
