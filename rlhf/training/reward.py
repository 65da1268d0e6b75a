"""Reward model from human feedback: train, measure honestly, save, load, score.

Two kinds, chosen by the amount of data (``reward.method``):

- ``head`` (default while data is small): a regularised linear Bradley–Terry head, as a bootstrap ensemble, on
  frozen features of the base model (``rlhf.training.features``, ``rlhf.training.reward_head``). It learns a
  preference from tens of pairs in seconds, and its members' spread says how sure it is.
- ``lora``: the base model with a scalar head and a LoRA adapter, trained with TRL (``rlhf.training.reward_lora``),
  for thousands of pairs.

Accuracy is measured by k-fold cross-validation grouped by conversation (no context on both sides) with a 95%
Wilson interval; below ``reward.cv_min_pairs`` pairs a single held-out split is too small to report. A reward
directory is self-describing (``meta.json`` + ``head.npz`` or ``adapter/``, ``tokenizer/``, ``data/``) and is
written to a temp dir, renamed into place, then registered in the Store.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from rlhf.config import AppConfig, RewardConfig
from rlhf.files import atomic_dir
from rlhf.training.data import (NotEnoughData, build_kto, build_pairs, build_pointwise, count_sources,
                                group_labels, split_by_conversation)
from rlhf.models import pick_device, resolve_model
from rlhf.training import reward_head
from rlhf.training.features import DEFAULT_DEPTHS
from rlhf.training.judge import JUDGE_FILE, NO_JUDGE, fit_judge, judge_split
from rlhf.training.reward_lora import RewardModelError, RewardScorer, train_lora
from rlhf.training.tokens import encode  # noqa: F401  (the encoding every reward model reads)

log = logging.getLogger(__name__)

FORMAT = 1  # LoRA reward dirs
HEAD_FORMAT = 2  # linear head on frozen features
META_FILE, ADAPTER_DIR, TOKENIZER_DIR, DATA_DIR, HEAD_FILE = "meta.json", "adapter", "tokenizer", "data", "head.npz"
METHODS = ("auto", "head", "lora")
MODES = ("auto", "pairwise", "pointwise")
MIN_EXPLICIT_PAIRS = 2  # mode=pairwise: one pair to train on, one to hold out
Progress = Callable[[float, str, Optional[dict]], None]


@dataclass(frozen=True)
class RewardData:
    """What one training run learns from: the mode, the split rows, and the counts."""

    mode: str
    pairs_train: list
    pairs_eval: list
    points_train: list
    points_eval: list
    kto: list
    counts: dict
    pairs_judge: list = field(default_factory=list)  # held out of every row above: the gate's judge fits on them


@dataclass(frozen=True)
class RewardResult:
    """A trained and registered reward model."""

    reward_model_id: int
    path: str
    mode: str
    pairs_train: int
    pairs_eval: int
    eval_accuracy: Optional[float]
    seconds: float
    metrics: dict = field(default_factory=dict)
    method: str = "head"

    def summary(self) -> dict:
        """The CLI's JSON line."""
        cv = {k: self.metrics.get(f"reward/{k}") for k in ("cv_accuracy", "cv_low", "cv_high")}
        return {"reward_model_id": self.reward_model_id, "path": self.path, "mode": self.mode,
                "method": self.method, "pairs_train": self.pairs_train, "pairs_eval": self.pairs_eval,
                "eval_accuracy": self.eval_accuracy, **cv,
                "verdict": reward_head.verdict_text(cv["cv_accuracy"], cv["cv_low"], cv["cv_high"]),
                "seconds": round(self.seconds, 2)}


