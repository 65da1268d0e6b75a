"""Shared steps for driving the app in Debian's Chromium with Playwright (the browser test and the
README screenshot script)."""
from __future__ import annotations

import re
import time

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
SLOW = 120_000  # ms: generous waits for a loaded 2-core machine (an answer, not a timing goal)


def status_text(page, pattern: str, timeout: int = SLOW) -> str:
    """Wait for a status line matching ``pattern`` and return its text."""
    from playwright.sync_api import expect

    line = page.get_by_text(re.compile(pattern)).last
    expect(line).to_be_visible(timeout=timeout)
    return line.inner_text()


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


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


def send_chat(page, text: str) -> int:
    """Type a message in the Chat tab and wait for the reply; the reply's message id."""
    box = page.get_by_placeholder("Type a message and press Enter")
    box.fill(text)
    box.press("Enter")
    return int(re.search(r"#(\d+)", status_text(page, r"Selected reply #\d+")).group(1))


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
