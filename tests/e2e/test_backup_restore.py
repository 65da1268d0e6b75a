"""A data dir you can back up, restore and move: real app processes (`python app.py`, tiny model), the real CLI.

Back up a running app in the middle of a retrain, restore the archive at another path and start an app there:
every version serves, every rating and vote is there, the counts are equal, and a new retrain publishes into the
restored data dir. Then move the original (copy it, delete it): the moved app serves every version too.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from rlhf.config import load_config
from rlhf.retrain.publish import publish_version
from storage import Store
from storage.backup import BACKUP_INTERRUPTED
from tests.conftest import ROOT, make_adapter
from tests.e2e.app_process import FAST_RETRAIN, TEST_APP, AppProcess, seed_preferences, wait_until, write_config

FEEDBACK = ("conversations", "messages", "ratings", "comparisons", "annotators", "arena_pairs")


def cli(*args: str, data: Path) -> dict:
    """Run `python -m cli ...` as its own process on ``data``; its JSON line."""
    env = {**os.environ, "RLHF_DATA_DIR": str(data)}
    done = subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def counts(data: Path) -> dict:
    store = Store(data / "studio.db")
    try:
        return {t: store.count(t) for t in FEEDBACK}
    finally:
        store.close()


def served_versions(http: httpx.Client) -> list[dict]:
    return [p for p in http.get("/policies").json() if p["status"] in ("active", "candidate")]


def assert_every_version_serves(http: httpx.Client, expected: set[int]) -> None:
    listed = served_versions(http)
    assert {p["id"] for p in listed} == expected, listed
    for p in listed:
        reply = http.post("/chat", json={"messages": [{"role": "user", "content": "still you?"}],
                                         "policy_id": p["id"], "max_new_tokens": 4})
        assert reply.status_code == 200 and reply.json()["policy_id"] == p["id"], reply.text


def move_and_serve(tmp_path, data, tiny_model_dir, config, versions) -> None:
    """Move the data dir: copy it, delete the original, start at the new path; every version serves from there."""
    final = counts(data)
    moved = tmp_path / "moved" / "data"
    shutil.copytree(data, moved)
    shutil.rmtree(data)
    with AppProcess(moved, tiny_model_dir, config) as there:
        assert counts(moved) == final  # the start-up clean-up and checks lost nothing
        assert_every_version_serves(there.client(), versions)
    statuses = Store(moved / "studio.db")
    assert "broken" not in {p.status for p in statuses.list_policies()}
    assert all(Path(p.adapter_path).is_relative_to(moved) for p in statuses.list_policies() if p.adapter_path)
    statuses.close()


def test_back_up_mid_retrain_restore_elsewhere_and_move(tmp_path, tiny_model_dir):
    data = tmp_path / "data"
    config = write_config(tmp_path / "app.yaml", TEST_APP, FAST_RETRAIN, {"ppo": {"steps": 30}})  # still running
    store = Store(data / "studio.db")
    store.ensure_default_agent(str(tiny_model_dir))
    app_config = load_config(env={}, overrides=[f"data_dir={data}"])
    for i in range(2):  # v1 active, v2 candidate
        publish_version(store, app_config, "assistant", make_adapter(tiny_model_dir, tmp_path / f"v{i + 1}", seed=i),
                        parent_id=store.active_policy("assistant").id, promote=i == 0)
    store.close()
    app = AppProcess(data, tiny_model_dir, config).start()
    try:
        http = app.client()
        seed_preferences(http, 10)
        before = counts(data)
        versions_before = {p["id"] for p in served_versions(http)}
        job_id = http.post("/train", json={}).json()["job_id"]
        wait_until(lambda: (lambda j: j["status"] == "running" and j["phase"] == "ppo")(http.get(f"/jobs/{job_id}")
                                                                                         .json()), 300,
                   "the retrain to be in its PPO phase")

        archive = tmp_path / "backups" / "studio.tar.gz"
        made = cli("backup", str(archive), data=data)  # a second process, while the app trains
        assert http.get(f"/jobs/{job_id}").json()["status"] == "running"  # the backup did not disturb the job
        assert made["tables"]["ratings"] == before["ratings"] and made["tables"]["comparisons"] == before["comparisons"]

        restored = tmp_path / "restored" / "data"
        cli("restore", str(archive), "--data", str(restored), data=restored)
        assert counts(restored) == before  # every rating and vote is there
        with AppProcess(restored, tiny_model_dir, config) as copy:
            other = copy.client()
            assert_every_version_serves(other, versions_before)
            old_job = other.get(f"/jobs/{job_id}").json()
            assert old_job["status"] == "failed" and old_job["error"] == BACKUP_INTERRUPTED
            # The restored data dir trains and publishes in its own place.
            new_job = other.post("/train", json={"config": {"ppo.steps": 2}}).json()["job_id"]
            done = wait_until(lambda: (lambda j: j if j["status"] in ("succeeded", "failed") else None)(
                other.get(f"/jobs/{new_job}").json()), 600, "the restored app's retrain")
            assert done["status"] == "succeeded", done
            new = Store(restored / "studio.db")  # every version, old and new, is served from the restored copy
            assert all(Path(p.adapter_path).is_relative_to(restored) for p in new.list_policies() if p.adapter_path)
            assert done["result"]["policy_id"] in {p.id for p in new.list_policies()}
            new.close()
            assert_every_version_serves(other, versions_before | {done["result"]["policy_id"]})

        # Meanwhile the original app finished its own retrain, untouched by the copy.
        finished = wait_until(lambda: (lambda j: j if j["status"] in ("succeeded", "failed") else None)(
            http.get(f"/jobs/{job_id}").json()), 600, "the original retrain")
        assert finished["status"] == "succeeded", finished
        versions_after = {p["id"] for p in served_versions(http)}
        assert finished["result"]["policy_id"] in versions_after
    finally:
        app.stop()

    move_and_serve(tmp_path, data, tiny_model_dir, config, versions_after)
