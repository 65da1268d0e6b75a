"""Reward data builders on a hand-made Store: pairs from every source, pointwise and KTO rows, the split."""
from __future__ import annotations

import pytest

from rlhf.training.data import (DataError, build_kto, build_pairs, build_pointwise, count_sources,
                       split_by_conversation)


def exchange(store, text, replies, conversation_id=None):
    """A user turn (new conversation unless given) answered by sibling replies; returns (user, replies)."""
    if conversation_id is None:
        conversation_id = store.create_conversation("assistant").id
    user = store.append_messages(conversation_id, [{"role": "user", "content": text}])[-1]
    return user, [store.record_reply(user.id, r, None) for r in replies]


def rows(store):
    return store.feedback_rows("assistant")


def as_texts(pairs):
    return sorted((p["chosen"], p["rejected"], p["source"], p["margin"]) for p in pairs)


def test_comparisons_give_pairs_but_ties_and_both_bad_do_not(store):
    _, (a1, b1) = exchange(store, "q1", ["a1", "b1"])
    _, (a2, b2) = exchange(store, "q2", ["a2", "b2"])
    _, (a3, b3) = exchange(store, "q3", ["a3", "b3"])
    _, (a4, b4) = exchange(store, "q4", ["a4", "b4"])
    store.record_comparison(a1.id, b1.id, "a")
    store.record_comparison(a2.id, b2.id, "b")
    store.record_comparison(a3.id, b3.id, "tie")
    store.record_comparison(a4.id, b4.id, "both_bad")
    pairs = build_pairs(rows(store))
    assert as_texts(pairs) == [("a1", "b1", "comparison", 0.0), ("b2", "a2", "comparison", 0.0)]
    assert count_sources(pairs) == {"comparison": 2, "siblings": 0, "unsafe": 0, "rated_vs_unrated": 0}


def test_an_annotators_latest_vote_counts_and_scores_set_the_margin(store):
    _, (a, b) = exchange(store, "q", ["a", "b"])
    store.record_comparison(a.id, b.id, "a", annotator="ann")
    store.record_comparison(a.id, b.id, "b", annotator="ann")  # changed mind
    store.record_rating(a.id, "ann", score=2)
    store.record_rating(b.id, "ann", score=5)
    assert as_texts(build_pairs(rows(store), margin_per_score=0.25)) == [("b", "a", "comparison", 0.75)]
    store.record_comparison(a.id, b.id, "tie", annotator="ann")
    # the comparison is now a tie, so the differing scores speak for themselves (a sibling pair)
    assert as_texts(build_pairs(rows(store), margin_per_score=0.25)) == [("b", "a", "siblings", 0.75)]


def test_siblings_thumbs_decide_then_scores(store):
    _, (up, down) = exchange(store, "t", ["up", "down"])
    store.record_rating(up.id, thumb=1, score=2)
    store.record_rating(down.id, thumb=-1, score=5)  # the thumb decides; a negative score lead is no margin
    _, (hi, lo) = exchange(store, "s", ["hi", "lo"])
    store.record_rating(hi.id, thumb=1, score=5)
    store.record_rating(lo.id, thumb=1, score=3)
    _, (same1, same2) = exchange(store, "same", ["same1", "same2"])
    store.record_rating(same1.id, thumb=1, score=4)
    store.record_rating(same2.id, thumb=1, score=4)
    _, (only_thumb, only_score) = exchange(store, "mixed", ["only_thumb", "only_score"])
    store.record_rating(only_thumb.id, thumb=1)
    store.record_rating(only_score.id, score=5)  # no common field: no preference
    pairs = build_pairs(rows(store), margin_per_score=0.5)
    assert as_texts(pairs) == [("hi", "lo", "siblings", 1.0), ("up", "down", "siblings", 0.0)]


def test_three_regenerations_give_every_ordered_pair(store):
    _, (r1, r2, r3) = exchange(store, "q", ["r1", "r2", "r3"])
    for reply, score in ((r1, 1), (r2, 3), (r3, 5)):
        store.record_rating(reply.id, score=score)
    assert as_texts(build_pairs(rows(store), margin_per_score=1.0)) == [
        ("r2", "r1", "siblings", 2.0), ("r3", "r1", "siblings", 4.0), ("r3", "r2", "siblings", 2.0)]


