"""The six wrong or lost labels of issue 34, each clicked in a real browser (Debian Chromium + Playwright against
`python app.py` on the tiny model) and checked against what the Store holds. Each failed on the form that carried
its values between replies; a label is now one immediate write addressed by the reply it was clicked on.

1. a rating revised while the next reply streams (Send or Regenerate) stays as revised when that reply ends;
2. a note typed while a reply streams is still in its box, on that reply, when it ends (another reply's unsaved
   note stays as that reply's draft);
3. a new name labels only what is clicked after it: moving with ◀/▶ stores nothing under it;
4. a lit 👍/👎 clicked again takes the thumb back (an append-only withdrawal), also after a reload;
5. the empty Seed box sends "random", never 0; a repeated seed's identical replies never make a preference pair;
6. a thumb clicked while a reply streams leaves New conversation and Regenerate locked until the reply ends.

Turns are held back by stopping the engine process (``EngineHeld``) so that "while it streams" holds on any machine.
"""
from __future__ import annotations

import re

import pytest

from rlhf.training.data import build_pairs
from storage import Store
from tests.e2e.app_process import wait_until
from tests.e2e.browser import (MESSAGE_BOX, NAME_BOX, SLOW, bot_bubbles, chat_status, launched_chromium, open_app,
                               panel_on, save_note, score_reply, send_chat, tick_flag)
from tests.e2e.chat_support import EngineHeld, one_reply_at_a_time, rating, rating_rows, replies_to, user_message

pytestmark = pytest.mark.browser
WRITE = 60  # s: a label click reaches the Store well within this on a loaded machine (an answer, not a timing goal)


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir):
    yield from one_reply_at_a_time(tmp_path_factory.mktemp("label-cases"), tiny_model_dir)


@pytest.fixture(scope="module")
def chromium():
    yield from launched_chromium()


@pytest.fixture
def page_of(studio, chromium, tmp_path):
    """``page_of(name)``: a fresh page on the app at 1400×1000 (own local storage); a screenshot when it ends."""
    pages = []

    def make(name=None):
        pages.append(open_app(chromium, studio[0].url, name, viewport=(1400, 1000)))
        return pages[-1]

    yield make
    for i, page in enumerate(pages):
        page.screenshot(path=str(tmp_path / f"page{i}.png"), full_page=True)
        page.context.close()


def stored(store: Store, reply: int, name: str, expected: tuple) -> None:
    """Wait until the Store holds ``expected`` (thumb, score, flags, note) as ``name``'s labels on ``reply``."""
    wait_until(lambda: rating(store, reply, name) == expected, WRITE,
               f"{name}'s labels on reply {reply} to be {expected} (they are {rating(store, reply, name)})")


def stays(page, shown: int, new: int) -> None:
    """Wait until the label panel, kept on reply ``shown`` by the person's hand, says the reply ``new`` is in."""
    from playwright.sync_api import expect

    expect(page.get_by_text(re.compile(rf"Labels of reply #{shown}\b.*new reply #{new} is in"))).to_be_visible(
        timeout=SLOW)


def test_1_a_rating_revised_while_the_next_reply_streams_stays_as_revised(studio, page_of):
    from playwright.sync_api import expect

    app, store = studio
    page = page_of("ulla")
    first = send_chat(page, "first question")
    score_reply(page, 2)
    save_note(page, "first thoughts")
    stored(store, first, "ulla", (None, 2, [], "first thoughts"))

    # Send: while the next reply streams, go back to the first reply and revise its labels
    box = page.get_by_placeholder(MESSAGE_BOX)
    with EngineHeld(app):
        box.fill("second question")
        box.press("Enter")
        chat_status(page, "Generating")
        bot_bubbles(page).first.click()
        panel_on(page, first)
        score_reply(page, 4)
        tick_flag(page, "Inaccurate")
        save_note(page, "revised while the next reply streamed")
        revised = (None, 4, ["Inaccurate"], "revised while the next reply streamed")
        stored(store, first, "ulla", revised)
        assert not replies_to(store, user_message(store, "second question").id)  # it was still streaming
    # the reply ended: it wrote nothing back, and the panel stayed where the hand was labelling
    second = int(chat_status(page, r"Reply #(\d+) stored").group(1))
    stays(page, first, second)
    assert rating(store, first, "ulla") == revised
    assert rating(store, second, "ulla") == (None, None, [], None)

    # Regenerate the first reply: the panel moves to the alternative being written (a key meanwhile stores
    # nothing), and fills in with it when it ends; the first reply keeps its labels as revised
    with EngineHeld(app):
        page.get_by_role("button", name="Regenerate").click()
        chat_status(page, "Regenerating")
        expect(page.get_by_text(re.compile("Labels of the new reply"))).to_be_visible(timeout=SLOW)
        page.keyboard.press("1")
        assert len(store.siblings(first)) == 1
    again = int(chat_status(page, r"Alternative 2 stored as reply #(\d+)").group(1))
    panel_on(page, again)
    assert rating(store, first, "ulla") == revised
    assert rating(store, again, "ulla") == (None, None, [], None)
    assert [r[0] for r in rating_rows(store, "ulla")] == [first] * 5  # 2 + 3 clicks, one event each


