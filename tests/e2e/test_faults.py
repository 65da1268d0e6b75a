"""Faults on the real app process (`python app.py`, tiny model, fast retrain settings).

kill -9 during a retrain and just before a publish's rename, corrupted or missing adapters, a read-only
or full data directory, 128 concurrent votes racing on the same pairs. After each: the app starts, serves
what is intact, answers clearly, and every acknowledged write is in the Store exactly once.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest

from rlhf.config import load_config
from rlhf.retrain.publish import policies_root, publish_version
from storage import Store
from tests.conftest import make_adapter
from tests.e2e.app_process import (FAST_RETRAIN, TEST_APP, AppProcess, pid_alive, seed_preferences, wait_until,
                                   write_config)

FEEDBACK = ("conversations", "messages", "ratings", "comparisons", "arena_pairs", "annotators")


def open_store(data: Path, base_model) -> Store:
    """The data dir's Store from the test process (the app shares the SQLite file), default agent in place."""
    store = Store(data / "studio.db")
    store.ensure_default_agent(str(base_model))
    return store


def add_version(store: Store, data: Path, adapter: str, agent: str = "assistant", promote: bool = False):
    """Publish a LoRA adapter as the agent's next version, the way a retrain does (temp dir + rename + row)."""
    config = load_config(env={}, overrides=[f"data_dir={data}"])
    parent = store.active_policy(agent)
    return publish_version(store, config, agent, adapter, parent_id=parent.id, promote=promote)


def rows(store: Store) -> dict:
    return {t: store.count(t) for t in FEEDBACK}


def versions(store: Store) -> list[tuple]:
    return [(p.id, p.version, p.status) for p in store.list_policies()]


def on_disk(data: Path) -> list[str]:
    """Every entry under policies/<agent>/ (version dirs and any temp dir a publish left)."""
    root = data / "policies"
    return sorted(str(p.relative_to(root)) for p in root.glob("*/*")) if root.is_dir() else []


def ask(http: httpx.Client, **extra) -> httpx.Response:
    return http.post("/chat", json={"messages": [{"role": "user", "content": "still there?"}], "max_new_tokens": 4,
                                    **extra})


def wait_job(store: Store, job_id: int, what: str, check, timeout: float = 300):
    return wait_until(lambda: (lambda j: j if check(j) else None)(store.get_job(job_id)), timeout, what)


# ---- kill -9 during a retrain ------------------------------------------------------------------------------
def test_kill_9_during_a_retrain_fails_the_job_and_loses_nothing(tmp_path, tiny_model_dir):
    data = tmp_path / "data"
    config = write_config(tmp_path / "app.yaml", TEST_APP, FAST_RETRAIN, {"ppo": {"steps": 40}})  # long enough
    store = open_store(data, tiny_model_dir)
    v1 = add_version(store, data, make_adapter(tiny_model_dir, tmp_path / "v1", seed=51), promote=True)
    app = AppProcess(data, tiny_model_dir, config).start()
    try:
        seed_preferences(app.client(), 10)
        before, listed, dirs = rows(store), versions(store), on_disk(data)
        job_id = app.client().post("/train", json={}).json()["job_id"]
        job = wait_job(store, job_id, "the retrain to be running its PPO phase",
                       lambda j: j.status == "running" and j.phase == "ppo" and j.pid != app.pid)
        app.kill()
        # The job process notices its app is gone within a heartbeat and exits: no orphan keeps training.
        wait_until(lambda: not pid_alive(job.pid), 60, f"job process {job.pid} to exit after the app died")
    finally:
        app.kill()
    assert on_disk(data) == dirs  # no partial version directory
    with AppProcess(data, tiny_model_dir, config) as again:
        http = again.client()
        swept = http.get(f"/jobs/{job_id}").json()
        assert swept["status"] == "failed" and "interrupted" in swept["error"], swept
        assert rows(store) == before and versions(store) == listed
        assert [(p["id"], p["version"], p["status"]) for p in http.get("/policies").json()] == listed
        reply = ask(http)
        assert reply.status_code == 200 and reply.json()["policy_id"] == v1.id  # the previous active version
    assert on_disk(data) == dirs
    store.close()


