"""Config precedence (defaults < YAML < env < --set), types, errors, and that the manual (docs/configuration.md) documents it."""
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
    assert "steps: 16" in to_yaml(cfg)


def test_every_field_has_help_and_the_manual_table_is_current():
    for key, default, help in describe():
        assert help, f"{key} has no help text"
    manual = (ROOT / "docs" / "configuration.md").read_text()
    assert markdown_table() in manual, "docs/configuration.md's table is stale: paste `rlhf-studio config docs`"


def test_ppo_advantage_is_explicit_and_gae_only_keys_are_refused_under_group():
    assert load_config(env={}).ppo.advantage == "group"
    gae = load_config(env={}, overrides=["ppo.advantage=gae", "ppo.group_size=1", "ppo.gamma=0.99", "ppo.lam=0.9"])
    assert gae.ppo.uses_value_head and gae.ppo.gamma == 0.99
    with pytest.raises(ConfigError, match="ppo.gamma, ppo.vf_coef only apply with ppo.advantage=gae"):
        load_config(env={}, overrides=["ppo.gamma=0.99", "ppo.vf_coef=1.0"])
    with pytest.raises(ConfigError, match="ppo.group_size must be >= 2"):
        load_config(env={}, overrides=["ppo.advantage=group", "ppo.group_size=1"])
    with pytest.raises(ConfigError, match="ppo.advantage must be one of group, gae"):
        load_config(env={}, overrides=["ppo.advantage=vtrace"])


def test_old_configs_still_load_with_a_deprecation_warning(tmp_path):
    from rlhf.config import ConfigDeprecationWarning, from_dict

    path = tmp_path / "old.yaml"
    path.write_text("ppo:\n  group_size: 1\n  gamma: 0.99\n")  # GAE, as group_size 1 meant before ppo.advantage
    with pytest.warns(ConfigDeprecationWarning, match="set ppo.advantage: gae"):
        cfg = load_config(path, env={})
    assert cfg.ppo.advantage == "gae" and cfg.ppo.gamma == 0.99
    stored = load_config(env={}).to_dict()  # a job config stored before the key existed
    del stored["ppo"]["advantage"], stored["eval"]
    stored["ppo"]["group_size"] = 1
    with pytest.warns(ConfigDeprecationWarning):
        assert from_dict(stored).ppo.advantage == "gae"


def test_the_eval_section_has_the_values_evaluation_borrowed_from_ppo():
    cfg = load_config(env={})
    assert (cfg.eval.max_new_tokens, cfg.eval.temperature, cfg.eval.max_prompt_tokens) == \
        (cfg.ppo.max_new_tokens, cfg.ppo.temperature, cfg.ppo.max_prompt_tokens)
    assert load_config(env={"RLHF_EVAL_MAX_NEW_TOKENS": "64"}).eval.max_new_tokens == 64
    with pytest.raises(ConfigError, match="eval.max_new_tokens"):
        load_config(env={}, overrides=["eval.max_new_tokens=0"])
    for bad in ("-0.1", "nan", "3"):  # the compared replies' temperature: 0 (greedy) up to 2
        with pytest.raises(ConfigError, match="eval.reply_temperature"):
            load_config(env={}, overrides=[f"eval.reply_temperature={bad}"])
    assert load_config(env={}, overrides=["eval.reply_temperature=0.7"]).eval.reply_temperature == 0.7


@pytest.mark.parametrize("override, problem", [
    ("reward.mode=pairs", "reward.mode must be one of auto, pairwise, pointwise"),
    ("reward.min_pairs=0", "reward.min_pairs"), ("reward.cv_folds=1", "reward.cv_folds must be >= 2"),
    ("reward.eval_fraction=1.0", "reward.eval_fraction"), ("reward.method=not a kind", "reward.method"),
])
def test_reward_settings_are_validated_at_load(override, problem):
    with pytest.raises(ConfigError, match=problem):
        load_config(env={}, overrides=[override])


def test_group_metadata_lives_on_the_fields():
    from rlhf.config import PPO_GROUPS, PPOConfig

    import dataclasses

    assert all("group" in f.metadata for f in dataclasses.fields(PPOConfig))
    assert PPO_GROUPS["kl_target"] == "KL" and PPO_GROUPS["advantage"] == "optimisation"
    assert "*KL* · Target KL" in markdown_table()


def test_the_config_is_a_package_split_by_section():
    import rlhf.config as config

    assert config.PPOConfig.__module__ == "rlhf.config.training" and config.load_config.__module__ == \
        "rlhf.config.loading" and config.ServingConfig.__module__ == "rlhf.config.serving"
