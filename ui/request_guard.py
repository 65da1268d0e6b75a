"""The request guard: every request to the app (UI, Gradio's own routes, REST) passes these checks first.

Outermost first:
0. **Forwarded headers** — believed only from ``server.trusted_proxies`` (``ui.forwarded``), removed otherwise;
   no check below ever sees a client-chosen address, scheme or host.
1. **Host** — the ``Host`` header must name this app (DNS rebinding: a page on ``evil.example`` that
   resolves to 127.0.0.1 sends ``Host: evil.example``). Local mode accepts only loopback names and
   ``server.host``; with users or on a Space, ``server.allowed_hosts`` (a Space adds its own host).
2. **Origin** — a state-changing request (not GET/HEAD/OPTIONS, and every WebSocket handshake) whose
   ``Origin`` is neither this host nor in ``server.allowed_origins`` gets 403, on every path.
3. **CORS** — one allow-list (``server.allowed_origins``, empty = same-origin only) on the parent app,
   which also switches off Gradio's own CORS layer (it echoes any Origin for non-localhost hosts).
4. **/login** — failed sign-ins counted per client address (and per name from that address) before the password
   is checked (``ui.throttles.LoginThrottle``), and per name from anywhere with a capped backoff that spares addresses the
   name signed in from before (``ui.throttles.NameBackoff``); over a limit every attempt gets the same 429; the sign-in
   cookie is made ``SameSite=Lax`` (a Space keeps ``None``: it runs in huggingface.co's iframe, and the
   Origin check carries it).
5. **REST** (``/api/v1``) — the same throttle for HTTP Basic, 401 without valid credentials, 429 over
   ``server.rate_limit_per_minute``.
6. **Gradio events** (``GradioCalls``, inside the Gradio app where its sign-in is readable) — every event a user
   runs (``/gradio_api/call|run|api/<name>``, every ``/gradio_api/queue/join``, public or private) counts against the
   same per-user limiter as REST: one budget per person, whichever door they use. Timer ticks have their own.
Password checks run in worker threads, never on the event loop.
"""
from __future__ import annotations

import json
import math
import re
from typing import Callable, Optional
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware

from rlhf.config import AppConfig, ConfigError
from ui.api.errors import HEALTH, PREFIX, PUBLIC_PATHS, error
from ui.auth import basic_name
from ui.throttles import RateLimiter
from ui.forwarded import ForwardedHeaders, TrustedProxies
from ui.services import Services

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
MAX_LOGIN_BODY = 64 * 1024


# ---- hosts and origins (pure) ------------------------------------------------------------------------
def host_name(value: str) -> str:
    """The host part of a ``Host`` header or URL netloc, lower case: ``[::1]:7860`` → ``::1``."""
    value = (value or "").strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def space_host(space_id: str) -> str:
    """The host Hugging Face serves a Space at: ``Owner/My_Space`` → ``owner-my-space.hf.space``."""
    return re.sub(r"[^a-z0-9-]", "-", space_id.strip().lower().replace("/", "-")) + ".hf.space"


def allowed_hosts(config: AppConfig, local_mode: bool) -> Optional[set[str]]:
    """Host names this app answers to, or None for any (``'*'`` in the list, or users without a list)."""
    listed = {host_name(h) for h in config.server.allowed_hosts if h.strip()}
    if "*" in listed:
        return None
    if not local_mode and not listed and not config.server.space_id:
        return None  # a team server without a list (a warning at start says so)
    hosts = set(LOCAL_HOSTS) | listed
    if config.server.host not in WILDCARD_HOSTS:
        hosts.add(host_name(config.server.host))
    if config.server.space_id:
        hosts.add(space_host(config.server.space_id))
    return hosts


def host_allowed(headers: Headers, config: AppConfig, local_mode: bool) -> bool:
    """True when the request's Host (on a Space also an X-Forwarded-Host from its proxy) is allowed."""
    hosts = allowed_hosts(config, local_mode)
    if hosts is None:
        return True
    seen = [headers.get("host", "")]
    if config.server.space_id:
        seen += headers.get("x-forwarded-host", "").split(",")
    return any(host_name(h) in hosts for h in seen if h.strip())


def foreign_origin(headers: Headers, allowed_origins: list[str]) -> bool:
    """True when a browser sent this request from another origin than the app's own or an allowed one."""
    origin = headers.get("origin")
    if origin is None:
        return False  # scripts, and browsers on same-origin GETs, send none
    if origin.rstrip("/").lower() in allowed_origins:
        return False
    if origin == "null":
        return True  # sandboxed frames and file:// pages
    hosts = {headers.get("host", "").lower()}
    hosts.update(h.strip().lower() for h in headers.get("x-forwarded-host", "").split(",") if h.strip())
    return urlsplit(origin).netloc.lower() not in hosts


def check_origins(origins: list[str]) -> list[str]:
    """``server.allowed_origins`` as exact origins; a wildcard is refused (with cookies it would let any
    site act as the signed-in user)."""
    out = []
    for origin in origins:
        parts = urlsplit(origin.strip())
        if origin.strip() == "*" or parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
            raise ConfigError(f"server.allowed_origins: expected scheme://host[:port], got {origin!r} "
                              "(no wildcards: list each origin)")
        out.append(f"{parts.scheme}://{parts.netloc}".lower())
    return out


