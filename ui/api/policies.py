"""REST for promotion decisions and lineage (mounted under /api/v1 by ui.webapp).

GET /policies/{id}/decision, GET /decisions?agent=NAME, GET /policies/{id}/lineage, GET /lineage?agent=NAME,
POST /policies/{id}/retrain-without (admin).
"""
from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Request

from ui.api.errors import PREFIX, errors
from ui.api.models import Strict, TrainOut, ok
from ui.flows import decisions as flow
from ui.flows.access import caller_of
from ui.permissions import require_admin
from ui.services import Services


class WithoutBody(Strict):
    annotators: Optional[list[str]] = None  # default: the excluded annotators the version learned from


def build_policies_router(services: Services) -> APIRouter:
    """Decisions people make on candidates the gate left to them, and what each version learned from."""
    r = APIRouter(prefix=PREFIX)

    @r.get("/policies/{policy_id}/decision", responses=ok(dict[str, Any]) | errors(404))
    def decision(policy_id: int, request: Request):
        return flow.decision_json(services, policy_id, caller_of(services, request).admin)

    @r.get("/decisions", responses=ok(list[dict[str, Any]]) | errors(404))
    def decisions(request: Request, agent: Optional[str] = None):
        return flow.open_decisions(services, agent, caller_of(services, request).admin)

    @r.get("/policies/{policy_id}/lineage", responses=ok(dict[str, Any]) | errors(404))
    def lineage(policy_id: int):
        return flow.lineage_json(services, policy_id)

    @r.get("/lineage", responses=ok(list[dict[str, Any]]) | errors(404))
    def tainted(agent: Optional[str] = None):
        return flow.tainted(services, agent)

    @r.post("/policies/{policy_id}/retrain-without", responses=ok(TrainOut) | errors(404, 409, write=True))
    def retrain_without(policy_id: int, request: Request, body: Optional[WithoutBody] = None):
        require_admin(services, request)
        return flow.retrain_without(services, policy_id, body.annotators if body else None)

    return r
