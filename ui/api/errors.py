"""The REST API's prefix, its open paths and its one error shape, shared by the routers and the request guard.

Every refusal under /api/v1 (a handler's, a Store error, the guard's, FastAPI's own) answers
``{"error": "<message>"}`` with a 4xx status, or 503 with ``Retry-After`` when the server or the database is busy.
``install_error_handlers`` maps the errors a route lets through (the Store's, Forbidden, Busy, FastAPI's own) to
that shape in one place, so no route catches them. The module imports error types only (storage, serving,
permissions), never a router, so ``ui.request_guard`` and ``ui.auth`` can use it without a cycle.
"""
from __future__ import annotations

import math
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from rlhf.serving.policy_server import Busy
from storage import StoreError
from ui.permissions import Forbidden

PREFIX = "/api/v1"
HEALTH = f"{PREFIX}/health"
# Open without credentials: the liveness probe and the API's own description (no data in either).
PUBLIC_PATHS = {HEALTH, f"{PREFIX}/docs", f"{PREFIX}/openapi.json", f"{PREFIX}/docs/oauth2-redirect"}


def error(status: int, message: str, headers: Optional[dict] = None) -> JSONResponse:
    """The API's error response: ``{"error": message}``."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class ErrorBody(BaseModel):
    """Every error the REST API answers."""
    error: str


WHY = {
    204: "Nothing to return",
    400: "Malformed request: a body that is not JSON, or an unknown Host header",
    401: "Authentication required (sign-in is on)",
    403: "Not allowed: the caller's role, or a cross-origin request",
    404: "Not found (or not the caller's to see)",
    409: "Conflict with the current state",
    413: "Request body too large",
    422: "Invalid input",
    429: "Too many requests or failed sign-ins; see Retry-After",
    503: "Busy (model server queue full, or the database locked); see Retry-After",
}
# What any route may answer, whatever it does: the guard's refusals, rate limits, a busy database.
COMMON = (400, 401, 403, 422, 429, 503)
WRITE = COMMON + (413,)  # a route with a request body also has the body-size limit


def errors(*statuses: int, write: bool = False) -> dict:
    """``responses=`` for a route: the common refusals plus ``statuses``, each with the error body."""
    codes = sorted(set((WRITE if write else COMMON) + statuses))
    return {code: {"description": WHY[code]} if code == 204 else {"model": ErrorBody, "description": WHY[code]}
            for code in codes}


class ClientGone(Exception):
    """The client hung up before its reply was complete (the reply was cancelled, nothing stored)."""


def install_error_handlers(app: FastAPI) -> None:
    """Map Store errors, validation errors and Busy to JSON errors."""

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError):
        retry = getattr(exc, "retry_after", None)  # StoreBusy: the same "busy, retry" answer as a full queue
        return error(exc.status, str(exc), {"Retry-After": str(int(math.ceil(retry)))} if retry else None)

    @app.exception_handler(Forbidden)
    async def _forbidden(request: Request, exc: Forbidden):
        return error(403, str(exc))

    @app.exception_handler(Busy)
    async def _busy(request: Request, exc: Busy):
        return error(503, str(exc), {"Retry-After": str(int(math.ceil(exc.retry_after)))})

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone):
        return Response(status_code=499)  # nobody reads it: the client is gone (nginx's "client closed request")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        # FastAPI's own refusals (a body that is not UTF-8, one over the size limit) in the API's error shape.
        if request.url.path.startswith(PREFIX):
            return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            if err.get("type") == "json_invalid":
                return error(400, "malformed JSON body")
            problems.append(f"{where or 'body'}: {err.get('msg')}")
        return error(422, "; ".join(problems) or "invalid request")
