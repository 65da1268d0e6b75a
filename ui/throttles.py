"""Counting requests and sign-ins: the per-user rate limit, failed sign-ins per key, a capped backoff per name."""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Optional

class RateLimiter:
    """At most ``per_minute`` requests per key in any sliding 60 s window."""

    def __init__(self, per_minute: int, window: float = 60.0):
        self.per_minute = per_minute
        self.window = window
        self._hits: dict[str, deque] = {}
        self._lock = threading.Lock()

    def retry_after(self, key: str, now: Optional[float] = None) -> Optional[float]:
        """Count a request; None when allowed, else seconds until the oldest request leaves the window."""
        if self.per_minute <= 0:
            return None
        now = time.monotonic() if now is None else now
        with self._lock:
            hits = self._hits.setdefault(key, deque())
            while hits and hits[0] <= now - self.window:
                hits.popleft()
            if len(hits) >= self.per_minute:
                return max(0.0, hits[0] + self.window - now)
            hits.append(now)
            if len(self._hits) > 10_000:  # forget idle keys
                self._hits = {k: v for k, v in self._hits.items() if v and v[-1] > now - self.window}
            return None


class LoginThrottle:
    """Failed sign-ins per key (a client address, a user name) in a sliding window.

    ``attempt`` counts an attempt as failed *before* the password is checked, and ``succeeded`` takes that
    back: parallel guesses cannot overshoot the limit, and while a key is over it every attempt, right or
    wrong, gets the same answer (the check never runs, so the answer says nothing about the password).
    """

    def __init__(self, max_failures: int, window: float):
        self.max_failures = max_failures
        self.window = window
        self._fails: dict[str, deque] = {}
        self._lock = threading.Lock()

    def attempt(self, keys: list[str], now: Optional[float] = None) -> Optional[float]:
        """Reserve a failure under every key; None to go ahead, else seconds until the lock-out lifts."""
        if self.max_failures <= 0:
            return None
        now = time.monotonic() if now is None else now
        with self._lock:
            if len(self._fails) > 10_000:  # forget idle keys
                self._fails = {k: v for k, v in self._fails.items() if v and v[-1] > now - self.window}
            queues = [self._fails.setdefault(k, deque()) for k in keys]
            for q in queues:
                while q and q[0] <= now - self.window:
                    q.popleft()
            full = [q[0] + self.window - now for q in queues if len(q) >= self.max_failures]
            if full:
                return max(full)
            for q in queues:
                q.append(now)
            return None

    def succeeded(self, keys: list[str]) -> None:
        """Take back the failure ``attempt`` reserved: the password was right."""
        if self.max_failures <= 0:
            return
        with self._lock:
            for k in keys:
                q = self._fails.get(k)
                if q:
                    q.pop()


class NameBackoff:
    """Failed sign-ins for one user name from anywhere: after ``free`` of them within ``window`` seconds, each further
    attempt for that name waits 1, 2, 4, ... seconds after the last failure, at most ``max_wait``.

    Guesses spread over many addresses (which the per-address throttle cannot see as one) slow down to one per
    ``max_wait``. The owner is never locked out for good: the wait is capped, a right password resets the count,
    and an address the name signed in from before is not held back by the name's count at all.
    """

    KNOWN_PER_NAME = 16

    def __init__(self, free: int, max_wait: float, window: float):
        self.free = free
        self.max_wait = max_wait
        self.window = window
        self._fails: dict[str, deque] = {}
        self._known: dict[str, deque] = {}
        self._lock = threading.Lock()

    def _on(self, name: Optional[str]) -> bool:
        return self.free > 0 and bool(name)

    def attempt(self, name: Optional[str], client: Optional[str], now: Optional[float] = None) -> Optional[float]:
        """None to go ahead (a failure is reserved under the name), else seconds to wait."""
        if not self._on(name):
            return None
        name = name.strip()[:128]
        now = time.monotonic() if now is None else now
        with self._lock:
            if len(self._fails) > 10_000:  # forget idle names
                self._fails = {k: v for k, v in self._fails.items() if v and v[-1] > now - self.window}
            q = self._fails.setdefault(name, deque())
            while q and q[0] <= now - self.window:
                q.popleft()
            if len(q) >= self.free and client not in self._known.get(name, ()):
                wait = q[-1] + min(self.max_wait, 2.0 ** (len(q) - self.free)) - now
                if wait > 0:
                    return wait
            q.append(now)
            return None

    def release(self, name: Optional[str]) -> None:
        """Take back the failure ``attempt`` reserved (the attempt was refused elsewhere, nothing was checked)."""
        if self._on(name):
            with self._lock:
                q = self._fails.get(name.strip()[:128])
                if q:
                    q.pop()

    def succeeded(self, name: Optional[str], client: Optional[str]) -> None:
        """A right password: the name's count starts again, and ``client`` is known for it."""
        if not self._on(name):
            return
        name = name.strip()[:128]
        with self._lock:
            self._fails.pop(name, None)
            if len(self._known) > 10_000:
                self._known.clear()
            known = self._known.setdefault(name, deque(maxlen=self.KNOWN_PER_NAME))
            if client not in known:
                known.append(client)


def login_keys(client: Optional[str], name: str) -> list[str]:
    """The throttle keys of one sign-in attempt: the client address, and the user name *from that address*.

    No key is the name alone: counted from every address, wrong guesses by anyone would lock its owner out.
    """
    return [f"ip:{client or '?'}", f"user:{name.strip()[:128]}@{client or '?'}"]
