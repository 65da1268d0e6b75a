"""The linear-head reward model: maths on synthetic features, honest CV, and a tiny model end to end."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rlhf.config import load_config
from rlhf.training import reward_head as rh
from rlhf.training.data import group_labels
from rlhf.training.reward import choose_method, load_reward_model, train_reward_model
from storage import Store
from tests.rlhf.training.test_reward import plant


def synthetic(n: int, d: int = 20, seed: int = 0, noise: float = 0.0):
    """Pairs whose preference is a fixed direction in feature space (plus label noise)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=d)
    a, b = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    a_wins = (a - b) @ w > 0
    flip = rng.random(n) < noise
    a_wins = a_wins ^ flip
    chosen = np.where(a_wins[:, None], a, b)
    rejected = np.where(a_wins[:, None], b, a)
    return chosen, rejected


def test_the_head_learns_a_direction_from_few_pairs():
    xc, xr = synthetic(32)
    head = rh.fit_pairs(xc, xr, c=1.0, members=4, seed=0)
    test_c, test_r = synthetic(400, seed=0)[0][32:], synthetic(400, seed=0)[1][32:]
    assert rh.pair_accuracy(head, test_c, test_r) >= 0.8
    assert head.weights.shape == (4, 20)
    scores = head.scores(np.concatenate([xc, xr]))
    assert abs(np.std(scores) - 1.0) < 1e-6  # unit spread on the training replies


def test_the_preference_fit_weighs_pairs_by_margin_as_configured():
    xc, xr = synthetic(40, seed=3)
    pairs = [{"margin": 2.0 if i % 2 else 0.0} for i in range(40)]
    cfg = load_config(env={}).reward
    head = rh.fit_preference_head(xc, xr, pairs, cfg)
    same = rh.fit_pairs(xc, xr, c=cfg.head_c, members=cfg.ensemble, seed=cfg.seed,
                        weights=np.array([3.0 if i % 2 else 1.0 for i in range(40)]))
    assert np.allclose(head.member_scores(xc), same.member_scores(xc))
    assert list(rh.pair_weights([{"margin": -1}, {}, {"margin": 0.5}])) == [1.0, 1.0, 1.5]


def test_members_disagree_more_where_data_is_thin():
    xc, xr = synthetic(12, seed=3)
    head = rh.fit_pairs(xc, xr, c=1.0, members=8, seed=0)
    p = head.preference(xc[:5], xr[:5])
    assert p.shape == (5, 8) and ((p >= 0) & (p <= 1)).all()
    assert p.std(axis=1).max() > 0  # bootstrap members are not copies


def test_score_regression_orders_by_target():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 10))
    y = 1 / (1 + np.exp(-x[:, 0] * 3))
    head = rh.fit_scores(x, y, alpha=1.0, members=3)
    pred = head.scores(x)
    assert np.corrcoef(pred, y)[0, 1] > 0.9


def test_save_and_load_give_the_same_scores(tmp_path):
    xc, xr = synthetic(20)
    head = rh.fit_pairs(xc, xr, members=3)
    head.save(tmp_path / "head.npz")
    again = rh.LinearHead.load(tmp_path / "head.npz")
    np.testing.assert_allclose(again.scores(xc), head.scores(xc))


def test_folds_never_split_a_group():
    groups = [f"g{i // 3}" for i in range(30)]  # 10 groups of 3 rows
    folds = rh.grouped_folds(groups, 4, seed=1)
    assert sorted(np.concatenate(folds).tolist()) == list(range(30))
    for fold in folds:
        inside = {groups[i] for i in fold}
        outside = {groups[i] for f in folds if f is not fold for i in f}
        assert not inside & outside


def test_cross_validation_judges_every_pair_once_and_reports_an_interval():
    xc, xr = synthetic(60, d=5, noise=0.1)
    groups = [f"c{i // 2}" for i in range(60)]
    cv = rh.cross_validate_pairs(xc, xr, groups, k=5, c=1.0)
    assert cv["cv_pairs"] == 60 and cv["cv_folds"] == 5
    assert cv["cv_low"] < cv["cv_accuracy"] < cv["cv_high"]
    assert cv["cv_accuracy"] > 0.7


def coin_flip_votes(seed: int, n: int = 64, d: int = 40):
    """Votes that carry no preference: the two replies' features are independent of which one won."""
    rng = np.random.default_rng(100 + seed)
    return rng.normal(size=(n, d)), rng.normal(size=(n, d)), [f"c{i // 2}" for i in range(n)]


def test_cross_validation_is_the_one_member_head_fitted_per_fold():
    """The representer-form fit the CV uses is ``fit_pairs`` itself: the same verdict on every held-out pair."""
    xc, xr = synthetic(48, d=30, noise=0.3)
    groups = [f"c{i // 2}" for i in range(48)]
    correct = 0.0
    for fold in rh.grouped_folds(groups, 4, 0):
        train = np.setdiff1d(np.arange(48), fold)
        head = rh.fit_pairs(xc[train], xr[train], c=0.05, members=1)
        correct += rh.pair_accuracy(head, xc[fold], xr[fold]) * len(fold)
    assert rh.cross_validate_pairs(xc, xr, groups, k=4, c=0.05)["cv_accuracy"] == pytest.approx(correct / 48)


