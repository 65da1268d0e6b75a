"""Issue #33's low findings over REST in process: a blind reply's `created` tells nothing, sign-in is also limited per
name (with a backoff that spares the owner), and the leaderboard is fitted once per vote, off the request thread."""
from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from tests.ui.test_trust import ALICE, BOB, LOCAL, USERS, build, two_versions
from rlhf.analysis import arena as pairing
from ui.throttles import NameBackoff


@pytest.fixture
def team(tmp_path, tiny_model_dir, tiny_server):
    from ui.webapp import create_app

    services = build(tmp_path, tiny_model_dir, tiny_server, f"server.users={USERS}", "server.trusted_proxies=*",
                     "server.login_name_failures=5", "server.login_max_backoff_seconds=60")
    with TestClient(create_app(services, ui=False), base_url=LOCAL) as client:
        yield services, client
    services.store.close()


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory):
    from tests.conftest import make_adapter

    return make_adapter(tiny_model_dir, tmp_path_factory.mktemp("hardening") / "v1", seed=7)


def test_a_blind_reply_shows_its_questions_time_not_its_own(team, adapter_dir):
    services, client = team
    two_versions(services, adapter_dir)
    rnd = client.post("/api/v1/arena", auth=BOB, json={"messages": [{"role": "user", "content": "Which?"}]}).json()
    store = services.store
    for side in ("a", "b"):
        reply = store.get_message(rnd[side]["message_id"])
        asked = store.get_message(reply.parent_id).created
        assert reply.created != asked  # stored after generating: its time would tell the latency
        assert client.get(f"/api/v1/messages/{reply.id}", auth=BOB).json()["created"] == asked
    client.post(f"/api/v1/arena/{rnd['pair_id']}/vote", auth=BOB, json={"winner": "a"}).raise_for_status()
    shown = client.get(f"/api/v1/messages/{rnd['a']['message_id']}", auth=BOB).json()
    assert shown["created"] == store.get_message(rnd["a"]["message_id"]).created  # voted: nothing is hidden


def test_sign_in_is_also_limited_per_name_but_never_locks_the_owner_out(team):
    """72 guesses from 8 addresses used to go through (9 each, under the per-address limit of 10). Now the name's
    count holds every new address back after 5, while alice's own address (she signed in from it before) is spared."""
    services, client = team
    me = lambda address, password: client.get("/api/v1/me", auth=("alice", password),  # noqa: E731
                                               headers={"X-Forwarded-For": address}).status_code
    assert me("10.0.0.100", "a-pass") == 200  # alice, from her usual address
    answers, failed_at = [], []  # (before the request, after its answer) of each wrong guess that was checked
    for i in range(8):
        for n in range(9):
            before = time.monotonic()
            answers.append(me(f"10.9.9.{i}", f"guess-{i}-{n}"))
            if answers[-1] == 401:
                failed_at.append((before, time.monotonic()))
    assert set(answers) == {401, 429} and answers[:5] == [401] * 5  # five wrong guesses, then everyone waits ...
    for k in range(5, len(failed_at)):  # ... and a guess gets through only once the doubling backoff has run out
        assert failed_at[k][1] - failed_at[k - 1][0] >= min(60.0, 2.0 ** (k - 5)), f"guess {k + 1} came too soon"
    assert me("10.0.0.100", "a-pass") == 200  # the owner, from a known address, is not held back
    assert me("10.0.0.100", "a-pass") == 200 and me("10.9.9.50", "b-pass") == 401  # and the count started again


def test_the_name_backoff_doubles_is_capped_and_spares_known_addresses():
    backoff = NameBackoff(free=2, max_wait=8.0, window=600.0)
    assert backoff.attempt("alice", "a", now=0) is None and backoff.attempt("alice", "b", now=0) is None
    waits = []
    t = 0.0
    for _ in range(6):
        wait = backoff.attempt("alice", "c", now=t)
        waits.append(wait)
        t += wait
        assert backoff.attempt("alice", "c", now=t) is None  # after the wait, one more guess
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]  # doubling, never above max_wait
    backoff.succeeded("bob", "home")
    for _ in range(5):
        backoff.attempt("bob", "x", now=t)
    assert backoff.attempt("bob", "y", now=t) is not None and backoff.attempt("bob", "home", now=t) is None
    backoff.succeeded("alice", "c")
    assert backoff.attempt("alice", "z", now=t) is None  # a right password starts the count again
    assert NameBackoff(free=0, max_wait=8, window=600).attempt("alice", "a", now=0) is None  # off


def test_the_leaderboard_is_fitted_once_per_vote_on_its_own_thread(team, adapter_dir, monkeypatch):
    services, client = team
    v0, v1 = two_versions(services, adapter_dir)
    fits, refitted, hold = [], threading.Event(), threading.Event()
    real = pairing.board

    def counted(*args, **kwargs):  # the real fit, recording where it ran (the arena's pairing fit is not counted)
        if kwargs.get("n_boot") != 0:
            if threading.current_thread().name.startswith("leaderboard"):
                hold.wait(60)  # a background fit waits until the test has read the table served meanwhile
            fits.append(threading.current_thread().name)
            refitted.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(services.leaderboards, "_fit", counted)  # this app's fits only (not another test's app's)
    for _ in range(2):
        rnd = client.post("/api/v1/arena", auth=BOB, json={"messages": [{"role": "user", "content": "Pick"}]}).json()
        client.post(f"/api/v1/arena/{rnd['pair_id']}/vote", auth=BOB, json={"winner": "a"}).raise_for_status()
    fits.clear()
    boards = [client.get("/api/v1/leaderboard", auth=BOB).json() for _ in range(10)]
    assert len(fits) == 1  # ten readers, one fit (the first table: nothing to serve before it)
    assert all(b == boards[0] for b in boards) and sum(r["votes"] for r in boards[0]) == 4
    refitted.clear()
    rnd = client.post("/api/v1/arena", auth=BOB, json={"messages": [{"role": "user", "content": "Again"}]}).json()
    client.post(f"/api/v1/arena/{rnd['pair_id']}/vote", auth=BOB, json={"winner": "b"}).raise_for_status()
    # the last table at once (a refit the arena's round queued may already be fitting: it is held until then);
    # the refit runs on the leaderboard's own thread, not on a request thread
    assert sum(r["votes"] for r in client.get("/api/v1/leaderboard", auth=BOB).json()) == 4
    hold.set()
    assert refitted.wait(60) and fits[1].startswith("leaderboard")
    assert services.leaderboards.table("assistant", fresh=True)["votes"].sum() == 6
    client.post("/api/v1/annotators/bob/exclude", auth=ALICE, json={"excluded": True}).raise_for_status()
    assert services.leaderboards.table("assistant", fresh=True)["votes"].sum() == 0
