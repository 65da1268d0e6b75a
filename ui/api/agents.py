"""REST: what a client reads first: GET /health, GET /agents, GET /policies."""
from __future__ import annotations

from typing import Optional

from fastapi import APIRouter

from ui.api.errors import PREFIX, errors
from ui.api.models import AgentOut, Health, PolicyOut, ok
from ui.flows.agents import agent_json
from ui.services import Services


def build_agents_router(services: Services) -> APIRouter:
    """The read-only routes about the app, its agents and their versions."""
    r = APIRouter(prefix=PREFIX)
    read_routes(r, services)
    return r


def read_routes(r: APIRouter, services: Services) -> None:
    """GET /health, GET /agents, GET /policies."""
    store = services.store

    @r.get("/health", responses=ok(Health) | errors())
    def health():
        server = services.server
        return {"status": "ok", "model": server.model_name, "schema_version": store.schema_version(),
                "engine": server.engine_name, "engine_status": server.engine_status,
                "engine_build": server.engine_build}

    @r.get("/agents", responses=ok(list[AgentOut]) | errors())
    def agents():
        return [agent_json(services, a) for a in store.list_agents()]

    @r.get("/policies", responses=ok(list[PolicyOut]) | errors(404))
    def policies(agent: Optional[str] = None):
        rows = store.list_policies(agent if agent is not None else None)
        return [{k: p.to_dict()[k] for k in ("id", "agent_id", "version", "parent_id", "status", "created",
                                              "metrics", "error")} for p in rows]
