"""The vote queue in a real browser: `python app.py` on the tiny model fills its queue in the background; Debian
Chromium driven by Playwright opens the Vote tab and votes through three items; every vote is in the Store as a
comparison of that item's two replies. Also the queue's REST contract against the real process."""
from __future__ import annotations

import re

import pytest

from tests.e2e.app_process import queue_studio, wait_until
from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS, SLOW, open_tab, status_text, sync_playwright_or_skip

pytestmark = pytest.mark.browser


def ready(page) -> None:
    """Wait until the Vote tab takes input (a pair that came after a vote is read for queue.read_ms first)."""
    page.locator("#vote-buttons:not([data-ready='0'])").wait_for(timeout=SLOW)

QUEUE = {"queue": {"refill": True, "low_water": 8, "target_ready": 16, "batch_size": 4, "poll_seconds": 0.5,
                   "max_new_tokens": 12, "temperature": 1.0}}


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir):
    yield from queue_studio(tmp_path_factory.mktemp("vote-queue"), tiny_model_dir, QUEUE, 4, 120)


def test_vote_through_three_queue_items_in_a_browser(studio):
    sync_playwright = sync_playwright_or_skip()
    from playwright.sync_api import expect

    app, store = studio
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        try:
            page.goto(app.url + "/")
            page.get_by_placeholder("e.g. alice").fill("vera")
            open_tab(page, "Vote")
            seen, comparisons = [], []
            for winner in ("a", "b", "both_bad"):
                item_id = int(re.search(r"Item #(\d+)", status_text(page, r"Item #\d+ · ")).group(1))
                assert item_id not in seen
                seen.append(item_id)
                button = page.locator(f"#vote-{winner}")
                expect(button).to_be_enabled(timeout=SLOW)
                ready(page)
                button.click()
                text = status_text(page, rf"Stored as comparison #\d+: .* on item #{item_id}\. "
                                         rf"Item #(?!{item_id}\b)\d+")
                comparisons.append((item_id, winner, int(re.search(r"comparison #(\d+)", text).group(1))))
            page.screenshot(path=str(app.data_dir.parent / "vote.png"), full_page=True)
        finally:
            browser.close()
    for item_id, winner, comparison_id in comparisons:
        item = store.get_queue_item(item_id)
        vote = next(c for c in store.list_comparisons("assistant") if c.id == comparison_id)
        assert (vote.message_a_id, vote.message_b_id, vote.winner) == (item.message_a_id, item.message_b_id, winner)
        assignment = store.queue_assignments(item_id)[0]
        assert assignment.comparison_id == comparison_id
    assert app.client().get("/queue/stats").json()["votes"]["vera"] == 3


def test_queue_rest_contract_on_the_real_app(studio):
    app, store = studio
    http = app.client()
    item = http.get("/queue/next", params={"annotator": "rest-user"})
    assert item.status_code == 200 and set(item.json()) == {"item_id", "messages", "a", "b", "reason"}
    vote = http.post(f"/queue/{item.json()['item_id']}/vote", json={"winner": "tie", "annotator": "rest-user"})
    assert vote.status_code == 200 and set(vote.json()) == {"comparison_id"}
    bad = http.post("/queue/123456/vote", json={"winner": "a"})
    assert bad.status_code == 404 and "error" in bad.json()


def test_a_phone_votes_ten_times_without_scrolling(studio):
    sync_playwright = sync_playwright_or_skip()
    from playwright.sync_api import expect

    app, store = studio
    http = app.client()
    wait_until(lambda: http.get("/queue/stats").json()["fresh"] >= 10, 300, "ten unseen items")
    buttons = ["#vote-a", "#vote-b", "#vote-tie", "#vote-both_bad", "#vote-skip"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True).new_page()
        try:
            page.goto(app.url + "/")
            page.get_by_placeholder("e.g. alice").fill("phone")
            open_tab(page, "Vote")
            item = int(re.search(r"Item #(\d+)", status_text(page, r"Item #\d+ · ")).group(1))
            expect(page.locator("#vote-keys")).to_be_hidden()  # no keyboard hint on a touch screen
            page.locator("#vote-context").evaluate("el => el.scrollIntoView({block: 'start'})")  # once, to read
            top = page.evaluate("window.scrollY")
            voted = []
            for n in range(10):
                for name in buttons + ["#vote-context", "#vote-reply-a", "#vote-reply-b"]:  # all on screen
                    box = page.locator(name).bounding_box()
                    assert box["y"] >= 0 and box["y"] + box["height"] <= 844 and box["x"] + box["width"] <= 390, name
                    if name in buttons:
                        assert box["width"] >= 44 and box["height"] >= 44, name
                winner = ("a", "b", "tie", "both_bad")[n % 4]
                ready(page)
                page.locator(f"#vote-{winner}").tap()
                text = status_text(page, rf"on item #{item}\. Item #(?!{item}\b)\d+")
                voted.append((item, winner))
                item = int(re.findall(r"Item #(\d+) · ", text)[-1])
                assert page.evaluate("window.scrollY") == top  # no scrolling between votes
        finally:
            browser.close()
    phone = next(a.id for a in store.list_annotators() if a.name == "phone")
    stored = [(store.queue_item_of(c.message_a_id).id, c.winner)
              for c in store.list_comparisons("assistant", history=True) if c.annotator_id == phone]
    assert stored == voted