def test_2_a_note_typed_while_a_reply_streams_stays_in_its_box_on_its_reply(studio, page_of):
    from playwright.sync_api import expect

    app, store = studio
    page = page_of("vera")
    first = send_chat(page, "tell me something")
    note = page.get_by_label("Note", exact=True)
    note.fill("about the first, not saved yet")
    box = page.get_by_placeholder(MESSAGE_BOX)
    with EngineHeld(app):
        box.fill("and something else")
        box.press("Enter")
        chat_status(page, "Generating")
        expect(note).to_have_value("")  # the panel is on the reply being written; the first's note is its draft
        note.fill("typed while the reply streams, for it")
        assert rating_rows(store, "vera") == []
    second = int(chat_status(page, r"Reply #(\d+) stored").group(1))
    panel_on(page, second)
    expect(note).to_have_value("typed while the reply streams, for it")
    page.get_by_role("button", name="Save note").click()
    chat_status(page, rf"Note stored on reply #{second}\b")
    stored(store, second, "vera", (None, None, [], "typed while the reply streams, for it"))
    bot_bubbles(page).first.click()  # the first reply's draft comes back with it
    panel_on(page, first)
    expect(note).to_have_value("about the first, not saved yet")
    assert rating(store, first, "vera") == (None, None, [], None)


def test_3_a_new_name_labels_only_what_is_clicked_after_it(studio, page_of):
    from playwright.sync_api import expect

    _, store = studio
    page = page_of("alma")
    first = send_chat(page, "what is a good name for a cat?")
    score_reply(page, 2)
    page.get_by_role("button", name="Regenerate").click()
    second = int(chat_status(page, r"Alternative 2 stored as reply #(\d+)").group(1))
    panel_on(page, second)
    score_reply(page, 3)
    save_note(page, "alma's note")
    before = rating_rows(store, "alma")

    page.get_by_placeholder(NAME_BOX).fill("bert")  # another person takes the chair
    expect(page.get_by_text(re.compile(rf"Labels of reply #{second}\b.* as bert"))).to_be_visible(timeout=SLOW)
    expect(page.get_by_role("radio", name="3", exact=True)).not_to_be_checked()  # bert has no score here
    expect(page.get_by_label("Note", exact=True)).to_have_value("")
    page.get_by_role("button", name="Previous alternative").click()
    panel_on(page, first)
    page.get_by_role("button", name="Next alternative").click()
    panel_on(page, second)
    page.get_by_role("button", name="Previous alternative").click()
    panel_on(page, first)
    assert rating_rows(store, "bert") == []  # moving stored nothing, under either name
    assert rating_rows(store, "alma") == before

    score_reply(page, 5)  # a click after the change: bert's, on the reply shown
    stored(store, first, "bert", (None, 5, [], None))
    assert rating(store, first, "alma") == (None, 2, [], None)
    assert rating(store, second, "alma") == (None, 3, [], "alma's note") and rating_rows(store, "alma") == before


def test_4_a_lit_thumb_clicked_again_is_taken_back(studio, page_of):
    from playwright.sync_api import expect

    _, store = studio
    page = page_of("tomo")
    reply = send_chat(page, "thumbs please")
    page.get_by_role("button", name="Like", exact=True).last.click()
    stored(store, reply, "tomo", (1, None, [], None))
    page.get_by_role("button", name="Liked", exact=True).last.click()  # the lit icon again
    chat_status(page, rf"thumb taken back on reply #{reply}\b")
    stored(store, reply, "tomo", (None, None, [], None))
    page.get_by_role("button", name="Dislike", exact=True).last.click()
    stored(store, reply, "tomo", (-1, None, [], None))
    page.get_by_role("button", name="Disliked", exact=True).last.click()
    stored(store, reply, "tomo", (None, None, [], None))
    assert store.count("rating_withdrawals") >= 2
    assert [r.withdrawn for r in store.ratings_by(reply, "tomo")] == [["thumb"], ["thumb"]]  # append-only

    page.reload()  # the icons come back from the Store: nothing lit
    expect(page.get_by_placeholder(NAME_BOX)).to_have_value("tomo")
    page.get_by_role("combobox", name="Your conversations").click()
    page.get_by_role("option", name=re.compile("thumbs please")).click()
    panel_on(page, reply)
    expect(page.get_by_role("button", name="Like", exact=True).last).to_be_visible()
    assert page.get_by_role("button", name=re.compile("^(Liked|Disliked)$")).count() == 0
    page.get_by_role("button", name="Like", exact=True).last.click()
    stored(store, reply, "tomo", (1, None, [], None))