# ---- kill -9 during a publish, before the rename -----------------------------------------------------------
FREEZE = '''"""Test-only fault injection (tests/e2e/test_faults.py): freeze a publish just before its rename."""
import os
import pathlib
import time

_marker = os.environ.get("STUDIO_TEST_FREEZE_PUBLISH")
if _marker:
    _rename = os.rename

    def _frozen(src, dst, *args, **kwargs):
        name = os.path.basename(str(src))
        if name.startswith(".job") and ".tmp-" in name:  # rlhf.files.atomic_dir's temp name of a version dir
            pathlib.Path(_marker).write_text(str(src))
            while True:  # until the app is killed: the job's heartbeat thread then ends the process
                time.sleep(0.2)
        return _rename(src, dst, *args, **kwargs)

    os.rename = _frozen
'''


def test_kill_during_a_publish_before_the_rename_leaves_no_version(tmp_path, tiny_model_dir):
    data, hook, marker = tmp_path / "data", tmp_path / "hook", tmp_path / "frozen-at"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FREEZE)  # imported at start by the app and its job processes
    config = write_config(tmp_path / "app.yaml", TEST_APP, FAST_RETRAIN)
    store = open_store(data, tiny_model_dir)
    env = {"PYTHONPATH": str(hook), "STUDIO_TEST_FREEZE_PUBLISH": str(marker)}
    app = AppProcess(data, tiny_model_dir, config, env=env).start()
    try:
        seed_preferences(app.client(), 10)
        before, listed = rows(store), versions(store)
        job_id = app.client().post("/train", json={}).json()["job_id"]
        wait_until(marker.exists, 300, "the publish to reach its rename")
        temp = Path(marker.read_text())
        assert temp.parent == policies_root(load_config(env={}, overrides=[f"data_dir={data}"])) / "assistant"
        assert (temp / "adapter_config.json").is_file()  # copied, not yet renamed
        job = store.get_job(job_id)
        assert job.status == "running" and job.phase == "publish" and versions(store) == listed
        app.kill()
        wait_until(lambda: not pid_alive(job.pid), 60, f"job process {job.pid} to exit after the app died")
    finally:
        app.kill()
    assert temp.is_dir()  # what the crash left behind
    with AppProcess(data, tiny_model_dir, config) as again:  # no hook this time
        assert not temp.exists() and on_disk(data) == []  # cleaned at start
        http = again.client()
        swept = http.get(f"/jobs/{job_id}").json()
        assert swept["status"] == "failed" and "interrupted" in swept["error"]
        assert versions(store) == listed and rows(store) == before  # no version row, no feedback lost
        assert ask(http).json()["policy_id"] == store.active_policy("assistant").id == listed[0][0]
    store.close()


# ---- corrupted and missing adapters; concurrent votes (one app) --------------------------------------------
@pytest.fixture(scope="module")
def versions_app(tmp_path_factory, tiny_model_dir):
    """An app whose default agent has good, missing, corrupt and truncated adapters, plus an 'arena' agent
    with two healthy versions (for the vote race)."""
    root = tmp_path_factory.mktemp("versions")
    data = root / "data"
    store = open_store(data, tiny_model_dir)
    adapter = lambda name, seed: make_adapter(tiny_model_dir, root / name, seed=seed)  # noqa: E731
    good = add_version(store, data, adapter("good", 61), promote=True)
    other = add_version(store, data, adapter("other", 62))
    missing = add_version(store, data, adapter("missing", 63))
    garbled = add_version(store, data, adapter("garbled", 64))
    weightless = add_version(store, data, adapter("weightless", 65))
    truncated = add_version(store, data, adapter("truncated", 66))
    shutil.rmtree(missing.adapter_path)
    (Path(garbled.adapter_path) / "adapter_config.json").write_text('{"r": 8, "target_mod')
    for f in Path(weightless.adapter_path).glob("adapter_model.*"):
        f.unlink()
    weights = next(Path(truncated.adapter_path).glob("adapter_model.*"))
    weights.write_bytes(weights.read_bytes()[:100])  # passes the start check, fails to load
    store.create_agent("arena", "You are terse.", str(tiny_model_dir), generation={"max_new_tokens": 6})
    add_version(store, data, adapter("arena-v1", 67), agent="arena")
    config = write_config(root / "app.yaml", TEST_APP)
    with AppProcess(data, tiny_model_dir, config) as app:
        yield {"app": app, "store": store, "good": good, "other": other, "missing": missing, "garbled": garbled,
               "weightless": weightless, "truncated": truncated}
    store.close()


