"""Who is calling: configured users (Gradio login, HTTP Basic, API tokens) or Hugging Face sign-in on Spaces.

``Auth`` answers ``user_of(request)`` and ``role_of(request)`` for a ``gr.Request`` (Gradio sets
``username`` after its login, or the OAuth session holds the HF profile) and for a Starlette/FastAPI
request (``Authorization: Basic ...``, ``Authorization: Bearer <token>`` or Gradio's sign-in cookie).
Password checks cost the same for unknown and known names, and at most a few run at once; failed
sign-ins are counted by ``LoginThrottle``. The request guard that uses all this is ``ui.request_guard``; role
checks stay in the handlers (``ui.permissions.require_admin``).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from typing import Any, Optional

import gradio as gr

from rlhf.config import AppConfig
from storage import Store
from storage.credentials import hash_password, verify_password
from ui.permissions import Forbidden, current_user
from ui.services import Services
from ui.throttles import LoginThrottle, NameBackoff, login_keys
from ui.users import AuthConfigError, configured_users, sync_users

log = logging.getLogger(__name__)

VERIFIED_TTL = 300.0  # seconds a successful Basic login is remembered (scrypt costs ~50 ms per check)
# scrypt is CPU-bound: a flood of sign-ins may keep at most half the cores busy, the rest keep serving.
PASSWORD_CHECKS = max(1, (os.cpu_count() or 2) // 2)


# ---- the Auth object ------------------------------------------------------------------------------
def basic_name(header: Optional[str]) -> Optional[str]:
    """The user name in an ``Authorization: Basic`` header (before any password check), or None."""
    scheme, _, value = (header or "").strip().partition(" ")
    if scheme.lower() != "basic" or not value.strip():
        return None
    try:
        name, sep, _ = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return name if sep else None


def _gradio_cookie_user(request: Any) -> Optional[str]:
    """The user Gradio's sign-in cookie names, for a plain request routed inside the Gradio app (its
    ``scope["app"]`` holds the cookie ids and tokens Gradio handed out at /login), else None."""
    scope = getattr(request, "scope", None)
    app = scope.get("app") if isinstance(scope, dict) else None
    tokens, cookie_id = getattr(app, "tokens", None), getattr(app, "cookie_id", None)
    if not isinstance(tokens, dict) or cookie_id is None:
        return None
    cookies = getattr(request, "cookies", None) or {}
    token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
    return tokens.get(token) if token else None


def _session(request: Any) -> dict:
    """The signed cookie session of a request (where Gradio keeps the HF OAuth profile), or {}."""
    for candidate in (getattr(request, "request", None), request):
        if candidate is None or isinstance(candidate, gr.Request):
            continue
        try:
            session = candidate.session  # Starlette asserts when no SessionMiddleware is installed
        except (AssertionError, AttributeError, KeyError):
            continue
        if isinstance(session, dict):
            return session
    return {}


class Auth:
    """Users and roles: ``mode`` is 'users' (configured names and passwords) or 'hf' (Hugging Face sign-in)."""

    def __init__(self, store: Store, mode: str, roles: Optional[dict[str, str]] = None, admins=(),
                 throttle: Optional["LoginThrottle"] = None, backoff: Optional["NameBackoff"] = None):
        if mode not in ("users", "hf"):
            raise ValueError(f"unknown auth mode {mode!r}")
        self.store = store
        self.mode = mode
        self.roles = dict(roles or {})
        self.admins = {a.strip() for a in admins if a and a.strip()}
        self.throttle = throttle or LoginThrottle(10, 600.0)
        self.backoff = backoff or NameBackoff(20, 60.0, 600.0)
        self._key = secrets.token_bytes(32)  # per process: remembered logins die with it
        self._verified: dict[bytes, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._checks = threading.BoundedSemaphore(PASSWORD_CHECKS)
        self._dummy: Optional[str] = None  # a hash to check unknown names against, made on first need

    @classmethod
    def from_config(cls, config: AppConfig, store: Store) -> Optional["Auth"]:
        """Auth for this config, or None for single-user local mode (no users, not on a Space)."""
        users = configured_users(config)
        server = config.server
        throttle = LoginThrottle(server.login_max_failures, server.login_window_seconds)
        backoff = NameBackoff(server.login_name_failures, server.login_max_backoff_seconds, server.login_window_seconds)
        if users:
            sync_users(store, users)
            auth = cls(store, "users", {u["name"]: u["role"] for u in users}, config.server.admins, throttle, backoff)
            auth._dummy_hash()  # made now, so the first unknown name is not slower than the rest
            return auth
        store.clear_passwords_except([])
        if config.server.space_id:
            check_session_secret()
            check_real_space(config)
            return cls(store, "hf", admins=config.server.admins, throttle=throttle)
        return None

    @property
    def hf_sign_in(self) -> bool:
        return self.mode == "hf"

    def describe(self) -> str:
        """One line for the UI header."""
        if self.mode == "users":
            return f"team mode: {len(self.roles)} configured user(s), sign-in required"
        return "Hugging Face sign-in: signed-in users annotate" + (
            f"; admins: {', '.join(sorted(self.admins))}" if self.admins else "; no admins configured (RLHF_ADMINS)")

    # -- counting sign-in attempts (ui.request_guard calls these around every password check)
    def attempt(self, client: Optional[str], name: str) -> Optional[float]:
        """Before a password check: None to go ahead (a failure is reserved, per address, per name from that address
        and per name), else the seconds until this client may try this name again."""
        wait = self.backoff.attempt(name, client)
        if wait is not None:
            return wait
        wait = self.throttle.attempt(login_keys(client, name))
        if wait is not None:
            self.backoff.release(name)
        return wait

    def succeeded(self, client: Optional[str], name: str) -> None:
        """After a right password: take the reserved failures back; this address is now known for this name."""
        self.throttle.succeeded(login_keys(client, name))
        self.backoff.succeeded(name, client)

    # -- credentials
    def login(self, username: str, password: str) -> bool:
        """Check a name and password (Gradio's login form and HTTP Basic).

        Blocking (scrypt, ~50 ms): call it from a worker thread. An unknown name costs one check against a
        dummy hash, so the answer time does not tell which names exist.
        """
        if self.mode != "users" or not isinstance(username, str) or not isinstance(password, str):
            return False
        known = username in self.roles
        cache_key = hmac.new(self._key, f"{username}\x00{password}".encode(), hashlib.sha256).digest()
        now = time.monotonic()
        with self._lock:
            hit = self._verified.get(cache_key)
            if known and hit and hit[1] > now:
                return True
        stored = self.store.password_hash(username[:128])  # read for unknown names too: same work, same time
        with self._checks:
            ok = verify_password(password, stored if stored else self._dummy_hash())
        if not (known and stored and ok):
            return False
        with self._lock:
            if len(self._verified) > 10_000:
                self._verified.clear()
            self._verified[cache_key] = (username, now + VERIFIED_TTL)
        return True

    def _dummy_hash(self) -> str:
        with self._lock:
            if self._dummy is None:
                self._dummy = hash_password(secrets.token_urlsafe(16))
            return self._dummy

    def from_header(self, header: Optional[str]) -> Optional[str]:
        """The user an ``Authorization`` header proves (Basic name:password or Bearer API token), or None."""
        if not header:
            return None
        scheme, _, value = header.strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and value:
            name = self.store.token_owner(value)
            return name if name is not None and self.role_for(name) is not None else None
        if scheme.lower() == "basic" and value:
            try:
                decoded = base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return None
            name, sep, password = decoded.partition(":")
            return name if sep and self.login(name, password) else None
        return None

    # -- the hooks ui.permissions calls
    def user_of(self, request: Any) -> Optional[str]:
        """The signed-in user of a Gradio or REST request, or None."""
        if request is None:
            return None
        if isinstance(request, gr.Request):
            name = getattr(request, "username", None)
            if name:
                return name if self.role_for(name) is not None else None
        else:
            state = getattr(request, "state", None)
            name = getattr(state, "rlhf_user", None) if state is not None else None
            if name:
                return name
            headers = getattr(request, "headers", None)
            name = self.from_header(headers.get("authorization") if headers is not None else None)
            if name:
                return name
            name = _gradio_cookie_user(request)
            if name and self.role_for(name) is not None:
                return name
        if self.mode == "hf":
            profile = (_session(request).get("oauth_info") or {}).get("userinfo") or {}
            return profile.get("preferred_username") or None
        return None

    def role_for(self, name: Optional[str]) -> Optional[str]:
        """A user's role: configured (RLHF_ADMINS may promote a configured user), or on Spaces admin when
        listed, else annotator. None for nobody, and for names that are not configured users."""
        if not name:
            return None
        if self.mode == "users":
            role = self.roles.get(name)
            return "admin" if role is not None and name in self.admins else role
        return "admin" if name in self.admins else "annotator"

    def role_of(self, request: Any) -> Optional[str]:
        return self.role_for(self.user_of(request))


def check_session_secret() -> None:
    """Refuse Hugging Face sign-in without a session secret.

    Gradio signs the HF sign-in session cookie with a key derived from ``OAUTH_CLIENT_SECRET`` (read once, when
    Gradio is imported), and with an empty one anyone can sign a cookie naming any user, admins included. A Space
    with ``hf_oauth: true`` sets it; an unset ``${VAR}`` in a compose file gives exactly the empty string.
    """
    from gradio import oauth

    if not (oauth.OAUTH_CLIENT_SECRET or "").strip():
        raise AuthConfigError("Hugging Face sign-in (SPACE_ID is set) needs OAUTH_CLIENT_SECRET: without it anyone "
                              "could forge a signed-in session, admins included. Enable `hf_oauth: true` in the "
                              "Space's README front matter (it sets the OAuth variables), or set OAUTH_CLIENT_SECRET "
                              "to the OAuth app's secret; refusing to start.")


def check_real_space(config: AppConfig) -> None:
    """Refuse Hugging Face sign-in where Gradio would fake it.

    Outside a real Space (Gradio's test: ``SYSTEM=spaces``) Gradio mocks OAuth: every visitor who clicks *Sign in* is
    signed in as the HF user of the machine the app runs on, an admin when that name is in ``server.admins``. Only
    ``server.insecure_hf_sign_in_off_space`` lets it start that way, and never with admins.
    """
    from gradio.utils import get_space

    if get_space() is not None:
        return
    if not config.server.insecure_hf_sign_in_off_space:
        raise AuthConfigError("SPACE_ID is set but this is not a Hugging Face Space (SYSTEM is not 'spaces'): here "
                              "Gradio would sign every visitor in as this machine's HF user. Unset SPACE_ID and "
                              "configure users (server.users) for a team server, or, only to try the sign-in page on "
                              "your own machine, set server.insecure_hf_sign_in_off_space; refusing to start.")
    if config.server.admins:
        raise AuthConfigError("server.insecure_hf_sign_in_off_space with server.admins: every visitor would be signed "
                              "in as this machine's HF user and could be an admin; remove the admins; refusing to "
                              "start.")
    log.warning("HF sign-in OFF a Space (server.insecure_hf_sign_in_off_space): every visitor is signed in as this "
                "machine's Hugging Face user. Never expose this server.")


def signed_in_annotator(services: Services, request: Any, typed: Optional[str]) -> Optional[str]:
    """Who a write is attributed to: the signed-in user when auth is on (Forbidden when nobody is), else
    the name typed in the UI (None when blank)."""
    if services.auth is None:
        return (typed or "").strip() or None
    name = current_user(services, request)
    if not name:
        raise Forbidden("sign in first: ratings are stored under your name")
    return name
