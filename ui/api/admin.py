"""REST for teams: agents, exports, annotation quality, annotator exclusion, API tokens, who am I.

Mounted under /api/v1 by ``ui.webapp.create_app``. Writes here need the admin role (``require_admin``);
the quality stats: admins see every annotator's, others their own (per-annotator counts, read before and after a
vote, would tell how someone voted).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from fastapi import APIRouter, Request
from pydantic import Field
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from rlhf.analysis import quality
from rlhf.interop.export import FORMATS, ExportError, archive, default_name, export
from storage import InvalidInput, NotFound
from storage.util import SLUG
from ui.flows import decisions as decisions_flow
from ui.flows.agents import agent_json, check_chat_template, check_generation, create_agent
from ui.permissions import current_user, is_admin, require_admin
from ui.api.errors import PREFIX, errors
from ui.api.models import AgentOut, Excluded, Me, NewToken, Quality, Strict, TokenOut, ok
from ui.services import Services

MEDIA_TYPES = {".jsonl": "application/x-ndjson", ".parquet": "application/vnd.apache.parquet",
               ".zip": "application/zip"}
EXPORT = {200: {"description": "The export: one file, or a zip of several",
                "content": {media: {"schema": {"type": "string", "format": "binary"}}
                            for media in sorted(set(MEDIA_TYPES.values()))}}}


class AgentBody(Strict):
    # Documented, checked by the Store (``check_slug``, with its own message): a 1-64 character slug.
    name: str = Field(json_schema_extra={"pattern": f"^{SLUG.pattern}$"})
    system_prompt: str
    # A shipped name, a local directory or GGUF file (a path: at most PATH_MAX bytes), or a hub id.
    base_model: Optional[str] = Field(None, max_length=4096)
    generation: Optional[dict[str, Any]] = None
    chat_template: Optional[str] = None  # the agent's own chat template (Jinja); null: the base model's


class AgentPatch(Strict):
    system_prompt: Optional[str] = None
    generation: Optional[dict[str, Any]] = None
    guidelines: Optional[str] = None  # annotation guidelines shown in Chat, Arena and Vote (Markdown)
    chat_template: Optional[str] = None  # the agent's own chat template (Jinja); "" back to the base model's


class ExcludeBody(Strict):
    excluded: bool


class TokenBody(Strict):
    name: str
    label: str = ""
    expires_in_days: Optional[float] = None


def build_admin_router(services: Services) -> APIRouter:
    """POST/PATCH /agents, GET /export, GET /quality, GET /flagged, POST /annotators/{name}/exclude,
    POST/GET /tokens, DELETE /tokens/{id}, GET /me."""
    r = APIRouter(prefix=PREFIX)
    agent_routes(r, services)
    export_route(r, services)
    quality_routes(r, services)
    token_routes(r, services)
    return r


def agent_routes(r: APIRouter, services: Services) -> None:
    """POST /agents, PATCH /agents/{name} (admins)."""
    store = services.store

    @r.post("/agents", responses=ok(AgentOut) | errors(409, write=True))
    def new_agent(body: AgentBody, request: Request):
        require_admin(services, request)
        return agent_json(services, create_agent(services, body.name, body.system_prompt, body.base_model,
                                                 body.generation, body.chat_template))

    @r.patch("/agents/{name}", responses=ok(AgentOut) | errors(404, write=True))
    def edit_agent(name: str, body: AgentPatch, request: Request):
        require_admin(services, request)
        agent = store.update_agent(name, body.system_prompt, check_generation(services, body.generation),
                                   body.guidelines, check_chat_template(body.chat_template))
        return agent_json(services, agent)


def export_route(r: APIRouter, services: Services) -> None:
    """GET /export (admins): the feedback as a file (or a zip of files) in one of the export formats."""
    store = services.store

    @r.get("/export", response_class=FileResponse, responses=EXPORT | errors(404))
    def export_feedback(request: Request, format: str, agent: Optional[str] = None):
        require_admin(services, request)
        if format not in FORMATS:
            raise InvalidInput(f"unknown format {format!r}; choose one of: {', '.join(FORMATS)}")
        agent_id = store.get_agent(agent).id if agent is not None else None  # 404 before any work
        work = Path(tempfile.mkdtemp(prefix="rlhf-export-"))
        try:
            result = export(store, services.config, format, work / default_name(format, agent_id), agent)
            path = archive(result, work)
        except ExportError as exc:
            shutil.rmtree(work, ignore_errors=True)
            raise InvalidInput(str(exc)) from None
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        return FileResponse(path, filename=path.name,
                            media_type=MEDIA_TYPES.get(path.suffix, "application/octet-stream"),
                            background=BackgroundTask(shutil.rmtree, work, ignore_errors=True))


def _viewer(services: Services, request: Request) -> tuple:
    return current_user(services, request), is_admin(services, request)


def quality_routes(r: APIRouter, services: Services) -> None:
    """GET /quality (everyone: admins see every annotator's row, others their own), GET /flagged and
    POST /annotators/{name}/exclude (admins)."""
    store = services.store

    @r.get("/quality", responses=ok(Quality) | errors(404))
    def quality_stats(request: Request, agent: Optional[str] = None):
        rows = store.feedback_rows(store.get_agent(agent).id)
        stats = quality.own_stats(quality.annotator_stats(rows), *_viewer(services, request))
        return {"annotators": _records(stats), "alpha": quality.alpha_report(rows)}

    @r.get("/flagged", responses=ok(list[dict[str, Any]]) | errors(404))
    def flagged(request: Request, agent: Optional[str] = None):
        require_admin(services, request)
        return _records(quality.flagged_replies(store.feedback_rows(store.get_agent(agent).id)))

    @r.post("/annotators/{name}/exclude", responses=ok(Excluded) | errors(404, write=True))
    def exclude(name: str, body: ExcludeBody, request: Request):
        require_admin(services, request)
        return decisions_flow.set_excluded(services, name, body.excluded)


def token_routes(r: APIRouter, services: Services) -> None:
    """GET /me, POST /tokens (admins), GET /tokens, DELETE /tokens/{id}."""
    store = services.store

    @r.get("/me", responses=ok(Me) | errors())
    def me(request: Request):
        mode = "local" if services.auth is None else services.auth.mode
        return {"user": current_user(services, request), "admin": is_admin(services, request), "mode": mode}

    @r.post("/tokens", responses=ok(NewToken) | errors(404, write=True))
    def new_token(body: TokenBody, request: Request):
        require_admin(services, request)
        name = body.name.strip()  # the Store keeps user names stripped: " carol " is carol
        auth = services.auth
        if auth is not None and auth.mode == "users" and auth.role_for(name) is None:
            raise NotFound(f"{name!r} is not a configured user; add them to server.users or the users file")
        token = store.create_api_token(name, body.label, body.expires_in_days)
        return {"name": name, "token": token, "expires": store.list_api_tokens(name)[-1]["expires"]}

    @r.get("/tokens", responses=ok(list[TokenOut]) | errors())
    def tokens(request: Request):
        """API tokens without their secrets: every user's for admins, the caller's own for everyone else."""
        if is_admin(services, request):
            return store.list_api_tokens()
        return store.list_api_tokens(current_user(services, request) or "")

    @r.delete("/tokens/{token_id}", responses=ok(TokenOut) | errors(404))
    def revoke_token(token_id: int, request: Request):
        """Revoke a token (admins: anyone's; users: their own; someone else's is 404). Kept for the record."""
        if not is_admin(services, request) and store.api_token_user(token_id) != current_user(services, request):
            raise NotFound(f"unknown API token {token_id}")
        store.revoke_api_token(token_id)
        return next(t for t in store.list_api_tokens() if t["id"] == token_id)


def _records(frame) -> list[dict]:
    """DataFrame rows as JSON-safe dicts (NaN → null)."""
    return [{k: (None if _missing(v) else v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def _missing(value) -> bool:
    try:
        return value != value  # NaN is the only value unequal to itself
    except (TypeError, ValueError):
        return False
