"""A thumb taken back (issue 34): an append-only withdrawal event, idempotent, honoured by every fold and snapshot."""
from __future__ import annotations

import pytest

from storage import InvalidInput, Store


def reply(store: Store, text: str = "a reply"):
    conv = store.create_conversation("assistant", "alice", messages=[{"role": "user", "content": "hi"}])
    return store.record_reply(store.leaf(conv.id).id, text, None)


def test_a_withdrawn_thumb_counts_as_none_and_the_events_stay(store):
    r = reply(store)
    first = store.record_rating(r.id, "alice", thumb=1, score=4)
    w = store.withdraw_rating(r.id, "alice")
    assert w is not None and w.rating_id == first.id and w.field == "thumb"
    assert store.effective_rating(r.id, "alice")["thumb"] is None
    assert store.effective_rating(r.id, "alice")["score"] == 4  # only the thumb is taken back
    assert store.count("ratings") == 1 and store.ratings_for(r.id)[0].withdrawn == ["thumb"]
    store.record_rating(r.id, "alice", thumb=-1)  # a new thumb after it counts again
    assert store.effective_rating(r.id, "alice")["thumb"] == -1


def test_withdrawing_twice_or_with_nothing_to_take_back_stores_nothing(store):
    r = reply(store)
    assert store.withdraw_rating(r.id, "alice") is None  # no thumb yet
    assert store.withdraw_rating(r.id, "nobody-knows-me") is None
    assert "nobody-knows-me" not in [a.name for a in store.list_annotators()]  # asking creates no one
    store.record_rating(r.id, "alice", thumb=1)
    assert store.withdraw_rating(r.id, "alice") is not None
    assert store.withdraw_rating(r.id, "alice") is None  # a double click
    assert store.count("rating_withdrawals") == 1


def test_only_the_annotators_own_latest_thumb_is_withdrawn(store):
    r = reply(store)
    store.record_rating(r.id, "alice", thumb=1)
    store.record_rating(r.id, "alice", thumb=-1)
    store.record_rating(r.id, "bob", thumb=1)
    store.withdraw_rating(r.id, "alice")
    # the withdrawn -1 is gone, and the earlier +1 does not come back: alice has no thumb now
    assert store.effective_rating(r.id, "alice")["thumb"] is None
    assert store.effective_rating(r.id, "bob")["thumb"] == 1


def test_a_score_can_be_withdrawn_too_but_nothing_else(store):
    r = reply(store)
    store.record_rating(r.id, "alice", score=2)
    store.withdraw_rating(r.id, "alice", field="score")
    assert store.effective_rating(r.id, "alice")["score"] is None
    with pytest.raises(InvalidInput, match="field must be one of"):
        store.withdraw_rating(r.id, "alice", field="note")
    user = store.get_message(r.parent_id)
    with pytest.raises(InvalidInput, match="only replies"):
        store.withdraw_rating(user.id, "alice")


def test_snapshots_count_and_freeze_withdrawals(store):
    r = reply(store)
    store.record_rating(r.id, "alice", thumb=1)
    before = store.feedback_watermark("assistant")
    assert "withdrawal_id" not in before  # a watermark without it means: no withdrawals yet
    store.withdraw_rating(r.id, "alice")
    after = store.feedback_watermark("assistant")
    assert after["withdrawal_id"] >= 1 and store.count_feedback_since("assistant", before) == 1
    frozen = store.feedback_rows("assistant", until=before)
    assert frozen["ratings"][0]["withdrawn"] == [] and frozen["withdrawals"] == []
    now = store.feedback_rows("assistant")
    assert now["ratings"][0]["withdrawn"] == ["thumb"]
    assert [(w["message_id"], w["annotator"], w["field"]) for w in now["withdrawals"]] == [(r.id, "alice", "thumb")]


def test_the_migration_adds_the_table_once(tmp_path):
    s = Store(tmp_path / "s.db")
    version = s.schema_version()
    s.close()
    again = Store(tmp_path / "s.db")
    assert "rating_withdrawals" in again.db.table_names() and again.schema_version() == version
    again.close()
