"""REST API contracts and every bad-input case: 4xx with {"error"}, nothing stored."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from ui.webapp import create_app


@pytest.fixture
def client(services):
    with TestClient(create_app(services, ui=False)) as c:
        yield c


def chat(client, text="Hello", **extra):
    r = client.post("/api/v1/chat", json={"messages": [{"role": "user", "content": text}], "max_new_tokens": 8,
                                          "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def counts(services):
    return {t: services.store.count(t) for t in ("messages", "ratings", "comparisons", "conversations")}


def test_health_agents_policies(client):
    health = client.get("/api/v1/health").json()
    assert health["status"] == "ok" and health["model"] and health["schema_version"] >= 1
    agents = client.get("/api/v1/agents").json()
    assert agents[0]["name"] == "assistant" and agents[0]["active_policy_id"] == 1
    policies = client.get("/api/v1/policies", params={"agent": "assistant"}).json()
    assert policies[0]["version"] == 0 and policies[0]["status"] == "active"


def test_chat_regenerate_feedback_comparison_roundtrip(client):
    first = chat(client, annotator="alice")
    assert set(first) == {"conversation_id", "message_id", "policy_id", "content", "latency_ms"}
    follow = chat(client, "And more?", conversation_id=first["conversation_id"])
    assert follow["conversation_id"] == first["conversation_id"]
    alt = client.post(f"/api/v1/messages/{follow['message_id']}/regenerate", json={"seed": 1, "temperature": 1.0})
    assert alt.status_code == 200 and alt.json()["message_id"] != follow["message_id"]
    fb = client.post("/api/v1/feedback", json={"message_id": follow["message_id"], "thumb": 1, "score": 5,
                                               "flags": ["Unhelpful"], "note": "ok", "annotator": "alice"})
    assert fb.status_code == 200 and fb.json()["id"] > 0
    comp = client.post("/api/v1/comparisons", json={"message_a_id": follow["message_id"],
                                                    "message_b_id": alt.json()["message_id"], "winner": "a"})
    assert comp.status_code == 200
    back = client.get(f"/api/v1/messages/{follow['message_id']}").json()
    assert back["content"] == follow["content"] and back["ratings"][0]["score"] == 5
    assert back["ratings"][0]["flags"] == ["Unhelpful"]


def test_chat_with_client_side_history(client, services):
    r = client.post("/api/v1/chat", json={"messages": [{"role": "user", "content": "hi"},
                                                       {"role": "assistant", "content": "hello"},
                                                       {"role": "user", "content": "how are you?"}],
                                          "max_new_tokens": 4})
    assert r.status_code == 200
    system, history = services.store.state_for(r.json()["message_id"])
    assert [m["content"] for m in history[:3]] == ["hi", "hello", "how are you?"]


BAD_CHAT = [
    ({"messages": []}, 422, "non-empty"),
    ({"messages": [{"role": "user", "content": ""}]}, 422, "empty"),
    ({"messages": [{"role": "user", "content": " \t "}]}, 422, "empty"),
    ({"messages": [{"role": "user", "content": "x" * 8001}]}, 422, "limit"),
    ({"messages": [{"role": "user", "content": "a\u0000b"}]}, 422, "NUL"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, 422, "last message"),
    ({"messages": [{"role": "user", "content": "hi"}], "agent": "nobody"}, 404, "unknown agent"),
    ({"messages": [{"role": "user", "content": "hi"}], "policy_id": 999}, 404, "unknown policy"),
    ({"messages": [{"role": "user", "content": "hi"}], "conversation_id": 999}, 404, "unknown conversation"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 422, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_new_tokens": 0}, 422, "max_new_tokens"),
    ({"messages": "hi"}, 422, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "bogus": 1}, 422, "bogus"),
]


@pytest.mark.parametrize("body, status, problem", BAD_CHAT)
def test_bad_chat_requests(client, services, body, status, problem):
    before = counts(services)
    r = client.post("/api/v1/chat", json=body)
    assert r.status_code == status and problem in r.json()["error"], r.text
    assert counts(services) == before


@pytest.mark.parametrize("patch, status, problem", [
    ({"score": 0}, 422, "score"), ({"score": 6}, 422, "score"), ({"score": "five"}, 422, "score"),
    ({"score": 2.5}, 422, "score"), ({"thumb": 0}, 422, "thumb"), ({"thumb": 2}, 422, "thumb"),
    ({"flags": ["Nope"]}, 422, "flags"), ({"note": "x" * 8001}, 422, "limit"), ({}, 422, "at least one"),
    ({"message_id": 999, "thumb": 1}, 404, "unknown message"),
])
def test_bad_feedback(client, services, patch, status, problem):
    reply = chat(client)
    before = counts(services)
    r = client.post("/api/v1/feedback", json={"message_id": reply["message_id"], **patch})
    assert r.status_code == status and problem in r.json()["error"], r.text
    assert counts(services) == before


@pytest.mark.parametrize("raw", ['{"message_id": 2, "score": NaN}', '{"message_id": 2, "score": Infinity}'])
def test_nan_and_infinite_scores(client, services, raw):
    chat(client)
    before = counts(services)
    r = client.post("/api/v1/feedback", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "score" in r.json()["error"]
    assert counts(services) == before


def test_comparison_of_different_contexts_is_refused(client, services):
    a, b = chat(client, "first question"), chat(client, "second question")
    before = counts(services)
    r = client.post("/api/v1/comparisons", json={"message_a_id": a["message_id"], "message_b_id": b["message_id"],
                                                 "winner": "a"})
    assert r.status_code == 422 and "different contexts" in r.json()["error"]
    r = client.post("/api/v1/comparisons", json={"message_a_id": a["message_id"], "message_b_id": a["message_id"],
                                                 "winner": "z"})
    assert r.status_code == 422
    assert counts(services) == before


def test_malformed_json_and_oversized_bodies(client, services):
    before = counts(services)
    r = client.post("/api/v1/chat", content="{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "malformed JSON body"
    big = '{"messages": [{"role": "user", "content": "' + "x" * 1_100_000 + '"}]}'
    r = client.post("/api/v1/chat", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger" in r.json()["error"]
    assert counts(services) == before
    assert client.get("/api/v1/health").status_code == 200


def test_unknown_ids(client):
    assert client.get("/api/v1/messages/12345").status_code == 404
    assert client.post("/api/v1/messages/12345/regenerate", json={}).json()["error"].startswith("unknown message")
    assert client.get("/api/v1/policies", params={"agent": "ghost"}).status_code == 404


def test_a_locked_database_answers_busy_retry_like_a_full_queue(client, services):
    import sqlite3

    services.store.busy_timeout_s = 0.2  # every connection this test opens waits this long
    first = chat(client)
    holder = sqlite3.connect(services.store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        r = client.post("/api/v1/feedback", json={"message_id": first["message_id"], "thumb": 1})
    finally:
        holder.execute("ROLLBACK")
    assert r.status_code == 503 and "busy" in r.json()["error"]
    assert int(r.headers["Retry-After"]) >= 1
    assert client.post("/api/v1/feedback", json={"message_id": first["message_id"], "thumb": 1}).status_code == 200
