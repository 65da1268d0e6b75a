"""The Gradio UI over real HTTP on loopback, driven by gradio_client (one chat round, the reply stored)."""
from __future__ import annotations

from gradio_client import Client


def test_chat_round_through_gradio_client(live_app, services):
    client = Client(live_app.url + "/", verbose=False)
    history, box, status, *_ = client.predict("Hello from the client", "assistant", "active", "dora", 8, 0.0, 1.0,
                                              "", api_name="/chat")
    text = lambda m: "".join(p["text"] for p in m["content"]) if isinstance(m["content"], list) else m["content"]
    assert len(history) == 2 and text(history[0]) == "Hello from the client"  # the box was cleared at once
    assert "stored" in status
    store = services.store
    assert store.count("messages") == 2
    reply_id = int(status.split("#")[1].split("*")[0])
    assert store.get_message(reply_id).gen_params["seed"] is None  # the empty seed box: random
    assert store.get_message(reply_id).role == "assistant"
    shown = text(history[1]).split("✂️")[0]  # a reply cut at max_new_tokens carries a mark under it
    assert store.get_message(reply_id).content.split() == shown.split()  # the chatbot folds whitespace
