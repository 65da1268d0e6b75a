"""Atomic publish, leftovers of an interrupted publish, and broken adapters at start."""
from __future__ import annotations

import pytest

import numpy as np

from rlhf.jobs.evaluation import bootstrap_interval, gate, win_matrix, win_rate
from rlhf.jobs.publish import check_adapters, clean_leftovers, policies_root, publish_version


def job(store, n):
    """A real job row with id n (the version dir is named after its job)."""
    while store.count("jobs") < n:
        store.enqueue_job(f"kind{store.count('jobs') + 1}")
    return n


@pytest.fixture
def adapter(tmp_path, tiny_model_dir):
    from tests.conftest import make_adapter

    return make_adapter(tiny_model_dir, tmp_path / "trained", seed=3)


def test_publish_copies_then_registers_in_one_step(store, app_config, adapter):
    policy = publish_version(store, app_config, "assistant", adapter, parent_id=1, promote=True, job_id=job(store, 7),
                             data_snapshot={"rating_id": 3, "comparison_id": 2}, metrics={"eval/reward": 0.5})
    assert policy.version == 1 and policy.status == "active" and policy.parent_id == 1
    assert (policies_root(app_config) / "assistant" / "job7" / "adapter_config.json").is_file()
    assert policy.adapter_path.endswith("job7") and policy.data_snapshot == {"rating_id": 3, "comparison_id": 2}
    assert store.get_policy(1).status == "candidate"
    with pytest.raises(FileExistsError):
        publish_version(store, app_config, "assistant", adapter, parent_id=1, promote=False, job_id=job(store, 7))
    assert len(store.list_policies("assistant")) == 2


def test_candidate_published_without_promotion(store, app_config, adapter):
    policy = publish_version(store, app_config, "assistant", adapter, parent_id=1, promote=False, job_id=job(store, 8))
    assert policy.status == "candidate" and store.active_policy("assistant").id == 1


def test_a_publish_interrupted_before_the_rename_leaves_nothing(store, app_config, adapter):
    import shutil

    root = policies_root(app_config) / "assistant"
    root.mkdir(parents=True)
    shutil.copytree(adapter, root / ".tmp-job9-abc123")  # the state a kill before the rename leaves
    shutil.copytree(adapter, root / "job10")  # renamed, but the row was never inserted
    kept = publish_version(store, app_config, "assistant", adapter, parent_id=1, promote=False, job_id=job(store, 11))
    removed = clean_leftovers(store, app_config)
    assert sorted(p.name for p in removed) == [".tmp-job9-abc123", "job10"]
    assert [p.name for p in root.iterdir()] == ["job11"] and store.get_policy(kept.id).adapter_path
    assert len(store.list_policies("assistant")) == 2


def test_missing_or_corrupt_adapters_are_marked_broken(store, app_config, adapter):
    import shutil

    good = publish_version(store, app_config, "assistant", adapter, parent_id=1, promote=False, job_id=job(store, 1))
    gone = publish_version(store, app_config, "assistant", adapter, parent_id=1, promote=True, job_id=job(store, 2))
    bad = publish_version(store, app_config, "assistant", adapter, parent_id=1, promote=False, job_id=job(store, 3))
    shutil.rmtree(gone.adapter_path)
    (policies_root(app_config) / "assistant" / "job3" / "adapter_config.json").write_text("{oops")
    broken = {p.id: p.error for p in check_adapters(store)}
    assert set(broken) == {gone.id, bad.id}
    assert "missing" in broken[gone.id] and "unreadable" in broken[bad.id]
    assert store.get_policy(good.id).status == "candidate"
    assert store.active_policy("assistant").version == 0  # the broken active version fell back to the base


def test_win_rate():
    assert win_rate([1.0, 0.0, 2.0], [0.5, 0.0, 3.0]) == pytest.approx(0.5)
    assert win_matrix(np.array([1.0, 0.0]), np.array([0.5, 0.0])).tolist() == [[1.0], [0.5]]


def test_the_gate_promotes_a_clear_win():
    rng = np.random.default_rng(0)
    active = rng.normal(size=(40, 8))
    verdict = gate(active + 1.0 + 0.1 * rng.normal(size=(40, 8)), active, kl_to_base=2.0, min_win_rate=0.5,
                   max_kl=10.0)
    assert verdict.verdict == "promote" and verdict.low > 0.5 and verdict.win_rate > 0.9
    assert set(verdict.to_dict()) == {"verdict", "win_rate", "low", "high", "reason"}


def test_the_gate_rejects_a_clear_loss_and_a_kl_blowup():
    rng = np.random.default_rng(1)
    active = rng.normal(size=(40, 8))
    worse = gate(active - 1.0, active, kl_to_base=2.0, min_win_rate=0.5, max_kl=10.0)
    assert worse.verdict == "reject" and worse.high < 0.5 and "upper bound" in worse.reason
    drift = gate(active + 1.0, active, kl_to_base=12.0, min_win_rate=0.5, max_kl=10.0)
    assert drift.verdict == "reject" and "KL" in drift.reason


def test_the_gate_says_inconclusive_when_the_interval_straddles():
    rng = np.random.default_rng(2)
    active = rng.normal(size=(12, 8))
    coin = gate(active + rng.normal(size=(12, 8)), active, kl_to_base=1.0, min_win_rate=0.5, max_kl=10.0)
    assert coin.verdict == "inconclusive" and coin.low <= 0.5 <= coin.high and "arena votes" in coin.reason


def test_member_disagreement_widens_the_interval():
    rng = np.random.default_rng(3)
    active = np.zeros((30, 8))
    agree = np.tile(rng.normal(0.3, 1.0, size=(30, 1)), (1, 8))  # every member says the same
    disagree = agree + rng.normal(0, 3.0, size=(30, 8))  # members disagree per prompt
    lo1, hi1 = bootstrap_interval(win_matrix(agree, active))
    lo2, hi2 = bootstrap_interval(win_matrix(disagree, active))
    assert hi2 - lo2 >= hi1 - lo1 - 0.02
