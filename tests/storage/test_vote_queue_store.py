"""The vote queue in the Store: items, one showing per annotator, overlap, leases, expiry, excluded annotators,
and that a queue vote is an ordinary comparison the reward model's data builder reads."""
from __future__ import annotations

import sqlite3

import pytest
from sqlite_utils import Database

from rlhf.training.data import build_pairs
from storage import Conflict, InvalidInput, NotFound, Store
from storage.migrations import MIGRATIONS

LEASE = 600.0


def first(candidates):
    """A chooser that takes the oldest candidate."""
    return (candidates[0]["id"], "random") if candidates else None


def show(store: Store, item_id: int, annotator, excluded=()) -> None:
    """Hand ``item_id`` to ``annotator`` through the queue (a vote needs the item to have been shown)."""
    got = store.next_queue_item("assistant", annotator, lambda c: (item_id, "random"), LEASE, excluded)
    assert got is not None and got[0].id == item_id


def make_items(store: Store, n: int, overlap_every: int = 0, ttl: float = 3600.0, prefix: str = "q") -> list:
    policy = store.active_policy("assistant").id
    return [store.create_queue_item("assistant", [{"role": "user", "content": f"{prefix} {i}?"}],
                                    [{"content": f"answer one {i}", "policy_id": policy},
                                     {"content": f"answer two {i}", "policy_id": policy}],
                                    overlap_every=overlap_every, ttl_seconds=ttl) for i in range(n)]


def test_an_item_is_a_context_and_two_sibling_replies(store):
    item = make_items(store, 1)[0]
    a, b = store.get_message(item.message_a_id), store.get_message(item.message_b_id)
    assert a.parent_id == b.parent_id and a.context_key == b.context_key == item.context_key
    assert store.get_conversation(a.conversation_id).source == "queue"
    system, history = store.queue_item_context(item)
    assert history == [{"role": "user", "content": "q 0?"}] and system
    assert item.votes_wanted == 1 and item.uncertainty is None
    assert store.queue_context_keys("assistant", (item.policy_a_id, item.policy_b_id)) == {item.context_key}


def test_bad_items_store_nothing(store):
    before = store.count("messages")
    with pytest.raises(InvalidInput):
        store.create_queue_item("assistant", [{"role": "user", "content": "x"}], [{"content": "only one"}])
    with pytest.raises(InvalidInput):
        store.create_queue_item("assistant", [{"role": "user", "content": ""}], [{"content": "a"}, {"content": "b"}])
    assert store.count("messages") == before and store.count("queue_items") == 0
    with pytest.raises(NotFound):
        store.get_queue_item(999)
    with pytest.raises(InvalidInput):
        store.get_queue_item("1")


def test_no_item_is_shown_twice_to_one_annotator(store):
    make_items(store, 3)
    seen = []
    for _ in range(3):
        item, assignment = store.next_queue_item("assistant", "alice", first, LEASE)
        assert store.next_queue_item("assistant", "alice", first, LEASE)[0].id == item.id  # unvoted: same item back
        store.vote_queue_item(item.id, "a", "alice", LEASE)
        seen.append(item.id)
    assert len(set(seen)) == 3
    assert store.next_queue_item("assistant", "alice", first, LEASE) is None  # all voted: nothing left for her


def test_a_vote_is_an_ordinary_comparison_and_a_retry_returns_the_first(store):
    make_items(store, 1)
    item, assignment = store.next_queue_item("assistant", "alice", first, LEASE)
    assert assignment.reason == "random" and assignment.comparison_id is None
    vote = store.vote_queue_item(item.id, "b", "alice", LEASE)
    again = store.vote_queue_item(item.id, "b", "alice", LEASE)  # the same vote sent again: a client's retry
    assert again.id == vote.id and again.winner == "b"
    assert (vote.message_a_id, vote.message_b_id, vote.pair_id) == (item.message_a_id, item.message_b_id, None)
    assert store.queue_assignments(item.id)[0].comparison_id == vote.id
    pairs = build_pairs(store.feedback_rows("assistant"))
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("answer two 0", "answer one 0")]
    with pytest.raises(InvalidInput):
        store.vote_queue_item(item.id, "c", "alice", LEASE)


def test_every_nth_item_goes_to_a_second_annotator(store):
    items = make_items(store, 6, overlap_every=3)
    assert [i.votes_wanted for i in items] == [1, 1, 2, 1, 1, 2]
    for _ in range(6):
        item, _ = store.next_queue_item("assistant", "alice", first, LEASE)
        store.vote_queue_item(item.id, "a", "alice", LEASE)
    offered = []
    while (got := store.next_queue_item("assistant", "bob", first, LEASE)) is not None:
        offered.append(got[0].id)
        store.vote_queue_item(got[0].id, "b", "bob", LEASE)
    assert offered == [items[2].id, items[5].id]  # only the overlap items still want a vote
    assert store.queue_stats("assistant", LEASE)["ready"] == 0
    assert store.next_queue_item("assistant", "carol", first, LEASE) is None  # two votes each: done


