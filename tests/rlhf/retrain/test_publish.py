"""Atomic publish, leftovers of an interrupted publish, and broken adapters at start."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlhf.retrain.evaluation import bootstrap_interval, gate, win_matrix, win_rate
from rlhf.retrain.publish import check_adapters, clean_leftovers, policies_root, publish_version


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


def test_a_publish_interrupted_before_the_rename_leaves_only_a_temp_dir(store, app_config, adapter):
    import shutil

    root = policies_root(app_config) / "assistant"
    root.mkdir(parents=True)
    shutil.copytree(adapter, root / ".job9.tmp-abc123")  # the state a kill before the rename leaves
    shutil.copytree(adapter, root / "job10")  # renamed, but the row was never inserted
    kept = publish_version(store, app_config, "assistant", adapter, parent_id=1, promote=False, job_id=job(store, 11))
    removed = clean_leftovers(store, app_config)
    assert [p.name for p in removed] == [".job9.tmp-abc123"]  # only what the atomic-write rule names a temp dir
    assert sorted(p.name for p in root.iterdir()) == ["job10", "job11"] and store.get_policy(kept.id).adapter_path
    assert len(store.list_policies("assistant")) == 2
    # The job that died between rename and insert publishes again (resumed): the unregistered copy is replaced.
    again = publish_version(store, app_config, "assistant", adapter, parent_id=1, promote=False, job_id=job(store, 10))
    assert again.adapter_path.endswith("job10") and len(store.list_policies("assistant")) == 3


def test_the_clean_up_never_removes_a_directory_a_row_points_to(store, app_config, adapter):
    import shutil

    root = policies_root(app_config) / "assistant"
    odd = root / ".job5.tmp-imported"  # a temp-looking name, but registered
    shutil.copytree(adapter, odd)
    policy = store.register_policy_version("assistant", str(odd), parent_id=1, promote=False)
    rm_dir = app_config.data_path / "reward_models" / ".rm-registered"
    rm_dir.mkdir(parents=True)
    store.register_reward_model("assistant", str(rm_dir), "pairwise", {}, {}, {})
    assert clean_leftovers(store, app_config) == []
    assert odd.is_dir() and rm_dir.is_dir() and store.get_policy(policy.id).status == "candidate"


def test_a_copied_data_dir_keeps_every_version_when_the_original_is_gone(tmp_path, app_config, adapter):
    """The reported bug: a copy deleted its own adapters at start and served the original's."""
    import shutil

    from rlhf.config import apply_overrides
    from storage import Store

    first = Store(app_config.db_path)
    first.ensure_default_agent("tiny")
    published = [publish_version(first, app_config, "assistant", adapter, parent_id=1, promote=i == 0,
                                 job_id=job(first, i + 1)) for i in range(2)]
    first.close()
    moved = tmp_path / "moved"
    shutil.copytree(app_config.data_path, moved)
    shutil.rmtree(app_config.data_path)
    config = apply_overrides(app_config, {"data_dir": str(moved)})
    store = Store(config.db_path)
    assert clean_leftovers(store, config) == [] and check_adapters(store) == []
    for p in published:
        path = store.get_policy(p.id).adapter_path
        assert path == str(moved / "policies" / "assistant" / Path(p.adapter_path).name)
        assert (Path(path) / "adapter_config.json").is_file()
    store.close()


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
