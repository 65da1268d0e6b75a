"""The whole loop in a real browser: Debian Chromium driven by Playwright against `python app.py` (tiny model).

Chat, thumbs up, score and note, regenerate, vote in the arena, "Retrain now", watch the job finish, see the
new version in the dashboard and chat with it. Every step is checked on the page and in the Store; a
screenshot of each tab lands in pytest's tmp dir. Skipped when Chromium or Playwright is missing, unless
RLHF_REQUIRE_BROWSER=1 (CI) makes that a failure.
"""
from __future__ import annotations

import re

import pytest

from storage import Store
from tests.conftest import make_adapter
from tests.e2e.app_process import FAST_RETRAIN, TEST_APP, AppProcess, seed_preferences, write_config
from tests.e2e.browser import (CHROMIUM, CHROMIUM_ARGS, SLOW, arena_vote_a, chat_status, open_tab, pick_version,
                               save_note, score_reply, send_chat,
                               status_text, sync_playwright_or_skip)

pytestmark = pytest.mark.browser

HTML = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"> <b>bold?</b>'
NOTE = "<b>keep</b> me & <i>you</i>"


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir):
    """The app on the tiny model with a second version (for the arena) and enough feedback to retrain."""
    root = tmp_path_factory.mktemp("browser")
    data = root / "data"
    store = Store(data / "studio.db")
    store.ensure_default_agent(str(tiny_model_dir))
    v0 = store.active_policy("assistant")
    store.update_agent("assistant", generation={"max_new_tokens": 12})
    v1 = store.register_policy_version("assistant", make_adapter(tiny_model_dir, root / "v1", seed=71), v0.id,
                                       promote=False)
    config = write_config(root / "app.yaml", TEST_APP, FAST_RETRAIN)
    with AppProcess(data, tiny_model_dir, config) as app:
        seed_preferences(app.client(), 6)
        yield {"app": app, "store": store, "v0": v0, "v1": v1, "shots": root / "screenshots"}
    store.close()


def chat_and_label(page, store, v0_id: int, shots) -> None:
    """Chat, thumb, score, note and Regenerate, each checked in the Store; HTML in a message is never run."""
    from playwright.sync_api import expect

    # Chat: a reply streams in and is selected for rating
    reply_id = send_chat(page, "Hello from the browser")
    reply = store.get_message(reply_id)
    assert reply.role == "assistant" and reply.policy_id == v0_id
    assert store.get_message(reply.parent_id).content == "Hello from the browser"

    # Thumbs up from the reply's icon
    page.get_by_role("button", name="Like", exact=True).last.click()
    chat_status(page, rf"👍 stored on reply #{reply_id}\b")
    assert store.effective_rating(reply_id, "alice")["thumb"] == 1

    # Score and note (HTML in the note is stored as text), each stored when clicked
    score_reply(page, 4)
    save_note(page, NOTE)
    rating = store.effective_rating(reply_id, "alice")
    assert (rating["thumb"], rating["score"], rating["note"]) == (1, 4, NOTE)

    # Regenerate: a second reply to the same message, both kept
    page.get_by_role("button", name="Regenerate").click()
    chat_status(page, r"Alternative 2 stored")
    assert len(store.siblings(reply_id)) == 2

    # HTML and script in a message: stored as typed, shown as typed, never run
    send_chat(page, HTML)
    expect(page.get_by_text("<b>bold?</b>", exact=False).first).to_be_visible()
    assert page.evaluate("window.__xss") is None
    assert [m["content"] for m in store.feedback_rows("assistant")["messages"] if m["role"] == "user"][-1] == HTML
    page.screenshot(path=str(shots / "chat.png"), full_page=True)


def retrain_and_watch(page, store, shots):
    """Retrain now in the Training tab and watch the job run to its end: the new version."""
    from playwright.sync_api import expect

    # Training: retrain now, watch the job run to its end
    open_tab(page, "Training")
    page.get_by_role("button", name="Retrain now").click()
    page.get_by_role("button", name="Yes, retrain").click()  # it asks first
    job_id = int(re.search(r"#(\d+)", status_text(page, r"Retrain job #\d+ is in the queue")).group(1))
    expect(page.get_by_text(re.compile(rf"Job {job_id} · retrain · succeeded"))).to_be_visible(
        timeout=600_000)
    job = store.get_job(job_id)
    assert job.status == "succeeded" and job.result["version"] == 2
    new = store.get_policy(job.result["policy_id"])
    page.screenshot(path=str(shots / "training.png"), full_page=True)
    return new


def test_the_whole_loop_in_a_browser(studio):
    sync_playwright = sync_playwright_or_skip()
    from playwright.sync_api import expect

    store, app, shots = studio["store"], studio["app"], studio["shots"]
    shots.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        try:
            page.goto(app.url + "/")
            page.get_by_placeholder("e.g. alice").fill("alice")

            chat_and_label(page, store, studio["v0"].id, shots)

            # Arena: two anonymous versions answer; the vote reveals them
            comparison_id = arena_vote_a(page, "Which version are you?")
            vote = next(c for c in store.list_comparisons("assistant") if c.id == comparison_id)
            assert vote.pair_id and vote.winner == "a"
            assert {vote.policy_a_id, vote.policy_b_id} == {studio["v0"].id, studio["v1"].id}
            page.screenshot(path=str(shots / "arena.png"), full_page=True)

            new = retrain_and_watch(page, store, shots)

            # Dashboard: the new version is listed with its parent
            open_tab(page, "Dashboard")
            expect(page.get_by_role("gridcell", name="v2", exact=True).first).to_be_visible(timeout=SLOW)
            page.screenshot(path=str(shots / "dashboard.png"), full_page=True)

            # Chat with the new version
            open_tab(page, "Chat & Rate")
            page.get_by_role("button", name="New conversation").click()
            pick_version(page, "v2")
            send_chat(page, "Hello, new version")
            latest = store.feedback_rows("assistant")["messages"][-1]
            assert latest["role"] == "assistant" and latest["policy_id"] == new.id

            # Data: the feedback table shows the note's HTML as text
            open_tab(page, "Data")
            expect(page.get_by_role("gridcell", name=NOTE, exact=True).first).to_be_visible(timeout=SLOW)
            page.screenshot(path=str(shots / "data.png"), full_page=True)
            assert page.evaluate("window.__xss") is None
        except Exception:
            page.screenshot(path=str(shots / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert sorted(p.name for p in shots.glob("*.png")) == ["arena.png", "chat.png", "dashboard.png", "data.png",
                                                            "training.png"]
