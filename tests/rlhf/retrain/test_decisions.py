"""Open decisions on a real Store: only blind votes count, at most a few per person, from enough people; settling
under the auto and ask rules (and local mode, which asks); reopening when an excluded annotator's votes carried it;
pairing open decisions first."""
from __future__ import annotations

import pytest

from rlhf.analysis.arena import pair_candidates
from rlhf.config import AppConfig, apply_overrides
from rlhf.retrain import decisions
from rlhf.vote_queue.contexts import queue_versions
from tests.conftest import vote_on_item
from rlhf.analysis import arena as pairing

INCONCLUSIVE = {"gate/verdict": "inconclusive", "gate/reason": "too close to call"}
TEAM = {"server.users": "admin:pw:admin"}  # team mode: the people rules apply (local mode is one person)


def version(store, tmp_path, n, metrics=None, promote=False):
    path = tmp_path / f"adapter{n}"
    path.mkdir()
    return store.register_policy_version("assistant", str(path), 1, promote, metrics=metrics or {},
                                         data_snapshot={"rating_id": 0, "comparison_id": 0})


def _pair(store, cand, opp, annotator, i, cand_on_a, source="chat"):
    conv = store.create_conversation("assistant", annotator, source=source,
                                     messages=[{"role": "user", "content": f"q{i}"}])
    user = store.leaf(conv.id)
    first, second = (cand, opp) if cand_on_a else (opp, cand)
    return store.record_reply(user.id, f"reply a {i}", first.id), store.record_reply(user.id, f"reply b {i}", second.id)


def vote(store, cand, opp, winner, annotator, i, cand_on_a=True):
    """A blind vote: an arena round between the two versions, voted on by its player."""
    a, b = _pair(store, cand, opp, annotator, i, cand_on_a, source="arena")
    pair = store.create_arena_pair("assistant", a.id, b.id)
    return store.vote_arena_pair(pair.id, winner, annotator)


def chosen_vote(store, cand, opp, winner, annotator, i, cand_on_a=True):
    """A vote on replies the voter asked of chosen versions in chat (POST /comparisons): not blind."""
    a, b = _pair(store, cand, opp, annotator, i, cand_on_a)
    return store.record_comparison(a.id, b.id, winner, annotator)


def config(rule="auto", **values):
    return apply_overrides(AppConfig(), {**TEAM, "gate.decision_rule": rule, **values})


def test_only_blind_votes_count_at_most_three_per_person(store, tmp_path):
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    other = version(store, tmp_path, 2)
    active = store.active_policy("assistant")
    for i in range(30):  # one person choosing the versions in chat and voting as often as they like
        chosen_vote(store, cand, active, "a", "mallory", i)
    vote(store, cand, active, "a", "ann", 100)  # a win, candidate on side a
    vote(store, cand, active, "a", "bob", 101, cand_on_a=False)  # a loss, candidate on side b
    vote(store, cand, active, "tie", "ann", 102)
    vote(store, cand, active, "both_bad", "ann", 103)
    vote(store, cand, active, "a", "ann", 104)  # ann's 4th blind vote: over the per-person cap
    vote(store, cand, other, "a", "ann", 105)  # another pair of versions: not counted
    t = decisions.tally(store.list_comparisons("assistant"), cand.id, active.id, per_person=3)
    assert (t.wins, t.ties, t.losses, t.both_bad, t.people) == (1, 1, 1, 1, 2)
    assert t.blind == 5 and t.not_blind == 30
    store.set_annotator_excluded("bob", True)
    d = decisions.decision_for(store, config(), store.get_policy(cand.id))
    assert (d["wins"], d["losses"], d["ties"], d["both_bad"]) == (1, 0, 1, 1) and d["votes"] == 2
    assert d["open"] and d["verdict"] == "collecting" and d["opponent_id"] == active.id
    assert d["people"] == 1 and d["people_needed"] == 2 and d["uncounted_votes"] == 30
    assert {"verdict", "votes", "win_rate", "low", "high", "votes_needed"} <= set(d)


def test_vote_queue_votes_are_blind_too(store, tmp_path):
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    active = store.active_policy("assistant")
    replies = [{"content": "one", "policy_id": cand.id}, {"content": "two", "policy_id": active.id}]
    item = store.create_queue_item("assistant", [{"role": "user", "content": "q?"}], replies)
    vote_on_item(store, item.id, "a", "ann")
    t = decisions.tally(store.list_comparisons("assistant"), cand.id, active.id)
    assert (t.wins, t.people, t.blind, t.not_blind) == (1, 1, 1, 0)


def test_one_person_voting_as_often_as_they_like_never_settles_a_decision(store, tmp_path):
    """The attack of issue 33: one annotator picks the versions, regenerates and votes 'a' again and again; and the
    same annotator in 40 blind arena rounds. Neither moves the decision past three votes of one person."""
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    active = store.active_policy("assistant")
    for i in range(40):
        chosen_vote(store, cand, active, "a", "mallory", i)
        vote(store, cand, active, "a", "mallory", 100 + i)
    for rule in ("auto", "ask"):
        assert decisions.settle(store, config(rule)) == []
    d = decisions.decision_for(store, config(), store.get_policy(cand.id))
    assert d["verdict"] == "collecting" and d["votes"] == 3 and d["people"] == 1
    assert store.get_policy(cand.id).status == "candidate"