# ---- data ---------------------------------------------------------------------------------------
def choose_mode(cfg: RewardConfig, n_pairs: int, n_points: int) -> str:
    """pairwise | pointwise for this much data, or NotEnoughData saying how much is needed."""
    if cfg.mode not in MODES:
        raise ValueError(f"reward.mode must be one of {', '.join(MODES)}, got {cfg.mode!r}")
    pairs_hint = "comparisons with a winner, or regenerated replies rated differently"
    if cfg.mode == "pairwise":
        if n_pairs < MIN_EXPLICIT_PAIRS:
            raise NotEnoughData(f"pairwise training needs at least {MIN_EXPLICIT_PAIRS} preference pairs "
                                f"({pairs_hint}); have {n_pairs}", MIN_EXPLICIT_PAIRS, n_pairs)
        return "pairwise"
    if cfg.mode == "auto" and n_pairs >= cfg.min_pairs:
        return "pairwise"
    if n_points >= cfg.min_pointwise:
        return "pointwise"
    if cfg.mode == "pointwise":
        raise NotEnoughData(f"pointwise training needs at least {cfg.min_pointwise} rated replies (thumb or "
                            f"score); have {n_points}", cfg.min_pointwise, n_points)
    raise NotEnoughData(f"not enough feedback to train a reward model: need at least {cfg.min_pairs} preference "
                        f"pairs ({pairs_hint}; have {n_pairs}) or {cfg.min_pointwise} rated replies (have "
                        f"{n_points})", cfg.min_pairs, n_pairs)


def prepare_data(rows: dict, cfg: RewardConfig, judge_share: float = 0.0, min_judge_pairs: int = 8) -> RewardData:
    """Build pairs, pointwise and KTO rows, pick the mode, hold out the judge's share of the pairs (whole
    conversations, ``rlhf.training.judge``), and split the rest by conversation (no model needed)."""
    excluded = list(cfg.exclude_annotators or [])
    pairs = build_pairs(rows, excluded, cfg.margin_per_score, cfg.rated_vs_unrated)
    points = build_pointwise(rows, excluded)
    mode = choose_mode(cfg, len(pairs), len(points))
    judged: list = []
    if mode == "pairwise":
        mine, theirs = judge_split(group_labels(pairs), judge_share, min_judge_pairs, cfg.seed)
        pairs, judged = [pairs[i] for i in mine], [pairs[i] for i in theirs]
    # One split for both kinds of rows, so a conversation is on the same side for every metric.
    train, held = split_by_conversation(pairs + points, cfg.eval_fraction, cfg.seed)
    pairs_train, pairs_eval = [r for r in train if "chosen" in r], [r for r in held if "chosen" in r]
    points_train, points_eval = [r for r in train if "score" in r], [r for r in held if "score" in r]
    counts = {"pairs": len(pairs) + len(judged), "points": len(points), "pairs_judge": len(judged),
              **{f"pairs_{k}": v for k, v in count_sources(pairs + judged).items()}}
    if mode == "pairwise" and not pairs_train or mode == "pointwise" and not points_train:
        raise NotEnoughData(f"every {mode} training row landed in the held-out split; add feedback from more "
                            "conversations or lower reward.eval_fraction", 1, 0)
    return RewardData(mode, pairs_train, pairs_eval, points_train, points_eval, build_kto(rows, excluded), counts,
                      judged)


# ---- model --------------------------------------------------------------------------------------
def _base_source(meta: dict, path: Path) -> str:
    source = meta.get("base_source") or ""
    if source and Path(source).exists():
        return source
    name = meta.get("base_model") or ""
    with contextlib.suppress(Exception):  # the data dir moved: resolve the name under this dir's data dir
        return resolve_model(name, path.parent.parent, allow_hub=False)
    if source and not Path(source).is_absolute() and "/" in source and not source.startswith("."):
        return source  # a hub id
    raise RewardModelError(f"the base model of {path} ({name or source!r}) cannot be found")


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


def load_judge(path: str | os.PathLike, features) -> Optional[HeadScorer]:
    """The gate's judge saved beside a reward model (``rlhf.training.judge``), as a scorer over ``features`` (the
    frozen base's reply features); None when the reward model has none."""
    file = Path(path) / JUDGE_FILE
    if not file.is_file():
        return None
    return HeadScorer(features, reward_head.LinearHead.load(file), {"judge": True})


def _read_meta(path: Path) -> dict:
    try:
        return json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise RewardModelError(f"{path} is not a reward model directory: cannot read {META_FILE} ({exc})") from exc


