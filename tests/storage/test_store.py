"""Store: migrations, constraints, feedback semantics, and concurrency from threads and processes."""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import sqlite3
import stat
import threading

import pytest

from storage import Conflict, InvalidInput, NotFound, Store


def chat(store: Store, text="hi", conversation_id=None, agent="assistant"):
    if conversation_id is None:
        conversation_id = store.create_conversation(agent).id
    user = store.append_messages(conversation_id, [{"role": "user", "content": text}])[-1]
    reply = store.record_reply(user.id, f"reply to {text}", store.active_policy(agent).id)
    return user, reply


def test_migrations_apply_once_and_version_is_queryable(tmp_path):
    s = Store(tmp_path / "a.db")
    assert s.schema_version() >= 1
    tables = set(s.db.table_names())
    assert {"annotators", "agents", "policies", "conversations", "messages", "ratings", "comparisons", "jobs",
            "job_metrics"} <= tables
    version = s.schema_version()
    s.close()
    again = Store(tmp_path / "a.db")
    assert again.schema_version() == version
    assert again.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert again.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_default_agent_has_active_base_version(store):
    agent = store.get_agent("assistant")
    policy = store.active_policy(agent.id)
    assert policy.version == 0 and policy.is_base and policy.status == "active"
    assert store.ensure_default_agent("tiny").id == agent.id  # idempotent


def test_foreign_keys_enforced(store):
    with pytest.raises(sqlite3.IntegrityError):
        store.db.execute("INSERT INTO ratings (message_id, thumb, created) VALUES (999, 1, 'now')")


def test_branches_siblings_and_context_keys(store):
    user, first = chat(store, "hello")
    second = store.record_reply(user.id, "another", None)
    assert [m.id for m in store.siblings(first.id)] == [first.id, second.id]
    assert first.context_key == second.context_key
    # a second conversation with the same history has the same context
    other_user, other = chat(store, "hello")
    assert other.context_key == first.context_key
    # continuing goes under the latest message, and the state holds the branch
    follow = store.append_messages(user.conversation_id, [{"role": "user", "content": "more"}])[-1]
    assert follow.parent_id == second.id
    system, history = store.state_for(follow.id)
    assert system == store.get_agent("assistant").system_prompt
    assert history == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "another"},
                       {"role": "user", "content": "more"}]
    assert store.get_message(follow.id).context_key != first.context_key


@pytest.mark.parametrize("messages, problem", [
    ([], "non-empty"),
    ([{"role": "user", "content": ""}], "empty"),
    ([{"role": "user", "content": "   \n"}], "empty"),
    ([{"role": "user", "content": "a\x00b"}], "NUL"),
    ([{"role": "user", "content": "x" * 8001}], "limit"),
    ([{"role": "system", "content": "hi"}], "role"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "last message"),
    ([{"role": "user", "content": 5}], "string"),
    (["hi"], "object"),
])
def test_bad_messages_are_refused_and_store_nothing(store, messages, problem):
    conv = store.create_conversation("assistant")
    with pytest.raises(InvalidInput, match=problem):
        store.append_messages(conv.id, messages)
    assert store.count("messages") == 0


def test_unicode_and_html_are_stored_verbatim(store):
    text = "مرحبا 👋 <script>alert(1)</script>"
    user, _ = chat(store, text)
    assert store.get_message(user.id).content == text


@pytest.mark.parametrize("kwargs, problem", [
    ({"thumb": 0}, "thumb"), ({"thumb": 2}, "thumb"), ({"thumb": True}, "thumb"), ({"thumb": "1"}, "thumb"),
    ({"score": 0}, "score"), ({"score": 6}, "score"), ({"score": math.nan}, "score"), ({"score": math.inf}, "score"),
    ({"score": "five"}, "score"), ({"score": 4.5}, "score"),
    ({"flags": ["Rude"]}, "unknown flags"), ({"flags": "Unsafe"}, "list"),
    ({"note": "x\x00"}, "NUL"), ({"note": "x" * 9000}, "limit"), ({}, "at least one"),
])
def test_bad_ratings_are_refused(store, kwargs, problem):
    _, reply = chat(store)
    with pytest.raises(InvalidInput, match=problem):
        store.record_rating(reply.id, "alice", **kwargs)
    assert store.count("ratings") == 0


