"""Open decisions on a real Store: which votes count, settling under the auto and ask rules, and pairing first."""
from __future__ import annotations

import pytest

from rlhf.analysis.arena import pair_candidates
from rlhf.config import apply_overrides
from rlhf.jobs import decisions
from rlhf.queue.pool import queue_versions
from ui import views

INCONCLUSIVE = {"gate/verdict": "inconclusive", "gate/reason": "too close to call"}


def version(store, tmp_path, n, metrics=None, promote=False):
    path = tmp_path / f"adapter{n}"
    path.mkdir()
    return store.register_policy_version("assistant", str(path), 1, promote, metrics=metrics or {},
                                         data_snapshot={"rating_id": 0, "comparison_id": 0})


def vote(store, cand, opp, winner, annotator, i, cand_on_a=True):
    conv = store.create_conversation("assistant", annotator, messages=[{"role": "user", "content": f"q{i}"}])
    user = store.leaf(conv.id)
    first, second = (cand, opp) if cand_on_a else (opp, cand)
    a = store.record_reply(user.id, f"reply a {i}", first.id)
    b = store.record_reply(user.id, f"reply b {i}", second.id)
    return store.record_comparison(a.id, b.id, winner, annotator)


def test_votes_between_the_two_versions_count_once_per_annotator_and_pair(store, tmp_path):
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    other = version(store, tmp_path, 2)
    active = store.active_policy("assistant")
    vote(store, cand, active, "a", "ann", 0)  # a win, candidate on side a
    vote(store, cand, active, "a", "bob", 1, cand_on_a=False)  # a loss, candidate on side b
    vote(store, cand, active, "tie", "ann", 2)
    vote(store, cand, active, "both_bad", "ann", 3)
    vote(store, cand, other, "a", "ann", 4)  # another pair of versions: not counted
    changed = vote(store, cand, active, "b", "eve", 5)
    store.record_comparison(changed.message_a_id, changed.message_b_id, "a", "eve")  # eve changed her mind: a win
    counts = decisions.vote_counts(store.list_comparisons("assistant"), cand.id, active.id)
    assert counts == (2, 1, 1, 1)
    store.set_annotator_excluded("bob", True)
    d = decisions.decision_for(store, apply_overrides_default(store), store.get_policy(cand.id))
    assert (d["wins"], d["losses"], d["ties"], d["both_bad"]) == (2, 0, 1, 1) and d["votes"] == 3
    assert d["open"] and d["verdict"] == "collecting" and d["opponent_id"] == active.id
    assert {"verdict", "votes", "win_rate", "low", "high", "votes_needed"} <= set(d)


def apply_overrides_default(store, **values):
    from rlhf.config import AppConfig

    return apply_overrides(AppConfig(), values)


@pytest.mark.parametrize("rule", ["auto", "ask"])
def test_a_decided_candidate_is_settled_by_the_admins_rule(store, tmp_path, rule):
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    active = store.active_policy("assistant")
    config = apply_overrides_default(store, **{"gate.decision_rule": rule})
    for i in range(6):
        vote(store, cand, active, "a", f"ann{i}", i)
    assert decisions.settle(store, config) == []  # 6 straight wins are not yet enough at alpha 0.05
    for i in range(6, 40):
        vote(store, cand, active, "a" if i % 4 else "tie", f"ann{i}", i)
    settled = decisions.settle(store, config)  # the scheduler's tick, after all 40 votes (it may peek sooner)
    assert [s["verdict"] for s in settled] == ["promote"]
    after = store.get_policy(cand.id)
    assert after.metrics["decision/verdict"] == "promote" and after.metrics["decision/votes"] == 40
    assert not decisions.is_open(after) and decisions.settle(store, config) == []
    if rule == "auto":
        assert after.status == "active"
    else:
        assert after.status == "candidate" and after.metrics["decision/awaiting_admin"]
        waiting = decisions.open_decisions(store, config, "assistant")
        assert [w["policy_id"] for w in waiting] == [cand.id] and waiting[0]["awaiting_admin"]


def test_a_losing_candidate_is_archived_under_auto(store, tmp_path):
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    active = store.active_policy("assistant")
    for i in range(40):
        vote(store, cand, active, "b", f"ann{i}", i)
    assert [s["verdict"] for s in decisions.settle(store, apply_overrides_default(store))] == ["reject"]
    assert store.get_policy(cand.id).status == "archived"


def test_open_decisions_go_first_in_the_arena_and_the_vote_queue(store, tmp_path):
    waiting = version(store, tmp_path, 1, INCONCLUSIVE)
    newest = version(store, tmp_path, 2, {"gate/verdict": "reject"})
    assert decisions.is_open(waiting) and not decisions.is_open(newest)
    table = views.board(store.list_comparisons("assistant"), store.list_policies("assistant"), n_boot=0)
    marked = {c["policy_id"]: c["needs_votes"] for c in pair_candidates(table, frozenset({waiting.id}))}
    assert marked[waiting.id] and not marked[newest.id]
    agent = store.get_agent("assistant")
    assert [p.id for p in queue_versions(store, agent)] == [store.active_policy("assistant").id, waiting.id]
    store.merge_policy_metrics(waiting.id, {"decision/verdict": "reject"})
    assert [p.id for p in queue_versions(store, agent)][1] == newest.id  # decided: back to the newest candidate
