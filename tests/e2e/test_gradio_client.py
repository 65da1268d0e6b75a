"""The Gradio UI over real HTTP on loopback, driven by gradio_client (one chat round, rating stored)."""
from __future__ import annotations

from gradio_client import Client


def test_chat_round_through_gradio_client(live_app, services):
    client = Client(live_app.url + "/", verbose=False)
    history, box, status = client.predict("Hello from the client", "assistant", 1, "dora", 8, 0.0, 1.0, None,
                                          api_name="/chat")
    text = lambda m: "".join(p["text"] for p in m["content"]) if isinstance(m["content"], list) else m["content"]
    assert box == "" and len(history) == 2 and text(history[0]) == "Hello from the client"
    assert "Selected reply" in status
    store = services.store
    assert store.count("messages") == 2
    reply_id = int(status.split("#")[1].split("*")[0])
    assert store.get_message(reply_id).role == "assistant"
    assert store.get_message(reply_id).content.split() == text(history[1]).split()  # the chatbot folds whitespace
