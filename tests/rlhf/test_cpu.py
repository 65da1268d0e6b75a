"""The CPU budget: serving + job threads never exceed the cores, and serving follows a running job."""
from __future__ import annotations

import time

import pytest

from rlhf.config import load_config
from rlhf.cpu import THREAD_VARIABLES, CpuBudget, CpuMeter, JobThreads, available_cores, plan_threads, \
    thread_env, thread_plan, threads_beside


@pytest.mark.parametrize("cores, idle, busy, job", [
    (1, 1, 1, 1),  # one core: both single-threaded, time-shared (the job niced)
    (2, 2, 1, 1),  # every core while no job runs; the fair share, one core each, while one does
    (4, 4, 2, 2),
    (16, 16, 8, 8),
])
def test_default_budget(cores, idle, busy, job):
    plan = plan_threads(cores)
    assert (plan.serving_idle, plan.serving_busy, plan.job) == (idle, busy, job)
    assert plan.serving(0) == idle and plan.serving(plan.job) == busy
    if cores > 1:
        assert plan.serving_busy + plan.job <= cores


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 16])
@pytest.mark.parametrize("serving", [0, 1, 3, 64])
@pytest.mark.parametrize("job", [0, 1, 2, 64])
def test_budget_never_oversubscribes(cores, serving, job):
    plan = plan_threads(cores, serving, job)
    assert 1 <= plan.job and 1 <= plan.serving_busy <= plan.serving_idle <= cores
    if cores > 1:
        assert plan.job + plan.serving_busy <= cores and plan.job < cores
    if serving:
        assert plan.serving_idle == min(serving, cores)


def test_explicit_job_threads_are_kept_when_they_fit():
    assert plan_threads(16, job_threads=1).job == 1 and plan_threads(16, job_threads=1).serving_busy == 15
    assert plan_threads(2, serving_threads=2).serving_idle == 2 and plan_threads(2, serving_threads=2).serving_busy == 1
    assert plan_threads(4, serving_threads=1, job_threads=2).serving_busy == 1
    assert plan_threads(2, job_threads=8).job == 1  # serving always keeps a core


def test_plan_from_config_and_env():
    cfg = load_config(env={}, overrides=["retrain.job_threads=3", "serving.threads=2", "retrain.job_nice=5"])
    plan = thread_plan(cfg, cores=8)
    assert (plan.serving_idle, plan.serving_busy, plan.job, plan.job_nice) == (2, 2, 3, 5)
    assert thread_plan(load_config(env={})).cores == available_cores()
    env = thread_env(3, {"PATH": "/bin", "OMP_NUM_THREADS": "16"})
    assert env["PATH"] == "/bin" and all(env[k] == "3" for k in THREAD_VARIABLES)


def test_budget_follows_the_running_job():
    budget = CpuBudget(plan_threads(4))
    assert budget.serving_threads() == 4 and "no job is running" in budget.status()
    budget.job_started(2)
    assert budget.serving_threads() == 2 and "a job is running" in budget.status()
    budget.job_ended()
    assert budget.serving_threads() == 4


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_job_takes_every_core_while_nobody_chats_and_gives_them_back_when_a_chat_starts():
    clock, woken = Clock(), []
    budget = CpuBudget(plan_threads(4, idle_after_s=15.0), clock)
    budget.listen(lambda: woken.append(clock.now))
    assert budget.plan.job == 2 and budget.plan.job_alone == 4 and "4 after 15 s without a chat" in budget.status()
    budget.job_started()
    assert budget.job_share() == 4 and budget.serving_threads() == 1  # nobody has chatted yet
    budget.serving_load(False)  # an idle engine's poll wakes nobody
    assert budget.job_share() == 4 and woken == []
    budget.serving_load(True)  # a reply in flight: the job's share drops at once, the listener hears it once
    assert budget.job_share() == 2 and budget.serving_threads() == 2 and woken == [1000.0]
    clock.now += 1.0
    budget.serving_load(True)
    assert woken == [1000.0] and "chat uses 2 thread(s), the job 2" in budget.status()
    clock.now += 14.9  # the last reply ended 14.9 s ago: not quiet yet
    assert budget.job_share() == 2
    clock.now += 0.1
    assert budget.job_share() == 4 and budget.serving_threads() == 1 and "the job 4" in budget.status()
    budget.serving_load(True)
    assert woken == [1000.0, 1016.0] and budget.job_share() == 2
    budget.job_ended()
    assert budget.serving_threads() == 4


@pytest.mark.parametrize("cores, idle_after", [(4, 0.0), (1, 15.0)])
def test_no_idle_cores_to_take(cores, idle_after):
    """``idle_cores_after_seconds`` 0 keeps the job on its share; one core has nothing to give."""
    budget = CpuBudget(plan_threads(cores, idle_after_s=idle_after), Clock())
    assert budget.job_share() == budget.plan.job == budget.plan.job_most
    assert "without a chat" not in budget.plan.describe()


