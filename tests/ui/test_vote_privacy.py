"""Nobody learns how a named annotator voted by reading before and after their vote: per-annotator quality stats and
the live tally of a people's decision are for admins; others see their own row, and how many votes and accounts a
decision has, not how they split."""
from __future__ import annotations

import gradio as gr
import pytest
from fastapi.testclient import TestClient

from tests.rlhf.retrain.test_decisions import INCONCLUSIVE, vote
from tests.ui.test_trust import ALICE, BOB, CAROL, LOCAL, USERS, build
from ui.tabs import decisions as panel


@pytest.fixture
def team(tmp_path, tiny_model_dir, tiny_server):
    from ui.webapp import create_app

    services = build(tmp_path, tiny_model_dir, tiny_server, f"server.users={USERS}", "server.rate_limit_per_minute=0")
    store = services.store
    active = store.active_policy("assistant")
    (tmp_path / "cand").mkdir()
    cand = store.register_policy_version("assistant", str(tmp_path / "cand"), active.id, promote=False,
                                         metrics=INCONCLUSIVE)
    with TestClient(create_app(services, ui=False), base_url=LOCAL) as client:
        yield services, client, active, cand
    services.store.close()


def views(client, who, cand):
    """What ``who`` can read about the votes: the quality rows, the decision, the open decisions."""
    quality = client.get("/api/v1/quality", auth=who).json()["annotators"]
    decision = client.get(f"/api/v1/policies/{cand.id}/decision", auth=who).json()
    (listed,) = client.get("/api/v1/decisions", auth=who).json()
    return quality, decision, listed


def test_reading_before_and_after_a_vote_does_not_tell_how_bob_voted(team):
    services, client, active, cand = team
    store = services.store
    vote(store, cand, active, "a", "carol", 0)  # carol's own vote: she sees her own row
    before = views(client, CAROL, cand)
    vote(store, cand, active, "a", "bob", 1)  # bob votes for the candidate
    quality, decision, listed = views(client, CAROL, cand)
    assert [r["annotator"] for r in quality] == ["carol"] and quality == before[0]
    for d in (decision, listed):
        assert d["tally_hidden"] and all(d[k] is None for k in ("wins", "ties", "losses", "both_bad", "win_rate"))
        assert (d["counted_votes"], d["people"]) == (2, 2)  # how many, not which way
    assert {k: v for k, v in decision.items() if k not in ("counted_votes", "people", "votes", "votes_needed",
                                                           "people_needed", "blind_votes")} == \
        {k: v for k, v in before[1].items() if k not in ("counted_votes", "people", "votes", "votes_needed",
                                                         "people_needed", "blind_votes")}
    text = panel.refresh_panel(services, "assistant", request=gr.Request(username="carol"))[0]
    assert "2 votes from 2 accounts" in text and "won" not in text and "for admins" in text

    quality, decision, _ = views(client, ALICE, cand)  # admins see it all, live
    assert {r["annotator"] for r in quality} == {"bob", "carol"}
    assert (decision["wins"], decision["tally_hidden"]) == (2, False)
    text = panel.refresh_panel(services, "assistant", request=gr.Request(username="alice"))[0]
    assert "2 won, 0 tied, 0 lost" in text


def test_an_annotator_without_votes_sees_no_ones_stats(team):
    services, client, active, cand = team
    vote(services.store, cand, active, "b", "bob", 0)
    assert client.get("/api/v1/quality", auth=CAROL).json()["annotators"] == []
    assert [r["annotator"] for r in client.get("/api/v1/quality", auth=BOB).json()["annotators"]] == ["bob"]


def test_the_vote_queues_votes_per_annotator_are_for_admins(team):
    from tests.conftest import vote_on_item

    services, client, active, cand = team
    store = services.store
    replies = [{"content": "one", "policy_id": cand.id}, {"content": "two", "policy_id": active.id}]
    item = store.create_queue_item("assistant", [{"role": "user", "content": "q?"}], replies)
    vote_on_item(store, item.id, "a", "bob")
    assert client.get("/api/v1/queue/stats", auth=CAROL).json()["votes"] == {}
    assert client.get("/api/v1/queue/stats", auth=BOB).json()["votes"] == {"bob": 1}
    assert client.get("/api/v1/queue/stats", auth=ALICE).json()["votes"] == {"bob": 1}
