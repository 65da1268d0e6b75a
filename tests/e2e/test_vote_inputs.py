"""The Vote tab in Chromium: every vote lands on the pair that was on screen, checked in the Store.

A second press right after a vote (mouse, touch, key) would vote on the next pair, unread: the page ignores it. The
app reads a pair for ``queue.read_ms``; here that is ten minutes, so the second press falls inside it on any machine
(the page counts the presses it ignored, which is what the tests wait for). Two tabs of one person, and a name
changed while a pair is shown, are refused in plain words and store nothing.
"""
from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from storage import Store
from tests.e2e.app_process import queue_studio
from tests.e2e.browser import NAME_BOX, SLOW, launched_chromium, open_tab

pytestmark = pytest.mark.browser

QUEUE = {"queue": {"refill": True, "low_water": 6, "target_ready": 10, "batch_size": 3, "poll_seconds": 0.5,
                   "max_new_tokens": 12, "temperature": 1.0, "read_ms": 600_000}}


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir):
    yield from queue_studio(tmp_path_factory.mktemp("vote-inputs"), tiny_model_dir, QUEUE, 6, 180)


@pytest.fixture(scope="module")
def browser():
    yield from launched_chromium()


def vote_page(browser, url: str, name: str, touch: bool = False):
    """A fresh page on the Vote tab with ``name`` typed and a pair shown; (page, the item on screen)."""
    size = {"width": 390, "height": 844} if touch else {"width": 1280, "height": 1000}
    page = browser.new_context(viewport=size, has_touch=touch, is_mobile=touch).new_page()
    page.goto(url + "/", timeout=SLOW)
    page.get_by_placeholder(NAME_BOX).fill(name)
    open_tab(page, "Vote")
    return page, shown_item(page)


def shown_item(page, other_than: int | None = None) -> int:
    """The item the status line names (waiting for one other than ``other_than``)."""
    skip = rf"(?!{other_than}\b)" if other_than is not None else ""
    line = page.locator("#vote-status")
    try:
        line.get_by_text(re.compile(rf"Item #{skip}\d+ · ")).wait_for(timeout=SLOW)
    except PlaywrightTimeout:  # say what the page said instead
        raise AssertionError(f"no item other than #{other_than} shown; the status line: {line.inner_text()!r}")
    return int(re.findall(r"Item #(\d+) · ", line.inner_text())[-1])


def ready_for(store: Store, name: str, seconds: float = SLOW / 1000) -> None:
    """Wait until the queue holds an item ``name`` may be shown (the refill runs in the background and, on a loaded
    machine, can be behind the tests that used the items before)."""
    deadline = time.monotonic() + seconds
    while store.queue_left("assistant", name, 600) == 0:
        assert time.monotonic() < deadline, f"the queue held nothing for {name} after {seconds:.0f} s"
        time.sleep(0.5)


def votes_of(store: Store, name: str) -> list:
    """(item id, winner) of every vote ever stored under ``name`` (superseded ones too)."""
    annotator = next((a.id for a in store.list_annotators() if a.name == name), None)
    return [(store.queue_item_of(c.message_a_id).id, c.winner)
            for c in store.list_comparisons("assistant", history=True) if c.annotator_id == annotator]


def press_twice(page, first, second, before: int) -> int:
    """One press, the next pair shown, a second press: the page ignores the second one; the next item's id."""
    first()
    after = shown_item(page, other_than=before)
    assert "Stored as comparison #" in page.locator("#vote-status").inner_text()
    second()
    page.locator('#vote-buttons[data-ignored="1"]').wait_for(timeout=SLOW)
    assert "Not counted" in page.locator("#vote-ignored").inner_text()
    return after


@pytest.mark.parametrize("how", ["mouse", "touch", "keys"])
def test_a_second_press_after_a_vote_never_votes_on_the_unread_pair(studio, browser, how):
    app, store = studio
    page, item = vote_page(browser, app.url, f"double-{how}", touch=how == "touch")
    button = page.locator("#vote-a")
    press = {"mouse": button.click, "touch": button.tap, "keys": lambda: page.keyboard.press("a")}[how]
    after = press_twice(page, press, press, item)
    assert votes_of(store, f"double-{how}") == [(item, "a")]  # one vote, on the pair that was on screen
    assert store.queue_assignment(after, f"double-{how}").voted is None  # the next pair: shown, not voted
    page.context.close()


def test_two_tabs_of_one_person_each_say_what_was_stored(studio, browser):
    app, store = studio
    first, item = vote_page(browser, app.url, "twotabs")
    second, same = vote_page(browser, app.url, "twotabs")
    assert same == item  # one person's unvoted item comes back in every tab
    first.locator("#vote-a").click()
    shown_item(first, other_than=item)
    comparison = re.search(r"Stored as comparison #(\d+): A is better on item #(\d+)",
                           first.locator("#vote-status").inner_text())
    assert comparison and int(comparison.group(2)) == item
    second.locator("#vote-b").click()  # the stale tab still shows the item voted in the first one
    shown_item(second, other_than=item)
    said = second.locator("#vote-status").inner_text()
    assert f"You already voted on item #{item}: A is better (stored as comparison #{comparison.group(1)})" in said
    assert "this one was not stored" in said and "Stored as comparison" not in said
    assert votes_of(store, "twotabs") == [(item, "a")]
    first.context.close()
    second.context.close()


def test_a_name_changed_while_a_pair_is_shown_stores_nothing_and_shows_the_new_names_pair(studio, browser):
    app, store = studio
    page, item = vote_page(browser, app.url, "kim")
    ready_for(store, "lou")  # the pair lou gets next is one the background refill has made already
    page.get_by_placeholder(NAME_BOX).fill("lou")
    page.locator("#vote-b").click()
    after = shown_item(page, other_than=item)
    said = page.locator("#vote-status").inner_text()
    assert f"Item #{item} was shown to kim, and the name is now lou: nothing was stored" in said
    assert "GET" not in said and "/api" not in said
    assert votes_of(store, "kim") == votes_of(store, "lou") == []
    assert store.queue_assignment(after, "lou") is not None  # the next item is lou's
    assert store.queue_assignment(item, "kim").voted is None  # kim's stays kim's, unvoted
    page.context.close()
