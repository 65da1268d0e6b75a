"""POST /api/v1/chat/stream over real HTTP: NDJSON deltas, then the stored reply; errors before the stream
are plain JSON errors."""
from __future__ import annotations

import json

import httpx


def test_chat_stream_sends_deltas_then_the_stored_reply_and_refuses_bad_input(live_app, services):
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_new_tokens": 12, "temperature": 0}
    with httpx.Client(base_url=live_app.url, timeout=60) as client:
        with client.stream("POST", "/api/v1/chat/stream", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
            events = [json.loads(line) for line in r.iter_lines() if line]
        deltas = [e["delta"] for e in events[:-1]]
        done = events[-1]
        assert deltas and all(set(e) == {"delta"} for e in events[:-1])
        assert done["done"] is True and done["content"] == "".join(deltas)
        assert 1 <= done["n_tokens"] <= 12 and 0 < done["ttft_ms"] <= done["latency_ms"]
        stored = client.get(f"/api/v1/messages/{done['message_id']}").json()
        assert stored["content"] == done["content"] and stored["role"] == "assistant"
        # Greedy: the streamed reply is the one /chat gives for the same state.
        plain = client.post("/api/v1/chat", json=body).json()
        assert plain["content"] == done["content"]
        # Bad input is refused before streaming starts: a plain JSON error, nothing stored.
        before = services.store.count("messages")
        r = client.post("/api/v1/chat/stream", json={"messages": [{"role": "user", "content": "hi"}],
                                                      "max_new_tokens": 0})
        assert r.status_code == 422 and "max_new_tokens" in r.json()["error"]
        r = client.post("/api/v1/chat/stream", json={"messages": []})
        assert r.status_code in (400, 422) and "error" in r.json()
        assert services.store.count("messages") == before