def load_reward_model(path: str | os.PathLike, device: str = "auto", load_in_4bit: bool = False,
                      batch_size: int = 8):
    """Load a trained reward model directory (only its path is needed): ``scorer(prompts, replies)``."""
    path = Path(path)
    meta = _read_meta(path)
    if meta.get("mode") not in ("pairwise", "pointwise") or meta.get("format") not in (FORMAT, HEAD_FORMAT):
        raise RewardModelError(f"{path / META_FILE} is not a reward model description (format {FORMAT} or "
                               f"{HEAD_FORMAT})")
    device = pick_device(device)
    if meta["format"] == HEAD_FORMAT:
        from rlhf.training.features import ReplyFeatures

        try:
            head = reward_head.LinearHead.load(path / HEAD_FILE)
        except Exception as exc:
            raise RewardModelError(f"cannot load the head of {path}: {exc}") from exc
        features = ReplyFeatures.load(_base_source(meta, path), device, int(meta["max_length"]),
                                      meta.get("depths") or DEFAULT_DEPTHS, batch_size, load_in_4bit)
        return HeadScorer(features, head, meta)
    return _load_lora(path, meta, device, load_in_4bit, batch_size)


def _load_lora(path: Path, meta: dict, device: str, load_in_4bit: bool, batch_size: int) -> RewardScorer:
    from peft import PeftModel

    from rlhf.models import load_tokenizer
    from rlhf.training.reward_lora import load_backbone

    try:
        tokenizer = load_tokenizer(str(path / TOKENIZER_DIR))
    except Exception as exc:
        raise RewardModelError(f"cannot load the tokenizer of {path}: {exc}") from exc
    model = load_backbone(_base_source(meta, path), device, load_in_4bit, tokenizer.pad_token_id)
    try:
        model = PeftModel.from_pretrained(model, str(path / ADAPTER_DIR), is_trainable=False)
    except Exception as exc:
        raise RewardModelError(f"cannot load the adapter of {path}: {exc}") from exc
    model.eval()
    return RewardScorer(model, tokenizer, device, int(meta["max_length"]), meta, batch_size)


# ---- evaluation ---------------------------------------------------------------------------------
def pair_metrics(scorer: Callable, pairs: list[dict], prefix: str) -> dict:
    """Pairwise accuracy (ties count half), mean margin r_c − r_r, and the rewards' mean/std."""
    if not pairs:
        return {f"{prefix}_accuracy": None, f"{prefix}_margin": None}
    scores = scorer([p["prompt"] for p in pairs] * 2, [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
    chosen, rejected = scores[:len(pairs)], scores[len(pairs):]
    diffs = [c - r for c, r in zip(chosen, rejected)]
    mean = sum(scores) / len(scores)
    return {f"{prefix}_accuracy": sum(1.0 if d > 0 else 0.5 if d == 0 else 0.0 for d in diffs) / len(diffs),
            f"{prefix}_margin": sum(diffs) / len(diffs), f"{prefix}_reward_mean": mean,
            f"{prefix}_reward_std": math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))}


def point_metrics(scorer: Callable, points: list[dict], prefix: str) -> dict:
    """MSE against the [0, 1] targets and Spearman rank correlation (None when either side is constant)."""
    if not points:
        return {f"{prefix}_mse": None, f"{prefix}_spearman": None}
    import pandas as pd

    pred = scorer([p["prompt"] for p in points], [p["completion"] for p in points])
    target = [p["score"] for p in points]
    # Spearman's rho = Pearson's r of the (tie-averaged) ranks; pandas' method="spearman" would need scipy.
    rho = pd.Series(pred).rank().corr(pd.Series(target).rank()) if len(points) > 1 else float("nan")
    return {f"{prefix}_mse": sum((a - b) ** 2 for a, b in zip(pred, target)) / len(points),
            f"{prefix}_spearman": None if rho is None or math.isnan(rho) else float(rho)}


def heldout_metrics(scorer: Callable, data: RewardData) -> dict:
    """Held-out metrics of a scorer (pairs always, scores in pointwise mode), keys without namespace."""
    m = pair_metrics(scorer, data.pairs_eval, "eval")
    if data.mode == "pointwise":
        m.update(point_metrics(scorer, data.points_eval, "eval"))
    m["mean"], m["std"] = m.get("eval_reward_mean"), m.get("eval_reward_std")  # the scale PPO will see
    return m


# ---- the whole run ------------------------------------------------------------------------------
def choose_method(cfg: RewardConfig, n_pairs: int) -> str:
    """head | lora for this many pairs (``auto``: the head until ``reward.lora_min_pairs``)."""
    if cfg.method not in METHODS:
        raise ValueError(f"reward.method must be one of {', '.join(METHODS)}, got {cfg.method!r}")
    if cfg.method == "auto":
        return "lora" if n_pairs >= cfg.lora_min_pairs else "head"
    return cfg.method


