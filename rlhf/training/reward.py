"""Reward model from human feedback: train, measure honestly, save, load, score.

The kinds (``reward.method``) live behind one interface with a registry (``rlhf.training.reward_kinds``):

- ``head`` (default while data is small): a regularised linear Bradley–Terry head, as a bootstrap ensemble, on
  frozen features of the base model (``rlhf.training.features``, ``rlhf.training.reward_head``). It learns a
  preference from tens of pairs in seconds, and its members' spread says how sure it is.
- ``lora``: the base model with a scalar head and a LoRA adapter, trained with TRL (``rlhf.training.reward_lora``),
  for thousands of pairs.

Accuracy is measured by k-fold cross-validation grouped by conversation (no context on both sides) with a 95%
Wilson interval; below ``reward.cv_min_pairs`` pairs a single held-out split is too small to report. A reward
directory is self-describing (``meta.json`` + the kind's files, ``data/``) and is written to a temp dir, renamed
into place, then registered in the Store.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from rlhf.config import AppConfig, RewardConfig
from rlhf.files import atomic_dir
from rlhf.training.data import (NotEnoughData, build_kto, build_pairs, build_pointwise, count_sources, feedback_votes,
                                group_labels, split_by_conversation)
from rlhf.base_models import pick_device, resolve_model
from rlhf.training import reward_head
from rlhf.training.judge import JUDGE_FILE, NO_JUDGE, fit_judge, judge_split
from rlhf.training.features import reply_features
from rlhf.training.reward_head_kind import HeadScorer
from rlhf.training.reward_kinds import REWARD_KINDS, FitContext, all_kinds, kind_for_format, reward_kind
from rlhf.training.reward_lora import RewardModelError
from storage.paths import DataDir

log = logging.getLogger(__name__)

META_FILE, DATA_DIR = "meta.json", "data"
MIN_EXPLICIT_PAIRS = 2  # mode=pairwise: one pair to train on, one to hold out
Progress = Callable[[float, str, Optional[dict]], None]


def methods() -> tuple[str, ...]:
    """The values ``reward.method`` accepts: auto and every registered kind."""
    return ("auto", *sorted(REWARD_KINDS))


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
    scorer: Optional[Callable] = field(default=None, repr=False, compare=False)  # the fitted scorer, in memory
    pairs: list = field(default_factory=list, repr=False, compare=False)  # the pairs it learned from (not the judge's)

    def summary(self) -> dict:
        """The CLI's JSON line."""
        cv = {k: self.metrics.get(f"reward/{k}") for k in ("cv_accuracy", "cv_low", "cv_high")}
        return {"reward_model_id": self.reward_model_id, "path": self.path, "mode": self.mode,
                "method": self.method, "pairs_train": self.pairs_train, "pairs_eval": self.pairs_eval,
                "eval_accuracy": self.eval_accuracy, **cv,
                "verdict": reward_head.verdict_text(cv["cv_accuracy"], cv["cv_low"], cv["cv_high"]),
                "seconds": round(self.seconds, 2)}


# ---- data ---------------------------------------------------------------------------------------
def choose_mode(cfg: RewardConfig, n_pairs: int, n_points: int, n_feedback: Optional[int] = None) -> str:
    """pairwise | pointwise for this much data, or NotEnoughData saying how much is needed (``cfg.mode`` was
    checked with the config). ``n_feedback``: the votes (ties and both-bad included) and ratings behind them
    (default ``n_pairs``): with auto, ``reward.min_pairs`` of those and ``reward.min_decided_pairs`` decided pairs
    train a pairwise model, so a tie is a vote that counts toward a retrain too."""
    pairs_hint = "comparisons with a winner, or regenerated replies rated differently"
    more_pairs = "{} more preference pairs (comparisons or differently rated regenerations)"
    if cfg.mode == "pairwise":
        if n_pairs < MIN_EXPLICIT_PAIRS:
            raise NotEnoughData(f"pairwise training needs at least {MIN_EXPLICIT_PAIRS} preference pairs "
                                f"({pairs_hint}); have {n_pairs}", MIN_EXPLICIT_PAIRS, n_pairs,
                                more_pairs.format(MIN_EXPLICIT_PAIRS - n_pairs))
        return "pairwise"
    feedback = max(n_pairs, n_feedback if n_feedback is not None else n_pairs)
    decided = min(cfg.min_decided_pairs, cfg.min_pairs)
    if cfg.mode == "auto" and n_pairs >= decided and feedback >= cfg.min_pairs:
        return "pairwise"
    if n_points >= cfg.min_pointwise:
        return "pointwise"
    more_points = f"{cfg.min_pointwise - n_points} more rated replies (thumbs or scores)"
    if cfg.mode == "pointwise":
        raise NotEnoughData(f"pointwise training needs at least {cfg.min_pointwise} rated replies (thumb or "
                            f"score); have {n_points}", cfg.min_pointwise, n_points, more_points)
    need_votes, need_pairs = max(0, cfg.min_pairs - feedback), max(0, decided - n_pairs)
    more = more_pairs.format(need_pairs) if not need_votes else \
        f"{max(need_votes, need_pairs)} more votes or ratings (ties count)" + \
        (f", {need_pairs} of them preference pairs" if need_pairs else "")
    raise NotEnoughData(f"not enough feedback to train a reward model: need at least {cfg.min_pairs} preference "
                        f"pairs, or votes and ratings with {decided} decided pairs among them ({pairs_hint}; have "
                        f"{n_pairs} pairs of {feedback} votes and ratings) or {cfg.min_pointwise} rated replies "
                        f"(have {n_points})", cfg.min_pairs, feedback, f"{more_points}, or {more}")


