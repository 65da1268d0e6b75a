"""Calling a UI event the way the page does (the Gradio API is off: ``ui.request_guard.hide_gradio_api``).

The browser finds an event in ``/config``, joins the queue with its index (``/gradio_api/queue/join``) and reads the
result from the session's event stream (``/gradio_api/queue/data``). ``page_call`` does the same over HTTP, with
the event found by the name it has in the code (``api_name="chat"``) and ``gr.State`` inputs filled with None, as
the page does on a fresh load.
"""
from __future__ import annotations

import json
import uuid
from typing import Optional

import httpx


def event(config: dict, name: str) -> dict:
    """The dependency of ``/config`` whose ``api_name`` is ``name``."""
    found = [d for d in config["dependencies"] if d.get("api_name") == name]
    assert len(found) == 1, f"no single UI event named {name!r} in /config"
    return found[0]


class Page:
    """One page load: a session (its ``gr.State`` values live on the server under it) and the app's ``/config``."""

    def __init__(self, url: str, headers: Optional[dict] = None, timeout: float = 120.0):
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers or {}, timeout=timeout)
        self.config = self.http.get("/config").json()
        self.kinds = {c["id"]: c.get("type") for c in self.config["components"]}
        self.session = uuid.uuid4().hex[:10]

    def join(self, name: str, *data) -> httpx.Response:
        """Queue the UI event ``name`` with ``data`` (its inputs less the ``gr.State`` ones); Gradio's answer."""
        dep = event(self.config, name)
        values = iter(data)
        inputs = [None if self.kinds.get(i) == "state" else next(values) for i in dep["inputs"]]
        return self.http.post("/gradio_api/queue/join", json={
            "data": inputs, "fn_index": dep["id"], "trigger_id": dep["targets"][0][0], "event_data": None,
            "session_hash": self.session})

    def call(self, name: str, *data) -> list:
        """Run the UI event ``name`` as the page would; its outputs less the ``gr.State`` ones (as gradio_client
        gave them). AssertionError with Gradio's message when the event fails."""
        return self.result(name, self.join(name, *data))

    def result(self, name: str, join: httpx.Response) -> list:
        """The outputs of the event ``join`` queued (``join(name, ...)``), once it completes."""
        dep = event(self.config, name)
        assert join.status_code == 200, join.text
        event_id = join.json()["event_id"]
        with self.http.stream("GET", "/gradio_api/queue/data", params={"session_hash": self.session}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("event_id") != event_id or message.get("msg") != "process_completed":
                    continue
                output = message.get("output", {})
                assert message.get("success"), output.get("error") or message
                return [v for i, v in zip(dep["outputs"], output["data"]) if self.kinds.get(i) != "state"]
        raise AssertionError(f"the event stream ended before {name!r} completed")

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Page":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def page_call(url: str, name: str, *data, headers: Optional[dict] = None, timeout: float = 120.0) -> list:
    """``Page(url, headers).call(name, *data)`` on a fresh page load."""
    with Page(url, headers, timeout) as page:
        return page.call(name, *data)
