"""The README's screenshots: the app on a real data dir, clicked through in Chromium at a desktop size (1400×1000)
and a phone size (390×844), one PNG per tab and size.

Not a test. Point it at a data dir that went around the loop once (the real default model, feedback and a
trained version), e.g. the one `rlhf-studio simulate --votes 24 --retrain` fills, then:

    .venv/bin/python -m tests.e2e.screenshots --data /tmp/demo --out assets/screenshots

The data dir is copied first, so the chat and the votes made for the pictures land in the copy. Desktop pictures
show what fits on the screen for the annotation tabs (the label controls must be there without scrolling) and the
whole page for the others; phone pictures show the screen where the reply and its labels are.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from tests.e2e.app_process import TEST_APP, AppProcess, write_config
from tests.e2e.browser import (CHROMIUM, CHROMIUM_ARGS, SLOW, arena_vote_a, chat_status, open_tab, save_note,
                               score_reply, send_chat)

DESKTOP, PHONE = (1400, 1000), (390, 844)
SHOTS = ("chat", "arena", "vote", "dashboard", "training", "data", "chat-phone", "vote-phone", "dashboard-phone")


def chat_and_label(page) -> None:
    """One exchange in the Chat tab, labelled: 👍 from the reply's icon, a score and a note in the panel."""
    reply = send_chat(page, "How do I keep basil fresh?")
    page.get_by_role("button", name="Like", exact=True).last.click()
    chat_status(page, rf"👍 stored on reply #{reply}\b")
    score_reply(page, 5)
    save_note(page, "Short and practical.")


def vote_picture(page, path: Path) -> None:
    """The Vote tab with a pair; on a phone scrolled to the context, the buttons stuck under the replies."""
    from playwright.sync_api import expect

    open_tab(page, "Vote")
    expect(page.get_by_text("Which reply is better?").or_(page.get_by_text("Nothing to vote on")).first) \
        .to_be_visible(timeout=SLOW)
    if page.viewport_size["width"] < 640:
        page.locator("#vote-context").evaluate("e => e.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(path))


def desktop(page, out: Path) -> None:
    """Every tab at 1400×1000: the annotation tabs as the screen shows them, the others as a whole page."""
    from playwright.sync_api import expect

    chat_and_label(page)
    page.screenshot(path=str(out / "chat.png"))
    arena_vote_a(page, "Give me one tip for learning to cook.")
    page.screenshot(path=str(out / "arena.png"))
    vote_picture(page, out / "vote.png")
    ready = {"Dashboard": 'svg[aria-label="ratings per version"]', "Training": "text=/Job \\d+ ·/",
             "Data": "text=/\\d+ of \\d+ feedback events/"}
    for tab, selector in ready.items():
        open_tab(page, tab)
        expect(page.locator(selector).first).to_be_visible(timeout=SLOW)
        page.screenshot(path=str(out / f"{tab.lower()}.png"), full_page=True)


def phone(page, out: Path) -> None:
    """The Chat tab with a labelled reply, the Vote tab and the top of the Dashboard at 390×844."""
    from playwright.sync_api import expect

    chat_and_label(page)
    page.locator("#chat-conversation").evaluate("e => e.scrollIntoView({block: 'start'})")  # the reply at the top
    page.screenshot(path=str(out / "chat-phone.png"))
    vote_picture(page, out / "vote-phone.png")
    open_tab(page, "Dashboard")
    versions = page.get_by_text("Versions (newest first)")
    expect(versions).to_be_visible(timeout=SLOW)
    versions.scroll_into_view_if_needed()
    page.screenshot(path=str(out / "dashboard-phone.png"))


def shoot(url: str, out: Path, only_vote: bool = False) -> None:
    """Both sizes, each on its own page (own name, own session; the phone a touch screen)."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for size, name, walk in ((DESKTOP, "alice", desktop), (PHONE, "bo", phone)):
                if only_vote:
                    walk = lambda page, out, shot=("vote.png" if size == DESKTOP else "vote-phone.png"): \
                        vote_picture(page, out / shot)  # noqa: E731
                touch = size == PHONE
                page = browser.new_context(viewport={"width": size[0], "height": size[1]}, has_touch=touch,
                                           is_mobile=touch).new_page()
                page.goto(url + "/", timeout=SLOW)
                page.get_by_placeholder("e.g. alice").fill(name)
                walk(page, out)
                page.context.close()
        finally:
            browser.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, type=Path, help="a data dir that went around the loop once")
    parser.add_argument("--out", default=Path("assets/screenshots"), type=Path)
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    parser.add_argument("--only-vote", action="store_true", help="only the Vote tab's two pictures (any data dir)")
    args = parser.parse_args(argv)
    if not (args.data / "studio.db").is_file():
        parser.error(f"{args.data} has no studio.db; fill one with `rlhf-studio simulate --retrain` first")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        shutil.copytree(args.data, data, ignore=shutil.ignore_patterns("runs", "jobs"))
        config = write_config(Path(tmp) / "app.yaml", TEST_APP, {"serving": {"max_new_tokens": 96},
                                                                   "queue": {"refill": True}})
        with AppProcess(data, args.base_model, config) as app:
            shoot(app.url, args.out, args.only_vote)
    print("\n".join(str(args.out / f"{t}.png") for t in SHOTS if not args.only_vote or t.startswith("vote")))


if __name__ == "__main__":
    main()
