"""Load: 50 simulated annotators for 60 s against the real app while retrain jobs run (`make load`).

Each annotator loops over the REST API the way a person in the Chat and Arena tabs does: ask, rate the reply
(thumb, score, a note), regenerate, prefer one of the two replies, and every third round judge a blind arena
pair. Meanwhile a trainer keeps a retrain job running (a new one is queued whenever the last ends), so
serving, writes and training compete for the same two cores and the same SQLite file.

Every write the server acknowledged (2xx with an id) is remembered with what was sent. At the end the app is
killed with SIGKILL (no shutdown code runs) and the Store is opened afresh: each acknowledged write must be
there exactly once with the content that was sent. Requests, errors, busy answers and p50/p99 latencies per
endpoint go to BENCHMARKS.md (through `bench.report.report`).

Knobs: RLHF_LOAD_USERS (50), RLHF_LOAD_SECONDS (60).
"""
from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import httpx

from bench.report import report
from bench.serve import percentile
from storage import Store
from tests.e2e.app_process import FAST_RETRAIN, TEST_APP, AppProcess, seed_preferences, wait_until, write_config

USERS = int(os.environ.get("RLHF_LOAD_USERS", "50"))
SECONDS = float(os.environ.get("RLHF_LOAD_SECONDS", "60"))
THINK_S = (0.2, 1.0)  # pause between an annotator's actions: faster than a person, so the test is a stress
# No per-user rate limit here (it is tested on its own); a larger queue than 50 users x 2 arena sides can fill.
LOAD_APP = {"server": {"rate_limit_per_minute": 0}, "serving": {"queue_size": 128, "max_new_tokens": 12}}
# Retrains that last a while on the tiny model, so one is nearly always running.
LOAD_RETRAIN = {"ppo": {"steps": 6}}


@dataclass
class Tally:
    """What the annotators saw and what the server acknowledged (shared by all threads, under a lock)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    latencies: dict = field(default_factory=lambda: defaultdict(list))
    errors: Counter = field(default_factory=Counter)
    busy: Counter = field(default_factory=Counter)
    error_samples: list = field(default_factory=list)
    acked: list = field(default_factory=list)  # (kind, id, expected fields)

    def ack(self, kind: str, row_id: int, **expected) -> None:
        with self.lock:
            self.acked.append((kind, row_id, expected))


class Annotator:
    """One simulated person: a REST client, a name, a random source, and the shared tally."""

    def __init__(self, app: AppProcess, user: int, tally: Tally, stop: threading.Event):
        self.http = app.client(timeout=180)
        self.name = f"load{user:02d}"
        self.user = user
        self.rng = random.Random(user)
        self.tally = tally
        self.stop = stop

    def call(self, endpoint: str, method: str, path: str, body: dict | None = None):
        """One request; busy answers are retried after the server's Retry-After. The JSON on 2xx, else None."""
        while True:
            start = time.perf_counter()
            try:
                resp = self.http.request(method, path, json=body)
            except httpx.HTTPError as exc:
                self.fail(endpoint, f"{type(exc).__name__}: {exc}")
                return None
            with self.tally.lock:
                self.tally.latencies[endpoint].append(time.perf_counter() - start)
            if resp.status_code == 503 and "Retry-After" in resp.headers:
                with self.tally.lock:
                    self.tally.busy[endpoint] += 1
                time.sleep(float(resp.headers["Retry-After"]))
                continue
            if resp.is_success:
                return resp.json()
            self.fail(endpoint, f"{resp.status_code} {resp.text[:200]}")
            return None

    def fail(self, endpoint: str, what: str) -> None:
        with self.tally.lock:
            self.tally.errors[endpoint] += 1
            if len(self.tally.error_samples) < 10:
                self.tally.error_samples.append(f"{self.name} {endpoint}: {what}")

    def think(self) -> None:
        self.stop.wait(self.rng.uniform(*THINK_S))

    def run(self) -> None:
        round_no = 0
        while not self.stop.is_set():
            round_no += 1
            self.chat_round(round_no)
            if round_no % 3 == 0 and not self.stop.is_set():
                self.arena_round(round_no)

    def chat_round(self, n: int) -> None:
        text = f"{self.name} round {n}: {self.rng.choice(['how do I', 'why do we', 'explain how to'])} " \
               f"{self.rng.choice(['boil rice', 'learn chess', 'fix a bike', 'say thanks'])}?"
        reply = self.call("chat", "POST", "/chat", {"messages": [{"role": "user", "content": text}],
                                                    "annotator": self.name, "seed": self.rng.randrange(10**6)})
        if reply is None:
            return
        self.tally.ack("reply", reply["message_id"], user_text=text, conversation_id=reply["conversation_id"])
        self.think()
        note = f"note {self.name}/{n}"
        thumb, score = self.rng.choice([1, -1]), self.rng.randint(1, 5)
        rating = self.call("rate", "POST", "/feedback", {"message_id": reply["message_id"], "thumb": thumb,
                                                         "score": score, "note": note, "annotator": self.name})
        if rating is not None:
            self.tally.ack("rating", rating["id"], message_id=reply["message_id"], thumb=thumb, score=score,
                           note=note)
        self.think()
        other = self.call("regenerate", "POST", f"/messages/{reply['message_id']}/regenerate",
                          {"seed": self.rng.randrange(10**6)})
        if other is None:
            return
        self.tally.ack("alternative", other["message_id"], sibling_of=reply["message_id"])
        self.think()
        winner = self.rng.choice(["a", "b", "tie"])
        vote = self.call("compare", "POST", "/comparisons", {"message_a_id": reply["message_id"],
                                                             "message_b_id": other["message_id"],
                                                             "winner": winner, "annotator": self.name})
        if vote is not None:
            self.tally.ack("comparison", vote["id"], message_a_id=reply["message_id"],
                           message_b_id=other["message_id"], winner=winner)
        self.think()

    def arena_round(self, n: int) -> None:
        pair = self.call("arena", "POST", "/arena", {"messages": [{"role": "user",
                                                                   "content": f"{self.name} arena {n}: hi!"}]})
        if pair is None:
            return
        self.think()
        winner = self.rng.choice(["a", "b", "tie", "both_bad"])
        vote = self.call("arena_vote", "POST", f"/arena/{pair['pair_id']}/vote",
                         {"winner": winner, "annotator": self.name})
        if vote is not None:
            self.tally.ack("arena_vote", vote["comparison_id"], pair_id=pair["pair_id"], winner=winner)
        self.think()