def test_the_job_follows_its_threads_file_on_its_training_thread(tmp_path):
    """The share is applied before the next module's forward, on the thread that trains, not on others."""
    import threading

    import torch

    path = tmp_path / "1.threads"
    before = torch.get_num_threads()
    layer = torch.nn.Linear(4, 4)
    JobThreads.write(path, 1)
    follower = JobThreads(path, 3, poll_s=0.01).follow()  # the job started on 3: the file says 1, then 2
    try:
        assert torch.get_num_threads() == 1 and follower.applied == 1
        JobThreads.write(path, 2)
        assert wait_for(lambda: follower.wanted == 2)
        seen = []
        other = threading.Thread(target=lambda: (layer(torch.zeros(1, 4)), seen.append(follower.applied)))
        other.start()
        other.join()
        assert seen == [1] and torch.get_num_threads() == 1  # another thread's forward changes nothing
        layer(torch.zeros(1, 4))
        assert torch.get_num_threads() == 2 and follower.applied == 2 and follower.changes == 2
        path.unlink()  # the job's file is gone (the app cleaned up): keep what we have
        assert follower.read() == 2
    finally:
        follower.stop()
        torch.set_num_threads(before)
    JobThreads.write(path, 1)
    time.sleep(0.05)
    layer(torch.zeros(1, 4))
    assert torch.get_num_threads() == before  # stopped: the hook is gone


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_serving_engine_drops_threads_while_a_job_runs_and_takes_them_back(tiny_model_dir):
    """torch's thread count is per calling thread: the engine must apply the budget on its own thread."""
    import torch

    from rlhf.serving.policy_server import AdapterRef, GenParams, PolicyServer

    server = PolicyServer.load(str(tiny_model_dir), "cpu", "tiny", max_context_tokens=256)
    budget = CpuBudget(plan_threads(4, job_threads=1))  # 4 "cores" whatever this machine has: 4 idle, 3 beside a job
    main_threads = torch.get_num_threads()
    try:
        server.use_budget(budget)
        assert wait_for(lambda: server.engine.threads == 4)
        budget.job_started()
        assert wait_for(lambda: server.engine.threads == 3)
        reply = server.generate("", [{"role": "user", "content": "hi"}], AdapterRef(0),
                                GenParams(max_new_tokens=4, temperature=0))
        assert isinstance(reply, str) and server.engine.threads == 3
        budget.job_ended()
        assert wait_for(lambda: server.engine.threads == 4)
        assert torch.get_num_threads() == main_threads  # the engine changed its own thread only
    finally:
        server.close()


def test_config_show_prints_the_budget_and_stays_a_config_file(tmp_path, capsys):
    import json

    import yaml

    from cli import main

    assert main(["config", "show", "--set", "retrain.job_threads=1", "--set", "serving.threads=1"]) == 0
    out = capsys.readouterr().out
    comments = [line for line in out.splitlines() if line.startswith("# ")]
    assert "CPU budget on this machine" in comments[0] and "a job 1 thread" in comments[0]
    plan = json.loads(comments[1][2:])
    assert plan["job"] == 1 and plan["serving_idle"] == 1 and plan["cores"] == available_cores()
    saved = tmp_path / "c.yaml"
    saved.write_text(out)
    assert yaml.safe_load(out)["retrain"]["job_threads"] == 1
    assert load_config(saved, env={}).retrain.job_threads == 1


@pytest.mark.parametrize("others, threads", [(0.0, 2), (0.3, 2), (0.5, 2), (0.7, 1), (1.0, 1), (1.9, 1)])
def test_serving_gives_a_core_to_other_busy_processes(others, threads):
    """A thread that shares its core with another busy process stalls every decode step: leave that core."""
    assert threads_beside(2, 2, others) == threads
    assert threads_beside(4, 8, 1.0) == 4 and threads_beside(8, 8, 3.0) == 5 and threads_beside(1, 2, 0.0) == 1


def test_the_meter_reads_proc_stat_and_a_process_stat():
    stat = "cpu  100 5 50 1000 20 3 2 10 0 0\ncpu0 50 2 25 500 10 1 1 5 0 0\n"
    assert CpuMeter.machine_busy(stat) == 100 + 5 + 50 + 3 + 2 + 10  # steal counts: a neighbour's, not ours
    pid_stat = "1234 (python (engine)) S 1 2 3 4 5 6 7 8 9 10 111 222 0 0 20 0 1 0"
    assert CpuMeter.process_busy(pid_stat) == 111 + 222
    meter = CpuMeter(window_s=0.0)
    assert meter.fit(1) == 1 and 1 <= meter.fit(64) <= available_cores()
