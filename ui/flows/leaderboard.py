"""The leaderboard every reader sees (REST, the Arena tab, the dashboard, the arena's pairing): excluded
annotators' votes left out, computed once per vote on one background thread, and shared.

A full leaderboard costs seconds of CPU (``arena.BOOTSTRAP_ROUNDS`` Bradley–Terry and style-controlled fits). It
depends only on the counted votes, who is excluded and the versions' statuses, so it is cached under exactly that
key (the newest vote's id stands for the votes: they are append-only). A reader whose key is not cached waits for the
one fit of that key, which runs on the ``Leaderboards`` worker thread: however many callers ask, at most one fit
runs at a time and each distinct state of the votes is fitted once.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import pandas as pd

from rlhf.analysis import arena
from storage import Comparison, Policy, Store
from ui.views.arena import leaderboard_json as json_rows

KEEP = 64  # cached tables kept (a few per agent: the readers ask for 2-3 variants)


def counted_votes(store: Store, agent_id: int, with_text: bool = False) -> list[Comparison]:
    """The comparisons a leaderboard rates: the counted set (``Store.list_comparisons``) minus excluded annotators'."""
    excluded = {a.id for a in store.list_annotators() if a.excluded}
    return [c for c in store.list_comparisons(agent_id, with_text=with_text) if c.annotator_id not in excluded]


class Leaderboards:
    """Leaderboard tables per agent, cached per vote and fitted on one worker thread."""

    def __init__(self, store: Store):
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leaderboard")
        self._tables: dict[tuple, Future] = {}
        self._lock = threading.Lock()

    def _key(self, agent_id: int, policies: list[Policy], n_boot: int, with_text: bool) -> tuple:
        excluded = tuple(sorted(a.id for a in self.store.list_annotators() if a.excluded))
        versions = tuple((p.id, p.status) for p in policies)
        return agent_id, n_boot, with_text, self.store.vote_mark(), excluded, versions

    def table(self, agent: int | str | None, n_boot: int = arena.BOOTSTRAP_ROUNDS,
              with_text: bool = True) -> pd.DataFrame:
        """The leaderboard of an agent's versions (``arena.board``'s columns); ``with_text`` adds style control."""
        agent_id = self.store.get_agent(agent).id
        policies = self.store.list_policies(agent_id)
        key = self._key(agent_id, policies, n_boot, with_text)
        with self._lock:
            future = self._tables.get(key)
            if future is None or (future.done() and future.exception() is not None):
                future = self._pool.submit(self._fit, agent_id, policies, n_boot, with_text)
                self._tables[key] = future
                while len(self._tables) > KEEP:
                    self._tables.pop(next(iter(self._tables)))
        return future.result().copy()

    def _fit(self, agent_id: int, policies: list[Policy], n_boot: int, with_text: bool) -> pd.DataFrame:
        return arena.board(counted_votes(self.store, agent_id, with_text), policies, n_boot=n_boot)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def leaderboard_json(boards: Leaderboards, agent: Optional[str]) -> list[dict]:
    """GET /leaderboard: the rows as JSON-safe dicts."""
    return json_rows(boards.table(agent))