def keep_training(app: AppProcess, stop: threading.Event, job_ids: list) -> None:
    """Queue a retrain whenever none is queued or running, until ``stop``."""
    admin = app.client(timeout=60)
    while not stop.is_set():
        jobs = admin.get("/jobs", params={"limit": 5}).json()
        if not any(j["kind"] == "retrain" and j["status"] in ("queued", "running") for j in jobs):
            resp = admin.post("/train", json={"config": LOAD_RETRAIN})
            if resp.is_success:
                job_ids.append(resp.json()["job_id"])
        stop.wait(1.0)


def verify(store: Store, acked: list) -> dict:
    """Each acknowledged write present once with what was sent: counts of lost and duplicated writes."""
    rows = store.feedback_rows("assistant")
    messages = {m["id"]: m for m in rows["messages"]}
    ratings = {r["id"]: r for r in rows["ratings"]}
    comparisons = {c["id"]: c for c in rows["comparisons"]}
    user_texts = Counter(m["content"] for m in rows["messages"] if m["role"] == "user")
    notes = Counter(r["note"] for r in rows["ratings"])
    pairs = Counter(c["pair_id"] for c in rows["comparisons"] if c["pair_id"])
    lost, duplicated = [], []
    for kind, row_id, want in acked:
        if kind == "reply":
            m = messages.get(row_id)
            parent = messages.get(m["parent_id"]) if m else None
            ok = bool(m and m["role"] == "assistant" and parent and parent["content"] == want["user_text"]
                      and m["conversation_id"] == want["conversation_id"])
            dup = user_texts[want["user_text"]] != 1
        elif kind == "alternative":
            m, first = messages.get(row_id), messages.get(want["sibling_of"])
            ok = bool(m and first and m["parent_id"] == first["parent_id"] and m["role"] == "assistant")
            dup = False
        elif kind == "rating":
            r = ratings.get(row_id)
            ok = bool(r and (r["message_id"], r["thumb"], r["score"], r["note"])
                      == (want["message_id"], want["thumb"], want["score"], want["note"]))
            dup = notes[want["note"]] != 1
        elif kind == "comparison":
            c = comparisons.get(row_id)
            ok = bool(c and (c["message_a_id"], c["message_b_id"], c["winner"])
                      == (want["message_a_id"], want["message_b_id"], want["winner"]))
            dup = False
        else:  # arena_vote
            c = comparisons.get(row_id)
            ok = bool(c and c["pair_id"] == want["pair_id"] and c["winner"] == want["winner"])
            dup = pairs[want["pair_id"]] != 1
        if not ok:
            lost.append((kind, row_id))
        if dup:
            duplicated.append((kind, row_id))
    comparison_keys = Counter((c["message_a_id"], c["message_b_id"], c["annotator"]) for c in rows["comparisons"]
                              if not c["pair_id"])
    duplicated += [("comparison", key) for key, count in comparison_keys.items() if count > 1]
    return {"lost": lost, "duplicated": duplicated}


