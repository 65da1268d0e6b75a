"""Decisions no single person can make (issue #33, findings 1 and 2), over REST in process and through the Chat tab's
handler: annotators chat with the version they are given, one annotator voting as often as they like never settles
a promotion, and excluding an annotator takes their votes out of the leaderboard and reopens what rested on them."""
from __future__ import annotations

import gradio as gr
import pytest
from fastapi.testclient import TestClient

from rlhf.retrain import decisions
from tests.rlhf.retrain.test_decisions import INCONCLUSIVE
from tests.ui.test_trust import ALICE, BOB, LOCAL, USERS, build, counts
from ui.tabs import chat as chat_tab

DAVE, ERIN, FRANK = ("dave", "d-pass"), ("erin", "e-pass"), ("frank", "f-pass")


@pytest.fixture
def team(tmp_path, tiny_model_dir, tiny_server, adapter):
    """A team app (alice admin; bob, carol, dave, erin, frank annotators) with a candidate the gate left to people."""
    from ui.webapp import create_app

    services = build(tmp_path, tiny_model_dir, tiny_server,
                     f"server.users={USERS},dave:d-pass,erin:e-pass,frank:f-pass", "server.rate_limit_per_minute=0")
    store = services.store
    active = store.active_policy("assistant")
    cand = store.register_policy_version("assistant", adapter, active.id, promote=False, metrics=INCONCLUSIVE)
    with TestClient(create_app(services, ui=False), base_url=LOCAL) as client:
        yield services, client, active, cand
    services.store.close()


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory):
    from tests.conftest import make_adapter

    return make_adapter(tiny_model_dir, tmp_path_factory.mktemp("people") / "v1", seed=33)


def ask(client, who, **body):
    return client.post("/api/v1/chat", auth=who, json={"messages": [{"role": "user", "content": "Which is better?"}],
                                                       "max_new_tokens": 2, **body})


def test_annotators_chat_with_the_version_they_are_given(team):
    services, client, active, cand = team
    before = counts(services)
    for path in ("/api/v1/chat", "/api/v1/chat/stream"):
        r = client.post(path, auth=BOB, json={"messages": [{"role": "user", "content": "hi"}], "policy_id": cand.id})
        assert r.status_code == 403 and "admins" in r.json()["error"]
    assert counts(services) == before  # refused before anything was stored
    mine = ask(client, BOB, policy_id=active.id).json()  # naming the active version is naming nothing
    assert mine["policy_id"] == active.id and ask(client, BOB).json()["policy_id"] == active.id
    regen = client.post(f"/api/v1/messages/{mine['message_id']}/regenerate", auth=BOB, json={"policy_id": cand.id})
    assert regen.status_code == 403
    services.store.promote_policy(cand.id)
    services.store.promote_policy(active.id)  # the reply's own version is not the point: annotators get the active
    again = client.post(f"/api/v1/messages/{mine['message_id']}/regenerate", auth=BOB, json={}).json()
    assert again["policy_id"] == active.id
    chosen = ask(client, ALICE, policy_id=cand.id)  # admins choose
    assert chosen.status_code == 200 and chosen.json()["policy_id"] == cand.id
    alt = client.post(f"/api/v1/messages/{chosen.json()['message_id']}/regenerate", auth=ALICE, json={}).json()
    assert alt["policy_id"] == cand.id  # an admin's regeneration keeps the reply's version


def test_the_chat_tab_refuses_a_chosen_version_for_annotators(team):
    services, _, active, cand = team
    before = counts(services)
    out = list(chat_tab.send_message(services, "hi", chat_tab.empty_state(), "assistant", cand.id, "typed", 2, 0.0,
                                     1.0, None, request=gr.Request(username="bob")))[-1]
    assert "admins" in out[3] and counts(services) == before
    out = list(chat_tab.send_message(services, "hi", chat_tab.empty_state(), "assistant", cand.id, "typed", 2, 0.0,
                                     1.0, None, request=gr.Request(username="alice")))[-1]
    reply = services.store.get_message(out[1]["ids"][-1])
    assert reply.policy_id == cand.id


@pytest.mark.slow  # seconds of real work: the full suite only (make test-fast < 60 s)
def test_one_annotator_voting_as_often_as_the_api_allows_never_decides(team):
    """The attack of the issue: 16 arena rounds by one annotator, each voted for whichever side the candidate wrote
    (the reveal after each vote tells them its style); then two more people vote once."""
    services, client, active, cand = team
    store = services.store
    for _ in range(16):
        rnd = client.post("/api/v1/arena", auth=BOB, json={"messages": [{"role": "user", "content": "Pick one"}]})
        assert rnd.status_code == 200, rnd.text
        pair = store.get_arena_pair(rnd.json()["pair_id"])
        cand_side = "a" if store.get_message(pair.message_a_id).policy_id == cand.id else "b"
        client.post(f"/api/v1/arena/{pair.id}/vote", auth=BOB, json={"winner": cand_side}).raise_for_status()
    d = client.get(f"/api/v1/policies/{cand.id}/decision", auth=BOB).json()
    assert d["blind_votes"] == 16 and d["votes"] == 3 and d["people"] == 1 and d["verdict"] == "collecting"
    assert decisions.settle(store, services.config) == [] and store.get_policy(cand.id).status == "candidate"
    board = {r["policy_id"]: r for r in client.get("/api/v1/leaderboard", auth=BOB).json()}
    assert board[cand.id]["votes"] == 16  # the leaderboard shows every counted vote; the decision counts people


@pytest.mark.slow  # seconds of real work: the full suite only (make test-fast < 60 s)
def test_excluding_an_annotator_reopens_the_promotion_that_rested_on_them(team):
    services, client, active, cand = team
    store = services.store
    for who in (BOB, DAVE, ERIN, FRANK):
        for _ in range(3):
            rnd = client.post("/api/v1/arena", auth=who, json={"messages": [{"role": "user", "content": "Pick"}]})
            pair = store.get_arena_pair(rnd.json()["pair_id"])
            side = "a" if store.get_message(pair.message_a_id).policy_id == cand.id else "b"
            client.post(f"/api/v1/arena/{pair.id}/vote", auth=who, json={"winner": side}).raise_for_status()
    assert [s["verdict"] for s in decisions.settle(store, services.config)] == ["promote"]
    assert store.active_policy("assistant").id == cand.id
    board = {r["policy_id"]: r["votes"] for r in client.get("/api/v1/leaderboard", auth=BOB).json()}
    assert board[cand.id] == 12
    done = client.post("/api/v1/annotators/frank/exclude", auth=ALICE, json={"excluded": True}).json()
    assert done["excluded"] and [(r["policy_id"], r["previous"]) for r in done["reopened"]] == [(cand.id, "promote")]
    undone = done["reopened"][0]
    assert undone["restored_active_id"] == active.id and "frank was excluded" in undone["because"]
    assert store.active_policy("assistant").id == active.id and store.get_policy(cand.id).status == "candidate"
    services.leaderboards.table("assistant", fresh=True)  # readers get the last table until the refit lands
    board = {r["policy_id"]: r["votes"] for r in client.get("/api/v1/leaderboard", auth=BOB).json()}
    assert board[cand.id] == 9  # frank's three votes are out of the leaderboard too
    d = client.get(f"/api/v1/policies/{cand.id}/decision", auth=BOB).json()
    assert d["open"] and d["reopened"]["previous"] == "promote" and d["votes"] == 9
