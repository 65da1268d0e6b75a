"""`rlhf-studio train-ppo`: Store + config -> prompts, reward, base model -> ``train_ppo`` -> one JSON line.

Also usable by the retrain job: ``ppo_inputs`` builds the prompts and picks the reward model the same way.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from rlhf.config import AppConfig, ConfigError, apply_overrides, from_dict
from rlhf.plugins import code_settings, with_app_code
from rlhf.training.prompts import PromptBuffer, prompt_sets


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


def add_train_ppo_args(p: argparse.ArgumentParser) -> None:
    """Arguments of `train-ppo`."""
    p.add_argument("--agent", metavar="NAME", help="agent to train (default: the first agent)")
    p.add_argument("--reward-model", metavar="ID",
                   help="reward model id (default: the agent's newest); 'none' = rule terms and "
                        "ppo.reward_functions only")
    p.add_argument("--resume", metavar="DIR", help="continue a run (its dir or one of its checkpoints)")


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


def run_train_ppo(config: AppConfig, args: argparse.Namespace) -> int:
    """The `train-ppo` command: progress bar on stderr, ONE JSON line last on stdout."""
    from tqdm import tqdm

    from rlhf.base_models import ModelNotFound, pick_device
    from rlhf.training.ppo.trainer import PPOFailed, train_ppo
    from storage import NotFound, Store

    run_dir = None
    if args.resume:
        config, run_dir = resumed_config(config, args.resume, list(getattr(args, "set", []) or []))
    device = pick_device(config.device)
    store = Store(config.db_path)
    try:
        store.ensure_default_agent(config.base_model)
        try:
            inputs = ppo_inputs(config, store, args.agent, args.reward_model, device)
        except (ModelNotFound, NotFound, FileNotFoundError) as exc:
            print(f"train-ppo: {exc}", file=sys.stderr)
            return 2
        if run_dir is None:
            run_dir = config.paths.run(shared_stamp(device))
        from accelerate import PartialState

        main = PartialState(cpu=device == "cpu").is_main_process
        bar = tqdm(total=config.ppo.steps, desc="PPO", file=sys.stderr, disable=None if main else True)

        def on_step(step: int, metrics: dict) -> None:
            bar.n = step
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", kl=f"{metrics['ppo/kl']:.2f}")

        try:
            with contextlib.redirect_stdout(sys.stderr):  # library prints must not mix with the JSON line
                result = train_ppo(config, inputs.base_source, inputs.reward_fn, inputs.buffer,
                                   inputs.eval_prompts, run_dir, init_adapter=inputs.init_adapter,
                                   resume=Path(args.resume) if args.resume else None, on_step=on_step,
                                   device=device)
        except PPOFailed as exc:
            bar.close()
            print(f"PPO failed: {exc}", file=sys.stderr)
            return 1
        bar.close()
        if result is None:  # not the main process of a multi-process run
            return 0
        print(json.dumps(result.summary()), flush=True)
        return 0
    finally:
        store.close()