@pytest.mark.parametrize("rule", ["auto", "ask"])
def test_a_decided_candidate_is_settled_by_the_admins_rule(store, tmp_path, rule):
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    active = store.active_policy("assistant")
    cfg = config(rule)
    for i in range(6):
        vote(store, cand, active, "a", f"ann{i}", i)
    assert decisions.settle(store, cfg) == []  # 6 straight wins are not yet enough at alpha 0.05
    for i in range(6, 40):
        vote(store, cand, active, "a" if i % 4 else "tie", f"ann{i}", i)
    settled = decisions.settle(store, cfg)  # the scheduler's tick, after all 40 votes (it may peek sooner)
    assert [s["verdict"] for s in settled] == ["promote"]
    after = store.get_policy(cand.id)
    assert after.metrics["decision/verdict"] == "promote" and after.metrics["decision/votes"] == 40
    assert after.metrics["decision/people"] == 40
    assert not decisions.is_open(after) and decisions.settle(store, cfg) == []
    if rule == "auto":
        assert after.status == "active"
    else:
        assert after.status == "candidate" and after.metrics["decision/awaiting_admin"]
        waiting = decisions.open_decisions(store, cfg, "assistant")
        assert [w["policy_id"] for w in waiting] == [cand.id] and waiting[0]["awaiting_admin"]


def test_a_verdict_waits_for_enough_different_people(store, tmp_path):
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    active = store.active_policy("assistant")
    for i in range(12):  # 12 straight wins decide the test, but from two people only
        vote(store, cand, active, "a", f"ann{i % 2}", i)
    cfg = config(**{"gate.decision_votes_per_annotator": 6})
    d = decisions.decision_for(store, cfg, store.get_policy(cand.id))
    assert d["verdict"] == "collecting" and d["people"] == 2 and d["people_needed"] == 1
    assert decisions.settle(store, cfg) == []
    vote(store, cand, active, "a", "ann2", 99)
    assert [s["verdict"] for s in decisions.settle(store, cfg)] == ["promote"]


def test_local_mode_is_one_person_and_asks_the_admin(store, tmp_path):
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    active = store.active_policy("assistant")
    for i in range(12):
        vote(store, cand, active, "a", None, i)  # local mode: the one (anonymous) user
    local = apply_overrides(AppConfig(), {"gate.decision_rule": "auto"})  # every vote of the one person counts
    settled = decisions.settle(store, local)
    assert [s["verdict"] for s in settled] == ["promote"] and not settled[0]["applied"]
    after = store.get_policy(cand.id)
    assert after.status == "candidate" and after.metrics["decision/awaiting_admin"]


def test_excluding_the_annotator_an_automatic_promotion_rested_on_reopens_it(store, tmp_path):
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    before = store.active_policy("assistant")
    cfg = config()
    for i in range(3):
        for person in ("ann", "bob", "carol", "mallory"):
            vote(store, cand, before, "a", person, f"{person}{i}")
    assert [s["verdict"] for s in decisions.settle(store, cfg)] == ["promote"]
    assert store.get_policy(cand.id).status == "active"
    assert decisions.revisit(store, cfg, "dave") == []  # unknown: nothing to look at
    store.set_annotator_excluded("mallory", True)
    reopened = decisions.revisit(store, cfg, "mallory")
    assert [(r["policy_id"], r["previous"], r["now"]) for r in reopened] == [(cand.id, "promote", "collecting")]
    assert reopened[0]["restored_active_id"] == before.id and "mallory was excluded" in reopened[0]["because"]
    assert store.active_policy("assistant").id == before.id
    after = store.get_policy(cand.id)
    assert after.status == "candidate" and decisions.is_open(after)
    d = decisions.decision_for(store, cfg, after)
    assert d["reopened"]["previous"] == "promote" and d["verdict"] == "collecting" and d["people"] == 3
    assert decisions.revisit(store, cfg, "mallory") == []  # reopened once: nothing recorded to revisit


def test_open_decisions_go_first_in_the_arena_and_the_vote_queue(store, tmp_path):
    waiting = version(store, tmp_path, 1, INCONCLUSIVE)
    newest = version(store, tmp_path, 2, {"gate/verdict": "reject"})
    assert decisions.is_open(waiting) and not decisions.is_open(newest)
    table = pairing.board(store.list_comparisons("assistant"), store.list_policies("assistant"), n_boot=0)
    marked = {c["policy_id"]: c["needs_votes"] for c in pair_candidates(table, frozenset({waiting.id}))}
    assert marked[waiting.id] and not marked[newest.id]
    agent = store.get_agent("assistant")
    assert [p.id for p in queue_versions(store, agent)] == [store.active_policy("assistant").id, waiting.id]
    store.merge_policy_metrics(waiting.id, {"decision/verdict": "reject"})
    assert [p.id for p in queue_versions(store, agent)][1] == newest.id  # decided: back to the newest candidate
