"""Reward-model kinds behind one small interface, and their registry.

A kind fits a scorer ``scorer(prompts, replies) -> list[float]`` on ``RewardData``, writes its files into a reward
directory and loads them back. ``rlhf.training.reward`` only speaks this interface: adding a kind is one class
here (or in its own module) and one ``register_reward_kind`` call in ``register_builtin_kinds``.

- ``head``: a linear Bradley–Terry ensemble on frozen features of the base (``reward_head``, ``features``).
- ``lora``: the base with a scalar head and a LoRA adapter, trained with TRL (``reward_lora``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from rlhf.config import RewardConfig
from rlhf.training import reward_head
from rlhf.training.data import group_labels
from rlhf.training.features import DEFAULT_DEPTHS, reply_features
from rlhf.training.reward_lora import RewardModelError
from rlhf.training.reward_metrics import heldout_metrics, split_interval

Progress = Callable[[float, str, Optional[dict]], None]


@dataclass
class FitContext:
    """What a kind may use while fitting: the base model's source and device, the prompt budget, and frozen
    features already loaded in this process (None: the kind loads what it needs)."""

    source: str
    device: str
    max_prompt_tokens: Optional[int] = None
    features: Any = None


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
    """One way to learn a reward: ``name`` is the ``reward.method`` value, ``format`` the ``meta.json`` format."""

    name: str
    format: int

    def fit(self, data, cfg: RewardConfig, ctx: FitContext, report: Progress) -> Fitted: ...

    def save(self, fitted: Fitted, directory: Path) -> None: ...

    def load(self, directory: Path, meta: dict, source: str, device: str, load_in_4bit: bool,
             batch_size: int) -> Callable: ...


REWARD_KINDS: dict[str, RewardKind] = {}


def register_reward_kind(kind: RewardKind) -> None:
    """Make ``kind`` selectable as ``reward.method`` and loadable by its ``meta.json`` format."""
    if any(k.format == kind.format and k.name != kind.name for k in REWARD_KINDS.values()):
        raise ValueError(f"reward kind {kind.name!r}: format {kind.format} is taken")
    REWARD_KINDS[kind.name] = kind


def reward_kind(name: str) -> RewardKind:
    """The registered kind called ``name``."""
    if name not in REWARD_KINDS:
        raise ValueError(f"unknown reward model kind {name!r}; known: {', '.join(sorted(REWARD_KINDS))}")
    return REWARD_KINDS[name]


def kind_for_format(fmt: Any) -> Optional[RewardKind]:
    """The kind that wrote a reward directory of format ``fmt`` (None when no kind did)."""
    return next((k for k in REWARD_KINDS.values() if k.format == fmt), None)


class HeadScorer:
    """A linear-head reward model: ``scorer(prompts, replies) -> list[float]`` (unit-spread ensemble mean)."""

    def __init__(self, features, head: "reward_head.LinearHead", meta: dict):
        self.features, self.head, self.meta = features, head, meta

    def __call__(self, prompts: list[list[dict]], replies: list[str]) -> list[float]:
        if len(prompts) != len(replies):
            raise ValueError(f"{len(prompts)} prompts but {len(replies)} replies")
        return self.head.scores(self.features(prompts, replies)).tolist() if replies else []

    def member_scores(self, prompts: list[list[dict]], replies: list[str]):
        """(n, members) each ensemble member's score, for uncertainty (gate, vote queue)."""
        return self.head.member_scores(self.features(prompts, replies)) / self.head.score_scale