def tabulate(tally, elapsed: float, outcome: dict, jobs: list, versions: int) -> tuple[list, dict]:
    """The load run's table (latency per endpoint) and its figures."""
    rows, all_latencies = [], []
    for endpoint in ("chat", "rate", "regenerate", "compare", "arena", "arena_vote"):
        lat = tally.latencies.get(endpoint, [])
        all_latencies += lat
        rows.append({"endpoint": endpoint, "requests": len(lat), "errors": tally.errors[endpoint],
                     "busy_retried": tally.busy[endpoint], "p50_ms": percentile(lat, 50) * 1000 if lat else 0.0,
                     "p99_ms": percentile(lat, 99) * 1000 if lat else 0.0})
    requests = sum(r["requests"] for r in rows)
    figures = {"annotators": USERS, "seconds": round(elapsed, 1), "requests": requests,
               "requests_per_s": round(requests / elapsed, 1), "errors": sum(tally.errors.values()),
               "busy_retried": sum(tally.busy.values()), "p50_ms": round(percentile(all_latencies, 50) * 1000, 1),
               "p99_ms": round(percentile(all_latencies, 99) * 1000, 1), "acknowledged_writes": len(tally.acked),
               "lost_writes": len(outcome["lost"]), "duplicate_writes": len(outcome["duplicated"]),
               "retrain_jobs": len(jobs), "retrain_succeeded": sum(j.status == "succeeded" for j in jobs),
               "versions_after": versions}
    return rows, figures


def test_fifty_annotators_while_retraining(tmp_path, tiny_model_dir):
    data = tmp_path / "data"
    store = Store(data / "studio.db")
    store.ensure_default_agent(str(tiny_model_dir))
    store.close()
    config = write_config(tmp_path / "load.yaml", TEST_APP, FAST_RETRAIN, LOAD_APP)
    tally, stop, job_ids = Tally(), threading.Event(), []
    app = AppProcess(data, tiny_model_dir, config).start()
    try:
        seed_preferences(app.client(), 6)
        trainer = threading.Thread(target=keep_training, args=(app, stop, job_ids), daemon=True)
        trainer.start()
        watcher = Store(data / "studio.db")
        # the arena needs two versions: the first retrain publishes the second before anyone asks for a pair
        # (replies take tens of ms now, so a person's third round came before it); the next retrain then runs
        wait_until(lambda: len(watcher.list_policies("assistant")) >= 2, 300, "the first retrain to publish")
        wait_until(lambda: any(j.status == "running" for j in watcher.list_jobs("assistant", 1)), 120,
                   "the next retrain job to start")
        watcher.close()
        people = [threading.Thread(target=Annotator(app, u, tally, stop).run, daemon=True) for u in range(USERS)]
        started = time.monotonic()
        for t in people:
            t.start()
        stop.wait(SECONDS)
        stop.set()
        for t in people:
            t.join(300)
        elapsed = time.monotonic() - started
        trainer.join(60)
        health = httpx.get(app.api + "/health", timeout=30).status_code
    finally:
        app.kill()  # a crash, not a shutdown: acknowledged writes must already be durable

    store = Store(data / "studio.db")
    try:
        jobs = [store.get_job(j) for j in job_ids]
        outcome = verify(store, tally.acked)
        versions = len(store.list_policies("assistant"))
    finally:
        store.close()

    rows, figures = tabulate(tally, elapsed, outcome, jobs, versions)
    notes = (f"{USERS} annotators x {SECONDS:.0f} s over REST on loopback (tiny model, think time "
             f"{THINK_S[0]}–{THINK_S[1]} s) while retrain jobs ran back to back; then SIGKILL and a fresh Store "
             f"checked every acknowledged write. Job outcomes: {Counter(j.status for j in jobs)}.")
    report("load (make load)", rows, figures, notes)
    assert tally.acked, "no write was acknowledged at all"
    assert not tally.error_samples, "errors under load:\n" + "\n".join(tally.error_samples)
    assert not outcome["lost"], f"acknowledged writes missing from the Store: {outcome['lost'][:10]}"
    assert not outcome["duplicated"], f"writes stored more than once: {outcome['duplicated'][:10]}"
    assert health == 200
    assert jobs and jobs[0].started is not None, "no retrain ran during the load"
    assert not [j for j in jobs if j.status == "failed"], [j.error for j in jobs if j.status == "failed"]
