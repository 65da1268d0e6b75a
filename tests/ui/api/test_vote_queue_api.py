"""REST contracts of the vote queue and every bad input (4xx with {"error"}, nothing stored); the Vote tab's
handlers without Gradio."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from rlhf.training.data import build_pairs
from ui.webapp import create_app
from ui.tabs import vote as vote_tab


@pytest.fixture
def client(services):
    with TestClient(create_app(services, ui=False)) as c:
        yield c


def add_items(services, n: int, ttl: float = 3600.0, overlap_every: int = 0) -> list:
    store = services.store
    policy = store.active_policy("assistant").id
    return [store.create_queue_item("assistant", [{"role": "user", "content": f"question {i}?"}],
                                    [{"content": f"first answer {i}", "policy_id": policy},
                                     {"content": f"second answer {i}", "policy_id": policy}],
                                    overlap_every=overlap_every, ttl_seconds=ttl) for i in range(n)]


def counts(services):
    return {t: services.store.count(t) for t in ("comparisons", "queue_assignments", "messages")}


def test_next_vote_stats_contracts(client, services):
    items = add_items(services, 2)
    r = client.get("/api/v1/queue/next", params={"agent": "assistant", "annotator": "alice"})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"item_id", "messages", "a", "b", "reason"}
    assert set(body["a"]) == set(body["b"]) == {"message_id", "content"}
    item = next(i for i in items if i.id == body["item_id"])
    assert body["messages"][-1]["role"] == "user" and body["a"]["message_id"] == item.message_a_id
    assert body["reason"] == "cold_start"  # no reward head yet: random
    vote = client.post(f"/api/v1/queue/{body['item_id']}/vote", json={"winner": "b", "annotator": "alice"})
    assert vote.status_code == 200 and set(vote.json()) == {"comparison_id"}
    comparison = services.store.list_comparisons("assistant")[-1]
    assert comparison.id == vote.json()["comparison_id"] and comparison.winner == "b"
    assert (comparison.message_a_id, comparison.message_b_id) == (item.message_a_id, item.message_b_id)
    again = client.post(f"/api/v1/queue/{body['item_id']}/vote", json={"winner": "b", "annotator": "alice"})
    assert again.status_code == 200 and again.json() == vote.json()  # a retry: the first vote
    other = client.post(f"/api/v1/queue/{body['item_id']}/vote", json={"winner": "a", "annotator": "alice"})
    assert other.status_code == 409 and "already voted" in other.json()["error"]  # the first vote counts
    pairs = build_pairs(services.store.feedback_rows("assistant"))
    assert [p["chosen"] for p in pairs] == [f"second answer {items.index(item)}"]
    second = client.get("/api/v1/queue/next", params={"annotator": "alice"}).json()
    assert second["item_id"] != body["item_id"]
    client.post(f"/api/v1/queue/{second['item_id']}/vote", json={"winner": "tie", "annotator": "alice"})
    assert client.get("/api/v1/queue/next", params={"annotator": "alice"}).status_code == 204
    stats = client.get("/api/v1/queue/stats", params={"agent": "assistant"}).json()
    assert stats["agent"] == "assistant" and stats["pool_size"] >= 60  # the starter prompts
    assert (stats["items"], stats["ready"], stats["votes"]) == (2, 0, {"alice": 2})


def test_an_unvoted_item_comes_back_and_others_get_different_ones(client, services):
    add_items(services, 2)
    first = client.get("/api/v1/queue/next", params={"annotator": "alice"}).json()
    assert client.get("/api/v1/queue/next", params={"annotator": "alice"}).json()["item_id"] == first["item_id"]
    other = client.get("/api/v1/queue/next", params={"annotator": "bob"}).json()
    assert other["item_id"] != first["item_id"]
    assert client.get("/api/v1/queue/next", params={"annotator": "carol"}).status_code == 204  # both held


def test_bad_input_gets_4xx_and_stores_nothing(client, services):
    item = add_items(services, 1)[0]
    expired = add_items(services, 1, ttl=-1)[0]
    before = counts(services)
    cases = [
        (client.post("/api/v1/queue/999/vote", json={"winner": "a"}), 404, "unknown queue item"),
        (client.post(f"/api/v1/queue/{2**70}/vote", json={"winner": "a"}), 404, None),
        (client.post("/api/v1/queue/abc/vote", json={"winner": "a"}), 422, "item_id"),
        (client.post(f"/api/v1/queue/{item.id}/vote", json={"winner": "left"}), 422, "winner"),
        (client.post(f"/api/v1/queue/{item.id}/vote", json={}), 422, "winner"),
        (client.post(f"/api/v1/queue/{item.id}/vote", json={"winner": "a", "extra": 1}), 422, "extra"),
        (client.post(f"/api/v1/queue/{item.id}/vote", content=b"{not json", headers={"content-type":
                                                                                    "application/json"}), 400, None),
        (client.post(f"/api/v1/queue/{item.id}/vote", json={"winner": "a", "annotator": "x" * 65}), 422, None),
        (client.post(f"/api/v1/queue/{expired.id}/vote", json={"winner": "a"}), 409, "expired"),
        (client.get("/api/v1/queue/next", params={"agent": "nobody"}), 404, "unknown agent"),
        (client.get("/api/v1/queue/stats", params={"agent": "nobody"}), 404, "unknown agent"),
        (client.get("/api/v1/queue/next", params={"annotator": "x" * 65}), 422, "limit"),
    ]
    for response, status, words in cases:
        assert response.status_code == status, (response.request.url, response.text)
        assert "error" in response.json()
        if words:
            assert words in response.json()["error"], response.json()
    assert counts(services) == before
    client.get("/api/v1/queue/next", params={"annotator": "alice"})  # alice holds the only open item
    closed = client.post(f"/api/v1/queue/{item.id}/vote", json={"winner": "a", "annotator": "bob"})
    assert closed.status_code == 409 and "closed" in closed.json()["error"]


def test_the_vote_tab_votes_and_shows_the_next_item_at_once(services):
    items = add_items(services, 3)
    state = vote_tab.empty_state()
    out = vote_tab.load_next(services, state, "assistant", "dora")
    context, chat_a, chat_b, state, status = out[:5]
    shown = [state["item_id"]]
    assert context[-1]["role"] == "user" and chat_a[0]["role"] == "assistant" and "Item #" in status
    for winner in ("a", "b"):
        out = vote_tab.submit_vote(services, winner, state, "assistant", "dora")
        state, status = out[3], out[4]
        assert "Stored as comparison #" in status and state["item_id"] not in shown
        shown.append(state["item_id"])
    out = vote_tab.submit_vote(services, "tie", state, "assistant", "dora")
    assert out[3]["item_id"] is None and "Nothing to vote on" in out[4]
    votes = services.store.queue_stats("assistant", 600)["votes"]
    assert votes == {"dora": 3} and sorted(shown) == sorted(i.id for i in items)
    # an expired item: the vote is refused with a warning, and the next item is shown anyway
    late = add_items(services, 1, ttl=0.5)[0]
    state = vote_tab.load_next(services, vote_tab.empty_state(), "assistant", "erin")[3]
    assert state["item_id"] == late.id
    import time

    time.sleep(0.6)
    with pytest.warns(UserWarning):
        out = vote_tab.submit_vote(services, "a", state, "assistant", "erin")
    assert "expired" in out[4]


def test_the_vote_tab_skips_counts_what_is_left_and_needs_a_name(services):
    items = add_items(services, 3)
    out = vote_tab.load_next(services, vote_tab.empty_state(), "assistant", "")
    assert "Type your name" in out[4] and services.store.queue_stats("assistant", 600)["votes"] == {}
    out = vote_tab.load_next(services, vote_tab.empty_state(), "assistant", "sky")
    first = out[3]["item_id"]
    assert "3 left for you" in out[4] and "reward model" not in out[4]
    out = vote_tab.skip(services, out[3], "assistant", "sky")
    assert f"Skipped item #{first}" in out[4] and "2 left for you" in out[4] and out[3]["item_id"] != first
    # a skipped item goes to others at once, never back to the one who skipped it
    assert vote_tab.load_next(services, vote_tab.empty_state(), "assistant", "sky")[3]["item_id"] != first
    other = [vote_tab.load_next(services, vote_tab.empty_state(), "assistant", f"o{i}")[3]["item_id"] for i in range(3)]
    assert first in other
    assert services.store.count("comparisons") == 0 and len(items) == 3


def test_the_vote_tab_refuses_a_stale_pair_and_a_changed_name_in_plain_words(services):
    add_items(services, 3)
    first = vote_tab.load_next(services, vote_tab.empty_state(), "assistant", "tam")[3]
    second = vote_tab.load_next(services, vote_tab.empty_state(), "assistant", "tam")[3]  # a second tab
    assert first == second == {"item_id": first["item_id"], "shown_to": "tam"}
    out = vote_tab.submit_vote(services, "a", first, "assistant", "tam")
    stored = services.store.list_comparisons("assistant")[-1]
    assert f"Stored as comparison #{stored.id}: A is better on item #{first['item_id']}." in out[4]
    with pytest.warns(UserWarning):
        out = vote_tab.submit_vote(services, "b", second, "assistant", "tam")  # the stale tab
    assert (f"You already voted on item #{first['item_id']}: A is better (stored as comparison #{stored.id})"
            in out[4]) and "Stored as" not in out[4] and out[3]["item_id"] != first["item_id"]
    shown = out[3]
    with pytest.warns(UserWarning):
        out = vote_tab.submit_vote(services, "b", shown, "assistant", "uma")  # the name changed meanwhile
    assert f"Item #{shown['item_id']} was shown to tam, and the name is now uma: nothing was stored" in out[4]
    assert "GET" not in out[4] and out[3]["shown_to"] == "uma"
    with pytest.warns(UserWarning):
        out = vote_tab.skip(services, out[3], "assistant", "tam")  # a skip under a changed name: refused too
    assert "was shown to uma" in out[4]
    assert [(c.winner, c.annotator_id) for c in services.store.list_comparisons("assistant", history=True)] == \
        [("a", services.store.annotator_id("tam"))]
