"""Shared steps for driving the app in Debian's Chromium with Playwright (the browser tests and the README
screenshot script). Every wait is for a condition on the page or in the Store, never a fixed sleep."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
# ms: generous waits for a loaded 2-core machine (an answer, not a timing goal); RLHF_E2E_WAIT_MS shortens them
# to see quickly which steps fail.
SLOW = int(os.environ.get("RLHF_E2E_WAIT_MS", "120000"))
MESSAGE_BOX = "Type a message and press Enter"
NAME_BOX = "e.g. alice"


def sync_playwright_or_skip():
    """Playwright's sync API, or a skip (a failure under RLHF_REQUIRE_BROWSER=1) naming what is missing."""
    import pytest

    missing = []
    if not Path(CHROMIUM).is_file():
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
        missing.append("the playwright package (pip install playwright)")
    if missing:
        reason = "the browser test needs " + " and ".join(missing)
        if os.environ.get("RLHF_REQUIRE_BROWSER") == "1":
            pytest.fail(reason + "; RLHF_REQUIRE_BROWSER=1 requires it")
        pytest.skip(reason)
    return sync_playwright


def launched_chromium():
    """A module fixture's body: Debian's Chromium under Playwright, closed after the module."""
    sync_playwright = sync_playwright_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def status_text(page, pattern: str, timeout: int = SLOW) -> str:
    """Wait for a status line matching ``pattern`` and return its text."""
    from playwright.sync_api import expect

    line = page.get_by_text(re.compile(pattern)).last
    expect(line).to_be_visible(timeout=timeout)
    return line.inner_text()


def open_tab(page, name: str) -> None:
    """Open a tab by its name; on a narrow screen the tabs that do not fit are under the "More tabs" menu."""
    page.get_by_role("tab").first.wait_for(timeout=SLOW)  # the tab bar is drawn
    tab = page.get_by_role("tab", name=name)
    if tab.count() and tab.first.is_visible():
        tab.first.click()
        return
    page.get_by_role("button", name="More tabs").click()
    page.locator(".overflow-dropdown button, .overflow-menu button").filter(has_text=name).first.click()


def open_app(browser, url: str, name: str | None = None, viewport=(1280, 1100)):
    """A fresh page (own cookies and local storage) on the app, with the annotator name typed when given."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    page = context.new_page()
    page.goto(url + "/", timeout=SLOW)  # a loaded machine serves the first page slowly
    box = page.get_by_placeholder(NAME_BOX)
    expect(box).to_be_visible(timeout=SLOW)
    if name is not None:
        box.fill(name)
    return page


def pick_version(page, label_start: str, timeout: float = 90.0) -> None:
    """Choose a version in the Chat tab's dropdown, waiting for its periodic refresh to offer it."""
    deadline = time.monotonic() + timeout
    while True:
        page.get_by_role("combobox", name="Version", exact=True).click()
        option = page.get_by_role("option", name=re.compile("^" + re.escape(label_start)))
        if option.count():
            option.first.click()
            return
        page.get_by_role("heading", name="RLHF Studio").click()  # close the list (Escape would keep a filter)
        if time.monotonic() > deadline:
            raise AssertionError(f"version {label_start!r} never appeared in the dropdown")
        page.wait_for_timeout(2000)


def set_max_tokens(page, n: int) -> None:
    """The Chat tab's "Max new tokens" setting (opens the Generation settings), checked on the slider itself."""
    from playwright.sync_api import expect

    number = page.get_by_label("number input for Max new tokens", exact=True)
    slider = page.get_by_label("range slider for Max new tokens", exact=True)
    if not number.is_visible():
        page.get_by_role("button", name=re.compile("^Generation settings")).click()
    # A key pressed while the accordion still opens goes to the page, not the slider (the slider then kept its
    # old value on a loaded CI machine): wait until both inputs show.
    expect(slider).to_be_visible(timeout=SLOW)
    expect(number).to_be_visible(timeout=SLOW)
    if str(n) == slider.get_attribute("max"):
        slider.focus()
        expect(slider).to_be_focused()
        slider.press("End")  # the slider's own key: the value moves with the knob
    else:
        number.fill(str(n))
        number.press("Enter")
    expect(slider).to_have_value(str(n))
    expect(number).to_have_value(str(n))


def chat_status(page, pattern: str, timeout: int = SLOW) -> re.Match:
    """Wait until the Chat tab's status line (under the conversation) matches ``pattern``; the match."""
    line = page.locator("#chat-status")
    deadline = time.monotonic() + timeout / 1000
    while True:
        text = line.inner_text() if line.count() else ""
        found = re.search(pattern, text)
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"the chat status never matched {pattern!r}; it says {text!r}")
        page.wait_for_timeout(100)


def panel_on(page, reply_id: int, timeout: int = SLOW) -> None:
    """Wait until the Chat tab's label panel shows reply ``reply_id``."""
    from playwright.sync_api import expect

    expect(page.get_by_text(re.compile(rf"Labels of reply #{reply_id}\b"))).to_be_visible(timeout=timeout)


def send_chat(page, text: str) -> int:
    """Type a message in the Chat tab and wait for its reply to be stored and shown in the label panel; its id."""
    box = page.get_by_placeholder(MESSAGE_BOX)
    before = re.search(r"Reply #(\d+) stored", page.locator("#chat-status").inner_text())
    box.fill(text)
    box.press("Enter")
    newer = rf"Reply #(?!{before.group(1)}\b)(\d+) stored" if before else r"Reply #(\d+) stored"
    reply = int(chat_status(page, newer).group(1))
    panel_on(page, reply)
    return reply


def score_reply(page, n: int) -> None:
    """Click score ``n`` in the label panel and wait until the page says it is stored."""
    page.get_by_role("radio", name=str(n), exact=True).click()
    chat_status(page, rf"Score {n} stored on reply #\d+")


def tick_flag(page, flag: str) -> None:
    """Tick (or untick) a flag in the label panel and wait until the page says so."""
    page.get_by_role("checkbox", name=flag).click()
    chat_status(page, rf"Flag {flag} (stored|taken off) on reply #\d+")


def save_note(page, text: str) -> None:
    """Type a note in the label panel and store it."""
    page.get_by_label("Note", exact=True).fill(text)
    page.get_by_role("button", name="Save note").click()
    chat_status(page, r"Note (stored|cleared) on reply #\d+")


def bot_bubbles(page):
    """The visible chat tab's reply bubbles, oldest first."""
    return page.locator('[data-testid="bot"]:visible')


def user_bubbles(page):
    return page.locator('[data-testid="user"]:visible')


def arena_vote_a(page, text: str) -> int:
    """Open the Arena, ask ``text``, vote "A is better" once both sides answered; the stored comparison's id."""
    from playwright.sync_api import expect

    open_tab(page, "Arena")
    prompt = page.get_by_placeholder("Type a prompt (or a follow-up after voting) and press Enter")
    prompt.fill(text)
    prompt.press("Enter")
    vote = page.get_by_role("button", name="A is better")
    expect(vote).to_be_enabled(timeout=SLOW)
    vote.click()
    return int(re.search(r"comparison #(\d+)", status_text(page, r"stored as comparison #\d+")).group(1))
