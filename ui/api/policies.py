"""REST for promotion decisions and lineage (mounted under /api/v1 by ui.server).

GET /policies/{id}/decision, GET /decisions?agent=NAME, GET /policies/{id}/lineage, GET /lineage?agent=NAME,
POST /policies/{id}/retrain-without (admin).
"""
from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Request

from ui.api.core import PREFIX, Strict
from ui.flows import decisions as flow
from ui.permissions import require_admin
from ui.services import Services


class WithoutBody(Strict):
    annotators: Optional[list[str]] = None  # default: the excluded annotators the version learned from


def build_policies_router(services: Services) -> APIRouter:
    """Decisions people make on candidates the gate left to them, and what each version learned from."""
    r = APIRouter(prefix=PREFIX)

    @r.get("/policies/{policy_id}/decision")
    def decision(policy_id: int):
        return flow.decision_json(services, policy_id)

    @r.get("/decisions")
    def decisions(agent: Optional[str] = None):
        return flow.open_decisions(services, agent)

    @r.get("/policies/{policy_id}/lineage")
    def lineage(policy_id: int):
        return flow.lineage_json(services, policy_id)

    @r.get("/lineage")
    def tainted(agent: Optional[str] = None):
        return flow.tainted(services, agent)

    @r.post("/policies/{policy_id}/retrain-without")
    def retrain_without(policy_id: int, request: Request, body: Optional[WithoutBody] = None):
        require_admin(services, request)
        return flow.retrain_without(services, policy_id, body.annotators if body else None)

    return r
