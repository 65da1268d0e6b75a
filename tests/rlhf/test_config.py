"""Config precedence (defaults < YAML < env < --set), types, errors, and that the README documents it."""
from __future__ import annotations

import pytest

from rlhf.config import ConfigError, apply_overrides, describe, load_config, markdown_table, to_yaml
from tests.conftest import ROOT


def test_defaults():
    cfg = load_config(env={})
    assert cfg.data_dir == "./data" and cfg.base_model == "smollm2-135m-instruct" and cfg.device == "auto"
    assert cfg.serving.max_message_chars == 8000 and cfg.reward.min_pairs == 16


def test_precedence_yaml_env_cli(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data_dir: /from/yaml\nppo:\n  steps: 3\n  batch_size: 5\nserving:\n  temperature: 0.1\n")
    env = {"RLHF_DATA_DIR": "/from/env", "RLHF_PPO_STEPS": "4", "RLHF_BASE_MODEL": "some/model",
           "RLHF_DEVICE": "cpu", "RLHF_UNRELATED_THING": "x"}
    cfg = load_config(path, ["ppo.steps=6", "reward.exclude_annotators=a,b"], env=env)
    assert cfg.data_dir == "/from/env"  # env beats YAML
    assert cfg.ppo.steps == 6  # CLI beats env
    assert cfg.ppo.batch_size == 5 and cfg.serving.temperature == 0.1  # YAML beats defaults
    assert cfg.base_model == "some/model" and cfg.device == "cpu"
    assert cfg.reward.exclude_annotators == ["a", "b"]


@pytest.mark.parametrize("override, problem", [
    ("ppo.stepz=3", "unknown config key"), ("nosuch.steps=3", "unknown config section"),
    ("ppo.steps=abc", "expected int"), ("ppo.steps=1.5", "expected int"),
    ("serving.warmup=maybe", "expected bool"), ("device=tpu", "device must be"), ("ppo.steps", "key=value"),
])
def test_bad_values_are_clear_errors(override, problem):
    with pytest.raises(ConfigError, match=problem):
        load_config(overrides=[override], env={})


def test_missing_yaml_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("/no/such/file.yaml", env={})


def test_apply_overrides_copies_and_yaml_roundtrip():
    cfg = load_config(env={})
    new = apply_overrides(cfg, {"ppo": {"steps": 2}, "reward.epochs": 1})
    assert new.ppo.steps == 2 and new.reward.epochs == 1.0 and cfg.ppo.steps != 2
    assert "steps: 8" in to_yaml(cfg)


def test_every_field_has_help_and_the_readme_table_is_current():
    for key, default, help in describe():
        assert help, f"{key} has no help text"
    readme = (ROOT / "README.md").read_text()
    assert markdown_table() in readme, "README config table is stale: paste `rlhf-studio config docs`"
