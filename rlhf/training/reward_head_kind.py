"""The ``head`` reward-model kind: a linear Bradley–Terry ensemble (``reward_head``) on frozen features of the base
(``features``); learns from tens of pairs in seconds, cross-validated. Registered in ``reward_kinds.REWARD_KINDS``."""
from __future__ import annotations

import math
from pathlib import Path

from rlhf.config import RewardConfig
from rlhf.training import reward_head
from rlhf.training.data import group_labels
from rlhf.training.features import DEFAULT_DEPTHS, reply_features
from rlhf.training.reward_kinds import FitContext, Fitted, Progress
from rlhf.training.reward_lora import RewardModelError
from rlhf.training.reward_metrics import heldout_metrics

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
                                                  ctx.max_prompt_tokens, template=ctx.template)
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
                                  meta.get("depths") or DEFAULT_DEPTHS, batch_size,
                                  template=meta.get("chat_template") or "")
        return HeadScorer(features, head, meta)


KIND = HeadKind()