def test_broken_adapters_are_marked_with_a_reason_and_the_others_are_served(versions_app):
    w, http = versions_app, versions_app["app"].client()
    listed = {p["id"]: p for p in http.get("/policies", params={"agent": "assistant"}).json()}
    assert listed[w["missing"].id]["status"] == "broken" and "missing" in listed[w["missing"].id]["error"]
    assert listed[w["garbled"].id]["status"] == "broken" and "unreadable" in listed[w["garbled"].id]["error"]
    assert listed[w["weightless"].id]["status"] == "broken" and "weights missing" in listed[w["weightless"].id]["error"]
    assert listed[w["good"].id]["status"] == "active" and listed[w["other"].id]["status"] == "candidate"
    for policy in (None, w["good"].id, w["other"].id, 1):  # the active default, both healthy versions, the base
        reply = ask(http, **({"policy_id": policy} if policy else {}))
        assert reply.status_code == 200, reply.text
        assert reply.json()["policy_id"] == (policy or w["good"].id)
    refused = ask(http, policy_id=w["missing"].id)
    assert refused.status_code == 409 and "broken" in refused.json()["error"]
    # A corruption only loading finds, in the middle of a conversation: refused with the reason, marked broken,
    # and the same turn then goes through on a healthy version (the refused turn does not block it).
    store, turn = w["store"], [{"role": "user", "content": "and then?"}]
    first = ask(http).json()
    refused = http.post("/chat", json={"conversation_id": first["conversation_id"], "messages": turn,
                                       "policy_id": w["truncated"].id, "max_new_tokens": 4})
    assert refused.status_code == 409 and "marked broken" in refused.json()["error"], refused.text
    truncated = store.get_policy(w["truncated"].id)
    assert truncated.status == "broken" and "cannot be loaded" in truncated.error
    assert not [m for m in store.feedback_rows("assistant")["messages"] if m["policy_id"] == truncated.id]
    retry = http.post("/chat", json={"conversation_id": first["conversation_id"], "messages": turn,
                                     "max_new_tokens": 4})
    assert retry.status_code == 200 and retry.json()["policy_id"] == w["good"].id, retry.text
    history = store.state_for(retry.json()["message_id"])[1]
    assert [m["content"] for m in history] == ["still there?", first["content"], "and then?", retry.json()["content"]]
    assert http.get("/health").status_code == 200


def test_128_concurrent_votes_race_on_the_same_pairs_and_each_is_stored_once(versions_app):
    store, http = versions_app["store"], versions_app["app"].client()
    arena_pairs = []
    for i in range(16):  # 16 blind rounds between the two healthy versions of the arena agent
        r = http.post("/arena", json={"agent": "arena", "messages": [{"role": "user", "content": f"round {i}"}]})
        assert r.status_code == 200, r.text
        arena_pairs.append(r.json())
    sibling_pairs = []
    for i in range(8):  # 8 reply + regeneration pairs outside the arena
        first = http.post("/chat", json={"agent": "arena", "messages": [{"role": "user", "content": f"pick {i}"}]})
        second = http.post(f"/messages/{first.json()['message_id']}/regenerate", json={"seed": i})
        sibling_pairs.append((first.json()["message_id"], second.json()["message_id"]))
    before = store.count("comparisons")
    # 64 arena votes (4 annotators disagreeing on each pair) + 64 comparisons (4 annotators, each sending twice).
    calls = [("arena", p["pair_id"], winner, f"voter{k}") for p in arena_pairs
             for k, winner in enumerate(("a", "b", "tie", "both_bad"))]
    calls += [("compare", pair, winner, f"voter{k}") for pair in sibling_pairs
              for k, winner in enumerate(("a", "b", "a", "tie")) for _ in range(2)]
    assert len(calls) == 128
    results: list = [None] * len(calls)
    start = threading.Barrier(len(calls))
    pool = httpx.Client(base_url=versions_app["app"].api, timeout=120,
                        limits=httpx.Limits(max_connections=256, max_keepalive_connections=256))

    def cast(i: int) -> None:
        kind, target, winner, who = calls[i]
        start.wait()
        if kind == "arena":
            r = pool.post(f"/arena/{target}/vote", json={"winner": winner, "annotator": who})
        else:
            r = pool.post("/comparisons", json={"message_a_id": target[0], "message_b_id": target[1],
                                                "winner": winner, "annotator": who})
        results[i] = (r.status_code, r.text, r.json() if r.status_code == 200 else None)

    threads = [threading.Thread(target=cast, args=(i,)) for i in range(len(calls))]
    [t.start() for t in threads]
    [t.join(300) for t in threads]
    pool.close()
    failures = [(calls[i], res) for i, res in enumerate(results) if res is None or res[0] != 200]
    assert not failures, failures[:5]  # every vote acknowledged; none saw "database is locked"
    assert not any("locked" in res[1] for res in results)
    acked = Counter()
    for (kind, target, winner, who), (_, _, body) in zip(calls, results):
        acked[(kind, str(target), who if kind == "compare" else None,
               body["comparison_id"] if kind == "arena" else body["id"])] += 1
    # Racing votes on one arena pair all get its single stored vote; a repeated comparison gets the same row.
    by_pair = Counter((kind, target) for kind, target, _, _ in acked)
    assert all(n == 1 for (kind, _), n in by_pair.items() if kind == "arena")
    stored = {c.id: c for c in store.list_comparisons("arena")}
    ids = {key[3] for key in acked}
    assert ids <= set(stored) and store.count("comparisons") - before == len(ids) == 16 + 8 * 4
    for p in arena_pairs:
        vote = store.arena_vote(p["pair_id"])
        assert vote is not None and vote.winner in ("a", "b", "tie", "both_bad")
    assert http.get("/health").status_code == 200


