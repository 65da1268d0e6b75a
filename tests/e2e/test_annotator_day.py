"""An annotator's day in a real browser (Debian Chromium + Playwright against `python app.py` on the tiny model),
and at the end every label in the Store checked against what was clicked: 0 wrong, 0 lost, none anonymous.

Chat and rate (icon, keys, form), regenerate and rate the alternative, a new conversation with a flag, a message
sent while a reply streams, a reload mid-reply (the conversation comes back from the list and its unanswered turn
is answered), five vote-queue items voted with the keyboard (and one skipped), an arena vote by key, then an
admin's retrain: asked first, live progress with time left, cancelled. Every wait is for a condition.
"""
from __future__ import annotations

import re

import pytest

from storage import Store
from tests.conftest import make_adapter
from tests.e2e.app_process import FAST_RETRAIN, TEST_APP, AppProcess, merged, wait_until, write_config
from tests.e2e.browser import (CHROMIUM, CHROMIUM_ARGS, MESSAGE_BOX, NAME_BOX, SLOW, bot_bubbles, open_app, open_tab,
                               send_chat, set_max_tokens, status_text, sync_playwright_or_skip, user_bubbles)

pytestmark = pytest.mark.browser
NAME = "walker"
LONG = 1024  # tokens: a reply that streams for seconds on the tiny model
QUEUE_VOTES = ("a", "b", "t", "x", "1")  # keys pressed on five items (1 = A)
KEY_WINNER = {"a": "a", "1": "a", "b": "b", "2": "b", "t": "tie", "3": "tie", "x": "both_bad", "4": "both_bad"}
# A retrain that runs long enough to be watched and cancelled (it never finishes in this test).
LONG_RETRAIN = merged(FAST_RETRAIN, {"ppo": {"steps": 500}})


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir):
    """The app with two versions (the arena needs both) and six vote-queue items made up front."""
    root = tmp_path_factory.mktemp("annotator-day")
    data = root / "data"
    store = Store(data / "studio.db")
    store.ensure_default_agent(str(tiny_model_dir))
    v0 = store.active_policy("assistant")
    v1 = store.register_policy_version("assistant", make_adapter(tiny_model_dir, root / "v1", seed=73), v0.id,
                                       promote=False)
    for i in range(6):
        store.create_queue_item("assistant", [{"role": "user", "content": f"Which is the better answer, {i}?"},
                                              {"role": "assistant", "content": "Let me think."},
                                              {"role": "user", "content": f"Go on ({i})."}],
                                [{"content": f"First reply {i}", "policy_id": v0.id},
                                 {"content": f"Second reply {i}", "policy_id": v1.id}])
    config = write_config(root / "app.yaml", TEST_APP, LONG_RETRAIN)
    with AppProcess(data, tiny_model_dir, config) as app:
        yield app, store
    store.close()


def reply_id(text: str) -> int:
    return int(re.search(r"#(\d+)", text).group(1))


