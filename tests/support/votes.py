"""Votes a test needs before a retrain is allowed: n conversations, each with a preferred and a worse reply."""
from __future__ import annotations


def seed_pairs(store, n: int = 16) -> None:
    for i in range(n):
        conv = store.create_conversation("assistant", "ann", messages=[{"role": "user", "content": f"q{i}"}])
        user = store.leaf(conv.id)
        a, b = store.record_reply(user.id, "good, thanks", 1), store.record_reply(user.id, "bad", 1)
        store.record_comparison(a.id, b.id, "a", "ann")