@pytest.mark.slow  # 40 cross-validations with their nulls
def test_on_coin_flip_votes_the_permutation_interval_holds_chance():
    """The issue's case: coin-flip votes whose CV accuracy (0.375) the Wilson interval called worse than chance;
    the label-shuffle null holds 0.5 in about 95% of such runs, Wilson's in fewer."""
    xc, xr, groups = coin_flip_votes(55)
    wilson = rh.cross_validate_pairs(xc, xr, groups, k=5, c=0.05)
    honest = rh.cross_validate_pairs(xc, xr, groups, k=5, c=0.05, permutations=200)
    assert wilson["cv_high"] < 0.5 and wilson["cv_accuracy"] == honest["cv_accuracy"] == 0.375
    assert honest["cv_low"] <= 0.5 <= honest["cv_high"] and honest["cv_chance"] and honest["cv_p_value"] > 0.5
    covered = {"wilson": 0, "permutation": 0}
    for seed in range(40):
        xc, xr, groups = coin_flip_votes(seed)
        for name, perms in (("wilson", 0), ("permutation", 200)):
            cv = rh.cross_validate_pairs(xc, xr, groups, k=5, c=0.05, permutations=perms)
            covered[name] += cv["cv_low"] <= 0.5 <= cv["cv_high"]
    assert covered["permutation"] >= 36 and covered["permutation"] > covered["wilson"]


def test_on_a_clear_preference_the_permutation_interval_excludes_chance():
    xc, xr = synthetic(64, d=40, noise=0.1)
    cv = rh.cross_validate_pairs(xc, xr, [f"c{i // 2}" for i in range(64)], k=5, c=0.05, permutations=200)
    assert cv["cv_low"] > 0.5 and not cv["cv_chance"] and cv["cv_p_value"] < 0.01
    assert cv["cv_low"] <= cv["cv_accuracy"] <= cv["cv_high"] and abs(cv["cv_null_mean"] - 0.5) < 0.05


def test_coin_flip_votes_are_never_promoted():
    """Item 7: even when the judge's replies look better, a reward model that cannot be told from chance blocks
    promotion."""
    from rlhf.retrain.gate import Evidence, decide

    xc, xr, groups = coin_flip_votes(3)
    cv = rh.cross_validate_pairs(xc, xr, groups, k=5, c=0.05, permutations=200)
    evidence = Evidence(judge_accuracy=0.9, judge_low=0.7, judge_high=0.97, judge_pairs=20, judge_test_pairs=20,
                        rm_cv_accuracy=cv["cv_accuracy"], rm_cv_low=cv["cv_low"], rm_cv_high=cv["cv_high"])
    better = np.full((16, 4), 2.0) + np.arange(16)[:, None] * 0.01
    result = decide(better, np.zeros((16, 4)), evidence, 1.0, 0.5, 20.0)
    assert cv["cv_chance"] and result.evidence["verdict_from_judge"] == "promote"
    assert result.verdict.verdict == "inconclusive" and "chance" in result.verdict.reason


def test_wilson_interval_by_hand():
    low, high = rh.wilson_interval(8, 10)  # p = 0.8, n = 10, z = 1.96
    assert low == pytest.approx(0.4902, abs=1e-3) and high == pytest.approx(0.9433, abs=1e-3)
    assert rh.wilson_interval(0, 0) == (0.0, 1.0)
    assert rh.wilson_interval(10, 10)[1] == 1.0


def test_the_app_says_not_enough_data_when_the_interval_includes_chance():
    assert rh.verdict_text(0.7, 0.42, 0.9).startswith("not enough data to tell")
    assert rh.verdict_text(0.85, 0.7, 0.94).startswith("0.85")
    assert rh.verdict_text(None, None, None) == "not measured"


def test_group_labels_follow_shared_contexts():
    rows = [{"conversation_ids": [1], "context_key": "a"}, {"conversation_ids": [2], "context_key": "a"},
            {"conversation_ids": [3], "context_key": "b"}, {"conversation_ids": [3, 4], "context_key": "c"}]
    labels = group_labels(rows)
    assert labels[0] == labels[1] and labels[2] == labels[3] and labels[0] != labels[2]


def test_method_choice():
    cfg = load_config(env={}).reward
    assert choose_method(cfg, 40) == "head" and choose_method(cfg, cfg.lora_min_pairs) == "lora"
    with pytest.raises(ValueError, match="reward.method"):
        cfg.method = "magic"
        choose_method(cfg, 1)


@pytest.mark.slow
def test_a_tiny_model_learns_a_planted_marker_word_preference(tmp_path, tiny_model_dir):
    config = load_config(env={}, overrides=[f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}",
                                            "device=cpu", "gate.min_judge_pairs=8"])  # a judge from 22 pairs
    store = Store(config.db_path)
    store.ensure_default_agent(str(tiny_model_dir))
    plant(store, 40, seed=0)  # the reply ending in "thanks" always wins
    result = train_reward_model(store, config)
    m = result.metrics
    assert result.method == "head" and result.mode == "pairwise"
    assert m["reward/cv_accuracy"] >= 0.9 and m["reward/cv_low"] > 0.5
    assert m["reward/cv_pairs"] + m["reward/judge_pairs"] == 40  # the gate's judge keeps its share out
    summary = result.summary()
    assert {"cv_accuracy", "cv_low", "cv_high"} <= set(summary) and summary["method"] == "head"
    meta = json.loads((tmp_path / "data" / "reward_models" / result.path.split("/")[-1] / "meta.json").read_text())
    assert meta["format"] == 2 and meta["metrics"]["reward/cv_accuracy"] == m["reward/cv_accuracy"]
    scorer = load_reward_model(result.path, device="cpu")
    prompt = [{"role": "user", "content": "Tell me about thing 99."}]
    good, bad = scorer([prompt, prompt], ["Thing 99 is a thing with six parts, thanks",
                                          "Thing 99 is a thing with six parts, sorry"])
    assert good > bad and all(math.isfinite(s) for s in (good, bad))
    store.close()