def test_an_annotators_day_stores_every_label_as_clicked(studio, tmp_path):
    sync_playwright = sync_playwright_or_skip()
    from playwright.sync_api import expect

    app, store = studio
    ratings: dict[int, dict] = {}  # what was clicked: reply id -> the rating it must have
    votes: list[tuple] = []  # (message a, message b, winner) in the order clicked
    typed: list[str] = []  # every message sent
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = open_app(browser, app.url, NAME)
        try:
            # Chat; thumbs up from the reply's icon; score 4 and save with the keys
            typed.append("What should I cook tonight?")
            first = send_chat(page, typed[-1])
            page.get_by_role("button", name="Like", exact=True).last.click()
            status_text(page, rf"Selected reply #{first} · 👍")
            bot_bubbles(page).last.click()  # the focus leaves the message box: keys rate
            page.keyboard.press("4")
            expect(page.get_by_role("radio", name="4", exact=True)).to_be_checked()
            page.keyboard.press("s")
            status_text(page, rf"Saved\. Selected reply #{first} · 👍 · score 4/5")
            ratings[first] = {"thumb": 1, "score": 4, "flags": [], "note": None}

            # Regenerate: the form is empty for the alternative; rate it with the mouse
            page.get_by_role("button", name="Regenerate").click()
            second = reply_id(status_text(page, r"Alternative 2 stored\. Selected reply #\d+"))
            expect(page.get_by_role("radio", name="4", exact=True)).not_to_be_checked()
            page.get_by_role("radio", name="2", exact=True).click()
            page.get_by_label("Note").fill("Too vague.")
            page.get_by_role("button", name="Save rating").click()
            status_text(page, rf"Saved\. Selected reply #{second}\b")
            ratings[second] = {"thumb": None, "score": 2, "flags": [], "note": "Too vague."}

            # A new conversation; a flag from the reply's icon ticks the form's checkbox
            page.get_by_role("button", name="New conversation").click()
            expect(user_bubbles(page)).to_have_count(0)
            typed.append("Name a quick dessert.")
            third = send_chat(page, typed[-1])
            page.get_by_role("button", name="Feedback").last.click()
            page.get_by_role("button", name="Unhelpful").last.click()
            status_text(page, rf"Selected reply #{third} · flags: Unhelpful")
            expect(page.get_by_role("checkbox", name="Unhelpful")).to_be_checked()
            ratings[third] = {"thumb": None, "score": None, "flags": ["Unhelpful"], "note": None}

            # A message sent while a reply streams goes out when the reply ends
            set_max_tokens(page, LONG)
            box = page.get_by_placeholder(MESSAGE_BOX)
            typed.append("Tell me a long story.")
            box.fill(typed[-1])
            box.press("Enter")
            status_text(page, "Generating")
            typed.append("And a short moral, please.")
            box.fill(typed[-1])
            box.press("Enter")
            moral = wait_until(lambda: _user(store, typed[-1]), SLOW / 1000, "the message sent while streaming")
            wait_until(lambda: _replies(store, moral.id), SLOW / 1000, "its reply")
            status_text(page, rf"Selected reply #{_replies(store, moral.id)[0]}\b")

            # A reload mid-reply: the conversation comes back from the list, its unanswered turn is answered
            typed.append("One more long story?")
            box.fill(typed[-1])
            box.press("Enter")
            status_text(page, "Generating")
            page.reload()
            expect(page.get_by_placeholder(NAME_BOX)).to_have_value(NAME)
            page.get_by_role("combobox", name="Your conversations").click()
            page.get_by_role("option", name=re.compile(r"Name a quick dessert.*unanswered")).click()
            status_text(page, "no reply yet")
            page.get_by_role("button", name="Regenerate").click()
            answered = reply_id(status_text(page, r"Answered\. Selected reply #\d+"))
            assert store.get_message(store.get_message(answered).parent_id).content == typed[-1]

            # Five vote-queue items with the keyboard (A, B, T, X, 1), one skipped with S
            open_tab(page, "Vote")
            for key in QUEUE_VOTES + ("s",):
                item = int(re.search(r"Item #(\d+)", status_text(page, r"Item #\d+ · \d+ left for you")).group(1))
                expect(page.locator("#vote-a")).to_be_enabled()
                page.keyboard.press(key)
                if key == "s":
                    status_text(page, rf"Skipped item #{item}\b")
                    continue
                status_text(page, rf"Stored as comparison #\d+\. (Item #(?!{item}\b)\d+|Nothing to vote on)")
                queued = store.get_queue_item(item)
                votes.append((queued.message_a_id, queued.message_b_id, KEY_WINNER[key]))

            # An arena round, voted with the B key
            open_tab(page, "Arena")
            prompt = page.get_by_placeholder("Type a prompt (or a follow-up after voting) and press Enter")
            typed.append("Which of you writes better haiku?")
            prompt.fill(typed[-1])
            prompt.press("Enter")
            expect(page.locator("#arena-b")).to_be_enabled(timeout=SLOW)
            prompt.evaluate("box => box.blur()")  # the focus leaves the prompt box: keys vote
            page.keyboard.press("b")
            comparison = reply_id(status_text(page, r"stored as comparison #\d+"))
            arena = next(c for c in store.list_comparisons("assistant") if c.id == comparison)
            votes.append((arena.message_a_id, arena.message_b_id, "b"))

            # An admin's retrain: asked first, then live progress with time left, then cancelled
            open_tab(page, "Training")
            page.get_by_role("button", name="Retrain now").click()
            expect(page.get_by_text(re.compile(r"Retrain assistant now\?"))).to_be_visible(timeout=SLOW)
            assert store.count("jobs") == 0  # asking stores nothing
            page.get_by_role("button", name="Yes, retrain").click()
            job_id = reply_id(status_text(page, r"Retrain job #\d+ is in the queue"))
            status_text(page, rf"Job {job_id} · retrain · running · phase \w+ · \d+% · \d+m\d\ds elapsed")
            page.get_by_role("button", name="Cancel job").click()
            status_text(page, rf"Job {job_id} · retrain · cancelled")
            expect(page.get_by_role("button", name="Cancel job")).to_be_disabled()
            assert store.get_job(job_id).status == "cancelled"
        finally:
            page.screenshot(path=str(tmp_path / "annotator-day.png"), full_page=True)
            browser.close()

    # Every label the walk made, and nothing else: none wrong, none lost, none anonymous.
    who = store.annotator_id(NAME)
    rated = {r["message_id"] for r in store.db.query("SELECT message_id FROM ratings WHERE annotator_id = ?", [who])}
    assert rated == set(ratings)
    for message_id, expected in ratings.items():
        got = store.effective_rating(message_id, NAME)
        assert {k: got[k] or (None if k != "flags" else []) for k in expected} == expected, message_id
    cast = [(c["message_a_id"], c["message_b_id"], c["winner"]) for c in
            store.db.query("SELECT * FROM comparisons WHERE annotator_id = ? ORDER BY id", [who])]
    assert cast == votes and len(votes) == len(QUEUE_VOTES) + 1
    assert store.db.execute("SELECT COUNT(*) FROM ratings WHERE annotator_id IS NULL").fetchone()[0] == 0
    assert store.db.execute("SELECT COUNT(*) FROM comparisons WHERE annotator_id IS NULL").fetchone()[0] == 0
    sent = [r["content"] for r in store.db.query(
        """SELECT m.content FROM messages m JOIN conversations c ON c.id = m.conversation_id
           WHERE c.annotator_id = ? AND m.role = 'user' AND c.source IN ('chat', 'arena') ORDER BY m.id""", [who])]
    assert sent == typed  # every message once, in order
    unanswered = [t for t in typed if not _replies(store, _user(store, t).id)]
    assert unanswered == []


def _user(store: Store, text: str):
    row = next(iter(store.db.query("SELECT id FROM messages WHERE role = 'user' AND content = ? ORDER BY id DESC",
                                   [text])), None)
    return store.get_message(row["id"]) if row else None


def _replies(store: Store, message_id: int) -> list[int]:
    return [r["id"] for r in store.db.query("SELECT id FROM messages WHERE parent_id = ? AND role = 'assistant'",
                                            [message_id])]