def _write_rows(path: Path, data: RewardData) -> None:
    (path / DATA_DIR).mkdir()
    for name in ("pairs_train", "pairs_eval", "points_train", "points_eval", "kto", "pairs_judge"):
        with (path / DATA_DIR / f"{name}.jsonl").open("w") as f:
            for row in getattr(data, name):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _fit_head(data: RewardData, cfg: RewardConfig, features, report: Progress) -> tuple:
    """The head ensemble on every row (cross-validation measures it); (head, metrics)."""
    import numpy as np

    pairs = data.pairs_train + data.pairs_eval
    report(0.1, "reward/features", None)
    if data.mode == "pairwise":
        xc = features([p["prompt"] for p in pairs], [p["chosen"] for p in pairs])
        xr = features([p["prompt"] for p in pairs], [p["rejected"] for p in pairs])
        report(0.6, "reward/train", None)
        weights = np.array([1.0 + max(0.0, float(p.get("margin") or 0.0)) for p in pairs])
        head = reward_head.fit_pairs(xc, xr, c=cfg.head_c, members=cfg.ensemble, seed=cfg.seed, weights=weights)
        report(0.7, "reward/cv", None)
        cv = reward_head.cross_validate_pairs(xc, xr, group_labels(pairs), k=cfg.cv_folds, c=cfg.head_c,
                                              seed=cfg.seed)
        metrics = {**cv, "train_accuracy": reward_head.pair_accuracy(head, xc, xr), "pairs_used": len(pairs)}
    else:
        points = data.points_train
        x = features([p["prompt"] for p in points], [p["completion"] for p in points])
        head = reward_head.fit_scores(x, [p["score"] for p in points], alpha=1.0 / cfg.head_c,
                                      members=cfg.ensemble, seed=cfg.seed)
        metrics = {"cv_accuracy": None, "cv_low": None, "cv_high": None, "cv_folds": 0, "cv_pairs": 0}
    return head, metrics


def _fit_judge(data: RewardData, cfg: RewardConfig, features) -> tuple:
    """The gate's judge on the held-out pairs, measured on the policy's pairs (it never saw them); (head, metrics)."""
    import numpy as np

    if not data.pairs_judge:
        return None, dict(NO_JUDGE)
    pairs = data.pairs_train + data.pairs_eval + data.pairs_judge
    xc = features([p["prompt"] for p in pairs], [p["chosen"] for p in pairs])
    xr = features([p["prompt"] for p in pairs], [p["rejected"] for p in pairs])
    weights = np.array([1.0 + max(0.0, float(p.get("margin") or 0.0)) for p in pairs])
    n = len(pairs) - len(data.pairs_judge)
    return fit_judge(xc, xr, np.arange(n, len(pairs)), np.arange(n), cfg.head_c, cfg.ensemble, cfg.seed, weights)


def _reply_features(source: str, device: str, cfg: RewardConfig):
    from rlhf.training.features import ReplyFeatures, feature_cache

    return feature_cache(ReplyFeatures.load(source, device, cfg.max_length, load_in_4bit=cfg.load_in_4bit))


