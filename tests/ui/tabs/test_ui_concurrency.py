"""Gradio's event settings let concurrent chats reach the batching engine together (none serialized)."""
from __future__ import annotations

import time

from tests.conftest import stall
from tests.support.gradio_page import Page


def wait_until(predicate, what, limit=60.0):
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def test_concurrent_ui_chats_reach_the_engine_together(live_app, services):
    server = services.server
    pages = [Page(live_app.url) for _ in range(3)]  # three people, each on their own page
    before = server.engine_load().submitted
    gate = stall(server.engine)  # the engine holds between two steps, so no chat can finish
    try:
        joins = [page.join("chat", f"Hello {i}", "assistant", "active", f"ann{i}", 8, 0.0, 1.0, "", 0, None, "", "",
                           [])
                 for i, page in enumerate(pages)]
        # With a concurrency limit of 1, the 2nd and 3rd chats would wait in Gradio's queue for the 1st.
        wait_until(lambda: server.engine_load().submitted - before == 3, "three chats in the engine at once")
    finally:
        gate.set()
    results = [page.result("chat", join) for page, join in zip(pages, joins)]
    for page in pages:
        page.close()
    assert all(len(history) == 2 for history, *_ in results)
    assert services.store.count("messages") == 6