def reward_rows(rows: dict, cfg: RewardConfig) -> tuple[list, list]:
    """(preference pairs, rated replies) a reward model could learn from in these feedback rows."""
    excluded = list(cfg.exclude_annotators or [])
    return (build_pairs(rows, excluded, cfg.margin_per_score, cfg.rated_vs_unrated),
            build_pointwise(rows, excluded))


def prepare_data(rows: dict, cfg: RewardConfig, judge_share: float = 0.0, min_judge_pairs: int = 8) -> RewardData:
    """Build pairs, pointwise and KTO rows, pick the mode, hold out the judge's share of the pairs (whole
    conversations, ``rlhf.training.judge``), and split the rest by conversation (no model needed)."""
    excluded = list(cfg.exclude_annotators or [])
    pairs, points = reward_rows(rows, cfg)
    mode = choose_mode(cfg, len(pairs), len(points), feedback_votes(rows, excluded))
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
                            "conversations or lower reward.eval_fraction", 1, 0,
                            "feedback from more conversations (every training row is in the held-out split)")
    return RewardData(mode, pairs_train, pairs_eval, points_train, points_eval, build_kto(rows, excluded), counts,
                      judged)


# ---- model --------------------------------------------------------------------------------------
def _base_source(meta: dict, path: Path, data_dir: Optional[DataDir] = None) -> str:
    """The base a reward model reads: its recorded source, else its base model's name resolved under ``data_dir``
    (by default the data dir the reward model lies in: a data dir that moved or was restored elsewhere)."""
    source = meta.get("base_source") or ""
    if source and Path(source).exists():
        return source
    name = meta.get("base_model") or ""
    data_dir = data_dir or DataDir.of_reward_model(path)
    with contextlib.suppress(Exception):  # the data dir moved: resolve the name under this dir's data dir
        return resolve_model(name, data_dir.root, allow_hub=False)
    if source and not Path(source).is_absolute() and "/" in source and not source.startswith("."):
        return source  # a hub id
    raise RewardModelError(f"the base model of {path} ({name or source!r}) cannot be found")


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
                      batch_size: int = 8, data_dir: Optional[DataDir] = None):
    """Load a trained reward model directory (only its path is needed): ``scorer(prompts, replies)``. A base
    recorded by name is looked up in ``data_dir`` (default: the data dir the directory lies in)."""
    path = Path(path)
    meta = _read_meta(path)
    kind = kind_for_format(meta.get("format"))
    if meta.get("mode") not in ("pairwise", "pointwise") or kind is None:
        known = ", ".join(str(k.format) for k in all_kinds())
        raise RewardModelError(f"{path / META_FILE} is not a reward model description (format {known})")
    return kind.load(path, meta, _base_source(meta, path, data_dir), pick_device(device), load_in_4bit, batch_size)


# ---- the whole run ------------------------------------------------------------------------------
def choose_method(cfg: RewardConfig, n_pairs: int) -> str:
    """A registered kind's name for this many pairs (``auto``: the head until ``reward.lora_min_pairs``)."""
    if cfg.method not in methods():
        raise ValueError(f"reward.method must be one of {', '.join(methods())}, got {cfg.method!r}")
    if cfg.method == "auto":
        return "lora" if n_pairs >= cfg.lora_min_pairs else "head"
    return cfg.method


def _write_rows(path: Path, data: RewardData) -> None:
    (path / DATA_DIR).mkdir()
    for name in ("pairs_train", "pairs_eval", "points_train", "points_eval", "kto", "pairs_judge"):
        with (path / DATA_DIR / f"{name}.jsonl").open("w") as f:
            for row in getattr(data, name):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _fit_judge(data: RewardData, cfg: RewardConfig, features) -> tuple:
    """The gate's judge on the held-out pairs, measured on the policy's pairs (it never saw them); (head, metrics)."""
    import numpy as np

    if not data.pairs_judge:
        return None, dict(NO_JUDGE)
    pairs = data.pairs_train + data.pairs_eval + data.pairs_judge
    xc = features([p["prompt"] for p in pairs], [p["chosen"] for p in pairs])
    xr = features([p["prompt"] for p in pairs], [p["rejected"] for p in pairs])
    n = len(pairs) - len(data.pairs_judge)
    return fit_judge(xc, xr, np.arange(n, len(pairs)), np.arange(n), cfg.head_c, cfg.ensemble, cfg.seed,
                     reward_head.pair_weights(pairs))


