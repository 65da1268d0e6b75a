"""Job lifecycle in real OS processes: success, failure, cancel (cooperative and forced), crash, sweep."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from rlhf.config import AppConfig
from rlhf.jobs.kinds import job_kinds
from rlhf.jobs.runner import JobRunner
from rlhf.registry import JOB_KINDS
from rlhf.plugins import code_settings
from rlhf.jobs.scheduler import StudioScheduler
from tests.support.job_kinds import with_selftest

pytestmark = pytest.mark.slow  # trains or starts processes: not in `make test-fast`


@pytest.fixture
def app_config(app_config):
    """The test config, whose job processes can run the selftest kind (it does not ship with the app)."""
    return with_selftest(app_config)


@pytest.fixture
def sched(app_config, store):
    s = StudioScheduler(store, app_config, JobRunner(store, app_config, cancel_grace=1.0))
    yield s
    s.shutdown()


def selftest(sched, **opts):
    return sched.enqueue("selftest", "assistant", selftest=opts)


def wait_status(store, job_id, statuses, timeout=60, runner=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if runner:
            runner.tick()
        job = store.get_job(job_id)
        if job.status in statuses:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} still {store.get_job(job_id).status}")


def test_job_succeeds_in_its_own_process_with_metrics(sched, store):
    job = selftest(sched, steps=3)
    assert job.status == "queued" and job.config["app"]["base_model"]  # full config stored with the job
    done = sched.runner.wait(job.id, timeout=60)
    assert done.status == "succeeded" and done.progress == 1.0 and done.result == {"steps": 3}
    assert done.pid and done.pid != os.getpid()
    assert [r["value"] for r in store.job_metrics(job.id)] == [1.5, 3.0, 4.5]
    assert any("started" in line["line"] for line in store.job_log_tail(job.id))


def test_failing_job_is_recorded_with_its_reason(sched, store):
    job = selftest(sched, steps=3, fail_at=2)
    done = sched.runner.wait(job.id, timeout=60)
    assert done.status == "failed" and "asked to fail at step 2" in done.error


def test_only_one_job_runs_and_the_next_waits(sched, store):
    first, second = selftest(sched, steps=20, sleep=0.1), sched.enqueue("selftest", None, selftest={"steps": 1})
    sched.runner.tick()
    wait_status(store, first.id, {"running"})
    sched.runner.tick()
    assert store.get_job(second.id).status == "queued"
    sched.runner.wait(first.id, timeout=60)
    assert sched.runner.wait(second.id, timeout=60).status == "succeeded"


def test_cooperative_cancel(sched, store):
    job = selftest(sched, steps=200, sleep=0.1)
    sched.runner.tick()
    wait_status(store, job.id, {"running"}, runner=sched.runner)
    while store.get_job(job.id).progress == 0:
        time.sleep(0.1)
    store.request_cancel(job.id)
    done = wait_status(store, job.id, {"cancelled", "failed", "succeeded"}, timeout=20, runner=sched.runner)
    assert done.status == "cancelled"


def test_a_job_that_ignores_cancel_is_killed(sched, store):
    job = selftest(sched, steps=1, hang=True)
    sched.runner.tick()
    wait_status(store, job.id, {"running"}, runner=sched.runner)
    while store.get_job(job.id).progress < 1:  # now inside the loop that ignores cancels
        time.sleep(0.1)
    store.request_cancel(job.id)
    done = wait_status(store, job.id, {"cancelled"}, timeout=20, runner=sched.runner)
    assert "killed" in done.error
    assert not _alive(done.pid)


def _alive(pid):
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def test_kill_9_of_the_job_process_marks_it_failed_and_loses_no_feedback(sched, store):
    conv = store.create_conversation("assistant", messages=[{"role": "user", "content": "keep me"}])
    reply = store.record_reply(store.leaf(conv.id).id, "kept", 1)
    store.record_rating(reply.id, "alice", thumb=1)
    before = {t: store.count(t) for t in ("messages", "ratings", "policies")}
    job = selftest(sched, steps=1, hang=True)
    sched.runner.tick()
    running = wait_status(store, job.id, {"running"}, runner=sched.runner)
    while store.get_job(job.id).progress < 1:
        time.sleep(0.1)
    os.kill(running.pid, signal.SIGKILL)
    done = wait_status(store, job.id, {"failed"}, timeout=20, runner=sched.runner)
    assert "exited with code -9" in done.error
    assert {t: store.count(t) for t in ("messages", "ratings", "policies")} == before


def test_restart_sweeps_jobs_of_dead_processes(app_config, store):
    job = store.enqueue_job("selftest", "assistant", {})
    store.claim_job(pid=2**22 + 12345)  # a pid that does not exist
    swept = JobRunner(store, app_config).sweep()
    assert [j.id for j in swept] == [job.id] and store.get_job(job.id).status == "failed"


def test_two_triggers_at_once_give_one_job(sched, store):
    ids = []
    threads = [threading.Thread(target=lambda: ids.append(selftest(sched).id)) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(set(ids)) == 1 and store.count("jobs") == 1


def test_scheduler_drains_the_queue_by_itself(app_config, store):
    s = StudioScheduler(store, app_config)
    s.start()
    try:
        job = s.enqueue("selftest", "assistant", selftest={"steps": 1})
        done = wait_status(store, job.id, {"succeeded", "failed"}, timeout=60)
        assert done.status == "succeeded"
    finally:
        s.shutdown()


def test_job_process_gets_its_thread_budget_and_serving_gets_the_cores_back(sched, store, app_config):
    from rlhf.cpu import THREAD_VARIABLES, thread_plan
    from rlhf.jobs.runner import worker_env

    plan = thread_plan(app_config)
    env, threads = worker_env(app_config, {"PYTHONPATH": "/x", "OMP_NUM_THREADS": "64"}, "/root")
    assert threads == plan.job and env["PYTHONPATH"] == "/root" + os.pathsep + "/x"
    assert all(env[k] == str(plan.job) for k in THREAD_VARIABLES)

    budget = sched.runner.budget
    assert budget.job_threads == 0 and budget.serving_threads() == plan.serving_idle
    job = selftest(sched, steps=10, sleep=0.2)
    sched.runner.tick()
    budget.serving_load(True)  # someone chats: the job keeps to its share
    assert budget.job_threads == plan.job and budget.serving_threads() == plan.serving_busy
    sched.runner.wait(job.id, timeout=60)
    deadline = time.time() + 30
    while sched.runner.tick() is not None and time.time() < deadline:  # until the process has exited
        time.sleep(0.1)
    assert budget.job_threads == 0 and budget.serving_threads() == plan.serving_idle
    log = "\n".join(r["line"] for r in store.job_log_tail(job.id, 50))
    assert f"OMP_NUM_THREADS={plan.job}" in log and f"MKL_NUM_THREADS={plan.job}" in log
    nice = min(19, os.nice(0) + plan.job_nice)  # the job's niceness on top of this process's own (CI may nice it)
    assert f"CPU budget: {plan.job} torch thread(s), nice {nice}" in log  # read inside the job process


def test_a_job_queued_before_its_data_dir_moved_writes_where_the_store_is_now(tmp_path, app_config):
    """A restored or moved data dir: the job's stored config still names the old data dir."""
    from rlhf.config import apply_overrides
    from rlhf.jobs.worker import run_job
    from storage import Store

    store = Store(tmp_path / "moved" / "studio.db")
    store.ensure_default_agent("tiny")
    old = apply_overrides(app_config, {"data_dir": str(tmp_path / "original")})
    job = store.enqueue_job("whereami", "assistant", {"app": old.to_dict()})
    store.claim_job(os.getpid())
    done = run_job(store, job.id, code_settings(app_config))
    assert done.status == "succeeded" and done.result["data_dir"] == str(tmp_path / "moved")
    store.close()