# ---- a read-only or full data directory --------------------------------------------------------------------
def tmpfs(path: Path, size: str) -> Path:
    """A small tmpfs mounted at ``path`` (skips the test where mounting is not permitted)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); needs root and "
                    "CAP_SYS_ADMIN")
    return path


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount_read_only(path: Path) -> None:
    done = subprocess.run(["mount", "-o", "remount,ro", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def snapshot_files(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_read_only_data_dir_is_a_clear_error_at_start(tmp_path, tiny_model_dir):
    mount = tmpfs(tmp_path / "ro", "8m")
    try:
        store = open_store(mount / "data", tiny_model_dir)  # an existing Store with some feedback
        conv = store.create_conversation("assistant", "ann", messages=[{"role": "user", "content": "keep me"}])
        reply = store.record_reply(store.leaf(conv.id).id, "kept", 1)
        store.record_rating(reply.id, "ann", thumb=1, note="precious")
        store.close()
        (mount / "fresh").mkdir()
        remount_read_only(mount)
        files = snapshot_files(mount)
        for data in (mount / "data", mount / "fresh" / "data"):  # existing data, and a first start
            app = AppProcess(data, tiny_model_dir, write_config(tmp_path / "app.yaml", TEST_APP),
                             log_file=tmp_path / f"{data.parent.name}.log")
            app.launch()
            assert app.wait_exit(180) != 0
            out = app.output()
            assert "StorageUnavailable" in out and str(data) in out, out[-2000:]
            assert "read-only" in out.lower() or "Read-only" in out
        assert snapshot_files(mount) == files  # nothing half-written
    finally:
        umount(mount)


def test_full_data_dir_refuses_writes_clearly_and_recovers(tmp_path, tiny_model_dir):
    mount = tmpfs(tmp_path / "small", "3m")
    try:
        with AppProcess(mount / "data", tiny_model_dir, write_config(tmp_path / "app.yaml", TEST_APP),
                        log_file=tmp_path / "app.log") as app:
            http = app.client()
            first = ask(http).json()
            store = Store(mount / "data" / "studio.db")
            filler = mount / "filler"
            with open(filler, "wb") as f:  # fill the disk to the last byte
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            acked, refused = [], []
            for i in range(200):  # SQLite may still have room in its WAL: write until it runs out
                r = http.post("/feedback", json={"message_id": first["message_id"], "note": f"{i} " + "n" * 7000,
                                                 "annotator": f"ann{i}"})
                (acked if r.status_code == 200 else refused).append(r)
                if refused:
                    break
            assert refused, "the disk never filled up"
            assert refused[0].status_code == 503 and "full" in refused[0].json()["error"], refused[0].text
            before = rows(store)
            for call in (lambda: ask(http),
                         lambda: http.post("/feedback", json={"message_id": first["message_id"], "thumb": -1}),
                         lambda: http.post(f"/messages/{first['message_id']}/regenerate", json={})):
                r = call()
                assert r.status_code == 503 and "full" in r.json()["error"], r.text
            assert rows(store) == before  # nothing half-written (no conversation without its message...)
            assert http.get("/health").status_code == 200
            assert http.get(f"/messages/{first['message_id']}").status_code == 200  # reads still work
            os.remove(filler)
            after = http.post("/feedback", json={"message_id": first["message_id"], "thumb": 1, "annotator": "z"})
            assert after.status_code == 200
            # every acknowledged write is there exactly once, the refused ones are not
            stored = [r.id for r in store.ratings_for(first["message_id"])]
            assert stored == [r.json()["id"] for r in acked] + [after.json()["id"]]
            store.close()
    finally:
        umount(mount)
