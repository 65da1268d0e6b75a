"""Shutdown with requests in flight (issue #33, finding 4): SIGTERM to the real app process while replies generate for
waiting clients and a client sends a body it never finishes. The app cancels the replies (none is stored), drops what
is still open after server.shutdown_seconds, and exits by itself."""
from __future__ import annotations

import signal
import socket
import subprocess
import threading

import httpx

from storage import Store
from tests.e2e.app_process import TEST_APP, AppProcess, wait_until, write_config


def test_sigterm_with_requests_in_flight_exits_and_stores_no_cut_reply(tmp_path, tiny_model_dir):
    config = write_config(tmp_path / "app.yaml", TEST_APP, {"scheduler": {"enabled": False}},
                          {"server": {"shutdown_seconds": 2.0}})
    app = AppProcess(tmp_path / "data", tiny_model_dir, config).start()
    answers: list = []

    def ask(i: int) -> None:
        try:
            answers.append(httpx.post(app.api + "/chat", timeout=300, json={
                "messages": [{"role": "user", "content": f"Tell me everything, part {i}."}], "max_new_tokens": 2048}))
        except httpx.HTTPError as exc:  # the server went away under the request: what a client sees at shutdown
            answers.append(exc)

    waiting = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(3)]
    stuck = socket.create_connection(("127.0.0.1", app.port))
    try:
        for t in waiting:
            t.start()
        store = Store(app.data_dir / "studio.db")
        wait_until(lambda: store.count("messages") >= 3, 120, "the three user turns to be stored")
        stuck.sendall(b"POST /api/v1/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"messages\": [")  # ... and the rest never comes
        app.proc.send_signal(signal.SIGTERM)
        try:
            app.proc.wait(90)  # generous: the point is that it ends by itself, not how fast
        except subprocess.TimeoutExpired:
            raise AssertionError("the app did not exit after SIGTERM with requests in flight:\n" + app.output())
        for t in waiting:
            t.join(30)
        assert len(answers) == 3 and not any(isinstance(a, httpx.Response) and a.status_code == 200 for a in answers)
        replies = [m for m in store.db.query("SELECT id FROM messages WHERE role = 'assistant'")]
        assert replies == []  # cancelled replies are not stored cut short
        store.close()
    finally:
        stuck.close()
        app.kill()
