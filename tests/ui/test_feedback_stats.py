"""The Data tab's statistics are computed once per change of the feedback, not once per refresh (#41 item 7)."""
from __future__ import annotations

from tests.support.votes import seed_pairs
from ui.feedback_stats import FeedbackStats


def test_statistics_are_reused_until_the_feedback_changes(store):
    seed_pairs(store, 3)
    cache, agent = FeedbackStats(store), store.get_agent("assistant").id
    first = cache.get(agent)
    assert cache.get(agent) is first and cache.get(agent) is first  # refreshes without a change: no work
    assert len(first.frame) == 3
    reply = store.record_reply(store.leaf(store.create_conversation(
        "assistant", "bob", messages=[{"role": "user", "content": "hi"}]).id).id, "hello", 1)
    store.record_rating(reply.id, "bob", thumb=1)
    second = cache.get(agent)
    assert second is not first and len(second.frame) == 4 and "bob" in set(second.stats["annotator"])
    assert cache.get(agent) is second
    store.set_annotator_excluded("ann", True)  # an in-place change the statistics show is a change too
    third = cache.get(agent)
    assert third is not second and bool(third.stats.set_index("annotator").loc["ann", "excluded"])


def test_the_mark_moves_with_every_kind_of_feedback(store):
    seed_pairs(store, 1)
    marks = [store.feedback_mark()]
    conv = store.create_conversation("assistant", "bob", messages=[{"role": "user", "content": "q"}])
    marks.append(store.feedback_mark())
    user = store.leaf(conv.id)
    a, b = store.record_reply(user.id, "a", 1), store.record_reply(user.id, "b", 1)
    marks.append(store.feedback_mark())
    store.record_comparison(a.id, b.id, "b", "bob")
    marks.append(store.feedback_mark())
    store.record_rating(a.id, "bob", score=4)
    marks.append(store.feedback_mark())
    assert len(set(marks)) == len(marks) and store.feedback_mark() == marks[-1]
