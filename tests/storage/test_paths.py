"""Stored paths are relative to the data dir: a data dir can be moved, copied or restored at another path."""
from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from sqlite_utils import Database

from storage import Store
from storage.migrations import MIGRATIONS
from storage.paths import from_legacy, to_absolute, to_stored


def raw(store: Store, sql: str) -> list:
    return [r[0] for r in store.db.execute(sql).fetchall()]


def version_dir(data: Path, name: str) -> Path:
    path = data / "policies" / "assistant" / name
    path.mkdir(parents=True)
    return path


def test_paths_by_hand(tmp_path, monkeypatch):
    root = tmp_path / "data"
    assert to_stored(root / "policies" / "a" / "job1", root) == "policies/a/job1"
    assert to_stored(tmp_path / "elsewhere", root) == str(tmp_path / "elsewhere")
    assert to_stored(root / ".." / "data" / "runs", root) == "runs"
    monkeypatch.chdir(tmp_path)
    assert to_stored("data/reward_models/rm-1", root) == "reward_models/rm-1"  # a caller's relative path: from cwd
    assert to_absolute("policies/a/job1", root) == str(root / "policies" / "a" / "job1")
    assert to_absolute("/abs/x", root) == "/abs/x" and to_absolute(None, root) is None


def test_the_store_keeps_paths_under_the_data_dir_relative(tmp_path):
    data = tmp_path / "data"
    store = Store(data / "studio.db")
    store.ensure_default_agent("tiny")
    inside, outside = version_dir(data, "job1"), tmp_path / "adapters" / "mine"
    outside.mkdir(parents=True)
    v1 = store.register_policy_version("assistant", str(inside), None, promote=True)
    v2 = store.register_policy_version("assistant", str(outside), None, promote=False)
    rm = store.register_reward_model("assistant", str(data / "reward_models" / "rm-1"), "pairwise", {}, {}, {})
    job = store.enqueue_job("retrain", "assistant")
    store.claim_job(os.getpid())
    store.job_progress(job.id, checkpoint=str(data / "runs" / "job1" / "checkpoints" / "step-000002"))
    assert raw(store, "SELECT adapter_path FROM policies WHERE adapter_path IS NOT NULL ORDER BY id") == \
        ["policies/assistant/job1", str(outside)]
    assert raw(store, "SELECT path FROM reward_models") == ["reward_models/rm-1"]
    assert raw(store, "SELECT checkpoint FROM jobs") == ["runs/job1/checkpoints/step-000002"]
    # Records always carry absolute paths.
    assert store.get_policy(v1.id).adapter_path == str(inside) and store.get_policy(v2.id).adapter_path == str(outside)
    assert store.get_reward_model(rm.id).path == str(data / "reward_models" / "rm-1")
    assert store.get_job(job.id).checkpoint == str(data / "runs" / "job1" / "checkpoints" / "step-000002")
    store.close()


def test_a_moved_data_dir_finds_its_own_files(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    store = Store(old / "studio.db")
    store.ensure_default_agent("tiny")
    v1 = store.register_policy_version("assistant", str(version_dir(old, "job1")), None, promote=True)
    store.close()
    shutil.copytree(old, new)
    shutil.rmtree(old)
    moved = Store(new / "studio.db")
    assert moved.get_policy(v1.id).adapter_path == str(new / "policies" / "assistant" / "job1")
    assert Path(moved.active_policy("assistant").adapter_path).is_dir()
    moved.close()


def test_a_symlinked_data_dir_still_stores_relative_paths(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    store = Store(link / "studio.db")
    store.ensure_default_agent("tiny")
    store.register_policy_version("assistant", str(version_dir(real, "job1")), None, promote=True)
    assert raw(store, "SELECT adapter_path FROM policies WHERE version = 1") == ["policies/assistant/job1"]
    store.close()


def legacy_db(data: Path, paths: list[str]) -> None:
    """A data dir as the release before relative paths left it: absolute or working-directory paths."""
    data.mkdir(parents=True, exist_ok=True)
    db = Database(sqlite3.connect(str(data / "studio.db")))
    MIGRATIONS.apply(db, stop_before="m007_relative_paths")
    db.execute("INSERT INTO agents (name, system_prompt, base_model, created, updated) VALUES ('a', '', 'tiny', '', '')")
    for i, path in enumerate(paths, start=1):
        db.execute("INSERT INTO policies (agent_id, version, adapter_path, status, created) VALUES (1, ?, ?, ?, '')",
                   [i, path, "candidate"])
    db.execute("INSERT INTO reward_models (agent_id, path, mode, created) VALUES (1, ?, 'pairwise', '')",
               [str(data / "reward_models" / "rm-1")])
    db.conn.commit()
    db.conn.close()


def test_the_migration_makes_old_paths_relative(tmp_path, monkeypatch):
    data, other = tmp_path / "data", tmp_path / "keep"
    monkeypatch.chdir(tmp_path)
    legacy_db(data, [str(data / "policies" / "a" / "job1"),  # absolute, under the data dir
                     "data/policies/a/job2",  # relative to the app's working directory (data_dir ./data)
                     str(other / "adapter")])  # outside: stays absolute
    store = Store(data / "studio.db")
    assert raw(store, "SELECT adapter_path FROM policies ORDER BY version") == \
        ["policies/a/job1", "policies/a/job2", str(other / "adapter")]
    assert raw(store, "SELECT path FROM reward_models") == ["reward_models/rm-1"]
    store.close()


def test_an_old_data_dir_copied_elsewhere_before_the_migration_uses_its_own_copies(tmp_path):
    """The reported bug: a copy of an old data dir served the original's adapters (absolute paths)."""
    old, copy = tmp_path / "old", tmp_path / "copy"
    legacy_db(old, [str(old / "policies" / "a" / "job1"), str(tmp_path / "gone" / "policies" / "a" / "job9")])
    version_dir_a = old / "policies" / "a" / "job1"
    version_dir_a.mkdir(parents=True)
    shutil.copytree(old, copy)
    shutil.rmtree(old)
    store = Store(copy / "studio.db")
    # job1 exists in the copy: it is the copy's own; job9 exists nowhere here: kept as it was
    assert raw(store, "SELECT adapter_path FROM policies ORDER BY version") == \
        ["policies/a/job1", str(tmp_path / "gone" / "policies" / "a" / "job9")]
    assert store.get_policy(1).adapter_path == str(copy / "policies" / "a" / "job1")
    store.close()
    assert from_legacy("/x/runs/job1", copy) == "/x/runs/job1"  # nothing of that name here