def test_rated_vs_unrated_is_a_pair_only_when_asked(store):
    _, (liked, unrated) = exchange(store, "q", ["liked", "unrated"])
    _, (disliked, unrated2) = exchange(store, "q2", ["disliked", "unrated2"])
    store.record_rating(liked.id, thumb=1)
    store.record_rating(disliked.id, thumb=-1)
    assert build_pairs(rows(store)) == []
    assert as_texts(build_pairs(rows(store), rated_vs_unrated=True)) == [("liked", "unrated", "rated_vs_unrated", 0.0)]


def test_unsafe_replies_always_lose_to_an_unflagged_sibling(store):
    _, (bad, plain) = exchange(store, "q", ["bad", "plain"])
    store.record_rating(bad.id, thumb=1, flags=["Unsafe"])  # liked but unsafe; the sibling is unrated
    _, (bad2, good2) = exchange(store, "q2", ["bad2", "good2"])
    store.record_rating(bad2.id, flags=["Unsafe", "Inaccurate"])
    store.record_comparison(bad2.id, good2.id, "a")  # the vote picked the unsafe one: the flag wins
    _, (both1, both2) = exchange(store, "q3", ["both1", "both2"])
    store.record_rating(both1.id, flags=["Unsafe"], thumb=1)
    store.record_rating(both2.id, flags=["Unsafe"], thumb=-1)  # both flagged: ratings decide as usual
    pairs = build_pairs(rows(store))
    assert as_texts(pairs) == [("both1", "both2", "siblings", 0.0), ("good2", "bad2", "unsafe", 0.0),
                               ("plain", "bad", "unsafe", 0.0)]
    store.record_rating(bad.id, flags=[])  # the annotator cleared the flag; a thumbs-up vs unrated is no pair
    assert ("plain", "bad", "unsafe", 0.0) not in as_texts(build_pairs(rows(store)))


def test_excluded_annotators_are_left_out(store):
    _, (a, b) = exchange(store, "q", ["a", "b"])
    _, (c, d) = exchange(store, "q2", ["c", "d"])
    store.record_comparison(a.id, b.id, "a", annotator="spammer")
    store.record_rating(c.id, "troll", thumb=1)
    store.record_rating(d.id, "troll", thumb=-1)
    store.record_rating(c.id, "fair", score=2)
    store.record_rating(d.id, "fair", score=4)
    assert as_texts(build_pairs(rows(store))) == [("a", "b", "comparison", 0.0), ("c", "d", "siblings", 0.0)]
    store.set_annotator_excluded("spammer", True)  # excluded in the Store
    assert as_texts(build_pairs(rows(store), exclude_annotators=["troll"], margin_per_score=0.5)) == [
        ("d", "c", "siblings", 1.0)]
    assert {p["completion"]: p["score"] for p in build_pointwise(rows(store), ["troll"])} == {"c": 0.25, "d": 0.75}
    assert len(build_pointwise(rows(store), ["troll"])) == 2 and build_kto(rows(store), ["troll"]) == []


def test_a_compared_sibling_pair_is_not_counted_twice(store):
    _, (a, b) = exchange(store, "q", ["a", "b"])
    store.record_rating(a.id, thumb=1)
    store.record_rating(b.id, thumb=-1)
    store.record_comparison(a.id, b.id, "a")
    assert as_texts(build_pairs(rows(store))) == [("a", "b", "comparison", 0.0)]


def test_prompt_is_system_prompt_plus_the_branch_before_the_reply(store):
    user, (first, second) = exchange(store, "hello", ["first answer", "second answer"])
    _, (x, y) = exchange(store, "and then?", ["x", "y"], conversation_id=user.conversation_id)  # under `second`
    store.record_rating(x.id, thumb=1)
    store.record_rating(y.id, thumb=-1)
    (pair,) = build_pairs(rows(store))
    system = store.get_agent("assistant").system_prompt
    assert pair["prompt"] == [{"role": "system", "content": system}, {"role": "user", "content": "hello"},
                              {"role": "assistant", "content": "second answer"},
                              {"role": "user", "content": "and then?"}]
    assert pair["context_key"] == x.context_key and pair["conversation_ids"] == [user.conversation_id]
    assert (pair["chosen_id"], pair["rejected_id"]) == (x.id, y.id)


