"""Training tab handlers and the training REST API (dry run, enqueue, jobs, cancel, promote)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from rlhf.retrain.triggers import Rule
from tests.support.job_kinds import with_selftest
from tests.support.votes import seed_pairs
from ui.tabs import training
from ui.webapp import create_app


@pytest.fixture
def app_config(app_config):
    """The test config with the selftest job kind (it does not ship with the app)."""
    return with_selftest(app_config)


@pytest.fixture
def client(services):
    with TestClient(create_app(services, ui=False)) as c:
        yield c


def test_retrain_asks_first_refuses_without_data_then_queues_once(services):
    box, text, status = training.ask_retrain(services, "assistant", None)
    assert "Not enough data" in status and not box.visible
    assert "Not enough data" in training.retrain_now(services, "assistant", None)[0]
    assert services.store.count("jobs") == 0
    seed_pairs(services.store, 16)
    box, text, status = training.ask_retrain(services, "assistant", None)
    assert box.visible and "Retrain assistant now?" in text and "16 ratings and votes" in text
    assert services.store.count("jobs") == 0  # asking stores nothing
    (first, pick), (second, _) = (training.retrain_now(services, "assistant", None) for _ in range(2))
    job = services.store.list_jobs()[0]
    assert f"job #{job.id}" in first and first == second and services.store.count("jobs") == 1
    assert pick.value == job.id and job.config["estimated_minutes"] > 0  # the panel follows the new job


def test_time_left_from_the_estimate_then_from_the_pace():
    from datetime import datetime, timezone

    from storage.records import Job

    def job(progress, status="running", config=None):
        return Job(1, "retrain", 1, status, progress, "ppo", "", config or {}, {}, None, None, 0, None,
                   "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00", None, None)

    now = datetime(2026, 1, 1, 0, 1, 0, tzinfo=timezone.utc)  # one minute in
    assert training.time_left(job(0.03, config={"estimated_minutes": 5}), now).startswith(
        "1m00s elapsed · about 4 min left if the machine stays as quiet as when it was estimated (~5 min in all)")
    assert training.time_left(job(0.5), now) == "1m00s elapsed · about 1 min left at its pace so far"
    assert "estimating" in training.time_left(job(0.01), now)
    assert training.time_left(job(1.0, "succeeded"), now) == ""
    # a busy machine: twenty minutes into a job estimated at seven, it says so (no "1 min left" forever)
    late = datetime(2026, 1, 1, 0, 20, 0, tzinfo=timezone.utc)
    text = training.time_left(job(0.1, config={"estimated_minutes": 7.4}), late)
    assert text.startswith("20m00s elapsed · past the ~7.4 min estimate") and "min left" not in text
    assert training.time_left(job(0.4, config={"estimated_minutes": 7.4}), late).endswith("about 30 min left at its "
                                                                                           "pace so far")


def test_time_left_never_grows_while_the_progress_stands_still():
    from datetime import datetime, timedelta, timezone

    from storage.records import Job

    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    # 87 % done after 10 minutes, then nothing moves: the countdown runs from the pace at that moment
    job = Job(1, "retrain", 1, "running", 0.87, "eval", "", {}, {}, None, None, 0, None, start.isoformat(),
              start.isoformat(), None, None, (start + timedelta(minutes=10)).isoformat())
    texts = [training.time_left(job, start + timedelta(minutes=m)) for m in (10, 10.5, 11, 20)]
    lefts = [int(t.split("about ")[1].split(" min")[0]) for t in texts[:2]]
    assert lefts == sorted(lefts, reverse=True) and lefts[0] == 1  # 10 min × 0.13 / 0.87 ≈ 1.5 min, counting down
    assert "min left" not in texts[3] and "the eval phase has not moved for 10m00s" in texts[3]
    assert texts[3].startswith("20m00s elapsed · 87% done")



def test_the_panel_follows_a_job_started_elsewhere_unless_one_is_picked(services):
    first = services.scheduler.enqueue("selftest", "assistant")
    assert training.refresh(services, "assistant", None)[2].value == first.id
    second = services.store.enqueue_job("retrain", "assistant", {})  # e.g. the Dashboard's Retrain without them
    assert second.id != first.id
    assert training.refresh(services, "assistant", None)[2].value == second.id
    assert training.pin(services, first.id) == first.id and training.pin(services, second.id) is None
    assert training.refresh(services, "assistant", first.id)[2].value == first.id  # a hand-picked job stays


def test_refresh_shows_estimate_jobs_progress_and_curves(services):
    seed_pairs(services.store, 3)
    job = services.scheduler.enqueue("selftest", "assistant")
    services.store.claim_job(pid=1)
    services.store.job_progress(job.id, 0.4, "ppo", "PPO step 2/8")
    services.store.log_job(job.id, "[ppo] PPO step 2/8")
    services.store.log_metrics(job.id, 1, {"reward/mean": 0.1, "ppo/kl": 0.5, "loss/policy": 0.3})
    services.store.log_metrics(job.id, 2, {"reward/mean": 0.4, "ppo/kl": 0.7, "loss/policy": 0.2})
    estimate, jobs, pick, progress, curves, log, sched, cancel = training.refresh(services, "assistant", None)
    assert "pairs:** 3" in estimate and "Not enough data" in estimate
    assert "CPU budget" in estimate and "no job is running" in estimate
    assert list(jobs["job"]) == [job.id] and jobs["progress"][0] == "40%"
    assert "width:40.0%" in progress and "ppo" in progress and "elapsed" in progress
    # one panel per metric, whole-number steps
    assert [curves.count(f'aria-label="{k}"') for k in ("reward/mean", "ppo/kl", "loss/policy")] == [1, 1, 1]
    assert ">1.5<" not in curves and ">1<" in curves and ">2<" in curves
    assert "PPO step 2/8" in log and "not running" in sched and cancel.interactive
    services.store.finish_job(job.id, "succeeded")
    assert not training.refresh(services, "assistant", job.id)[-1].interactive  # nothing left to cancel


def test_progress_html_escapes_messages():
    from storage.records import Job

    job = Job(1, "retrain", 1, "failed", 0.5, "<b>x</b>", "", {}, {}, "<script>alert(1)</script>", None, 0, None,
              "2026-01-01T00:00:00+00:00", None, None, None)
    html = training.progress_html(job)
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_cancel_and_rules(services):
    job = services.scheduler.enqueue("selftest", "assistant")
    assert "Cancel requested" in training.cancel(services, job.id, None)
    assert services.store.get_job(job.id).status == "cancelled"
    assert "already" in training.cancel(services, job.id, None)
    saved = training.save_rule(services, "assistant", True, 10, 30, "0 3 * * *", None)
    assert "automatic retrain on" in saved and "0 3 * * *" in saved
    assert services.triggers.rule("assistant") == Rule(True, 10, 30.0, "0 3 * * *")
    assert "invalid cron" in training.save_rule(services, "assistant", True, 10, 30, "nope", None)
    assert "positive" in training.save_rule(services, "assistant", True, 0, 30, "", None)


def test_train_rest_dry_run_queue_jobs_cancel(client, services):
    dry = client.post("/api/v1/train", json={"dry_run": True}).json()
    assert dry["status"] == "dry_run" and dry["ready"] is False and "missing" in dry
    refused = client.post("/api/v1/train", json={})
    assert refused.status_code == 409 and "not enough feedback" in refused.json()["error"]
    seed_pairs(services.store, 16)
    dry = client.post("/api/v1/train", json={"dry_run": True, "config": {"ppo.steps": 2}}).json()
    assert dry["ready"] and dry["pairs"] == 16 and dry["feedback_count"] == 16
    queued = client.post("/api/v1/train", json={"config": {"ppo": {"steps": 2}}}).json()
    assert queued["status"] == "queued"
    job = services.store.get_job(queued["job_id"])
    assert job.config["app"]["ppo"]["steps"] == 2 and job.kind == "retrain"
    listed = client.get("/api/v1/jobs").json()
    assert listed[0]["id"] == job.id and listed[0]["status"] == "queued" and listed[0]["agent"] == "assistant"
    one = client.get(f"/api/v1/jobs/{job.id}").json()
    assert one["metrics"] == {} and one["policy_id"] is None
    assert client.post(f"/api/v1/jobs/{job.id}/cancel").json()["status"] == "cancelled"
    assert client.post(f"/api/v1/jobs/{job.id}/cancel").status_code == 409
    assert client.get("/api/v1/jobs/999").status_code == 404


@pytest.mark.parametrize("body, problem", [
    ({"config": {"ppo.stepz": 2}}, "unknown config key"), ({"config": {"ppo.steps": "many"}}, "expected int"),
    ({"agent": "ghost"}, "unknown agent"), ({"dry_run": "yes"}, "dry_run"),
])
def test_train_rest_bad_input(client, services, body, problem):
    seed_pairs(services.store, 16)
    r = client.post("/api/v1/train", json=body)
    assert 400 <= r.status_code < 500 and problem in r.json()["error"], r.text
    assert services.store.count("jobs") == 0


def test_promote_is_rollback(client, services, tmp_path):
    (tmp_path / "v1").mkdir()
    v1 = services.store.register_policy_version("assistant", str(tmp_path / "v1"), parent_id=1, promote=True)
    r = client.post("/api/v1/policies/1/promote").json()
    assert r == {"id": 1, "version": 0, "status": "active"}
    assert services.store.get_policy(v1.id).status == "candidate"
    assert client.post("/api/v1/policies/999/promote").status_code == 404


@pytest.mark.parametrize("config", [
    {"scheduler.job_kinds": {"pwn": "data.policies.pwn:run"}}, {"scheduler": {"job_kinds": {"pwn": "pwn:run"}}},
    {"ppo.reward_functions": {"data.policies.pwn:score": 1.0}}, {"ppo": {"reward_functions": {"pwn:score": 1}}},
])
def test_train_rest_refuses_code_overrides(client, services, config):
    """Code to import is set in the app's own config only: a REST override naming any gets 422, nothing queued."""
    seed_pairs(services.store, 16)
    for dry in (True, False):
        r = client.post("/api/v1/train", json={"config": config, "dry_run": dry})
        assert r.status_code == 422 and "never per job" in r.json()["error"], r.text
    assert services.store.count("jobs") == 0


