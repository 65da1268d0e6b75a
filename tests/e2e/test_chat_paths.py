"""Issue #42's Chat-tab paths, clicked, tapped and keyed in a real browser (Debian Chromium + Playwright against
`python app.py` on the tiny model), each checked against what the Store holds.

2. keys 1–5 go only to the reply marked in the chat (outlined, with its number); after Send the panel moves to the
   new reply as it starts, and a key pressed while it is written stores nothing anywhere;
4. one person in two tabs: a click on a view the other tab changed is refused and never applied to the other
   state; the tab reads the Store again when it gets the focus;
3. a click still in flight while the next reply ends lands on the reply marked at the click, and the panel goes on
   naming the reply the next click goes to;
6. a name typed while the page loads is never replaced by the name the browser remembered.
Also the phone: tap targets of at least 44 px, no keys hint on a touch screen, and the marked reply (or the
alternative Regenerate writes) on screen together with the label panel's score.
"""
from __future__ import annotations

import re

import pytest

from tests.e2e.app_process import wait_until
from tests.e2e.browser import (MESSAGE_BOX, NAME_BOX, SLOW, chat_status, launched_chromium, open_app, panel_on,
                               save_note, send_chat)
from tests.e2e.chat_support import (EngineHeld, one_reply_at_a_time, rating, rating_rows, replies_to,
                                    user_message)

pytestmark = pytest.mark.browser
WRITE = 60  # s: a label reaches the Store well within this on a loaded machine (an answer, not a timing goal)


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir):
    yield from one_reply_at_a_time(tmp_path_factory.mktemp("chat-paths"), tiny_model_dir)


@pytest.fixture(scope="module")
def chromium():
    yield from launched_chromium()


@pytest.fixture
def pages(tmp_path):
    """Pages to screenshot and close when the test ends."""
    made = []
    yield made
    for i, page in enumerate(made):
        page.screenshot(path=str(tmp_path / f"page{i}.png"), full_page=True)
    for context in {id(page.context): page.context for page in made}.values():
        context.close()


def stored(store, reply: int, name: str, expected: tuple) -> None:
    wait_until(lambda: rating(store, reply, name) == expected, WRITE,
               f"{name}'s labels on reply {reply} to be {expected} (they are {rating(store, reply, name)})")


def marked(page, label: str) -> None:
    """Wait until exactly one bubble of the chat is outlined, and it carries ``label``."""
    from playwright.sync_api import expect

    bubble = page.locator("#chat-conversation .rlhf-marked")
    expect(bubble).to_have_count(1, timeout=SLOW)
    expect(bubble).to_have_attribute("data-mark", re.compile(label), timeout=SLOW)


def test_path_2_keys_go_only_to_the_marked_reply(studio, chromium, pages):
    from playwright.sync_api import expect

    app, store = studio
    pages.append(page := open_app(chromium, app.url, "kai", viewport=(1400, 1000)))
    first = send_chat(page, "first for the keys")
    marked(page, rf"reply #{first}\b")
    page.keyboard.press("5")
    stored(store, first, "kai", (None, 5, [], None))
    box = page.get_by_placeholder(MESSAGE_BOX)
    with EngineHeld(app):
        box.fill("second for the keys")
        box.press("Enter")
        chat_status(page, "Generating")
        marked(page, "the new reply")  # the panel moved to the reply being written: the last bubble
        expect(page.get_by_text(re.compile("Labels of the new reply"))).to_be_visible(timeout=SLOW)
        expect(page.locator('#chat-score input[value="2"]')).to_be_disabled()
        page.keyboard.press("2")  # the marked reply is being written: nothing is stored anywhere
        assert not replies_to(store, user_message(store, "second for the keys").id)  # it was still streaming
    second = int(chat_status(page, r"Reply #(\d+) stored").group(1))
    panel_on(page, second)
    marked(page, rf"reply #{second}\b")
    page.keyboard.press("4")
    stored(store, second, "kai", (None, 4, [], None))
    assert rating(store, first, "kai") == (None, 5, [], None)
    assert [r[:3] for r in rating_rows(store, "kai")] == [(first, None, 5), (second, None, 4)]
    # a click on an earlier reply marks it, and the keys follow the mark
    page.locator('[data-testid="bot"]:visible').first.click()
    panel_on(page, first)
    marked(page, rf"reply #{first}\b")
    page.keyboard.press("3")
    stored(store, first, "kai", (None, 3, [], None))
    assert rating(store, second, "kai") == (None, 4, [], None)


class HeldClick:
    """The page's next Gradio event request held in the browser (the click is in flight) until ``release``; the
    requests after it go out at once. Playwright's route is the network, not a door in the app."""

    def __init__(self, page):
        self.page, self.held, self.armed = page, [], False
        page.route("**/gradio_api/queue/join*", self._route)

    def _route(self, request) -> None:
        if self.armed and not self.held:
            self.held.append(request)
        else:
            request.continue_()

    def wait_sent(self) -> None:
        """Until the click's request reached the network (Playwright calls the route while the page is waited on)."""
        for _ in range(WRITE * 10):
            if self.held:
                return
            self.page.wait_for_timeout(100)
        raise AssertionError("the click never sent its request")

    def release(self) -> None:
        self.armed = False
        for request in self.held:
            request.continue_()
        self.page.unroute("**/gradio_api/queue/join*")


