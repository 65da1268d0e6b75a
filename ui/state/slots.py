"""A fair share of the model: at most ``server.max_replies_per_user`` replies of one person generate at once, and
every reply still generating can be cancelled at once (shutdown).

``begin_reply`` (``ui.flows.chat``) starts every chat, regeneration and arena reply through ``ReplySlots.start``,
keyed by the conversation's owner, so REST and the Gradio tabs share one count per person. A reply holds its slot
until it ends or is cancelled (``ReplyStream.finished_at`` / ``cancelled``). Local mode is one person: no cap.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

from storage import StoreError

RETRY_AFTER = 2.0  # seconds: about one short reply


class TooManyReplies(StoreError):
    """This person already has their share of replies generating (nothing was started or stored)."""

    status = 429

    def __init__(self, who: str, limit: int):
        super().__init__(f"{who} already has {limit} replies being generated; wait for one to end, then retry "
                         f"(server.max_replies_per_user)")
        self.retry_after = RETRY_AFTER


def _open(stream) -> bool:
    return stream.finished_at is None and not stream.cancelled


class ReplySlots:
    """Replies generating per person, capped at ``per_user`` (0 = no cap)."""

    def __init__(self, per_user: int = 0):
        self.per_user = per_user
        self._streams: dict[Optional[str], list] = {}
        self._reserved: dict[Optional[str], int] = {}
        self._lock = threading.Lock()

    def start(self, who: Optional[str], begin: Callable):
        """``begin()`` (which starts one reply and returns its stream) under ``who``'s cap; TooManyReplies when they
        have ``per_user`` replies generating already. ``who`` None (nobody signed in) is not capped."""
        with self._lock:
            live = [s for s in self._streams.get(who, []) if _open(s)]
            self._streams[who] = live
            if self.per_user and who is not None and len(live) + self._reserved.get(who, 0) >= self.per_user:
                raise TooManyReplies(who, self.per_user)
            self._reserved[who] = self._reserved.get(who, 0) + 1
        try:
            stream = begin()
        finally:
            with self._lock:
                self._reserved[who] -= 1
        with self._lock:
            self._streams.setdefault(who, []).append(stream)
        return stream

    def cancel_all(self) -> int:
        """Cancel every reply still generating (at shutdown); how many were."""
        with self._lock:
            live = [s for streams in self._streams.values() for s in streams if _open(s)]
            self._streams = {}
        for stream in live:
            stream.cancel()
        return len(live)