def test_engine_status_is_shown_as_plain_text(services, monkeypatch):
    """The engine status quotes recorded faults (data in the data dir): the tab's Markdown shows it as text."""
    monkeypatch.setattr(type(services.server), "engine_status",
                        property(lambda self: "<img src=x onerror=alert(1)> [x](javascript:alert(1)) **b**"))
    estimate = training.refresh(services, "assistant", None)[0]
    assert "<img" not in estimate and "&lt;img" in estimate
    assert "\\[x\\]\\(javascript:alert\\(1\\)\\)" in estimate and "\\*\\*b\\*\\*" in estimate


def test_train_rest_refuses_an_unknown_method_and_queues_nothing(client, services):
    seed_pairs(services.store, 16)
    refused = client.post("/api/v1/train", json={"config": {"retrain": {"method": "grpo"}}})
    assert refused.status_code == 422 and "retrain.method" in refused.json()["error"]
    for dry in (True, False):  # a reward-model kind that no table names fails at the config check, not in the job
        refused = client.post("/api/v1/train", json={"config": {"reward.method": "hed"}, "dry_run": dry})
        assert refused.status_code == 422 and "reward.method" in refused.json()["error"], refused.text
    assert services.store.list_jobs("assistant") == []
    assert client.post("/api/v1/train", json={"dry_run": True, "config": {"retrain.method": "rpo"}}).json()["ready"]
