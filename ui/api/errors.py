"""The REST API's prefix, its open paths and its one error shape, shared by the routers and the request guard.

Every refusal under /api/v1 (a handler's, a Store error, the guard's, FastAPI's own) answers
``{"error": "<message>"}`` with a 4xx status, or 503 with ``Retry-After`` when the server or the database is busy.
A leaf module: it imports nothing from the app, so ``ui.guard`` and ``ui.auth`` can use it without a cycle.
"""
from __future__ import annotations

from typing import Optional

from fastapi.responses import JSONResponse
from pydantic import BaseModel

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