class RequestPolicy:
    """Pure ASGI middleware for checks 1 and 2 (Host, then Origin) on every HTTP request and WebSocket."""

    def __init__(self, app, services: Services, origins: list[str]):
        self.app = app
        self.services = services
        self.origins = origins

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        config = self.services.config
        problem = None
        if scope["path"] != HEALTH and not host_allowed(headers, config, self.services.auth is None):
            problem = (400, f"unknown host {headers.get('host', '')!r}: add it to server.allowed_hosts")
        elif (scope["type"] == "websocket" or scope["method"] not in SAFE_METHODS) \
                and foreign_origin(headers, self.origins):
            problem = (403, "cross-origin request refused: use the app from its own origin, or list the other "
                            "origin in server.allowed_origins")
        if problem is None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        return await error(*problem)(scope, receive, send)


# ---- /login ------------------------------------------------------------------------------------------
class LoginGuard:
    """Pure ASGI middleware around Gradio's ``POST /login`` (users mode): throttle before the check, and a
    sign-in cookie that other sites cannot make the browser send."""

    def __init__(self, app, services: Services):
        self.app = app
        self.services = services

    async def __call__(self, scope, receive, send):
        auth = self.services.auth
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") != "/login" \
                or auth is None or auth.mode != "users":
            return await self.app(scope, receive, send)
        body = await _read_body(receive, MAX_LOGIN_BODY)
        if body is None:
            return await error(413, "sign-in form too large")(scope, receive, send)
        try:
            form = await Request(scope, _replay(body, receive)).form()
            name = str(form.get("username") or "").strip()
            await form.close()
        except Exception:  # a malformed form: Gradio answers it (422); it still counts for this address
            name = ""
        client = scope["client"][0] if scope.get("client") else None
        wait = auth.attempt(client, name)
        if wait is not None:
            return await _too_many(wait)(scope, receive, send)
        status = {}
        lax = not self.services.config.server.space_id

        async def sending(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                if lax:
                    message["headers"] = [(k, _lax(v) if k.lower() == b"set-cookie" else v)
                                          for k, v in message.get("headers", [])]
            await send(message)

        await self.app(scope, _replay(body, receive), sending)
        if status.get("code") == 200:
            auth.succeeded(client, name)


def _lax(cookie: bytes) -> bytes:
    """A Set-Cookie value with ``SameSite=Lax`` (replacing ``None`` or adding it)."""
    parts = [p for p in cookie.split(b";") if not p.strip().lower().startswith(b"samesite")]
    return b";".join(parts) + b"; SameSite=Lax"


async def _read_body(receive, limit: int) -> Optional[bytes]:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    """A receive channel that hands out an already read body, then waits on the real one (disconnects)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _too_many(wait: float) -> JSONResponse:
    seconds = max(1, math.ceil(wait))
    return error(429, f"too many failed sign-ins: try again in {seconds} s", {"Retry-After": str(seconds)})


def limit_key(user: Optional[str], client: Optional[str]) -> str:
    """The rate limiter's key of a request: the signed-in user, else the client address."""
    return f"user:{user}" if user else f"ip:{client or '?'}"


def _slow_down(wait: float) -> JSONResponse:
    return error(429, "too many requests; slow down", {"Retry-After": str(max(1, math.ceil(wait)))})


GRADIO_CALLS = re.compile(r"/gradio_api/(?:call(?:/v2)?|run|api)/[^/]+/?$")
QUEUE_JOIN = re.compile(r"/gradio_api/queue/join/?$")
COMPONENT_SERVER = re.compile(r"/gradio_api/component_server/?$")


NO_GRADIO_API = "the Gradio API is off: scripts use the REST API under /api/v1 (its documentation: /api/v1/docs)"


class GradioCalls:
    """Pure ASGI middleware inside the Gradio app. Gradio's by-name call routes (``/gradio_api/call/<name>``, ...)
    are refused (404): the UI's events are no API (``hide_gradio_api``), REST is. Every Gradio event a signed-in
    user runs counts against the per-user rate limit REST uses (the same ``RateLimiter``), 429 over it: every
    ``/gradio_api/queue/join`` — public or private (``fn_index``), as the UI's own clicks and refreshes are. A timer's
    tick (and what it chains) counts against ``timer_limiter`` instead (``server.timer_rate_limit_per_minute``): an
    open page ticks on its own, and should not eat its user's budget for clicks."""

    def __init__(self, app, services: Services, limiter: RateLimiter, timer_limiter: RateLimiter,
                 timers: Callable[[int], bool]):
        self.app = app
        self.services = services
        self.limiter = limiter
        self.timer_limiter = timer_limiter
        self.timers = timers  # fn_index -> True for a timer's tick or an event chained to one

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and GRADIO_CALLS.search(scope.get("path", "")):
            return await error(404, NO_GRADIO_API)(scope, receive, send)
        auth = self.services.auth
        if scope["type"] != "http" or scope["method"] != "POST" or auth is None:
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        limiter = None
        if QUEUE_JOIN.search(path):
            body = await _read_body(receive, self.services.config.server.max_body_bytes)
            if body is None:
                return await error(413, "request body too large")(scope, receive, send)
            receive = _replay(body, receive)
            try:
                fn_index = json.loads(body).get("fn_index")
            except (ValueError, AttributeError):
                fn_index = None
            timer = isinstance(fn_index, int) and not isinstance(fn_index, bool) and self.timers(fn_index)
            limiter = self.timer_limiter if timer else self.limiter
        elif GRADIO_CALLS.search(path) or COMPONENT_SERVER.search(path):
            limiter = self.limiter
        if limiter is not None and limiter.per_minute > 0:
            user = await run_in_threadpool(auth.user_of, Request(scope, receive))
            wait = limiter.retry_after(limit_key(user, (scope.get("client") or ("?",))[0]))
            if wait is not None:
                return await _slow_down(wait)(scope, receive, send)
        return await self.app(scope, receive, send)


def timer_events(demo) -> Callable[[int], bool]:
    """fn_index -> True for an event a ``gr.Timer`` triggers: its tick, or an event chained (``.then``) to one."""
    import gradio as gr

    def timer(fn_index: int) -> bool:
        fn, seen = demo.fns.get(fn_index), {fn_index}
        while fn is not None and getattr(fn, "trigger_after", None) is not None and fn.trigger_after not in seen:
            seen.add(fn.trigger_after)
            fn = demo.fns.get(fn.trigger_after)  # a chained event: what started the chain decides
        if fn is None or not fn.targets:
            return False
        return all(event == "tick" and isinstance(demo.blocks.get(block), gr.Timer) for block, event in fn.targets)

    return timer


def hide_gradio_api(demo) -> None:
    """Take every event of the Blocks out of the Gradio API (its page, ``/gradio_api/info``, gradio_client): the
    UI's events take and return widgets, not data, and REST is the API for scripts. Call before mounting (Gradio
    reads the config then). The page's own calls still count against the per-user rate limit (``GradioCalls``)."""
    for fn in demo.fns.values():
        fn.api_visibility = "private"


def gradio_login(services: Services):
    """The check Gradio's ``/login`` calls: a coroutine, so Gradio awaits it, running scrypt in a worker
    thread instead of on the event loop. None when there are no passwords (local mode, HF sign-in)."""
    auth = services.auth
    if auth is None or auth.mode != "users":
        return None

    async def check(username: str, password: str) -> bool:
        return await run_in_threadpool(auth.login, username, password)

    return check


# ---- /api/v1 -----------------------------------------------------------------------------------------
class RestGuard:
    """Pure ASGI middleware for check 5 on the REST paths. Every other path passes untouched, as a bare ASGI call:
    wrapped in Starlette's ``BaseHTTPMiddleware``, Gradio's event stream sometimes missed a page's reload (its
    generator was closed instead of cancelled), and a reply went on generating, and was stored, for a page gone."""

    def __init__(self, app, services: Services, limiter: RateLimiter):
        self.app = app
        self.services = services
        self.limiter = limiter

    async def __call__(self, scope, receive, send):
        auth = self.services.auth
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX) or auth is None \
                or scope["path"] in PUBLIC_PATHS:
            return await self.app(scope, receive, send)
        request = Request(scope, receive)
        client = request.client.host if request.client else None
        name = basic_name(request.headers.get("authorization"))
        if name is not None:
            wait = auth.attempt(client, name)
            if wait is not None:
                return await _too_many(wait)(scope, receive, send)
        user = await run_in_threadpool(auth.user_of, request)  # Basic means scrypt: off the event loop
        if user and name is not None:
            auth.succeeded(client, name)
        wait = self.limiter.retry_after(limit_key(user, client))
        if wait is not None:
            return await _slow_down(wait)(scope, receive, send)
        if not user:
            return await error(401, "authentication required: HTTP Basic (name:password) or 'Authorization: "
                                    "Bearer <API token>'", {"WWW-Authenticate": 'Basic realm="RLHF Studio"'})(
                scope, receive, send)
        request.state.rlhf_user = user  # scope["state"]: the routes' requests read it
        return await self.app(scope, receive, send)


# ---- the whole guard ---------------------------------------------------------------------------------
def install_security(app: FastAPI, services: Services, limiter: RateLimiter) -> None:
    """Install the checks above on the parent app (call after every other middleware: the last one
    added runs first). Reads ``services.auth`` per request, so local mode (None) passes 4 and 5. ``limiter``: the
    per-user rate limit, shared with ``GradioCalls``."""
    config = services.config.server
    origins = check_origins(config.allowed_origins)

    app.add_middleware(RestGuard, services=services, limiter=limiter)
    app.add_middleware(LoginGuard, services=services)
    app.add_middleware(CORSMiddleware, allow_origins=origins, allow_credentials=True, allow_methods=["*"],
                       allow_headers=["*"], max_age=600)
    app.add_middleware(RequestPolicy, services=services, origins=origins)
    app.add_middleware(ForwardedHeaders, proxies=TrustedProxies(config.trusted_proxies))