def test_path_3_a_click_in_flight_lands_on_the_reply_marked_at_the_click(studio, chromium, pages):
    from playwright.sync_api import expect

    app, store = studio
    pages.append(page := open_app(chromium, app.url, "ivy", viewport=(1400, 1000)))
    first = send_chat(page, "first, labelled while the next one ends")
    box = page.get_by_placeholder(MESSAGE_BOX)
    held = HeldClick(page)
    with EngineHeld(app):
        box.fill("second, ending while a click is in flight")
        box.press("Enter")
        chat_status(page, "Generating")
        page.locator('[data-testid="bot"]:visible').first.click()  # the hand goes back to the first reply
        panel_on(page, first)
        marked(page, rf"reply #{first}\b")
        held.armed = True
        page.get_by_role("radio", name="4", exact=True).click()  # in flight: held in the browser
        held.wait_sent()
        assert rating(store, first, "ivy") == (None, None, [], None)
    second = int(chat_status(page, r"Reply #(?!%d\b)(\d+) stored" % first).group(1))  # the new reply ended
    held.release()
    stored(store, first, "ivy", (None, 4, [], None))  # the click landed on the reply marked when it was made
    assert rating(store, second, "ivy") == (None, None, [], None)
    panel_on(page, first)  # and the panel names the reply the next click goes to
    marked(page, rf"reply #{first}\b")
    page.get_by_role("checkbox", name="Unsafe").click()
    stored(store, first, "ivy", (None, 4, ["Unsafe"], None))
    assert rating(store, second, "ivy") == (None, None, [], None)
    assert [r[0] for r in rating_rows(store, "ivy")] == [first, first]


def test_path_4_two_tabs_of_one_person_follow_the_store(studio, chromium, pages):
    from playwright.sync_api import expect

    app, store = studio
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    a = context.new_page()
    pages.append(a)
    a.goto(app.url + "/", timeout=SLOW)
    a.get_by_placeholder(NAME_BOX).fill("pia")
    reply = send_chat(a, "one person, two tabs")
    a.get_by_role("button", name="Like", exact=True).last.click()
    stored(store, reply, "pia", (1, None, [], None))

    b = context.new_page()  # the same browser: the name is remembered
    b.goto(app.url + "/", timeout=SLOW)
    expect(b.get_by_placeholder(NAME_BOX)).to_have_value("pia", timeout=SLOW)
    b.get_by_role("combobox", name="Your conversations").click()
    b.get_by_role("option", name=re.compile("one person, two tabs")).click()
    panel_on(b, reply)
    b.get_by_role("button", name="Dislike", exact=True).last.click()
    stored(store, reply, "pia", (-1, None, [], None))
    b.get_by_role("radio", name="5", exact=True).click()
    stored(store, reply, "pia", (-1, 5, [], None))

    # tab A still shows its lit 👍 and no score: a click on either is refused and never applied to the other state
    a.get_by_role("button", name="Liked", exact=True).last.click()
    chat_status(a, r"changed in another tab")
    a.get_by_role("radio", name="2", exact=True).click()
    chat_status(a, r"score changed in another tab")
    assert rating(store, reply, "pia") == (-1, 5, [], None) and store.count("rating_withdrawals") == 0
    # the refusals showed tab A what is stored; a focus reads it again too
    expect(a.get_by_role("button", name="Disliked", exact=True).last).to_be_visible(timeout=SLOW)
    expect(a.get_by_role("radio", name="5", exact=True)).to_be_checked(timeout=SLOW)
    b.get_by_role("checkbox", name="Unsafe").click()
    stored(store, reply, "pia", (-1, 5, ["Unsafe"], None))
    a.bring_to_front()
    a.evaluate("() => window.dispatchEvent(new Event('focus'))")  # headless windows never lose the focus
    expect(a.get_by_role("checkbox", name="Unsafe")).to_be_checked(timeout=SLOW)
    a.get_by_role("checkbox", name="Inaccurate").click()  # on the view A now shows: stored
    stored(store, reply, "pia", (-1, 5, ["Inaccurate", "Unsafe"], None))

    # a note typed in A while A's re-read is on its way stays in the box, and Save stores it (the walk found the
    # re-read's answer putting B's stored note over it, and Save then storing nothing)
    save_note(b, "B's note")
    b.get_by_role("checkbox", name="Off-topic").click()
    stored(store, reply, "pia", (-1, 5, ["Inaccurate", "Off-topic", "Unsafe"], "B's note"))
    a.bring_to_front()
    # the focus sends the re-read and the note is typed in the same task, so the typing lands while the re-read is
    # on its way on any machine (Playwright's fill selects, then inserts: an answer landing between the two would
    # put B's note in the box first, as it would for a person who began typing after the answer came)
    a.evaluate("""(text) => {
      window.dispatchEvent(new Event('focus'));
      const box = document.querySelector('#chat-note textarea');
      box.focus();
      box.value = text;
      box.dispatchEvent(new Event('input', {bubbles: true}));
    }""", "A typed this as the page read again")
    expect(a.get_by_role("checkbox", name="Off-topic")).to_be_checked(timeout=SLOW)  # the re-read's answer came
    expect(a.get_by_label("Note", exact=True)).to_have_value("A typed this as the page read again")
    a.get_by_role("button", name="Save note").click()
    chat_status(a, r"Note stored on reply #\d+")
    stored(store, reply, "pia", (-1, 5, ["Inaccurate", "Off-topic", "Unsafe"], "A typed this as the page read again"))


