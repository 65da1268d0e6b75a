"""The README's screenshots: the app on a real data dir, clicked through in Chromium, one PNG per tab.

Not a test. Point it at a data dir that went around the loop once (the real default model, feedback and a
trained version), e.g. the one `rlhf-studio simulate --votes 64 --retrain` fills, then:

    .venv/bin/python -m tests.e2e.screenshots --data /tmp/demo --out assets/screenshots

The data dir is copied first, so the chat and the vote made for the pictures land in the copy.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from tests.e2e.app_process import TEST_APP, AppProcess, write_config
from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS, SLOW, arena_vote_a, open_tab, send_chat, status_text

TABS = ("chat", "arena", "dashboard", "training", "data")


def shoot(url: str, out: Path) -> None:
    """Chat and rate, vote once in the arena, then a full-page picture of every tab once its content is in."""
    from playwright.sync_api import expect, sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        try:
            page.goto(url + "/")
            page.get_by_placeholder("e.g. alice").fill("alice")
            page.get_by_role("button", name="Annotation guidelines").first.click()
            reply = send_chat(page, "How do I keep basil fresh?")
            page.get_by_role("button", name="Like", exact=True).last.click()
            page.get_by_role("radio", name="5").click()
            page.get_by_label("Note").fill("Short and practical.")
            page.get_by_role("button", name="Save rating").click()
            status_text(page, rf"Saved\. Selected reply #{reply}\b")
            page.screenshot(path=str(out / "chat.png"), full_page=True)

            arena_vote_a(page, "Give me one tip for learning to cook.")
            page.screenshot(path=str(out / "arena.png"), full_page=True)

            ready = {"Dashboard": 'svg[aria-label="ratings per version"]', "Training": "text=/Job \\d+ ·/",
                     "Data": "text=/\\d+ of \\d+ feedback events/"}
            for tab, selector in ready.items():
                open_tab(page, tab)
                expect(page.locator(selector).first).to_be_visible(timeout=SLOW)
                page.screenshot(path=str(out / f"{tab.lower()}.png"), full_page=True)
        finally:
            browser.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, type=Path, help="a data dir that went around the loop once")
    parser.add_argument("--out", default=Path("assets/screenshots"), type=Path)
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    args = parser.parse_args(argv)
    if not (args.data / "studio.db").is_file():
        parser.error(f"{args.data} has no studio.db; fill one with `rlhf-studio simulate --retrain` first")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        shutil.copytree(args.data, data, ignore=shutil.ignore_patterns("runs", "jobs"))
        config = write_config(Path(tmp) / "app.yaml", TEST_APP, {"serving": {"max_new_tokens": 96}})
        with AppProcess(data, args.base_model, config) as app:
            shoot(app.url, args.out)
    print("\n".join(str(args.out / f"{t}.png") for t in TABS))


if __name__ == "__main__":
    main()