def test_job_kinds_are_a_table_of_import_paths_loaded_when_a_job_runs():
    import subprocess
    import sys

    code = ("import sys, rlhf.jobs.worker, rlhf.jobs.kinds as k; print(sorted(k.job_kinds({})), "
            "'rlhf.retrain.pipeline' in sys.modules, k.job_kind('retrain', {}).__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[3])).stdout.strip()
    assert out == "['eval_samples', 'prepare_base', 'retrain'] False rlhf.retrain.pipeline"  # what ships; a test's: its config
    assert job_kinds({"retrain": "tests.support.job_kinds:selftest", "x": "m:f"})["retrain"] == JOB_KINDS["retrain"]


def test_a_kind_named_in_the_config_is_imported_by_the_job_that_runs_it(tmp_path, app_config):
    from rlhf.config import apply_overrides
    from rlhf.jobs.kinds import job_kind
    from rlhf.jobs.worker import run_job
    from storage import Store

    store = Store(tmp_path / "data" / "studio.db")
    store.ensure_default_agent("tiny")
    wrong = apply_overrides(app_config, {"scheduler.job_kinds": {"selftest": "tests.support.job_kinds:nothing"}})
    for cfg, status, error in ((wrong, "failed", "scheduler.job_kinds.selftest: 'tests.support.job_kinds' has no "
                                "attribute 'nothing'"), (app_config, "succeeded", None)):
        job = store.enqueue_job("selftest", "assistant", {"app": AppConfig().to_dict(), "selftest": {"steps": 1}})
        store.claim_job(os.getpid())
        done = run_job(store, job.id, code_settings(cfg))  # the app's config decides, not the job's saved one
        assert done.status == status and (error is None or error in done.error)
    with pytest.raises(ValueError, match="unknown job kind 'nope'"):
        job_kind("nope", app_config.scheduler.job_kinds)
    with pytest.raises(Exception, match="scheduler.job_kinds: expected name"):
        apply_overrides(app_config, {"scheduler.job_kinds": {"selftest": "no_function_named"}})
    store.close()


def test_a_running_job_takes_the_idle_cores_and_gives_them_back_when_a_chat_starts(app_config, store, tmp_path):
    """Through the real files and process: the job's training thread runs on every core while nobody chats, on its
    share within a moment of a chat starting, and on every core again once chat has been quiet a while."""
    from rlhf.config import apply_overrides
    from rlhf.cpu import available_cores

    if available_cores() < 2:
        pytest.skip("one core: a job has no serving cores to take")
    config = apply_overrides(app_config, {"retrain.idle_cores_after_seconds": 1.0})
    runner = JobRunner(store, config, cancel_grace=1.0)
    sched = StudioScheduler(store, config, runner)
    stop = tmp_path / "stop"
    plan, budget = runner.budget.plan, runner.budget
    try:
        job = sched.enqueue("threads", "assistant", threads={"stop_file": str(stop)})
        runner.tick()

        def threads_seen():
            return [int(r["value"]) for r in store.job_metrics(job.id)]

        def wait_seen(value):
            deadline = time.time() + 30
            while time.time() < deadline:
                runner.tick()
                if threads_seen() and threads_seen()[-1] == value:
                    return
                time.sleep(0.05)
            raise AssertionError(f"the job never ran on {value} threads: {threads_seen()}")

        wait_seen(plan.cores)  # nobody has chatted: every core
        t0 = time.monotonic()
        budget.serving_load(True)  # a reply starts: the listener writes the job's share at once
        wait_seen(plan.job)
        handover = time.monotonic() - t0
        for _ in range(5):  # the chat goes on for a moment: the job stays on its share
            budget.serving_load(True)
            runner.tick()
            time.sleep(0.1)
        assert threads_seen()[-1] == plan.job
        wait_seen(plan.cores)  # a second of quiet: every core again
        assert handover < 5.0, handover
        stop.touch()
        done = runner.wait(job.id, timeout=30)
        assert done.status == "succeeded"
        log = "\n".join(r["line"] for r in store.job_log_tail(job.id, 50))
        assert "changed its thread count" in log
        deadline = time.time() + 30
        while runner.tick() is not None and time.time() < deadline:  # until the process has exited
            time.sleep(0.1)
        assert not list(config.paths.job_logs.glob("*.threads"))  # the runner cleaned up
    finally:
        stop.touch()
        sched.shutdown()
