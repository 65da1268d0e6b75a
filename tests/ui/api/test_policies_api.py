"""REST for decisions and lineage over real HTTP: GET /policies/{id}/decision, /lineage, retrain without."""
from __future__ import annotations

import httpx
import pytest

from tests.rlhf.retrain.test_decisions import INCONCLUSIVE, version, vote
from tests.rlhf.retrain.test_lineage import feedback, trained


@pytest.fixture
def api(live_app):
    with httpx.Client(base_url=live_app.url + "/api/v1", timeout=30) as client:
        yield client


def test_decision_of_an_open_candidate(api, services, tmp_path):
    store = services.store
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    for i in range(4):
        vote(store, cand, store.active_policy("assistant"), "a" if i else "tie", f"ann{i}", i)
    d = api.get(f"/policies/{cand.id}/decision").json()
    assert {"verdict", "votes", "win_rate", "low", "high", "votes_needed"} <= set(d)
    assert d["verdict"] == "collecting" and d["votes"] == 4 and d["win_rate"] == pytest.approx(3.5 / 4)
    assert 0 <= d["low"] < d["win_rate"] < d["high"] <= 1 and d["votes_needed"] > 0 and d["open"]
    assert [x["policy_id"] for x in api.get("/decisions", params={"agent": "assistant"}).json()] == [cand.id]
    assert api.get("/policies/999/decision").status_code == 404
    assert api.get("/policies/abc/decision").status_code in (400, 422)


def test_lineage_and_retrain_without_an_excluded_annotator(api, services, tmp_path):
    store = services.store
    for i in range(10):
        feedback(store, "alice", i)
    v1 = trained(store, tmp_path, 1, 1)
    for i in range(10):
        feedback(store, "mallory", i)
    v2 = trained(store, tmp_path, 2, v1.id)
    lin = api.get(f"/policies/{v2.id}/lineage").json()
    assert [a["annotator"] for a in lin["annotators"]] == ["alice", "mallory"]
    assert lin["annotators"][1]["comparisons"]["count"] == 10 and lin["tainted_by"] == []
    refused = api.post(f"/policies/{v2.id}/retrain-without", json={})
    assert refused.status_code == 422 and "no excluded annotator" in refused.json()["error"]
    assert api.post(f"/annotators/mallory/exclude", json={"excluded": True}).status_code == 200
    assert api.get("/lineage", params={"agent": "assistant"}).json() == [
        {"policy_id": v2.id, "version": 2, "status": "candidate", "tainted_by": ["mallory"], "retrain_from": v1.id}]
    jobs_before = len(store.list_jobs("assistant"))
    bad = api.post(f"/policies/{v2.id}/retrain-without", json={"annotators": "mallory"})
    assert bad.status_code in (400, 422) and len(store.list_jobs("assistant")) == jobs_before
    queued = api.post(f"/policies/{v2.id}/retrain-without").json()
    assert queued["status"] == "queued" and queued["without"] == ["mallory"] and queued["from_policy_id"] == v1.id
    job = store.get_job(queued["job_id"])
    assert job.config["from_policy_id"] == v1.id and job.config["app"]["reward"]["exclude_annotators"] == ["mallory"]
