"""The Gradio API is off (REST is the API for scripts): gradio_client finds no endpoint, Gradio's by-name routes
answer 404 with where to go, and the page itself still chats over real HTTP on loopback (one round, stored)."""
from __future__ import annotations

import httpx
import pytest
from gradio_client import Client

from tests.support.gradio_page import event, page_call

CHAT = ("Hello from the page", "assistant", "active", "dora", 8, 0.0, 1.0, "", 0, None, "", "", [])  # its inputs


def test_the_ui_events_are_no_api_and_gradio_client_is_sent_to_rest(live_app, services):
    client = Client(live_app.url + "/", verbose=False)
    try:
        api = client.view_api(print_info=False, return_format="dict")
        assert api["named_endpoints"] == {} and api["unnamed_endpoints"] == {}  # the API page lists nothing
        with pytest.raises(ValueError, match="Cannot find a function with `api_name`: /chat"):
            client.predict(*CHAT, api_name="/chat")
        chat = event(client.config, "chat")["id"]
        with pytest.raises(ValueError, match="Invalid function index"):  # nor by its index
            client.predict(*CHAT, fn_index=chat)
    finally:
        client.close()
    info = httpx.get(live_app.url + "/gradio_api/info").json()
    assert info["named_endpoints"] == {} and info["unnamed_endpoints"] == {}
    for route in ("/gradio_api/call/chat", "/gradio_api/api/chat", "/gradio_api/run/chat"):
        called = httpx.post(live_app.url + route, json={"data": list(CHAT)})
        assert called.status_code == 404 and "/api/v1" in called.json()["error"], route  # the way to REST
    assert services.store.count("messages") == 0  # nothing ran


def test_the_page_still_chats_through_its_own_event(live_app, services):
    history, box, status, *_ = page_call(live_app.url, "chat", *CHAT)
    text = lambda m: "".join(p["text"] for p in m["content"]) if isinstance(m["content"], list) else m["content"]
    assert len(history) == 2 and text(history[0]) == "Hello from the page"
    assert "stored" in status
    store = services.store
    assert store.count("messages") == 2
    reply_id = int(status.split("#")[1].split("*")[0])
    assert store.get_message(reply_id).gen_params["seed"] is None  # the empty seed box: random
    assert store.get_message(reply_id).role == "assistant"
    shown = text(history[1]).split("✂️")[0]  # a reply cut at max_new_tokens carries a mark under it
    assert store.get_message(reply_id).content.split() == shown.split()  # the chatbot folds whitespace