def test_the_chooser_sees_votes_so_a_second_opinion_can_come_first(store):
    items = make_items(store, 3, overlap_every=3)
    show(store, items[2].id, "alice")
    store.vote_queue_item(items[2].id, "a", "alice", LEASE)
    seen = {}

    def spy(candidates):
        seen.update({c["id"]: c["votes"] for c in candidates})
        return first(candidates)

    store.next_queue_item("assistant", "bob", spy, LEASE)
    assert seen == {items[0].id: 0, items[1].id: 0, items[2].id: 1}


def test_a_lease_holds_the_last_slot_and_expires(store):
    item = make_items(store, 1)[0]
    assert store.next_queue_item("assistant", "alice", first, LEASE)[0].id == item.id
    assert store.next_queue_item("assistant", "bob", first, LEASE) is None  # alice holds its only slot
    with pytest.raises(Conflict, match="closed"):
        store.vote_queue_item(item.id, "a", "bob", LEASE)
    # With no lease time left, alice's unvoted showing no longer holds it: bob gets it, alice never again.
    assert store.next_queue_item("assistant", "bob", first, 0.0)[0].id == item.id
    store.vote_queue_item(item.id, "a", "bob", 0.0)
    assert store.next_queue_item("assistant", "alice", first, 0.0) is None
    late = store.vote_queue_item(item.id, "tie", "alice", 0.0)  # she was shown it: her late vote is kept
    assert late.winner == "tie"


def test_an_expired_item_is_not_offered_and_its_vote_is_refused(store):
    item = make_items(store, 1, ttl=-1.0)[0]
    assert store.next_queue_item("assistant", "alice", first, LEASE) is None
    before = store.count("comparisons")
    with pytest.raises(Conflict, match="expired"):
        store.vote_queue_item(item.id, "a", "alice", LEASE)
    assert store.count("comparisons") == before
    assert store.queue_stats("assistant", LEASE)["expired"] == 1


def test_excluded_annotators_votes_are_kept_but_do_not_fill_items_or_train(store):
    item = make_items(store, 1)[0]
    store.ensure_annotator("mallory")
    store.set_annotator_excluded("mallory", True)
    show(store, item.id, "mallory")
    vote = store.vote_queue_item(item.id, "a", "mallory", LEASE)
    assert store.count("comparisons") == 1 and vote.winner == "a"  # kept in the Store
    assert store.next_queue_item("assistant", "alice", first, LEASE)[0].id == item.id  # still open for a vote
    assert build_pairs(store.feedback_rows("assistant")) == []  # and not trained on
    # the config list excludes the same way
    other = make_items(store, 1, prefix="r")[0]
    show(store, other.id, "trudy", ["trudy"])
    store.vote_queue_item(other.id, "b", "trudy", LEASE, exclude_annotators=["trudy"])
    assert other.id in {i.id for i in store.open_queue_items("assistant", LEASE, ["trudy"])}
    assert other.id not in {i.id for i in store.open_queue_items("assistant", LEASE)}


def test_archived_versions_close_their_items(store, tmp_path):
    base = store.active_policy("assistant")
    (tmp_path / "v1").mkdir()
    v1 = store.register_policy_version("assistant", str(tmp_path / "v1"), base.id, promote=False)
    item = store.create_queue_item("assistant", [{"role": "user", "content": "hi"}],
                                   [{"content": "one", "policy_id": base.id}, {"content": "two", "policy_id": v1.id}])
    assert store.queue_stats("assistant", LEASE)["ready"] == 1
    store.archive_policy(v1.id)
    assert store.queue_stats("assistant", LEASE)["ready"] == 0
    assert store.next_queue_item("assistant", "alice", first, LEASE) is None
    with pytest.raises(Conflict):
        store.vote_queue_item(item.id, "a", "alice", LEASE)


def test_scores_and_stats(store):
    items = make_items(store, 3)
    store.set_queue_scores([(items[0].id, 0.5, 1.0), (items[1].id, 0.9, 0.47)], scored_pairs=16)
    got = store.get_queue_item(items[0].id)
    assert (got.p_a, got.uncertainty, got.scored_pairs) == (0.5, 1.0, 16)
    store.next_queue_item("assistant", None, first, LEASE)
    store.vote_queue_item(items[0].id, "a", None, LEASE)
    stats = store.queue_stats("assistant", LEASE)
    assert stats == {"items": 3, "ready": 2, "fresh": 2, "scored": 1, "expired": 0, "votes": {"(anonymous)": 1}}
    store.next_queue_item("assistant", "bob", first, LEASE)  # bob's lease holds item 1's only slot
    assert store.queue_stats("assistant", LEASE)["ready"] == 1


