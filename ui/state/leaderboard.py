"""The leaderboard every reader sees (REST, the Arena tab, the dashboard, the arena's pairing): excluded
annotators' votes left out, refitted in the background, and shared. Nobody waits for a refit.

A full leaderboard costs seconds of CPU (``arena.BOOTSTRAP_ROUNDS`` Bradley–Terry and style-controlled fits; 11–13 s
at 2,000 votes). It depends only on the counted votes, who is excluded and the versions' statuses. A reader gets
the last table fitted for its agent at once; when the votes moved since, it asks for a refit, which runs on the
``Leaderboards`` worker thread. Each agent has at most one refit queued or running, started at most once every
``server.leaderboard_refit_seconds``; a refit fits every stale table of its agent (the arena pairing's cheap one
first) from the votes as they are when it starts, so many votes during a fit cause one more fit, not one each. A
refit whose counted votes are what the table was fitted on (a vote flipped and flipped back) fits nothing. Only the
very first table of an agent is waited for (there is nothing to serve before it), and it is fitted on the reader's
own thread, so the arena's pairing never queues behind another table's fit.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import pandas as pd

from rlhf.analysis import arena
from storage import Comparison, Store
from ui.views.arena import leaderboard_json as json_rows

log = logging.getLogger(__name__)


def counted_votes(store: Store, agent_id: int, with_text: bool = False) -> list[Comparison]:
    """The comparisons a leaderboard rates: the counted set (``Store.list_comparisons``) minus excluded annotators'."""
    excluded = {a.id for a in store.list_annotators() if a.excluded}
    return [c for c in store.list_comparisons(agent_id, with_text=with_text) if c.annotator_id not in excluded]


@dataclass
class _Slot:
    """One table of an agent (per ``n_boot`` and style control): the last fit, the state it answers, and the first
    fit while readers wait for it."""

    table: Optional[pd.DataFrame] = None
    mark: Optional[tuple] = None  # the cheap state it answers: newest vote id, excluded annotators, versions
    content: Optional[tuple] = None  # what it was fitted on: the counted votes and the versions' statuses
    first: Optional[Future] = None


class Leaderboards:
    """Leaderboard tables per agent, served at once and refitted in the background (see the module docstring)."""

    def __init__(self, store: Store, refit_seconds: float = 5.0, fit=arena.board):
        """``fit(votes, policies, n_boot=...)``: what fits a table (``arena.board``; this instance's own, so that
        whoever watches or holds its fits sees no other instance's)."""
        self.store = store
        self._fit = fit
        self.refit_seconds = max(0.0, float(refit_seconds))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leaderboard")
        self._slots: dict[tuple, _Slot] = {}
        self._pending: set[int] = set()  # agents with a refit queued or running
        self._started: dict[int, float] = {}  # agent id -> when its last refit started (monotonic)
        self._timers: list[threading.Timer] = []
        self._lock = threading.Lock()
        self._closed = False

    def _mark(self, agent_id: int) -> tuple:
        excluded = tuple(sorted(a.id for a in self.store.list_annotators() if a.excluded))
        versions = tuple((p.id, p.status) for p in self.store.list_policies(agent_id))
        return self.store.vote_mark(), excluded, versions

    def table(self, agent: int | str | None, n_boot: int = arena.BOOTSTRAP_ROUNDS, with_text: bool = True,
              fresh: bool = False) -> pd.DataFrame:
        """The leaderboard of an agent's versions (``arena.board``'s columns); ``with_text`` adds style control.
        The last table fitted, at once (a refit follows in the background when the votes moved); ``fresh``: the
        table of the votes as they are now, fitted on this thread if need be (scripts that must see a vote)."""
        agent_id = self.store.get_agent(agent).id
        spec = (agent_id, n_boot, with_text)
        mark = self._mark(agent_id)
        with self._lock:
            slot = self._slots.setdefault(spec, _Slot())
            if slot.table is not None and (slot.mark == mark or not fresh):
                if slot.mark != mark:
                    self._schedule(agent_id)
                return slot.table.copy()
            first, mine = slot.first, slot.first is None or fresh
            if mine:
                first = slot.first = Future()
        if mine:
            try:
                self._refresh(spec)
                first.set_result(None)
            except BaseException as exc:
                first.set_exception(exc)
                raise
            finally:
                with self._lock:
                    slot.first = None
        else:
            first.result()
        with self._lock:
            return slot.table.copy()

    def _schedule(self, agent_id: int) -> None:
        """Queue the agent's refit unless one is queued or running (call under the lock)."""
        if agent_id in self._pending or self._closed:
            return
        self._pending.add(agent_id)
        last = self._started.get(agent_id)
        wait = 0.0 if last is None else last + self.refit_seconds - time.monotonic()
        if wait <= 0:
            self._pool.submit(self._refit, agent_id)
            return
        timer = threading.Timer(wait, self._submit, args=(agent_id,))
        timer.daemon = True
        self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    def _submit(self, agent_id: int) -> None:
        with self._lock:
            if not self._closed:
                self._pool.submit(self._refit, agent_id)

    def _refit(self, agent_id: int) -> None:
        """Fit every stale table of the agent from the votes as they are now (cheap tables first)."""
        with self._lock:
            specs = sorted((s for s in self._slots if s[0] == agent_id and self._slots[s].table is not None),
                           key=lambda s: s[1])
        try:
            for spec in specs:
                self._refresh(spec)
        except Exception:  # a failed refit leaves the last table served; the next reader asks again
            log.exception("leaderboard refit of agent %s failed", agent_id)
        finally:
            with self._lock:
                self._pending.discard(agent_id)

    def _refresh(self, spec: tuple) -> None:
        """Bring one table up to the current votes: fit only when what it rates changed."""
        agent_id, n_boot, with_text = spec
        with self._lock:
            self._started[agent_id] = time.monotonic()
        mark = self._mark(agent_id)  # read first: a vote during the fit leaves the table stale, to be fitted again
        policies = self.store.list_policies(agent_id)
        votes = counted_votes(self.store, agent_id, with_text)
        content = (tuple((c.message_a_id, c.message_b_id, c.policy_a_id, c.policy_b_id, c.winner, c.annotator_id)
                         for c in votes), tuple((p.id, p.status) for p in policies))
        slot = self._slots[spec]
        if slot.table is None or slot.content != content:
            table = self._fit(votes, policies, n_boot=n_boot)
            with self._lock:
                slot.table, slot.content = table, content
        with self._lock:
            slot.mark = mark

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for timer in self._timers:
                timer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


def leaderboard_json(boards: Leaderboards, agent: Optional[str]) -> list[dict]:
    """GET /leaderboard: the rows as JSON-safe dicts."""
    return json_rows(boards.table(agent))