def test_path_6_a_name_typed_while_the_page_loads_is_never_replaced(studio, chromium, pages):
    from playwright.sync_api import expect

    app, store = studio
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    first = context.new_page()
    pages.append(first)
    first.goto(app.url + "/", timeout=SLOW)
    first.get_by_placeholder(NAME_BOX).fill("kim")  # remembered in this browser
    send_chat(first, "kim was here")

    page = context.new_page()
    pages.append(page)
    held, state = [], {"typed": False}

    def route(r):  # the page's first requests wait until a name is typed: the remembered one arrives late
        if state["typed"]:
            r.continue_()
        else:
            held.append(r)

    page.route("**/gradio_api/queue/join*", route)
    page.goto(app.url + "/", timeout=SLOW)
    box = page.get_by_placeholder(NAME_BOX)
    expect(box).to_be_visible(timeout=SLOW)
    box.fill("lou")
    state["typed"] = True
    for r in held:
        r.continue_()
    page.unroute("**/gradio_api/queue/join*")  # later requests go straight out, not through this (sync) handler
    reply = send_chat(page, "lou's own question")
    expect(box).to_have_value("lou")
    marked(page, rf"reply #{reply}\b")  # the panel filled in with the reply once it ended: the keys go there
    page.keyboard.press("4")
    stored(store, reply, "lou", (None, 4, [], None))
    assert store.get_conversation(store.get_message(reply).conversation_id).annotator_id == store.annotator_id("lou")
    assert rating_rows(store, "kim") == []


def test_phone_tap_targets_and_no_keys_hint_on_touch(studio, chromium, pages):
    from playwright.sync_api import expect

    app, store = studio
    context = chromium.new_context(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    page = context.new_page()
    pages.append(page)
    page.goto(app.url + "/", timeout=SLOW)
    page.get_by_placeholder(NAME_BOX).fill("tao")
    first = send_chat(page, "a question from a phone")
    second = send_chat(page, "and another from a phone")
    expect(page.locator(".rlhf-keys").first).to_be_hidden()
    for target in (page.get_by_role("button", name="Like", exact=True).first,
                   page.get_by_role("button", name="Save note"), page.get_by_role("button", name="Regenerate"),
                   page.get_by_role("button", name=re.compile("Previous alternative")),
                   page.get_by_role("button", name=re.compile("Next alternative"))):
        box = target.bounding_box()
        assert box and box["height"] >= 44 and box["width"] >= 44, (target, box)
    page.get_by_role("button", name="Like", exact=True).first.tap()  # the first reply's thumb, by touch
    stored(store, first, "tao", (1, None, [], None))
    panel_on(page, first)
    page.wait_for_timeout(2500)  # past the moments after a new mark when the page brings the reply back itself
    assert page.evaluate(CHAT_BOX_TO_BOTTOM)  # as the chat does when it redraws: the first reply leaves its box
    page.get_by_role("radio", name="2", exact=True).tap()
    stored(store, first, "tao", (1, 2, [], None))
    on_screen(page, first)  # the tapped reply and its score, without scrolling
    page.locator('[data-testid="bot"]:visible').last.tap()
    panel_on(page, second)
    on_screen(page, second)
    page.get_by_role("button", name="Regenerate").tap()  # the alternative streams where the eye is
    alternative = int(chat_status(page, r"Alternative 2 stored as reply #(\d+)").group(1))
    panel_on(page, alternative)
    on_screen(page, alternative)


# Scrolls every scroll box inside the conversation to its end; says whether one of them moved.
CHAT_BOX_TO_BOTTOM = """() => {
  let moved = false;
  document.querySelectorAll("#chat-conversation *").forEach((node) => {
    const style = getComputedStyle(node).overflowY;
    if ((style === "auto" || style === "scroll") && node.scrollHeight > node.clientHeight) {
      node.scrollTop = node.scrollHeight;
      moved = true;
    }
  });
  return moved;
}"""


def on_screen(page, reply: int) -> None:
    """The marked reply and the label panel's score are both in the phone's viewport."""
    from playwright.sync_api import expect

    marked(page, rf"reply #{reply}\b")
    expect(page.locator("#chat-conversation .rlhf-marked")).to_be_in_viewport(timeout=SLOW)
    for target in (page.get_by_text(re.compile(rf"Labels of reply #{reply}\b")),
                   page.get_by_role("radio", name="5", exact=True)):
        expect(target).to_be_in_viewport(timeout=SLOW)