class HeadKind:
    """The linear head on frozen features: learns from tens of pairs in seconds; cross-validated."""

    name, format, file = "head", 2, "head.npz"

    def fit(self, data, cfg: RewardConfig, ctx: FitContext, report: Progress) -> Fitted:
        features = ctx.features or reply_features(ctx.source, ctx.device, cfg.max_length, cfg.load_in_4bit,
                                                  ctx.max_prompt_tokens)
        report(0.1, "reward/features", None)
        if data.mode == "pairwise":
            pairs = data.pairs_train + data.pairs_eval
            xc = features([p["prompt"] for p in pairs], [p["chosen"] for p in pairs])
            xr = features([p["prompt"] for p in pairs], [p["rejected"] for p in pairs])
            report(0.6, "reward/train", None)
            head = reward_head.fit_preference_head(xc, xr, pairs, cfg)
            report(0.7, "reward/cv", None)
            cv = reward_head.cross_validate_pairs(xc, xr, group_labels(pairs), k=cfg.cv_folds, c=cfg.head_c,
                                                  seed=cfg.seed, permutations=cfg.cv_permutations)
            fit_metrics = {**cv, "train_accuracy": reward_head.pair_accuracy(head, xc, xr), "pairs_used": len(pairs)}
        else:
            points = data.points_train
            x = features([p["prompt"] for p in points], [p["completion"] for p in points])
            head = reward_head.fit_scores(x, [p["score"] for p in points], alpha=1.0 / cfg.head_c,
                                          members=cfg.ensemble, seed=cfg.seed)
            fit_metrics = {"cv_accuracy": None, "cv_low": None, "cv_high": None, "cv_folds": 0, "cv_pairs": 0}
        meta = {"format": self.format, "depths": list(DEFAULT_DEPTHS), "head_c": cfg.head_c, "ensemble": cfg.ensemble}
        scorer = HeadScorer(features, head, meta)
        report(0.85, "reward/eval", None)
        return Fitted(scorer, self._metrics(scorer, data, fit_metrics), meta, head, features)

    @staticmethod
    def _metrics(scorer: HeadScorer, data, fit_metrics: dict) -> dict:
        """Cross-validated accuracy stands for held-out accuracy (the head saw every pair)."""
        if data.mode == "pointwise":
            return {**heldout_metrics(scorer, data), **fit_metrics}
        pairs = data.pairs_train + data.pairs_eval
        scores = scorer([p["prompt"] for p in pairs] * 2,
                        [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
        return {**fit_metrics, "eval_accuracy": fit_metrics.get("cv_accuracy"), "mean": mean, "std": std}

    def save(self, fitted: Fitted, directory: Path) -> None:
        fitted.state.save(directory / self.file)

    def load(self, directory: Path, meta: dict, source: str, device: str, load_in_4bit: bool,
             batch_size: int) -> HeadScorer:
        try:
            head = reward_head.LinearHead.load(directory / self.file)
        except Exception as exc:
            raise RewardModelError(f"cannot load the head of {directory}: {exc}") from exc
        features = reply_features(source, device, int(meta["max_length"]), load_in_4bit, meta.get("max_prompt_tokens"),
                                  meta.get("depths") or DEFAULT_DEPTHS, batch_size)
        return HeadScorer(features, head, meta)


class LoraKind:
    """LoRA fine-tuning of the base with a scalar head (TRL): for thousands of pairs; one held-out split."""

    name, format = "lora", 1
    adapter_dir, tokenizer_dir = "adapter", "tokenizer"

    def fit(self, data, cfg: RewardConfig, ctx: FitContext, report: Progress) -> Fitted:
        from rlhf.training.reward_lora import train_lora

        scorer, train_metrics = train_lora(data.pairs_train, data.points_train, data.mode, cfg, ctx.source,
                                           ctx.device, report, max_prompt_tokens=ctx.max_prompt_tokens)
        report(0.85, "reward/eval", None)
        held = heldout_metrics(scorer, data)
        meta = {"format": self.format, "pad_token_id": scorer.tokenizer.pad_token_id,
                "lora": {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "layers": cfg.lora_layers}}
        return Fitted(scorer, {**held, **train_metrics, **split_interval(held, len(data.pairs_eval))}, meta)

    def save(self, fitted: Fitted, directory: Path) -> None:
        fitted.scorer.model.save_pretrained(str(directory / self.adapter_dir))
        fitted.scorer.tokenizer.save_pretrained(str(directory / self.tokenizer_dir))

    def load(self, directory: Path, meta: dict, source: str, device: str, load_in_4bit: bool, batch_size: int):
        from peft import PeftModel

        from rlhf.base_models import load_tokenizer
        from rlhf.training.reward_lora import RewardScorer, load_backbone

        try:
            tokenizer = load_tokenizer(str(directory / self.tokenizer_dir))
        except Exception as exc:
            raise RewardModelError(f"cannot load the tokenizer of {directory}: {exc}") from exc
        model = load_backbone(source, device, load_in_4bit, tokenizer.pad_token_id)
        try:
            model = PeftModel.from_pretrained(model, str(directory / self.adapter_dir), is_trainable=False)
        except Exception as exc:
            raise RewardModelError(f"cannot load the adapter of {directory}: {exc}") from exc
        model.eval()
        return RewardScorer(model, tokenizer, device, int(meta["max_length"]), meta, batch_size,
                            meta.get("max_prompt_tokens"))


def register_builtin_kinds() -> None:
    """The kinds the app ships, registered in one place."""
    register_reward_kind(HeadKind())
    register_reward_kind(LoraKind())


register_builtin_kinds()
