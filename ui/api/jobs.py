"""REST for training: dry run / enqueue a retrain, list and inspect jobs, cancel, promote a version."""
from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Request

from rlhf.retrain.data import dry_run
from storage import Conflict, InvalidInput
from ui.permissions import require_admin
from ui.api.errors import PREFIX, errors
from ui.api.models import JobDetail, JobOut, Promoted, Strict, TrainOut, ok
from ui.services import Services


class TrainBody(Strict):
    agent: Optional[str] = None
    dry_run: bool = False
    config: Optional[dict] = None


def job_json(services: Services, job_id: int, detail: bool = False) -> dict:
    """A job as the REST API shows it (with a metrics summary and its new policy when done)."""
    job = services.store.get_job(job_id)
    out = {k: v for k, v in job.to_dict().items() if k not in ("config", "checkpoint", "cancel_requested")}
    out["agent"] = services.store.get_agent(job.agent_id).name if job.agent_id else None
    out["policy_id"] = job.result.get("policy_id")
    out["promoted"] = job.result.get("promoted")
    if detail:
        summary: dict = {}
        for row in services.store.job_metrics(job_id):
            summary[row["key"]] = {"last": row["value"], "step": row["step"]}
        out["metrics"] = summary
        out["log"] = [r["line"] for r in services.store.job_log_tail(job_id, 20)]
    return out


def build_jobs_router(services: Services) -> APIRouter:
    r = APIRouter(prefix=PREFIX)
    store = services.store

    @r.post("/train", responses=ok(TrainOut) | errors(404, 409, write=True))
    def train(body: TrainBody, request: Request):
        require_admin(services, request)
        agent = store.get_agent(body.agent)
        if body.dry_run:
            return {"status": "dry_run", **dry_run(store, services.config, agent.name, body.config or {})}
        estimate = dry_run(store, services.config, agent.name, body.config or {})
        if not estimate["ready"]:
            raise Conflict("not enough feedback to retrain: " + estimate["missing"])
        job = services.scheduler.enqueue("retrain", agent.name, body.config or {}, reason="manual")
        return {"status": "queued", "job_id": job.id}

    @r.get("/jobs", responses=ok(list[JobOut]) | errors(404))
    def jobs(agent: Optional[str] = None, limit: int = 50):
        if not 1 <= limit <= 500:
            raise InvalidInput("limit must be in 1..500")
        return [job_json(services, j.id) for j in store.list_jobs(agent, limit)]

    @r.get("/jobs/{job_id}", responses=ok(JobDetail) | errors(404))
    def job(job_id: int):
        return job_json(services, job_id, detail=True)

    @r.post("/jobs/{job_id}/cancel", responses=ok(JobOut) | errors(404, 409))
    def cancel(job_id: int, request: Request):
        require_admin(services, request)
        store.request_cancel(job_id)
        services.scheduler.wake()
        return job_json(services, job_id)

    @r.post("/policies/{policy_id}/promote", responses=ok(Promoted) | errors(404, 409))
    def promote(policy_id: int, request: Request):
        require_admin(services, request)
        policy = store.promote_policy(policy_id)
        return {"id": policy.id, "version": policy.version, "status": policy.status}

    return r