def test_rating_unknown_or_user_message(store):
    user, _ = chat(store)
    with pytest.raises(NotFound):
        store.record_rating(12345, thumb=1)
    with pytest.raises(InvalidInput, match="only replies"):
        store.record_rating(user.id, thumb=1)


def test_ratings_are_append_only_and_a_repeat_stores_nothing(store):
    _, reply = chat(store)
    first = store.record_rating(reply.id, "alice", thumb=1)
    assert store.record_rating(reply.id, "alice", thumb=1).id == first.id  # double click
    store.record_rating(reply.id, "alice", score=4, flags=["Inaccurate"], note="too long")
    store.record_rating(reply.id, "alice", thumb=-1)  # a correction is a new row
    store.record_rating(reply.id, "bob", thumb=1)
    assert store.count("ratings") == 4
    assert store.effective_rating(reply.id, "alice") | {"id": 0} == {
        "thumb": -1, "score": 4, "flags": ["Inaccurate"], "note": "too long", "id": 0}
    assert store.effective_rating(reply.id, "nobody") is None


def test_comparisons_validate_context_and_versions(store):
    user, a = chat(store, "q")
    b = store.record_reply(user.id, "alt", store.active_policy("assistant").id)
    _, elsewhere = chat(store, "different question")
    with pytest.raises(InvalidInput, match="different contexts"):
        store.record_comparison(a.id, elsewhere.id, "a")
    with pytest.raises(InvalidInput, match="two different"):
        store.record_comparison(a.id, a.id, "a")
    with pytest.raises(InvalidInput, match="winner"):
        store.record_comparison(a.id, b.id, "c")
    with pytest.raises(InvalidInput, match="only replies"):
        store.record_comparison(user.id, b.id, "a")
    first = store.record_comparison(a.id, b.id, "a", "alice")
    assert store.record_comparison(a.id, b.id, "a", "alice").id == first.id
    assert store.count("comparisons") == 1


