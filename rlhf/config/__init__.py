"""Application config: one dataclass per concern, loaded once and passed down.

Precedence: defaults < YAML file (``--config FILE``) < environment (``RLHF_*``) < CLI ``--set a.b=v``.
``rlhf.config.loading`` is the only module that reads ``os.environ``. The sections live beside their concern:
``serving``, ``training`` (reward, ppo, eval), ``jobs`` (retrain, gate, scheduler, queue), ``server``.
"""
from rlhf.config.app import SECRETS, SECTIONS, AppConfig, check
from rlhf.config.docs import describe, markdown_table, to_yaml
from rlhf.config.fields import ConfigError, opt
from rlhf.config.jobs import GateConfig, QueueConfig, RetrainConfig, SchedulerConfig
from rlhf.config.loading import (ENV_ALIASES, ConfigDeprecationWarning, apply_overrides, env_overrides, from_dict,
                                 job_overrides, load_config, migrate, override_keys)
from rlhf.config.server import ServerConfig
from rlhf.config.serving import ServingConfig
from rlhf.config.spaces import SPACES_BASE_MODEL, apply_spaces_defaults, data_is_ephemeral
from rlhf.config.training import GAE_ONLY, PPO_GROUPS, DPOConfig, EvalConfig, PPOConfig, RewardConfig

__all__ = ["SECRETS", "SECTIONS", "AppConfig", "check", "describe", "markdown_table", "to_yaml", "ConfigError", "opt",
           "GateConfig", "QueueConfig", "RetrainConfig", "SchedulerConfig", "ENV_ALIASES", "ConfigDeprecationWarning",
           "apply_overrides", "env_overrides", "from_dict", "job_overrides", "override_keys", "load_config", "migrate", "ServerConfig",
           "ServingConfig", "SPACES_BASE_MODEL", "apply_spaces_defaults", "data_is_ephemeral", "GAE_ONLY",
           "PPO_GROUPS", "DPOConfig", "EvalConfig", "PPOConfig", "RewardConfig"]