def test_two_annotators_never_take_the_last_slot_together(tmp_path):
    import threading

    path = tmp_path / "studio.db"
    setup = Store(path)
    setup.ensure_default_agent("tiny")
    make_items(setup, 1)
    setup.close()
    got, barrier = [], threading.Barrier(8)

    def worker(i):
        s = Store(path)
        barrier.wait()
        got.append(s.next_queue_item("assistant", f"a{i}", first, LEASE))
        s.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(g is not None for g in got) == 1


def test_an_existing_database_gets_the_queue_tables(tmp_path):
    path = tmp_path / "old.db"
    db = Database(sqlite3.connect(str(path)))
    MIGRATIONS.apply(db, stop_before="m003_vote_queue")
    assert "queue_items" not in db.table_names()
    db.conn.close()
    old = Store(path)  # an older data dir: the new migration applies at start, nothing else changes
    old.ensure_default_agent("tiny")
    assert "queue_items" in old.db.table_names() and old.schema_version() >= 3
    assert make_items(old, 1)[0].id == 1
    old.close()


def test_only_annotators_an_item_was_shown_to_vote_on_it(store):
    """Issue #24, finding 4: a vote by item id alone (never shown to the voter) is refused and stores nothing."""
    item = make_items(store, 2)[0]
    with pytest.raises(Conflict, match="not shown to you"):
        store.vote_queue_item(item.id, "a", "mallory", LEASE)
    assert store.count("comparisons") == 0 and store.count("queue_assignments") == 0
    show(store, item.id, "alice")
    assert store.vote_queue_item(item.id, "a", "alice", LEASE).winner == "a"
    assert store.queue_assignment(item.id, "alice").voted is not None
    assert store.queue_assignment(item.id, "mallory") is None and store.queue_item_of(item.message_b_id).id == item.id


def test_queue_replies_are_compared_only_inside_their_item(store):
    """Issue #24, findings 4-5: a queue reply paired by hand (POST /comparisons) is refused, so a queue vote and a
    hand-made comparison of the same pair cannot both count."""
    item = make_items(store, 1)[0]
    conv = store.create_conversation("assistant", "alice", messages=[{"role": "user", "content": "q 0?"}])
    mine = store.record_reply(store.leaf(conv.id).id, "my own reply", item.policy_a_id)
    for a, b in ((item.message_a_id, item.message_b_id), (mine.id, item.message_a_id)):
        with pytest.raises(Conflict, match="vote-queue item"):
            store.record_comparison(a, b, "a", "alice")
    assert store.count("comparisons") == 0


def test_a_queue_reply_keeps_its_token_count_so_a_cut_one_is_marked(store):
    item = store.create_queue_item("assistant", [{"role": "user", "content": "long?"}],
                                   [{"content": "cut short", "gen_params": {"max_new_tokens": 8}, "n_tokens": 8},
                                    {"content": "done.", "gen_params": {"max_new_tokens": 8}, "n_tokens": 3}])
    a, b = store.get_message(item.message_a_id), store.get_message(item.message_b_id)
    assert (a.n_tokens, b.n_tokens) == (8, 3)  # the Vote tab marks a reply with n_tokens >= max_new_tokens ✂️


def test_a_second_vote_on_a_stale_item_is_refused_and_says_what_was_stored(store):
    make_items(store, 2)
    item, _ = store.next_queue_item("assistant", "alice", first, LEASE)
    vote = store.vote_queue_item(item.id, "a", "alice", LEASE)
    before = store.count("comparisons")
    # another answer (a second tab still showing the item), or any second vote from a page (retry=False)
    for winner, retry in (("b", True), ("a", False)):
        with pytest.raises(Conflict, match=rf"already voted on item #{item.id}: A is better \(stored as comparison "
                                           rf"#{vote.id}\)\..*not stored"):
            store.vote_queue_item(item.id, winner, "alice", LEASE, retry=retry)
    # an item skipped (in another tab) takes no vote either
    skipped, _ = store.next_queue_item("assistant", "alice", first, LEASE)
    store.skip_queue_item(skipped.id, "alice")
    with pytest.raises(Conflict, match=rf"skipped item #{skipped.id}; nothing was stored"):
        store.vote_queue_item(skipped.id, "b", "alice", LEASE)
    assert store.count("comparisons") == before and store.queue_assignments(skipped.id)[0].comparison_id is None
