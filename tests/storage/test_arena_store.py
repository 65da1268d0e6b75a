"""Store reads for the arena and dashboard: the vote of a pair, feedback volume per hour."""
from __future__ import annotations

import pytest

from storage import NotFound, Store


def reply_pair(store: Store, text="hi"):
    conv = store.create_conversation("assistant", source="arena", messages=[{"role": "user", "content": text}])
    user = store.leaf(conv.id)
    policy = store.active_policy("assistant").id
    return store.record_reply(user.id, "one", policy), store.record_reply(user.id, "two", policy)


def test_arena_vote_is_none_until_voted_then_the_first_vote(store):
    a, b = reply_pair(store)
    pair = store.create_arena_pair("assistant", a.id, b.id)
    assert store.arena_vote(pair.id) is None
    first = store.vote_arena_pair(pair.id, "b", "alice")
    store.vote_arena_pair(pair.id, "a", "alice")  # a second vote stores nothing
    vote = store.arena_vote(pair.id)
    assert vote.id == first.id and vote.winner == "b" and vote.message_b_id == b.id
    with pytest.raises(NotFound):
        store.arena_vote("no-such-pair")


def test_feedback_volume_counts_ratings_and_comparisons_per_hour(store):
    a, b = reply_pair(store)
    store.record_rating(a.id, "alice", thumb=1)
    store.record_rating(b.id, "alice", thumb=-1)
    store.record_comparison(a.id, b.id, "a", "alice")
    other = store.create_agent("other", "", "tiny")
    conv = store.create_conversation(other.id, messages=[{"role": "user", "content": "x"}])
    store.record_rating(store.record_reply(store.leaf(conv.id).id, "r", None).id, thumb=1)  # not counted
    # Pin the timestamps (only the Store speaks SQL in the app; a test may set up the file directly).
    store.db.execute("UPDATE ratings SET created = '2024-01-02T03:04:05.000+00:00' WHERE message_id = ?", [b.id])
    store.db.execute("UPDATE ratings SET created = '2024-01-02T05:59:59.999+00:00' WHERE message_id != ?", [b.id])
    store.db.execute("UPDATE comparisons SET created = '2024-01-02T05:00:00.000+00:00'")
    store.db.conn.commit()
    assert store.feedback_volume("assistant") == [{"hour": "2024-01-02T03", "kind": "ratings", "n": 1},
                                                  {"hour": "2024-01-02T05", "kind": "comparisons", "n": 1},
                                                  {"hour": "2024-01-02T05", "kind": "ratings", "n": 1}]
    assert store.feedback_volume(other.id) == [{"hour": "2024-01-02T05", "kind": "ratings", "n": 1}]
