"""Reward-model kinds behind one small interface, and their registry.

A kind fits a scorer ``scorer(prompts, replies) -> list[float]`` on ``RewardData``, writes its files into a reward
directory and loads them back. ``rlhf.training.reward`` only speaks this interface: adding a kind is one module with
a ``RewardKind`` and one line in ``REWARD_KINDS`` (``rlhf.registry``, the table the config check reads). This module
imports nothing heavy; a kind's module is imported when the kind is first used.

- ``head``: a linear Bradley–Terry ensemble on frozen features of the base (``reward_head_kind``).
- ``lora``: the base with a scalar head and a LoRA adapter, trained with TRL (``reward_lora``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from rlhf.registry import REWARD_KINDS  # the ``reward.method`` value -> "module:attribute" of its RewardKind

Progress = Callable[[float, str, Optional[dict]], None]


@dataclass
class FitContext:
    """What a kind may use while fitting: the base model's source and device, the prompt budget, and frozen
    features already loaded in this process (None: the kind loads what it needs)."""

    source: str
    device: str
    max_prompt_tokens: Optional[int] = None
    features: Any = None
    template: str = ""  # the chat template prompts are encoded with ("": the base's)


@dataclass
class Fitted:
    """A fitted reward model: its scorer, metrics (no namespace), what ``meta.json`` records about it, and what
    ``save`` writes."""

    scorer: Callable
    metrics: dict
    meta: dict
    state: Any = None
    features: Any = None  # the frozen features it scored through (the gate's judge reuses them)


class RewardKind(Protocol):
    """One way to learn a reward: ``name`` is the ``reward.method`` value, ``format`` the ``meta.json`` format.
    ``cfg`` is the config's ``reward`` section (``rlhf.config.RewardConfig``)."""

    name: str
    format: int

    def fit(self, data, cfg, ctx: FitContext, report: Progress) -> Fitted: ...

    def save(self, fitted: Fitted, directory: Path) -> None: ...

    def load(self, directory: Path, meta: dict, source: str, device: str, load_in_4bit: bool,
             batch_size: int) -> Callable: ...


def reward_kind(name: str) -> RewardKind:
    """The kind called ``name``, its module imported now (ValueError naming the known kinds when there is none)."""
    if name not in REWARD_KINDS:
        raise ValueError(f"unknown reward model kind {name!r}; known: {', '.join(sorted(REWARD_KINDS))}")
    module, _, attr = REWARD_KINDS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def all_kinds() -> list[RewardKind]:
    """Every kind in the table, imported; ValueError when two write the same ``meta.json`` format."""
    kinds = [reward_kind(name) for name in REWARD_KINDS]
    for i, kind in enumerate(kinds):
        taken = next((k for k in kinds[:i] if k.format == kind.format), None)
        if taken is not None:
            raise ValueError(f"reward kind {kind.name!r}: format {kind.format} is taken by {taken.name!r}")
    return kinds


def kind_for_format(fmt: Any) -> Optional[RewardKind]:
    """The kind that wrote a reward directory of format ``fmt`` (None when no kind did)."""
    return next((k for k in all_kinds() if k.format == fmt), None)
