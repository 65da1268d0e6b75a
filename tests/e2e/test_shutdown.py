"""Shutdown with requests in flight (issue #33, finding 4): SIGTERM to the real app process while replies generate for
waiting clients and a client sends a body it never finishes. The app cancels the replies (none is stored), drops what
is still open after server.shutdown_seconds, and exits by itself.

The engine decodes slowly here (the llama.cpp wrapper's ``slow`` mode: 50 ms a step), so the replies are surely
still generating when SIGTERM comes: a tiny model would otherwise finish 2,048 tokens in a second or two."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading

import httpx

from storage import Store
from tests.e2e.app_process import TEST_APP, AppProcess, wait_until, write_config
from tests.e2e.test_engine_faults import faulty_env

ASK = {"max_new_tokens": 2048}


def test_sigterm_with_requests_in_flight_exits_and_stores_no_cut_reply(tmp_path, tiny_model_dir):
    config = write_config(tmp_path / "app.yaml", TEST_APP, {"scheduler": {"enabled": False}},
                          {"server": {"shutdown_seconds": 2.0}})
    app = AppProcess(tmp_path / "data", tiny_model_dir, config, env=faulty_env(tmp_path, "slow:0.05")).start()
    streamed: dict[int, list] = {i: [] for i in range(2)}
    answers: list = []

    def stream(i: int) -> None:  # /chat/stream: its first delta proves the reply is generating
        body = {"messages": [{"role": "user", "content": f"Tell me everything, part {i}."}], **ASK}
        try:
            with httpx.stream("POST", app.api + "/chat/stream", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    streamed[i].append(json.loads(line))
        except httpx.HTTPError as exc:  # the server went away under the request: what a client sees at shutdown
            streamed[i].append({"gone": str(exc)})

    def ask() -> None:  # plain /chat: waits for the whole reply
        try:
            answers.append(httpx.post(app.api + "/chat", timeout=300, json={
                "messages": [{"role": "user", "content": "Tell me everything, plainly."}], **ASK}))
        except httpx.HTTPError as exc:
            answers.append(exc)

    waiting = [threading.Thread(target=ask, daemon=True)]
    waiting += [threading.Thread(target=stream, args=(i,), daemon=True) for i in streamed]
    stuck = socket.create_connection(("127.0.0.1", app.port))
    try:
        for t in waiting:
            t.start()
        wait_until(lambda: all(any("delta" in line for line in lines) for lines in streamed.values()), 120,
                   "both streamed replies to be generating")
        stuck.sendall(b"POST /api/v1/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"messages\": [")  # ... and the rest never comes
        app.proc.send_signal(signal.SIGTERM)
        try:
            app.proc.wait(90)  # generous: the point is that it ends by itself, not how fast
        except subprocess.TimeoutExpired:
            raise AssertionError("the app did not exit after SIGTERM with requests in flight:\n" + app.output())
        for t in waiting:
            t.join(30)
        assert len(answers) == 1 and not (isinstance(answers[0], httpx.Response) and answers[0].status_code == 200)
        assert not any("done" in line for lines in streamed.values() for line in lines), streamed
        store = Store(app.data_dir / "studio.db")
        assert list(store.db.query("SELECT id FROM messages WHERE role = 'assistant'")) == []  # none stored cut
        store.close()
    finally:
        stuck.close()
        app.kill()
