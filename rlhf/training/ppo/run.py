"""One PPO run from the Store: Store + config -> prompts, reward, base model -> ``train_ppo`` -> the result.

The core of `rlhf-studio train-ppo` (cli/train.py parses the flags, draws the progress bar and prints the result).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from rlhf.config import AppConfig, ConfigError, apply_overrides, from_dict
from rlhf.plugins import code_settings, with_app_code
from rlhf.training.prompts import PromptBuffer, prompt_sets

if TYPE_CHECKING:
    from rlhf.training.ppo.trainer import PPOResult


class PPOInputError(RuntimeError):
    """A PPO run's input is missing: the base model, the agent, or a prompt file."""


@dataclass
class PPOInputs:
    """Everything ``train_ppo`` needs that comes from the Store."""

    base_source: str
    buffer: PromptBuffer
    eval_prompts: list
    reward_fn: Optional[Callable]
    reward_model_id: Optional[int]
    init_adapter: Optional[str]
    parent_policy_id: Optional[int]


def load_reward(store, agent, reward_model: Optional[str], device: str):
    """(scorer, id) for ``--reward-model``: an id, 'none' (rules only), or None = the agent's newest."""
    if reward_model is not None and str(reward_model).lower() == "none":
        return None, None
    if reward_model is None:
        models = store.list_reward_models(agent.id)
        if not models:
            raise ConfigError(f"agent {agent.name!r} has no reward model yet: train one first, or pass "
                              "--reward-model none with rule weights or ppo.reward_functions")
        record = models[0]
    else:
        try:
            record = store.get_reward_model(int(reward_model))
        except ValueError:
            raise ConfigError(f"--reward-model expects an id or 'none', got {reward_model!r}") from None
    from rlhf.training.reward import RewardModelError, load_reward_model  # imported only when a reward model is used
    from storage import DataDir

    try:
        return load_reward_model(record.path, device=device, data_dir=DataDir(store.root)), record.id
    except RewardModelError as exc:
        raise ConfigError(f"reward model {record.id} cannot be used: {exc}") from None


def ppo_inputs(config: AppConfig, store, agent_name: Optional[str], reward_model: Optional[str],
               device: str) -> PPOInputs:
    """Resolve the base model, prompts (Store + prompt file, eval held out), reward and starting adapter."""
    from rlhf.base_models import resolve_model

    agent = store.get_agent(agent_name)
    buffer, eval_prompts = prompt_sets(store, config, agent.id)
    reward_fn, reward_id = load_reward(store, agent, reward_model, device)
    active = store.active_policy(agent.id)
    return PPOInputs(base_source=resolve_model(config.base_model, config.data_path), buffer=buffer,
                     eval_prompts=eval_prompts, reward_fn=reward_fn, reward_model_id=reward_id,
                     init_adapter=active.adapter_path, parent_policy_id=active.id)


def resumed_config(config: AppConfig, resume: str, overrides: list[str]) -> tuple[AppConfig, Path]:
    """The saved config of the run being resumed (with this call's --set applied) and its run dir; the settings that
    name code (``rlhf.plugins.CODE_KEYS``) stay this call's own."""
    from rlhf.training.checkpoint import find_checkpoint, run_dir_of

    checkpoint = find_checkpoint(Path(resume))
    if checkpoint is None:
        raise ConfigError(f"--resume {resume}: no checkpoint found there")
    run_dir = run_dir_of(checkpoint)
    saved = run_dir / "config.json"
    if saved.is_file():
        code = code_settings(config)  # what code to import is this command's config's, never the run dir's
        config = from_dict(json.loads(saved.read_text()))
        with_app_code(config, code)
        config = apply_overrides(config, dict(o.split("=", 1) for o in overrides if "=" in o))
    return config, run_dir


def shared_stamp(device: str) -> str:
    """A UTC timestamp for the run dir, the main process's one on every process of a multi-process run."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    names = [datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")]
    if PartialState(cpu=device == "cpu").num_processes > 1:
        broadcast_object_list(names, from_process=0)
    return names[0]


def run_ppo(config: AppConfig, agent: Optional[str] = None, reward_model: Optional[str] = None,
            resume: Optional[str] = None, overrides: Sequence[str] = (),
            on_start: Optional[Callable[[int, bool], None]] = None,
            on_step: Optional[Callable[[int, dict], None]] = None) -> Optional[PPOResult]:
    """One PPO run of ``agent``'s policy from the Store: resolve the inputs, then ``train_ppo`` into a new run dir (or
    continue the run ``resume`` names, with ``overrides`` (``key=value``) applied to its saved config).

    ``on_start(steps, is_main_process)`` once the inputs are resolved, ``on_step(step, metrics)`` after each step.
    Returns the result on the main process (None on the others of a multi-process run). Raises ConfigError (a bad
    config, no usable reward model), PPOInputError (no such model, agent or prompt file) or PPOFailed."""
    from accelerate import PartialState

    from rlhf.base_models import ModelNotFound, pick_device
    from rlhf.training.ppo.trainer import train_ppo
    from storage import NotFound, Store

    run_dir = None
    if resume:
        config, run_dir = resumed_config(config, resume, list(overrides))
    device = pick_device(config.device)
    store = Store(config.db_path)
    try:
        store.ensure_default_agent(config.base_model)
        try:
            inputs = ppo_inputs(config, store, agent, reward_model, device)
        except (ModelNotFound, NotFound, FileNotFoundError) as exc:
            raise PPOInputError(str(exc)) from exc
        if run_dir is None:
            run_dir = config.paths.run(shared_stamp(device))
        if on_start:
            on_start(config.ppo.steps, PartialState(cpu=device == "cpu").is_main_process)
        return train_ppo(config, inputs.base_source, inputs.reward_fn, inputs.buffer, inputs.eval_prompts, run_dir,
                         init_adapter=inputs.init_adapter, resume=Path(resume) if resume else None, on_step=on_step,
                         device=device)
    finally:
        store.close()