def test_votes_on_archived_versions_are_refused(store, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    v1 = store.register_policy_version("assistant", str(adapter), parent_id=1, promote=False)
    conv = store.create_conversation("assistant")
    user = store.append_messages(conv.id, [{"role": "user", "content": "q"}])[-1]
    a = store.record_reply(user.id, "base", 1)
    b = store.record_reply(user.id, "new", v1.id)
    store.archive_policy(v1.id)
    with pytest.raises(Conflict, match="archived"):
        store.record_comparison(a.id, b.id, "b")
    assert store.count("comparisons") == 0


def test_promote_keeps_one_active_version(store, tmp_path):
    (tmp_path / "v1").mkdir()
    v1 = store.register_policy_version("assistant", str(tmp_path / "v1"), parent_id=1, promote=True)
    assert store.active_policy("assistant").id == v1.id
    assert store.get_policy(1).status == "candidate"
    store.promote_policy(1)  # rollback
    assert [p.status for p in store.list_policies("assistant")] == ["active", "candidate"]
    with pytest.raises(Conflict):
        store.archive_policy(1)
    with pytest.raises(InvalidInput, match="does not exist"):
        store.register_policy_version("assistant", str(tmp_path / "missing"), parent_id=1, promote=True)


def test_arena_vote_is_stored_once(store):
    user, a = chat(store)
    b = store.record_reply(user.id, "other", 1)
    pair = store.create_arena_pair("assistant", a.id, b.id)
    first = store.vote_arena_pair(pair.id, "b", "alice")
    second = store.vote_arena_pair(pair.id, "a", "alice")
    assert first.id == second.id and second.winner == "b"
    with pytest.raises(NotFound):
        store.vote_arena_pair("nope", "a")


def test_job_queue_lifecycle(store):
    job = store.enqueue_job("retrain", "assistant", {"x": 1})
    assert store.enqueue_job("retrain", "assistant").id == job.id  # two triggers, one job
    other = store.enqueue_job("export")
    claimed = store.claim_job(pid=42)
    assert claimed.id == job.id and claimed.status == "running"
    assert store.claim_job(pid=43) is None  # one at a time
    assert store.job_progress(job.id, 0.5, "reward") is False
    store.log_metrics(job.id, 1, {"reward/mean": 0.5, "loss/policy": math.nan})
    assert {r["key"]: r["value"] for r in store.job_metrics(job.id)} == {"reward/mean": 0.5, "loss/policy": None}
    store.request_cancel(job.id)
    assert store.job_progress(job.id, 0.6) is True
    store.finish_job(job.id, "cancelled")
    assert store.get_job(job.id).status == "cancelled"
    assert store.request_cancel(other.id).status == "cancelled"  # queued: cancelled at once
    with pytest.raises(Conflict):
        store.request_cancel(other.id)


def test_sweep_marks_dead_running_jobs_failed(store):
    job = store.enqueue_job("retrain", "assistant")
    store.claim_job(pid=99999999)
    swept = store.sweep_stale_jobs(is_alive=lambda pid: False, stale_after_seconds=60)
    assert [j.id for j in swept] == [job.id]
    assert store.get_job(job.id).status == "failed" and "interrupted" in store.get_job(job.id).error


def test_writes_from_many_threads(store):
    _, reply = chat(store)
    errors = []

    def work(i):
        try:
            for j in range(25):
                store.record_rating(reply.id, f"annotator-{i}", score=1 + (j % 5))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.count("ratings") == 16 * 25


def _process_worker(path: str, message_id: int, n: int, out) -> None:
    s = Store(path)
    claimed = 0
    for j in range(n):
        s.record_rating(message_id, f"proc-{mp.current_process().pid}", score=1 + (j % 5))
        if s.claim_job(pid=mp.current_process().pid) is not None:
            claimed += 1
    out.put(claimed)


def test_writes_and_claims_from_two_processes(tmp_path):
    path = str(tmp_path / "shared.db")
    s = Store(path)
    s.ensure_default_agent("tiny")
    _, reply = chat(s)
    for _ in range(3):
        s.enqueue_job(f"kind-{_}")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_process_worker, args=(path, reply.id, 150, out)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert out.get() + out.get() == 1  # one running job at a time: only one claim succeeded
    assert s.count("ratings") == 300


def test_feedback_rows_and_watermarks(store):
    user, a = chat(store, "q")
    b = store.record_reply(user.id, "alt", 1)
    store.record_rating(a.id, "alice", thumb=1, flags=["Unsafe"])
    mark = store.feedback_watermark("assistant")
    store.record_comparison(a.id, b.id, "b", "bob")
    store.set_annotator_excluded("bob", True)
    rows = store.feedback_rows("assistant")
    assert [m["id"] for m in rows["messages"]] == [user.id, a.id, b.id]
    assert rows["ratings"][0]["flags"] == ["Unsafe"] and rows["ratings"][0]["annotator"] == "alice"
    assert rows["comparisons"][0]["winner"] == "b" and rows["excluded_annotators"] == ["bob"]
    assert store.count_feedback_since("assistant", mark) == 1
    assert store.count_feedback_since("assistant", None) == 2
    frozen = store.feedback_rows("assistant", until=mark)
    assert frozen["comparisons"] == [] and len(frozen["ratings"]) == 1


def test_feedback_rows_are_one_moment_while_another_connection_writes(store, monkeypatch):
    """A conversation and its messages written between two of ``feedback_rows``' reads are in neither (the vote
    queue's stats once answered 500: a message whose conversation the first read had not seen)."""
    chat(store, "before")
    writer = Store(store.path)
    reads, read = [], store._all

    def then_write(sql, params=()):
        rows = read(sql, params)
        if not reads:  # after the first read (the conversations), another connection adds a whole exchange
            chat(writer, "during")
        reads.append(sql)
        return rows

    monkeypatch.setattr(store, "_all", then_write)
    rows = store.feedback_rows("assistant")
    monkeypatch.undo()
    writer.close()
    assert len(reads) > 2
    assert [m["content"] for m in rows["messages"]] == ["before", "reply to before"]
    assert {m["conversation_id"] for m in rows["messages"]} <= {c["id"] for c in rows["conversations"]}
    assert len(store.feedback_rows("assistant")["messages"]) == 4  # the next read sees it


# ---- transactions: savepoints and one bounded wait ---------------------------------------------------
def test_a_failed_nested_block_rolls_back_only_its_own_writes(store):
    conversation = store.create_conversation("assistant")
    with store.transaction():
        store.append_messages(conversation.id, [{"role": "user", "content": "kept"}])
        with pytest.raises(RuntimeError):
            with store.transaction():
                store.append_messages(conversation.id, [{"role": "user", "content": "rolled back"}])
                raise RuntimeError("inner failure")
        store.append_messages(conversation.id, [{"role": "user", "content": "also kept"}])
    texts = [m.content for m in store.conversation_messages(conversation.id)]
    assert texts == ["kept", "also kept"]
    assert not store.db.conn.in_transaction


def test_an_outer_failure_rolls_back_the_nested_writes_too(store):
    conversation = store.create_conversation("assistant")
    with pytest.raises(RuntimeError):
        with store.transaction():
            with store.transaction():
                store.append_messages(conversation.id, [{"role": "user", "content": "inner"}])
            raise RuntimeError("outer failure")
    assert store.conversation_messages(conversation.id) == []


def test_a_writer_waits_once_then_gets_a_clear_busy_error(tmp_path):
    from storage import StoreBusy

    Store(tmp_path / "s.db").close()
    holder = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    store = Store.__new__(Store)
    try:
        store = Store(tmp_path / "s.db", busy_timeout_s=0.2)
    except StoreBusy:
        pass  # the lock can already refuse the migrations check: the same clear error
    else:
        with pytest.raises(StoreBusy) as caught:
            store.create_agent("writer", "hi", "tiny")
        assert caught.value.status == 503 and caught.value.retry_after >= 1
        assert "busy" in str(caught.value)
    holder.execute("ROLLBACK")
    writer = Store(tmp_path / "s.db", busy_timeout_s=0.2)
    assert writer.create_agent("writer", "hi", "tiny").name == "writer"  # free again: the write goes through


def test_the_data_dir_and_database_are_owner_only(tmp_path):
    """Issue #33: studio.db and its folder were world-readable (0644/0755); an existing data dir is tightened too."""
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o755)
    store = Store(data / "studio.db")
    store.ensure_default_agent("tiny")  # a write: the WAL files exist now
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(data) == 0o700
    files = [data / "studio.db", data / "studio.db-wal", data / "studio.db-shm"]
    assert all(p.exists() and mode(p) == 0o600 for p in files), {p.name: oct(mode(p)) for p in files if p.exists()}
    store.close()
    os.chmod(data / "studio.db", 0o644)
    Store(data / "studio.db").close()
    assert mode(data / "studio.db") == 0o600


def test_a_job_remembers_when_its_progress_last_moved(store):
    job = store.enqueue_job("selftest", "assistant", {})
    store.claim_job(pid=1)
    store.job_progress(job.id, 0.4)
    moved = store.get_job(job.id).progressed
    assert moved is not None
    store.job_progress(job.id, 0.4, message="still at 40 %")  # a heartbeat with the same progress
    store.job_progress(job.id, None, phase="eval")
    assert store.get_job(job.id).progressed == moved
    store.job_progress(job.id, 0.5)
    after = store.get_job(job.id)
    assert after.progressed >= moved and after.progress == 0.5