def test_pointwise_rows_scale_scores_and_thumbs_to_unit_interval(store):
    _, replies = exchange(store, "q", ["s1", "s5", "s3", "up", "down", "mixed", "unsafe", "unrated", "score_wins"])
    s1, s5, s3, up, down, mixed, unsafe, unrated, score_wins = replies
    store.record_rating(s1.id, score=1)
    store.record_rating(s5.id, score=5)
    store.record_rating(s3.id, score=3)
    store.record_rating(up.id, thumb=1)
    store.record_rating(down.id, thumb=-1)
    store.record_rating(mixed.id, "ann1", thumb=1)
    store.record_rating(mixed.id, "ann2", score=1)  # mean over annotators: (1 + 0) / 2
    store.record_rating(unsafe.id, score=5, flags=["Unsafe"])
    store.record_rating(unrated.id, note="no opinion")
    store.record_rating(score_wins.id, thumb=-1, score=4)  # one annotator's score is finer than their thumb
    got = {p["completion"]: p["score"] for p in build_pointwise(rows(store))}
    assert got == {"s1": 0.0, "s5": 1.0, "s3": 0.5, "up": 1.0, "down": 0.0, "mixed": 0.5, "unsafe": 0.0,
                   "score_wins": 0.75}


def test_kto_rows_come_from_thumbs(store):
    _, (up, down, scored, unsafe) = exchange(store, "q", ["up", "down", "scored", "unsafe"])
    store.record_rating(up.id, thumb=1)
    store.record_rating(down.id, thumb=-1)
    store.record_rating(scored.id, score=5)
    store.record_rating(unsafe.id, thumb=1, flags=["Unsafe"])
    got = {r["completion"]: r["label"] for r in build_kto(rows(store))}
    assert got == {"up": True, "down": False, "unsafe": False}
    assert all(r["prompt"][-1] == {"role": "user", "content": "q"} for r in build_kto(rows(store)))


def test_the_snapshot_leaves_out_later_feedback(store):
    _, (a, b) = exchange(store, "q", ["a", "b"])
    store.record_comparison(a.id, b.id, "a")
    mark = store.feedback_watermark("assistant")
    store.record_comparison(a.id, b.id, "b")
    assert as_texts(build_pairs(store.feedback_rows("assistant", until=mark))) == [("a", "b", "comparison", 0.0)]


def many_pairs(store, n, shared_every=0, first=0):
    """n conversations with one compared pair each; every `shared_every`-th opens with the same question."""
    for i in range(first, first + n):
        text = "the shared question" if shared_every and i % shared_every == 0 else f"question {i}"
        _, (a, b) = exchange(store, text, [f"good {i}", f"bad {i}"])
        store.record_comparison(a.id, b.id, "a")
    return build_pairs(rows(store))


def test_split_is_deterministic_seedable_and_leak_free(store):
    pairs = many_pairs(store, 30, shared_every=5)
    train, held = split_by_conversation(pairs, 0.2, seed=0)
    assert (train, held) == split_by_conversation(pairs, 0.2, seed=0)
    assert len(train) + len(held) == len(pairs) and train and held
    conv = lambda rs: {c for r in rs for c in r["conversation_ids"]}  # noqa: E731
    ctx = lambda rs: {r["context_key"] for r in rs}  # noqa: E731
    assert not conv(train) & conv(held)
    assert not ctx(train) & ctx(held)
    shared = [p for p in pairs if p["prompt"][-1]["content"] == "the shared question"]
    assert len(shared) == 6 and (all(p in train for p in shared) or all(p in held for p in shared))
    assert 3 <= len(conv(held)) <= 6  # about 20 % of 30 conversations
    others = [split_by_conversation(pairs, 0.2, seed=s)[1] for s in range(1, 6)]
    assert any(h != held for h in others)  # the seed matters


