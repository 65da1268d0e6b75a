"""The REST API's body-size limit: ASGI middleware that refuses an oversized body with 413 before (or while) it is
read. Routers define routes only; middleware lives here and in ``ui.request_guard`` (Host, Origin, credentials)."""
from __future__ import annotations

from fastapi import FastAPI
from starlette.exceptions import HTTPException

from ui.api.errors import PREFIX, error


def body_size_guard(app: FastAPI, max_bytes: int) -> None:
    """Refuse oversized REST bodies with 413: by Content-Length before reading, and while reading a body sent
    without one (chunked), so no client makes the server buffer more than ``max_bytes``."""
    app.add_middleware(BodyLimit, max_bytes=max_bytes)


class BodyLimit:
    """ASGI middleware behind ``body_size_guard`` (pure ASGI: it must see the body's chunks as they arrive)."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX) \
                or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        too_large = f"request body larger than {self.max_bytes} bytes"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await error(413, too_large)(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # FastAPI re-raises an HTTPException from the body read as is
                    raise HTTPException(413, too_large)
            return message

        await self.app(scope, counted, send)