def _save_judge(path: Path, data: RewardData, cfg: RewardConfig, ctx: FitContext, fitted) -> tuple[bool, dict]:
    """Fit the gate's judge on the fitted kind's features (or the base's, loaded only when there are judge pairs)
    and save it into ``path`` when there is one; (saved, its metrics)."""
    features = fitted.features or ctx.features or (
        data.pairs_judge and reply_features(ctx.source, ctx.device, cfg.max_length, cfg.load_in_4bit,
                                            ctx.max_prompt_tokens, template=ctx.template))
    judge, judge_metrics = _fit_judge(data, cfg, features)
    if judge is not None:
        judge.save(path / JUDGE_FILE)
    return judge is not None, judge_metrics


def _meta(config: AppConfig, data: RewardData, method: str, agent: str, source: str, device: str,
          snapshot, excluded_annotators) -> dict:
    """What ``meta.json`` records about the run before the kind adds its own fields."""
    cfg = config.reward
    return {"mode": data.mode, "method": method, "base_model": config.base_model, "base_source": source,
            "max_length": cfg.max_length, "max_prompt_tokens": config.ppo.max_prompt_tokens, "agent": agent,
            "chat_template": config.chat_template,
            "trained_on": device, "data_snapshot": snapshot,
            "excluded_annotators": sorted(set(cfg.exclude_annotators or []) | set(excluded_annotators)),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _row_counts(data: RewardData) -> dict:
    return {**data.counts, "pairs_train": len(data.pairs_train), "pairs_eval": len(data.pairs_eval),
            "points_train": len(data.points_train), "points_eval": len(data.points_eval), "kto_rows": len(data.kto)}


def train_reward_model(store, config: AppConfig, agent: int | str | None = None, job_id: Optional[int] = None,
                       progress: Optional[Progress] = None, rows: Optional[dict] = None,
                       snapshot: Optional[dict] = None, features=None) -> RewardResult:
    """Train a reward model on a feedback snapshot, measure it, save it and register it.

    ``rows``/``snapshot``: the job's one read of the feedback (``Store.feedback_rows(agent, until=snapshot)``);
    when missing, the snapshot is taken here. ``features``: frozen reply features of a base already loaded.
    """
    t0 = time.perf_counter()
    report: Progress = progress or (lambda fraction, phase, metrics: None)
    cfg = config.reward
    agent_rec = store.get_agent(agent)
    report(0.0, "reward/data", None)
    if rows is None:
        snapshot = store.feedback_watermark(agent_rec.id)
        rows = store.feedback_rows(agent_rec.id, until=snapshot)
    data = prepare_data(rows, cfg, config.gate.judge_share, config.gate.min_judge_pairs)
    kind = reward_kind(choose_method(cfg, len(data.pairs_train) + len(data.pairs_eval)))
    log.info("reward data for %s: %s, mode %s, method %s", agent_rec.name, data.counts, data.mode, kind.name)

    report(0.02, "reward/load", None)
    device = pick_device(config.device)
    source = resolve_model(config.base_model, config.data_path)
    if agent_rec.base_model != config.base_model:
        log.warning("agent %s was created on %s; the reward backbone is the served base %s",
                    agent_rec.name, agent_rec.base_model, config.base_model)
    final = config.paths.reward_models / f"rm-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    meta = _meta(config, data, kind.name, agent_rec.name, source, device, snapshot, rows["excluded_annotators"])
    ctx = FitContext(source, device, config.ppo.max_prompt_tokens, features, config.chat_template)
    renamed = False
    try:
        with atomic_dir(final, replace=False) as tmp:
            fitted = kind.fit(data, cfg, ctx, report)
            kind.save(fitted, tmp)
            meta.update(fitted.meta)
            report(0.9, "reward/judge", None)
            meta["judge"], judge_metrics = _save_judge(tmp, data, cfg, ctx, fitted)
            report(0.95, "reward/save", None)
            metrics = {f"reward/{k}": v for k, v in {**fitted.metrics, **_row_counts(data), **judge_metrics}.items()}
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
                        metrics.get("reward/eval_accuracy"), seconds, metrics, kind.name,
                        scorer=fitted.scorer, pairs=data.pairs_train + data.pairs_eval)
