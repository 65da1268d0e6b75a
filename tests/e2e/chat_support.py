"""What the Chat-tab browser tests share besides the page steps in ``browser.py``: reading the Store the way the
assertions need it, and holding a turn back so that it is still in flight while a test acts."""
from __future__ import annotations

import os
import signal

from storage import Store
from tests.e2e.app_process import TEST_APP, AppProcess, wait_until, write_config

LONG = 1024  # tokens: a reply that streams for seconds on the tiny model


def one_reply_at_a_time(root, tiny_model_dir):
    """A module fixture's body: the app on ``root`` decoding one reply at a time (first come, first served: what
    ``EngineHeld`` lets through is answered in the order it was sent) and a Store on its database."""
    config = write_config(root / "app.yaml", TEST_APP, {"serving": {"max_batch_size": 1}})
    with AppProcess(root / "data", tiny_model_dir, config) as app:
        store = Store(root / "data" / "studio.db")
        yield app, store
        store.close()


def user_message(store: Store, text: str):
    """The stored user message with this text (the newest one), or None."""
    rows = store.db.query("SELECT id FROM messages WHERE role = 'user' AND content = ? ORDER BY id DESC LIMIT 1",
                          [text])
    row = next(iter(rows), None)
    return store.get_message(row["id"]) if row else None


def replies_to(store: Store, message_id: int) -> list:
    rows = store.db.query("SELECT id FROM messages WHERE parent_id = ? AND role = 'assistant' ORDER BY id",
                          [message_id])
    return [store.get_message(r["id"]) for r in rows]


def rating(store: Store, message_id: int, name) -> tuple:
    """(thumb, score, flags, note) of one annotator's labels on a reply, as the Store folds them."""
    r = store.effective_rating(message_id, name) or {}
    return r.get("thumb"), r.get("score"), r.get("flags") or [], r.get("note")


def rating_rows(store: Store, name: str) -> list[tuple]:
    """Every rating event stored under a name: (message id, thumb, score, flags JSON, note)."""
    return [tuple(r) for r in store.db.execute(
        """SELECT r.message_id, r.thumb, r.score, r.flags, r.note FROM ratings r JOIN annotators a
           ON a.id = r.annotator_id WHERE a.name = ? ORDER BY r.id""", [name]).fetchall()]


class EngineHeld:
    """The app's engine process stopped (SIGSTOP) for the block, continued (SIGCONT) when it ends: a turn sent
    meanwhile is in flight (queued, "Generating") and cannot get a single token before the block ends, however fast
    or loaded the machine is. Requests and cancels sent meanwhile wait in the engine's socket and are read, in
    order, once it runs again (one reply at a time, ``serving.max_batch_size: 1``, keeps first come first served)."""

    def __init__(self, app: AppProcess):
        self.app, self.pids = app, []

    def __enter__(self):
        self.pids = wait_until(self.app.engine_pids, 60, "the app's engine process")
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
