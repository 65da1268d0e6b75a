"""One arena round over real HTTP on loopback, as the page plays it (the Gradio API is off): blind replies, a vote,
the reveal."""
from __future__ import annotations

import html

import pytest

from tests.conftest import make_adapter
from tests.support.gradio_page import Page


@pytest.fixture
def two_versions(services, tiny_model_dir, tmp_path):
    store = services.store
    store.update_agent("assistant", generation={"max_new_tokens": 6})
    v0 = store.active_policy("assistant")
    v1 = store.register_policy_version("assistant", make_adapter(tiny_model_dir, tmp_path / "v1", seed=31), v0.id,
                                       promote=False)
    return v0, v1


def text(message) -> str:
    content = message["content"]
    return "".join(p["text"] for p in content) if isinstance(content, list) else content


def test_arena_round_through_the_page(live_app, services, two_versions):
    with Page(live_app.url) as page:  # closed: lets the live server shut down at once
        play_and_vote(page, services.store, two_versions)


def play_and_vote(page, store, two_versions):
    chat_a, chat_b, box, status, *_ = page.call("arena", "Which of you is better?", "assistant", "dora")
    assert box == "" and "vote" in status.lower()
    assert [text(m) for m in chat_a][:1] == [text(m) for m in chat_b][:1] == ["Which of you is better?"]
    assert "v0" not in status and "v1" not in status  # blind before the vote
    (pair_row,) = store.db.query("SELECT id FROM arena_pairs")  # the pair id never reached the client
    pair = store.get_arena_pair(pair_row["id"])
    # what the chatbot shows, read back (ui.views.text.literal_html writes <, `, [ ... as entities; whitespace folds)
    # a reply cut at its token limit carries a mark under it (ui.tabs.chat_view.cut_badge)
    same = lambda shown, stored: html.unescape(shown.split("✂️")[0]).split() == stored.split()  # noqa: E731
    assert same(text(chat_a[-1]), store.get_message(pair.message_a_id).content)
    assert same(text(chat_b[-1]), store.get_message(pair.message_b_id).content)

    chat_a, chat_b, reveal, *_ = page.call("arena_vote_b", "dora")
    vote = store.arena_vote(pair.id)
    assert vote.winner == "b" and store.annotator_id("dora") == vote.annotator_id
    assert {vote.policy_a_id, vote.policy_b_id} == {p.id for p in two_versions}
    assert "**A** was" in reveal and "v0 · base (active)" in reveal and "v1 (candidate)" in reveal
