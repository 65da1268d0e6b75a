"""What the Chat-tab browser tests share besides the page steps in ``browser.py``: reading the Store the way the
assertions need it, and holding a turn back so that it is still streaming while a test acts."""
from __future__ import annotations

import threading

from storage import Store
from tests.e2e.app_process import TEST_APP, AppProcess, write_config

LONG = 1024  # tokens: a reply that streams for seconds on the tiny model


def one_reply_at_a_time(root, tiny_model_dir):
    """A module fixture's body: the app on ``root`` decoding one reply at a time (so replies queued ahead of a
    turn hold it back for as long as a test needs) and a Store on its database."""
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


class QueuedAhead:
    """Long REST replies streaming (and queued) ahead of whatever the browser sends next: with one reply decoding
    at a time (``serving.max_batch_size: 1``), the browser's turn waits behind them, however fast the engine is,
    until the block ends. Leaving closes their connections, which cancels them (nothing stored)."""

    def __init__(self, app, n: int = 12):
        self.app, self.n, self.stop, self.threads, self.started = app, n, threading.Event(), [], threading.Semaphore(0)

    def _one(self, i: int) -> None:
        import httpx

        body = {"messages": [{"role": "user", "content": f"hold the line {i}"}], "max_new_tokens": LONG,
                "annotator": "queue-filler"}
        with httpx.Client(timeout=120) as client, client.stream("POST", self.app.api + "/chat/stream", json=body) as r:
            self.started.release()
            for _ in r.iter_lines():
                if self.stop.is_set():
                    return

    def __enter__(self):
        for i in range(self.n):
            self.threads.append(threading.Thread(target=self._one, args=(i,), daemon=True))
            self.threads[-1].start()
        for _ in range(self.n):
            assert self.started.acquire(timeout=60), "a queued-ahead reply never started"
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