def test_split_keeps_a_conversations_side_as_data_grows(store):
    pairs = many_pairs(store, 20)
    grown = many_pairs(store, 20, first=20)  # 20 more conversations, new questions
    old = {c for r in pairs for c in r["conversation_ids"]}
    for seed in range(5):
        before = {c for r in split_by_conversation(pairs, 0.25, seed=seed)[1] for c in r["conversation_ids"]}
        after = {c for r in split_by_conversation(grown, 0.25, seed=seed)[1] for c in r["conversation_ids"]} & old
        # one seeded ranking: the old conversations held out after growth are a prefix of the same order
        assert before <= after or after <= before, seed


def test_split_edge_cases(store):
    assert split_by_conversation([], 0.2) == ([], [])
    pairs = many_pairs(store, 3, shared_every=1)  # one group: nothing can be held out without leaking
    assert split_by_conversation(pairs, 0.5) == (pairs, [])
    pairs = many_pairs(store, 4)
    assert split_by_conversation(pairs, 0.0)[1] == []
    train, held = split_by_conversation(pairs, 0.99)
    assert train and held  # never everything held out


def test_corrupted_rows_give_clear_errors(store):
    user, (a, b) = exchange(store, "q", ["a", "b"])
    store.record_rating(a.id, thumb=1)
    store.record_comparison(a.id, b.id, "a")
    good = rows(store)

    def broken(edit):
        data = {k: [dict(r) for r in v] if isinstance(v, list) and v and isinstance(v[0], dict) else v
                for k, v in good.items()}
        edit(data)
        return data

    cases = [
        (lambda d: d["messages"].remove(next(m for m in d["messages"] if m["id"] == user.id)),
         f"message {a.id} has parent {user.id}"),
        (lambda d: d["ratings"][0].update(message_id=999), "rating .* unknown message 999"),
        (lambda d: d["ratings"][0].update(message_id=user.id), "not a reply"),
        (lambda d: d["ratings"][0].update(thumb=7), "thumb 7"),
        (lambda d: d["ratings"][0].update(flags="Unsafe"), "flags"),
        (lambda d: d["comparisons"][0].update(message_b_id=user.id), "comparison .* not a known reply"),
        (lambda d: d["comparisons"][0].update(winner="c"), "unknown winner"),
        (lambda d: d["messages"][0].update(conversation_id=12345), "unknown conversation"),
        (lambda d: d.pop("ratings"), "ratings"),
        (lambda d: next(m for m in d["messages"] if m["id"] == user.id).update(parent_id=a.id), "cycle"),
    ]
    for edit, message in cases:
        with pytest.raises(DataError, match=message):
            build_pairs(broken(edit))
    assert build_pairs(good)  # the untouched rows are fine


def test_a_withdrawn_thumb_gives_no_pair(store):
    _, (up, down) = exchange(store, "w", ["up", "down"])
    store.record_rating(up.id, "ann", thumb=1)
    store.record_rating(down.id, "ann", thumb=-1)
    assert as_texts(build_pairs(rows(store))) == [("up", "down", "siblings", 0.0)]
    store.withdraw_rating(down.id, "ann")  # the thumb down clicked again: taken back
    assert build_pairs(rows(store)) == []
    assert [r["completion"] for r in build_kto(rows(store))] == ["up"]


def test_identical_texts_never_form_a_pair_and_say_why(store):
    _, (a, b) = exchange(store, "same", ["The same reply.", "The  same reply.\n"])
    _, (c, d) = exchange(store, "voted", ["Word for word.", "Word for word."])
    store.record_rating(a.id, "ann", thumb=1)
    store.record_rating(b.id, "ann", thumb=-1)
    store.record_comparison(c.id, d.id, "a", annotator="ann")
    skipped = []
    assert build_pairs(rows(store), skipped=skipped) == []
    assert sorted((s["chosen_id"], s["rejected_id"], s["source"]) for s in skipped) == \
        [(a.id, b.id, "siblings"), (c.id, d.id, "comparison")]
    assert all("identical texts" in s["reason"] for s in skipped)
