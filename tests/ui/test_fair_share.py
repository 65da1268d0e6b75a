"""Nobody ties up generation (issue #33, finding 4), over real HTTP on loopback: a client that hangs up cancels its
reply and nothing is stored, each person has a capped number of replies generating at once (a clear 429), and one
per-user rate limit counts REST and Gradio API calls alike. Shutdown with requests in flight:
tests/e2e/test_shutdown.py."""
from __future__ import annotations

import base64
import json
import socket

import httpx
import pytest

from tests.conftest import LiveServer
from tests.e2e.app_process import wait_until
from tests.support.gradio_page import Page
from tests.ui.test_trust import USERS, build

BOB, CAROL = ("bob", "b-pass"), ("carol", "c-pass")
LONG = 2048  # tokens: a reply that is still generating while the test looks at it


def live(tmp_path, tiny_model_dir, tiny_server, *extra, ui=False):
    from ui.webapp import create_app

    services = build(tmp_path, tiny_model_dir, tiny_server, f"server.users={USERS}", *extra)
    return services, LiveServer(create_app(services, ui=ui))


def replies(services) -> int:
    return sum(1 for m in services.store.db.query("SELECT id FROM messages WHERE role = 'assistant'"))


def hang_up_once_generating(url: str, path: str, body: dict, services, who=BOB) -> None:
    """POST ``body`` over a raw socket, wait until the reply is generating, then close the connection unread."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    token = base64.b64encode(f"{who[0]}:{who[1]}".encode()).decode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Basic {token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        wait_until(lambda: not services.server.idle(), 60, "the reply to start generating")


@pytest.mark.parametrize("path", ["/api/v1/chat", "/api/v1/arena"])
def test_a_client_that_hangs_up_cancels_its_reply_and_nothing_is_stored(tmp_path, tiny_model_dir, tiny_server, path):
    services, server = live(tmp_path, tiny_model_dir, tiny_server)
    store = services.store
    if path.endswith("arena"):  # two versions for the round
        from tests.conftest import make_adapter

        v0 = store.active_policy("assistant")
        store.register_policy_version("assistant", make_adapter(tiny_model_dir, tmp_path / "v1", seed=3), v0.id,
                                      promote=False)
    body = {"messages": [{"role": "user", "content": "Tell me everything."}]}
    body.update({"max_new_tokens": LONG} if path.endswith("chat") else {})
    if path.endswith("arena"):
        store.update_agent("assistant", generation={"max_new_tokens": LONG})
    with server:
        hang_up_once_generating(server.url, path, body, services)
        wait_until(lambda: services.server.idle(), 300, "the server to be idle again")
        assert replies(services) == 0  # cancelled before its end: no reply stored
        if path.endswith("chat"):  # nor the user's turn: it is stored only with its reply
            assert services.store.count("messages") == 0 and services.store.count("conversations") == 0
        ok = httpx.post(server.url + "/api/v1/chat", auth=BOB, timeout=120,
                        json={"messages": [{"role": "user", "content": "hi"}], "max_new_tokens": 2})
        assert ok.status_code == 200 and replies(services) == 1
    services.store.close()


@pytest.mark.slow  # seconds of real work: the full suite only (make test-fast < 60 s)
def test_each_person_has_a_capped_number_of_replies_generating(tmp_path, tiny_model_dir, tiny_server):
    services, server = live(tmp_path, tiny_model_dir, tiny_server, "server.max_replies_per_user=2")
    body = {"messages": [{"role": "user", "content": "Tell me everything."}], "max_new_tokens": LONG}
    with server, httpx.Client(base_url=server.url + "/api/v1", timeout=120) as client:
        streams = [client.stream("POST", "/chat/stream", auth=BOB, json=body) for _ in range(2)]
        opened = [s.__enter__() for s in streams]  # both replies generating, nobody reading yet
        try:
            assert all(r.status_code == 200 for r in opened)  # the replies are submitted before the first byte
            before = services.store.count("messages")
            third = client.post("/chat", auth=BOB, json=body)
            assert third.status_code == 429 and "max_replies_per_user" in third.json()["error"]
            assert int(third.headers["Retry-After"]) >= 1
            assert services.store.count("messages") == before  # refused before anything was stored
            other = client.post("/chat", auth=CAROL, json={**body, "max_new_tokens": 2})
            assert other.status_code == 200  # another person is not held back by bob's share
        finally:
            for s in streams:
                s.__exit__(None, None, None)  # hang up: both replies are cancelled
        wait_until(lambda: services.server.idle(), 300, "bob's replies to be cancelled")
        again = client.post("/chat", auth=BOB, json={**body, "max_new_tokens": 2})
        assert again.status_code == 200
    services.store.close()


def test_one_rate_limit_counts_rest_and_the_pages_named_events(tmp_path, tiny_model_dir, tiny_server):
    services, server = live(tmp_path, tiny_model_dir, tiny_server, "server.rate_limit_per_minute=4", ui=True)
    with server:
        login = httpx.post(server.url + "/login", data={"username": "bob", "password": "b-pass"})
        assert login.status_code == 200
        cookie = "; ".join(f"{k}={v}" for k, v in login.cookies.items())
        with httpx.Client(base_url=server.url, cookies=login.cookies, timeout=60) as bob, \
                Page(server.url, headers={"Cookie": cookie}) as page:
            for _ in range(2):
                assert bob.get("/api/v1/me", auth=BOB).status_code == 200
            for _ in range(2):  # the Vote tab's "next pair" event, as the page calls it
                assert page.join("queue_next", "assistant", "").status_code == 200
            rest, gradio = bob.get("/api/v1/me", auth=BOB), page.join("queue_next", "assistant", "")
            assert rest.status_code == 429 and gradio.status_code == 429  # one budget for both doors
            assert int(gradio.headers["Retry-After"]) >= 1
        carol = httpx.get(server.url + "/api/v1/me", auth=CAROL)
        assert carol.status_code == 200  # per user
    services.store.close()


def test_every_gradio_event_counts_and_timers_have_their_own_budget(tmp_path, tiny_model_dir, tiny_server):
    """The UI's private events (called by ``fn_index``, as the browser does) count against the same per-user
    limit as REST; a timer's tick counts against its own budget (``server.timer_rate_limit_per_minute``)."""
    services, server = live(tmp_path, tiny_model_dir, tiny_server, "server.rate_limit_per_minute=3",
                            "server.timer_rate_limit_per_minute=2", ui=True)
    with server:
        login = httpx.post(server.url + "/login", data={"username": "bob", "password": "b-pass"})
        with httpx.Client(base_url=server.url, cookies=login.cookies, timeout=60) as bob:
            config = bob.get("/config").json()
            timers = {c["id"] for c in config["components"] if c["type"] == "timer"}
            deps = config["dependencies"]
            tick = next(d for d in deps if d["targets"] and all(b in timers for b, _ in d["targets"]))
            click = next(d for d in deps if d["api_visibility"] == "private" and d["trigger_after"] is None
                         and d["targets"] and not any(b in timers for b, _ in d["targets"]))

            def join(dep) -> httpx.Response:
                return bob.post("/gradio_api/queue/join", json={
                    "data": [None] * len(dep["inputs"]), "event_data": None, "fn_index": dep["id"],
                    "trigger_id": dep["targets"][0][0], "session_hash": "s-bob"})

            assert [join(click).status_code != 429 for _ in range(3)] == [True] * 3
            over = join(click)
            assert over.status_code == 429 and int(over.headers["Retry-After"]) >= 1  # a private event counted
            assert bob.get("/api/v1/me", auth=BOB).status_code == 429  # ... in the budget REST shares
            assert [join(tick).status_code != 429 for _ in range(2)] == [True] * 2  # ticks: a budget of their own
            assert join(tick).status_code == 429
        assert httpx.get(server.url + "/api/v1/me", auth=CAROL).status_code == 200  # per user
    services.store.close()
