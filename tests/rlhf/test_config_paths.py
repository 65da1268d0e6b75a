"""Every way a config is built ends in the same check: a file, ``--set``, ``apply_overrides``, ``from_dict``, the
REST body of ``POST /train``, the scheduler's enqueue, a job's stored config (the worker) and a resumed run. Each
refuses the same bad values naming the key, and nothing is stored."""
from __future__ import annotations

import json
import math
import os

import pytest
import yaml
from fastapi.testclient import TestClient

from rlhf.config import AppConfig, ConfigError, apply_overrides, from_dict, load_config
from rlhf.jobs.scheduler import StudioScheduler
from rlhf.jobs.worker import config_of, run_job
from rlhf.plugins import code_settings
from rlhf.training.ppo.run import resumed_config
from storage import InvalidInput
from tests.support.votes import seed_pairs

# (section, key, value): the same bad values on every path, each refused with "section.key" in the message
BAD = [
    ("ppo", "mini_batch_size", 999),  # more than the replies of one rollout (batch_size * group_size = 16)
    ("ppo", "temperature", math.nan),  # no rule `x <= 0` refuses a NaN
    ("reward", "head_c", math.inf),
    ("serving", "engine", "warp"),  # a section that was not checked when built
    ("ppo", "no_such_key", 1),
]
IDS = [f"{s}.{k}={v}" for s, k, v in BAD]


def saved_tree(section: str, key: str, value) -> dict:
    """A saved config (``to_dict``) with one bad value: what an older version may have stored with a job or run."""
    tree = AppConfig().to_dict()
    tree[section][key] = value
    return tree


@pytest.fixture
def client(services):
    from ui.webapp import create_app

    seed_pairs(services.store)  # enough votes: the only refusal left is the config's
    with TestClient(create_app(services, ui=False)) as c:
        yield c


@pytest.mark.parametrize("section, key, value", BAD, ids=IDS)
def test_every_construction_path_refuses_the_same_bad_value_naming_its_key(
        section, key, value, tmp_path, app_config, services, client):
    field = f"{section}.{key}"
    store = services.store
    nothing_stored = {t: store.count(t) for t in ("jobs", "reward_models", "policies")}

    # A YAML file, and `--set` on the command line
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({section: {key: value}}))
    with pytest.raises(ConfigError, match=field):
        load_config(path, env={})
    with pytest.raises(ConfigError, match=field):
        load_config(overrides=[f"{field}={value}"], env={})

    # Overrides (dotted and nested) and a saved dict
    for overrides in ({field: value}, {section: {key: value}}):
        with pytest.raises(ConfigError, match=field):
            apply_overrides(app_config, overrides)
    with pytest.raises(ConfigError, match=field):
        from_dict(saved_tree(section, key, value))

    # REST: 422 naming the key, for the dry run and the real thing (NaN is valid JSON to Python's parser)
    for body in ({"config": {field: value}}, {"dry_run": True, "config": {section: {key: value}}}):
        r = client.post("/api/v1/train", content=json.dumps(body), headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and field in r.json()["error"], r.text

    # The scheduler's enqueue (the UI's and the trigger rule's way in)
    with pytest.raises(InvalidInput, match=field):
        StudioScheduler(store, app_config).enqueue("retrain", "assistant", {field: value})
    assert {t: store.count(t) for t in nothing_stored} == nothing_stored  # nothing queued, nothing trained

    # A job stored with the bad value (by an older version): the worker fails it naming the key, before any work
    if isinstance(value, float) and not math.isfinite(value):
        with pytest.raises(InvalidInput, match="cannot be stored as JSON"):  # the Store keeps no NaN to rebuild
            store.enqueue_job("retrain", "assistant", {"app": saved_tree(section, key, value)})
    else:
        job = store.enqueue_job("retrain", "assistant", {"app": saved_tree(section, key, value)})
        with pytest.raises(ConfigError, match=field):
            config_of(job)
        store.claim_job(os.getpid())
        done = run_job(store, job.id, code_settings(app_config))
        assert done.status == "failed" and field in done.error and done.progress == 0
    assert {t: store.count(t) for t in ("reward_models", "policies")} == {
        t: nothing_stored[t] for t in ("reward_models", "policies")}
    assert not (app_config.data_path / "runs").exists()

    # Resuming a PPO run whose saved config has the bad value, and a good one resumed with the bad value as --set
    for saved, sets in ((saved_tree(section, key, value), []), (AppConfig().to_dict(), [f"{field}={value}"])):
        run = tmp_path / f"run-{len(sets)}"
        (run / "checkpoints" / "step-1").mkdir(parents=True)
        (run / "checkpoints" / "step-1" / "trainer_state.json").write_text("{}")
        (run / "config.json").write_text(json.dumps(saved))
        with pytest.raises(ConfigError, match=field):
            resumed_config(app_config, str(run), sets)


def test_the_good_values_still_pass_every_path(tmp_path, app_config):
    good = {"ppo.mini_batch_size": 16, "ppo.temperature": 0.5, "serving.engine": "transformers"}
    assert apply_overrides(app_config, good).ppo.mini_batch_size == 16
    assert from_dict(apply_overrides(AppConfig(), good).to_dict()).ppo.temperature == 0.5
    path = tmp_path / "good.yaml"
    path.write_text(yaml.safe_dump({"ppo": {"mini_batch_size": 16}, "serving": {"engine": "transformers"}}))
    assert load_config(path, env={}).serving.engine == "transformers"


def test_a_resumed_runs_saved_config_names_no_code(tmp_path, app_config):
    """Issue #41: what code to import comes from the running config, never from a run dir's saved config.json."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step-1").mkdir(parents=True)
    (run / "checkpoints" / "step-1" / "trainer_state.json").write_text("{}")
    hostile = {"scheduler.job_kinds": {"pwn": "data.policies.pwn:run"}, "ppo.reward_functions": {"pwn:score": 1.0}}
    (run / "config.json").write_text(json.dumps(apply_overrides(AppConfig(), hostile).to_dict()))
    config, _ = resumed_config(app_config, str(run), ["ppo.temperature=0.5"])
    assert config.scheduler.job_kinds == app_config.scheduler.job_kinds == {}
    assert config.ppo.reward_functions == app_config.ppo.reward_functions == {}
    assert config.ppo.temperature == 0.5
