"""`rlhf-studio train-reward` and `rlhf-studio train-ppo`: one training run from the Store, a progress bar on stderr,
ONE JSON line last on stdout (library prints go to stderr so they never mix with it)."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys

from cli.common import Command, config_from_args

BAR_FORMAT = "{desc} {percentage:3.0f}%|{bar}| {elapsed}{postfix}"


def add_reward_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", metavar="NAME", help="agent whose feedback is used (default: the first agent)")


def run_train_reward(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rlhf.base_models import ModelNotFound
    from rlhf.training.data import DataError, NotEnoughData
    from rlhf.training.reward import RewardModelError, train_reward_model
    from storage import NotFound, Store

    config = config_from_args(args)
    store = Store(config.db_path, max_text_chars=config.serving.max_message_chars)
    bar = tqdm(total=100, file=sys.stderr, desc="reward", bar_format=BAR_FORMAT)

    def progress(fraction: float, phase: str, metrics: dict | None) -> None:
        bar.set_description(phase)
        if metrics and "reward/train_loss" in metrics:
            bar.set_postfix(loss=f"{metrics['reward/train_loss']:.4f}")
        bar.update(max(0, round(100 * fraction) - bar.n))

    try:
        with contextlib.redirect_stdout(sys.stderr):  # library prints must not mix with the JSON line
            result = train_reward_model(store, config, args.agent, progress=progress)
    except (NotEnoughData, NotFound) as exc:
        bar.close()
        print(f"cannot train a reward model: {exc}", file=sys.stderr)
        return 2
    except (DataError, ModelNotFound, RewardModelError) as exc:
        bar.close()
        print(f"reward model training failed: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    bar.close()
    print(json.dumps(result.summary()), flush=True)
    return 0


def add_train_ppo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", metavar="NAME", help="agent to train (default: the first agent)")
    p.add_argument("--reward-model", metavar="ID",
                   help="reward model id (default: the agent's newest); 'none' = rule terms and "
                        "ppo.reward_functions only")
    p.add_argument("--resume", metavar="DIR", help="continue a run (its dir or one of its checkpoints)")


class StepBar:
    """The PPO progress bar: opened once the run knows its steps (only on the main process), one tick per step."""

    def __init__(self):
        self.bar = None

    def start(self, steps: int, main_process: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=steps, desc="PPO", file=sys.stderr, disable=None if main_process else True)

    def step(self, step: int, metrics: dict) -> None:
        self.bar.n = step
        self.bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", kl=f"{metrics['ppo/kl']:.2f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_train_ppo(args: argparse.Namespace) -> int:
    from rlhf.training.ppo.run import PPOInputError, run_ppo
    from rlhf.training.ppo.trainer import PPOFailed

    bar = StepBar()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # library prints must not mix with the JSON line
            result = run_ppo(config_from_args(args), args.agent, args.reward_model, args.resume,
                             list(args.set or []), on_start=bar.start, on_step=bar.step)
    except PPOInputError as exc:
        bar.close()
        print(f"train-ppo: {exc}", file=sys.stderr)
        return 2
    except PPOFailed as exc:
        bar.close()
        print(f"PPO failed: {exc}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    if result is not None:  # None: not the main process of a multi-process run
        print(json.dumps(result.summary()), flush=True)
    return 0


TRAIN_REWARD = Command("train-reward", "train a reward model on the Store's feedback; prints one JSON line last",
                       add_reward_args, run_train_reward)
TRAIN_PPO = Command("train-ppo", "PPO-train an agent's policy (LoRA) against its reward model; prints one JSON line "
                    "last", add_train_ppo_args, run_train_ppo)