def _head_metrics(scorer: HeadScorer, data: RewardData, fit_metrics: dict) -> dict:
    """The head's figures: cross-validated accuracy stands for held-out accuracy (the head saw every pair)."""
    if data.mode == "pointwise":
        return {**heldout_metrics(scorer, data), **fit_metrics}
    pairs = data.pairs_train + data.pairs_eval
    scores = scorer([p["prompt"] for p in pairs] * 2, [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    return {**fit_metrics, "eval_accuracy": fit_metrics.get("cv_accuracy"), "mean": mean, "std": std}


def train_reward_model(store, config: AppConfig, agent: int | str | None = None, job_id: Optional[int] = None,
                       progress: Optional[Progress] = None) -> RewardResult:
    """Train a reward model on the Store's current feedback, measure it, save it and register it."""
    t0 = time.perf_counter()
    report: Progress = progress or (lambda fraction, phase, metrics: None)
    cfg = config.reward
    agent_rec = store.get_agent(agent)
    report(0.0, "reward/data", None)
    snapshot = store.feedback_watermark(agent_rec.id)
    rows = store.feedback_rows(agent_rec.id, until=snapshot)
    data = prepare_data(rows, cfg, config.gate.judge_share, config.gate.min_judge_pairs)
    method = choose_method(cfg, len(data.pairs_train) + len(data.pairs_eval))
    log.info("reward data for %s: %s, mode %s, method %s", agent_rec.name, data.counts, data.mode, method)

    report(0.02, "reward/load", None)
    device = pick_device(config.device)
    source = resolve_model(config.base_model, config.data_path)
    if agent_rec.base_model != config.base_model:
        log.warning("agent %s was created on %s; the reward backbone is the served base %s",
                    agent_rec.name, agent_rec.base_model, config.base_model)
    final = config.data_path / "reward_models" / f"rm-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    meta = {"mode": data.mode, "method": method, "base_model": config.base_model, "base_source": source,
            "max_length": cfg.max_length, "agent": agent_rec.name, "trained_on": device, "data_snapshot": snapshot,
            "excluded_annotators": sorted(set(cfg.exclude_annotators or []) | set(rows["excluded_annotators"])),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    counts = {**data.counts, "pairs_train": len(data.pairs_train), "pairs_eval": len(data.pairs_eval),
              "points_train": len(data.points_train), "points_eval": len(data.points_eval), "kto_rows": len(data.kto)}
    renamed = False
    try:
        with atomic_dir(final, replace=False) as tmp:
            features = None
            if method == "head":
                features = _reply_features(source, device, cfg)
                head, fit_metrics = _fit_head(data, cfg, features, report)
                report(0.85, "reward/eval", None)
                metrics = {**_head_metrics(HeadScorer(features, head, meta), data, fit_metrics), **counts}
                head.save(tmp / HEAD_FILE)
                meta.update(format=HEAD_FORMAT, depths=list(DEFAULT_DEPTHS), head_c=cfg.head_c,
                            ensemble=cfg.ensemble)
            else:
                scorer, train_metrics = train_lora(data.pairs_train, data.points_train, data.mode, cfg, source, device,
                                                   report)
                report(0.85, "reward/eval", None)
                held = heldout_metrics(scorer, data)
                metrics = {**held, **train_metrics, **counts, **_split_interval(held, len(data.pairs_eval))}
                scorer.model.save_pretrained(str(tmp / ADAPTER_DIR))
                scorer.tokenizer.save_pretrained(str(tmp / TOKENIZER_DIR))
                meta.update(format=FORMAT, pad_token_id=scorer.tokenizer.pad_token_id,
                            lora={"r": cfg.lora_r, "alpha": cfg.lora_alpha, "layers": cfg.lora_layers})
            report(0.9, "reward/judge", None)
            judge, judge_metrics = _fit_judge(data, cfg, features or (data.pairs_judge and
                                                                      _reply_features(source, device, cfg)))
            if judge is not None:
                judge.save(tmp / JUDGE_FILE)
            meta["judge"] = judge is not None
            report(0.95, "reward/save", None)
            metrics = {f"reward/{k}": v for k, v in {**metrics, **judge_metrics}.items()}
            _write_rows(tmp, data)
            (tmp / META_FILE).write_text(json.dumps({**meta, "metrics": metrics}, indent=2, sort_keys=True))
        renamed = True  # the directory appears complete or not at all
        seconds = time.perf_counter() - t0
        metrics["reward/seconds"] = seconds
        rec = store.register_reward_model(agent_rec.id, str(final), data.mode, snapshot, config.to_dict(), metrics,
                                          job_id=job_id)
    except BaseException:
        if renamed:
            shutil.rmtree(final, ignore_errors=True)  # renamed but not registered: nobody refers to it
        raise
    report(1.0, "reward/done", metrics)
    return RewardResult(rec.id, str(final), data.mode, len(data.pairs_train), len(data.pairs_eval),
                        metrics.get("reward/eval_accuracy"), seconds, metrics, method)


def _split_interval(held: dict, n: int) -> dict:
    """The LoRA path's figure: one held-out split (it is taken only with plenty of pairs), with its interval."""
    acc = held.get("eval_accuracy")
    if acc is None or n == 0:
        return {"cv_accuracy": None, "cv_low": None, "cv_high": None, "cv_folds": 0, "cv_pairs": 0}
    low, high = reward_head.wilson_interval(acc * n, n)
    return {"cv_accuracy": acc, "cv_low": low, "cv_high": high, "cv_folds": 1, "cv_pairs": n}
