"""The app config: one section per concern, gathered in ``AppConfig``."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from rlhf.config.fields import ConfigError, check_finite, one_of, opt
from rlhf.config.jobs import GateConfig, QueueConfig, RetrainConfig, SchedulerConfig
from rlhf.config.online_dpo import OnlineDPOConfig
from rlhf.config.rpo import RPOConfig
from rlhf.config.server import ServerConfig
from rlhf.config.serving import ServingConfig
from rlhf.config.training import DPOConfig, EvalConfig, PPOConfig, RewardConfig
from storage.paths import DataDir


@dataclass
class AppConfig:
    data_dir: str = opt("./data", "Holds the database, cached models, adapters and runs.")
    base_model: str = opt("smollm2-135m-instruct",
                          "Shipped model name, Hugging Face model id, local dir, or local .gguf file.")
    device: str = opt("auto", "auto | cpu | cuda.")
    chat_template: str = opt("", "A Jinja chat template used in place of the base model's (empty: the base's, or "
                                 "plain 'role: text' lines for a base that has none). An agent may set its own.")
    serving: ServingConfig = field(default_factory=ServingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    rpo: RPOConfig = field(default_factory=RPOConfig)
    online_dpo: OnlineDPOConfig = field(default_factory=OnlineDPOConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    retrain: RetrainConfig = field(default_factory=RetrainConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    server: ServerConfig = field(default_factory=ServerConfig)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def paths(self) -> DataDir:
        """Every path in the data dir (``storage.paths.DataDir``)."""
        return DataDir(self.data_path)

    @property
    def db_path(self) -> Path:
        return self.paths.db

    def to_dict(self) -> dict:
        """Every field as plain data, secrets blanked: job configs, run dirs and trackers never see them."""
        tree = dataclasses.asdict(self)
        for dotted in SECRETS:
            section, key = dotted.split(".")
            if tree[section][key]:
                tree[section][key] = ""
        return tree

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


SECTIONS = ["serving", "reward", "ppo", "dpo", "rpo", "online_dpo", "eval", "retrain", "gate", "scheduler", "queue",
            "server"]
SECRETS = ("server.users", "server.hf_token")  # may hold plaintext passwords / tokens


def check(cfg: AppConfig) -> None:
    """Raise ConfigError naming the key when a value cannot work: finite numbers, then every section's ``check``.

    Every way a config is built ends here: ``load_config`` (file, env, ``--set``), ``apply_overrides`` (REST bodies,
    the scheduler's enqueue) and ``from_dict`` (a job's or a run's saved config: the worker, resume)."""
    one_of("device", cfg.device, ("auto", "cpu", "cuda"))
    if cfg.chat_template:
        from rlhf.prompting import check_template

        try:
            check_template(cfg.chat_template)
        except ValueError as exc:
            raise ConfigError(f"chat_template: {exc}") from None
    check_finite("", cfg)
    for name in SECTIONS:
        section = getattr(cfg, name)
        check_finite(f"{name}.", section)
        section.check()