def test_5_an_empty_seed_is_random_and_identical_replies_make_no_pair(studio, page_of):
    from playwright.sync_api import expect

    _, store = studio
    page = page_of("sora")
    page.get_by_role("button", name=re.compile("^Generation settings")).click()
    seed = page.get_by_role("textbox", name=re.compile(r"^Seed \(empty = random\)"))
    expect(seed).to_have_value("")  # empty, not 0
    first = send_chat(page, "surprise me")
    page.get_by_role("button", name="Regenerate").click()
    second = int(chat_status(page, r"Alternative 2 stored as reply #(\d+)").group(1))
    panel_on(page, second)
    assert [store.get_message(i).gen_params["seed"] for i in (first, second)] == [None, None]

    seed.fill("seven")  # bad input: a clear error, nothing stored
    n = store.count("messages")
    page.get_by_role("button", name="Regenerate").click()
    chat_status(page, "Seed must be a whole number")
    assert store.count("messages") == n

    seed.fill("7")  # a fixed seed repeats the reply word for word: the page says so, and no pair is ever made
    page.get_by_role("button", name="Regenerate").click()
    third = int(chat_status(page, r"Alternative 3 stored as reply #(\d+)").group(1))
    panel_on(page, third)
    page.get_by_role("button", name="Regenerate").click()
    fourth = int(chat_status(page, r"Alternative 4 stored as reply #(\d+).*word for word the same text").group(1))
    panel_on(page, fourth)
    assert store.get_message(third).content == store.get_message(fourth).content
    assert store.get_message(fourth).gen_params["seed"] == 7
    page.get_by_role("button", name="Like", exact=True).last.click()
    chat_status(page, rf"👍 stored on reply #{fourth}\b.*word for word the same text")
    page.get_by_role("button", name="Previous alternative").click()
    panel_on(page, third)
    page.get_by_role("button", name="Dislike", exact=True).last.click()
    stored(store, third, "sora", (-1, None, [], None))
    pairs = build_pairs(store.feedback_rows("assistant"))
    assert all(p["chosen"] != p["rejected"] for p in pairs)
    assert not [p for p in pairs if {p["chosen_id"], p["rejected_id"]} == {third, fourth}]


def test_6_a_thumb_during_a_stream_keeps_new_conversation_and_regenerate_locked(studio, page_of):
    from playwright.sync_api import expect

    app, store = studio
    page = page_of("wren")
    first = send_chat(page, "the old conversation")
    regen = page.get_by_role("button", name="Regenerate")
    new = page.get_by_role("button", name="New conversation")
    box = page.get_by_placeholder(MESSAGE_BOX)
    with EngineHeld(app):
        box.fill("still the old conversation")
        box.press("Enter")
        chat_status(page, "Generating")
        expect(regen).to_be_disabled()
        expect(new).to_be_disabled()
        page.get_by_role("button", name="Like", exact=True).first.click()  # the first reply's thumb
        stored(store, first, "wren", (1, None, [], None))
        chat_status(page, rf"👍 stored on reply #{first}\b")
        expect(regen).to_be_disabled()
        expect(new).to_be_disabled()
        page.get_by_role("button", name="Clear", exact=True).click()  # the chat's trash icon: refused too
        chat_status(page, "A reply is being written")
        assert not replies_to(store, user_message(store, "still the old conversation").id)
    second = int(chat_status(page, r"Reply #(\d+) stored").group(1))
    assert store.get_message(second).conversation_id == store.get_message(first).conversation_id
    expect(new).to_be_enabled()
    new.click()
    chat_status(page, "New conversation")
    fresh = send_chat(page, "a fresh start")
    assert store.get_message(fresh).conversation_id != store.get_message(first).conversation_id
    assert [m.content for m in store.branch(fresh)][:1] == ["a fresh start"]
