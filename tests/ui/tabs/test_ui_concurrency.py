"""Gradio's event settings let concurrent chats reach the batching engine together (none serialized)."""
from __future__ import annotations

import time

from gradio_client import Client

from tests.conftest import stall


def wait_until(predicate, what, limit=60.0):
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def test_concurrent_ui_chats_reach_the_engine_together(live_app, services):
    server = services.server
    client = Client(live_app.url + "/", verbose=False)
    before = server.engine_load().submitted
    gate = stall(server.engine)  # the engine holds between two steps, so no chat can finish
    try:
        jobs = [client.submit(f"Hello {i}", "assistant", 1, f"ann{i}", 8, 0.0, 1.0, None, api_name="/chat")
                for i in range(3)]
        # With a concurrency limit of 1, the 2nd and 3rd chats would wait in Gradio's queue for the 1st.
        wait_until(lambda: server.engine_load().submitted - before == 3, "three chats in the engine at once")
    finally:
        gate.set()
    results = [job.result(timeout=120) for job in jobs]
    assert all(len(history) == 2 for history, *_ in results)
    assert services.store.count("messages") == 6
