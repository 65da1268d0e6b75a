"""The promotion gate: a judge fitted on votes PPO's reward model never saw, and the rules of the verdict."""
from __future__ import annotations

import numpy as np
import pytest

from rlhf.retrain.evaluation import gate as old_gate
from rlhf.retrain.gate import Evidence, decide
from rlhf.training.judge import fit_judge, judge_split
from rlhf.training.reward_head import cross_validate_pairs, fit_pairs

GOOD = Evidence(judge_accuracy=0.8, judge_low=0.65, judge_high=0.9, judge_pairs=20, judge_test_pairs=44,
                rm_cv_accuracy=0.8, rm_cv_low=0.66, rm_cv_high=0.9)


def test_judge_split_keeps_whole_groups_and_its_share():
    groups = [f"g{i // 2}" for i in range(60)]  # 30 contexts, two pairs each
    mine, theirs = judge_split(groups, 0.33, 8, seed=1)
    assert len(mine) + len(theirs) == 60 and not set(mine) & set(theirs)
    assert 0.3 * 60 <= len(theirs) <= 0.4 * 60
    assert not {groups[i] for i in mine} & {groups[i] for i in theirs}  # no context on both sides
    assert judge_split(groups, 0.33, 8, seed=1)[1].tolist() == theirs.tolist()  # deterministic
    everything, none = judge_split(groups[:12], 0.33, 8)  # too few for both sides: no judge
    assert len(everything) == 12 and len(none) == 0
    assert len(judge_split(groups, 0.0, 8)[1]) == 0


def test_by_default_every_vote_trains_until_a_judge_can_be_set_aside_from_94_pairs():
    from rlhf.config import load_config
    from rlhf.training.judge import pairs_for_a_judge

    gate = load_config(env={}).gate
    assert pairs_for_a_judge(gate.judge_share, gate.min_judge_pairs) == 94
    for n, judged in ((64, 0), (93, 0), (94, 32)):  # 64 votes: all train, people decide (#40's table)
        mine, theirs = judge_split([str(i) for i in range(n)], gate.judge_share, gate.min_judge_pairs)
        assert (len(mine), len(theirs)) == (n - judged, judged)
    assert pairs_for_a_judge(0.33, 8) == 22 and pairs_for_a_judge(0.0, 8) is None


def synthetic(n, d=12, seed=0, signal=True):
    """Feature pairs; with ``signal`` the first feature decides the preference, else labels are coin flips."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    first = a[:, 0] > b[:, 0] if signal else rng.random(n) < 0.5
    return np.where(first[:, None], a, b), np.where(first[:, None], b, a)


def test_the_judge_is_measured_on_pairs_it_never_saw():
    xc, xr = synthetic(64)
    mine, theirs = judge_split([str(i) for i in range(64)], 0.33, 8)
    head, m = fit_judge(xc, xr, theirs, mine, c=0.5, members=4)
    assert m["judge_pairs"] == len(theirs) and m["judge_test_pairs"] == len(mine)
    assert m["judge_accuracy"] > 0.75 and m["judge_low"] > 0.5
    xc, xr = synthetic(64, signal=False)
    _, noise = fit_judge(xc, xr, theirs, mine, c=0.5, members=4)
    assert noise["judge_low"] <= 0.5 <= noise["judge_high"]
    assert fit_judge(xc, xr, np.array([], int), mine, 0.5, 4) == (None, {"judge_accuracy": None, "judge_low": None,
                                                                          "judge_high": None, "judge_pairs": 0,
                                                                          "judge_test_pairs": 0})


def scores(rate_shift, n=32, members=8, seed=0):
    rng = np.random.default_rng(seed)
    active = rng.normal(size=(n, members))
    return active + rate_shift + 0.2 * rng.normal(size=(n, members)), active


def test_the_verdict_needs_a_judge_that_beats_chance():
    cand, act = scores(1.0)
    assert decide(cand, act, GOOD, 2.0, 0.5, 20.0).verdict.verdict == "promote"
    blind = Evidence(0.55, 0.4, 0.7, 20, 44, 0.8, 0.66, 0.9)
    verdict = decide(cand, act, blind, 2.0, 0.5, 20.0).verdict
    assert verdict.verdict == "inconclusive" and "chance" in verdict.reason and "arena votes" in verdict.reason
    none = decide(None, None, Evidence(), 2.0, 0.5, 20.0)
    assert none.verdict.verdict == "inconclusive" and none.evidence["source"] == "none"


def test_an_unreliable_reward_model_or_a_tripped_guard_blocks_promotion():
    cand, act = scores(1.0)
    weak_rm = Evidence(0.8, 0.65, 0.9, 20, 44, 0.6, 0.45, 0.72)
    assert "reward model PPO followed" in decide(cand, act, weak_rm, 2.0, 0.5, 20.0).verdict.reason
    guard = {"tripped": ["off_prompt"], "examples": [{"check": "off_prompt"}] * 3}
    guarded = decide(cand, act, GOOD, 2.0, 0.5, 20.0, guard)
    assert guarded.verdict.verdict == "inconclusive" and "off_prompt" in guarded.verdict.reason and guarded.guarded
    d = guarded.to_dict()
    assert d["guard"]["tripped"] == ["off_prompt"] and len(d["guard"]["examples"]) == 3
    assert d["evidence"]["verdict_from_judge"] == "promote" and d["evidence"]["judge"]["accuracy"] == 0.8
    assert guarded.metrics()["gate/guard_tripped"] == ["off_prompt"]


def test_a_reliable_judge_still_rejects_and_kl_rejects():
    cand, act = scores(-1.0)
    assert decide(cand, act, GOOD, 2.0, 0.5, 20.0).verdict.verdict == "reject"
    cand, act = scores(1.0)
    assert decide(cand, act, GOOD, 25.0, 0.5, 20.0).verdict.verdict == "reject"


@pytest.mark.parametrize("trials", [30])
def test_on_coin_flip_votes_the_old_gate_promotes_and_the_new_one_does_not(trials):
    """No preference exists; the candidate is the best of 4 replies under PPO's reward model. PPO's own model
    calls that a win (the old gate), the held-out judge cannot (the new one)."""
    old = new = 0
    for seed in range(trials):
        xc, xr = synthetic(64, seed=seed, signal=False)
        groups = [str(i) for i in range(64)]
        mine, theirs = judge_split(groups, 0.33, 8, seed)
        rm = fit_pairs(xc[mine], xr[mine], c=0.5, members=4, seed=seed)
        cv = cross_validate_pairs(xc[mine], xr[mine], [groups[i] for i in mine], k=4, c=0.5)
        judge, jm = fit_judge(xc, xr, theirs, mine, 0.5, 4, seed)
        rng = np.random.default_rng(100 + seed)
        replies = rng.normal(size=(32, 4, 12))
        best = rm.scores(replies.reshape(-1, 12)).reshape(32, 4).argmax(axis=1)
        cand, act = replies[np.arange(32), best], replies[np.arange(32), (best + 1) % 4]
        old += old_gate(rm.member_scores(cand), rm.member_scores(act), 0.6, 0.5, 20.0).verdict == "promote"
        ev = Evidence.from_metrics({**cv, **jm}, prefix="")
        new += decide(judge.member_scores(cand), judge.member_scores(act), ev, 0.6, 0.5, 20.0).verdict.verdict \
            == "promote"
    assert old >= trials // 2  # PPO's own reward model is fooled by its own optimum
    assert new <= 2
