"""Reward model from human feedback: train, evaluate on held-out conversations, save, load, score.

The backbone is the base model with a scalar head (sequence classification, ``num_labels=1``) and a LoRA
adapter; the adapter and the head are saved together. Pairs train with TRL's ``RewardTrainer`` on the
Bradley–Terry loss with a margin, ``-log σ(r_chosen − r_rejected − margin)`` (Ouyang et al. 2022, Eq. 1;
margin as in Touvron et al. 2023, Llama 2, Eq. 2); too few pairs fall back to regression of a [0, 1] score
with a plain ``transformers.Trainer``.

SmolLM2 pads with its end-of-turn token and a sequence classifier reads the last non-pad token, so a
sequence is ``chat template(prompt) + reply tokens`` with no closing ``<|im_end|>``: the score is read at the
reply's last real token. A reward directory is self-describing (``meta.json``, ``adapter/``, ``tokenizer/``,
``data/``) and is written to a temp dir, then renamed into place, then registered in the Store.
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
from rlhf.training.data import (NotEnoughData, build_kto, build_pairs, build_pointwise, count_sources,
                       split_by_conversation)
from rlhf.models import pick_device, quantization, resolve_model, torch_dtype

log = logging.getLogger(__name__)

FORMAT = 1
META_FILE, ADAPTER_DIR, TOKENIZER_DIR, DATA_DIR = "meta.json", "adapter", "tokenizer", "data"
MODES = ("auto", "pairwise", "pointwise")
MIN_EXPLICIT_PAIRS = 2  # mode=pairwise: one pair to train on, one to hold out
Progress = Callable[[float, str, Optional[dict]], None]


class RewardModelError(RuntimeError):
    """A reward model directory that cannot be loaded (missing or corrupted files)."""


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

    def summary(self) -> dict:
        """The CLI's JSON line."""
        return {"reward_model_id": self.reward_model_id, "path": self.path, "mode": self.mode,
                "pairs_train": self.pairs_train, "pairs_eval": self.pairs_eval,
                "eval_accuracy": self.eval_accuracy, "seconds": round(self.seconds, 2)}


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


def prepare_data(rows: dict, cfg: RewardConfig) -> RewardData:
    """Build pairs, pointwise and KTO rows, pick the mode, and split by conversation (no model needed)."""
    excluded = list(cfg.exclude_annotators or [])
    pairs = build_pairs(rows, excluded, cfg.margin_per_score, cfg.rated_vs_unrated)
    points = build_pointwise(rows, excluded)
    mode = choose_mode(cfg, len(pairs), len(points))
    # One split for both kinds of rows, so a conversation is on the same side for every metric.
    train, held = split_by_conversation(pairs + points, cfg.eval_fraction, cfg.seed)
    pairs_train, pairs_eval = [r for r in train if "chosen" in r], [r for r in held if "chosen" in r]
    points_train, points_eval = [r for r in train if "score" in r], [r for r in held if "score" in r]
    counts = {"pairs": len(pairs), "points": len(points), **{f"pairs_{k}": v for k, v in count_sources(pairs).items()}}
    if mode == "pairwise" and not pairs_train or mode == "pointwise" and not points_train:
        raise NotEnoughData(f"every {mode} training row landed in the held-out split; add feedback from more "
                            "conversations or lower reward.eval_fraction", 1, 0)
    return RewardData(mode, pairs_train, pairs_eval, points_train, points_eval, build_kto(rows, excluded), counts)


# ---- model --------------------------------------------------------------------------------------
def encode(tokenizer, prompt: list[dict], reply: str, max_length: int) -> list[int]:
    """Token ids of the templated prompt + the reply, ending at the reply's last token, cut from the left."""
    if getattr(tokenizer, "chat_template", None):
        prompt_ids = list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                        return_dict=True)["input_ids"])
    else:  # a base model without a chat template: plain "role: text" lines
        text = "".join(f"{m['role']}: {m['content']}\n" for m in prompt) + "assistant: "
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # Reply tokens exactly as a policy generates them after the prompt; no end-of-turn token, which would be
    # read as padding (pad == eos) and move the score off the reply.
    reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
    return (prompt_ids + list(reply_ids))[-max_length:]


def _load_backbone(source: str, device: str, load_in_4bit: bool, pad_token_id: int):
    from transformers import AutoModelForSequenceClassification

    quant = quantization(load_in_4bit, device)
    if quant is not None:
        quant.llm_int8_skip_modules = ["score"]  # the scalar head stays in full precision and trainable
    try:
        from trl.trainer.reward_trainer import suppress_seqcls_warning  # quiets "score.weight newly initialized"
    except ImportError:  # pragma: no cover - another TRL version
        suppress_seqcls_warning = contextlib.nullcontext
    try:
        with suppress_seqcls_warning():
            model = AutoModelForSequenceClassification.from_pretrained(
                source, num_labels=1, dtype=torch_dtype(device), quantization_config=quant,
                device_map={"": device} if quant is not None else None)
    except OSError as exc:
        raise RewardModelError(f"cannot load the reward backbone from {source!r}: {exc}") from exc
    if quant is None:
        model.to(device)
    model.config.pad_token_id = pad_token_id  # batches > 1 need it to find each row's last token
    return model


def _lora_config(model, cfg: RewardConfig):
    from peft import LoraConfig

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in ("q_proj", "k_proj", "v_proj", "o_proj") if t in names] or None  # None: peft's default
    n_layers = getattr(model.config.get_text_config(), "num_hidden_layers", None)
    layers = None
    if cfg.lora_layers and n_layers and cfg.lora_layers < n_layers:
        # Adapting only the top layers means no backward pass through the frozen bottom ones: about half the
        # CPU time per step on SmolLM2-135M with the top 8 of 30 layers.
        layers = list(range(n_layers - cfg.lora_layers, n_layers))
    return LoraConfig(task_type="SEQ_CLS", r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                      target_modules=targets, layers_to_transform=layers, modules_to_save=["score"])


class RewardScorer:
    """A reward model: ``scorer(prompts, replies) -> list[float]``, batched, without gradients."""

    def __init__(self, model, tokenizer, device: str, max_length: int, meta: Optional[dict] = None,
                 batch_size: int = 8):
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.max_length, self.meta, self.batch_size = max_length, meta or {}, batch_size

    def __call__(self, prompts: list[list[dict]], replies: list[str]) -> list[float]:
        if len(prompts) != len(replies):
            raise ValueError(f"{len(prompts)} prompts but {len(replies)} replies")
        return self.score_ids([encode(self.tokenizer, p, r, self.max_length) for p, r in zip(prompts, replies)])

    def score_ids(self, sequences: list[list[int]]) -> list[float]:
        """Scores of already encoded sequences (see ``encode``)."""
        import torch

        pad = self.tokenizer.pad_token_id
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # similar lengths pad less
        scores = [0.0] * len(sequences)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(order), self.batch_size):
                    idx = order[start:start + self.batch_size]
                    width = max(len(sequences[i]) for i in idx)
                    ids = torch.full((len(idx), width), pad, dtype=torch.long)
                    mask = torch.zeros((len(idx), width), dtype=torch.long)
                    for row, i in enumerate(idx):  # right padding: the real tokens never see a pad
                        ids[row, :len(sequences[i])] = torch.tensor(sequences[i])
                        mask[row, :len(sequences[i])] = 1
                    out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
                    for i, value in zip(idx, out[:, 0].float().tolist()):
                        scores[i] = value
        finally:
            self.model.train(was_training)
        return scores


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


def load_reward_model(path: str | os.PathLike, device: str = "auto", load_in_4bit: bool = False,
                      batch_size: int = 8) -> RewardScorer:
    """Load a trained reward model directory (only its path is needed) as a ``RewardScorer``."""
    from peft import PeftModel

    from rlhf.models import load_tokenizer

    path = Path(path)
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise RewardModelError(f"{path} is not a reward model directory: cannot read {META_FILE} ({exc})") from exc
    if meta.get("format") != FORMAT or meta.get("mode") not in ("pairwise", "pointwise"):
        raise RewardModelError(f"{path / META_FILE} is not a format-{FORMAT} reward model description")
    device = pick_device(device)
    try:
        tokenizer = load_tokenizer(str(path / TOKENIZER_DIR))
    except Exception as exc:
        raise RewardModelError(f"cannot load the tokenizer of {path}: {exc}") from exc
    model = _load_backbone(_base_source(meta, path), device, load_in_4bit, tokenizer.pad_token_id)
    try:
        model = PeftModel.from_pretrained(model, str(path / ADAPTER_DIR), is_trainable=False)
    except Exception as exc:
        raise RewardModelError(f"cannot load the adapter of {path}: {exc}") from exc
    model.eval()
    return RewardScorer(model, tokenizer, device, int(meta["max_length"]), meta, batch_size)


# ---- training -----------------------------------------------------------------------------------
def _trainer_callback(report: Progress, start: float, span: float):
    from transformers import TrainerCallback

    class StepLog(TrainerCallback):
        """Keeps every step's log and forwards progress (an exception raised by ``progress`` stops training).

        ``progress`` gets ``step`` plus namespaced metrics: reward/train_loss, reward/train_batch_accuracy, ...
        """

        def __init__(self):
            self.steps: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "loss" not in logs:  # the end-of-training summary, not a step
                return
            self.steps.append({"epoch": float(logs.get("epoch", 0.0)), **logs})
            metrics = {"step": state.global_step}  # the trainer step, for whoever logs these metrics
            for ours, theirs in (("reward/train_loss", "loss"), ("reward/train_batch_accuracy", "accuracy"),
                                 ("reward/train_batch_margin", "margin"), ("reward/learning_rate", "learning_rate")):
                if theirs in logs:
                    metrics[ours] = float(logs[theirs])
            report(start + span * state.global_step / max(1, state.max_steps), "reward/train", metrics)

        def last_epoch(self, epochs: float, mode: str) -> dict:
            """Training-split metrics: means over the steps of the last epoch (no extra forward passes)."""
            steps = [s for s in self.steps if s["epoch"] > epochs - 1] or self.steps
            mean = lambda key: sum(s[key] for s in steps) / len(steps) if steps and key in steps[0] else None  # noqa
            if mode == "pairwise":
                return {"train_loss": mean("loss"), "train_accuracy": mean("accuracy"), "train_margin": mean("margin")}
            return {"train_loss": mean("loss"), "train_mse": mean("loss")}

    return StepLog()


def _training_args(cls, cfg: RewardConfig, device: str, output_dir: str, **extra):
    return cls(output_dir=output_dir, per_device_train_batch_size=cfg.batch_size, num_train_epochs=cfg.epochs,
               learning_rate=cfg.learning_rate, seed=cfg.seed, data_seed=cfg.seed, logging_steps=1,
               save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
               use_cpu=device == "cpu", bf16=device == "cuda", activation_checkpointing=False,
               dataloader_num_workers=0, **extra)


def _quiet(trainer) -> None:
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):  # they print logs to stdout; the CLI keeps stdout for JSON
        trainer.remove_callback(cb)


def _train_pairwise(model, tokenizer, data: RewardData, cfg: RewardConfig, device: str, work: str, callback):
    from datasets import Dataset
    from trl import RewardConfig as TrlRewardConfig
    from trl import RewardTrainer

    rows = [{"chosen_ids": encode(tokenizer, p["prompt"], p["chosen"], cfg.max_length),
             "rejected_ids": encode(tokenizer, p["prompt"], p["rejected"], cfg.max_length),
             "margin": float(p["margin"])} for p in data.pairs_train]
    # max_length=None: rows are already cut from the left; TRL would silently drop longer ones.
    args = _training_args(TrlRewardConfig, cfg, device, work, max_length=None)
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                            peft_config=_lora_config(model, cfg), callbacks=[callback])
    _quiet(trainer)
    trainer.train()
    return trainer.model


def _train_pointwise(model, tokenizer, data: RewardData, cfg: RewardConfig, device: str, work: str, callback):
    import torch
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import Trainer, TrainingArguments

    model.config.problem_type = "regression"
    model = get_peft_model(model, _lora_config(model, cfg))
    rows = [{"input_ids": encode(tokenizer, p["prompt"], p["completion"], cfg.max_length), "labels": float(p["score"])}
            for p in data.points_train]
    pad = tokenizer.pad_token_id

    def collate(batch):
        width = max(len(r["input_ids"]) for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, :len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([r["labels"] for r in batch])}

    def mse(outputs, labels, num_items_in_batch=None):  # in fp32 whatever the model's dtype
        return torch.nn.functional.mse_loss(outputs.logits.float().squeeze(-1), labels.float())

    args = _training_args(TrainingArguments, cfg, device, work, remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(rows), data_collator=collate,
                      compute_loss_func=mse, callbacks=[callback])
    _quiet(trainer)
    trainer.train()
    return trainer.model


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


def evaluate(scorer: Callable, data: RewardData) -> dict:
    """Held-out metrics of a scorer (pairs always, scores in pointwise mode), keys without namespace."""
    m = pair_metrics(scorer, data.pairs_eval, "eval")
    if data.mode == "pointwise":
        m.update(point_metrics(scorer, data.points_eval, "eval"))
    m["mean"], m["std"] = m.get("eval_reward_mean"), m.get("eval_reward_std")  # the scale PPO will see
    return m


# ---- the whole run ------------------------------------------------------------------------------
def _write_reward_dir(path: Path, model, tokenizer, data: RewardData, meta: dict) -> None:
    """Adapter + head, tokenizer, the rows it learned from and was judged on, and meta.json (written last)."""
    model.save_pretrained(str(path / ADAPTER_DIR))
    tokenizer.save_pretrained(str(path / TOKENIZER_DIR))
    (path / DATA_DIR).mkdir()
    for name in ("pairs_train", "pairs_eval", "points_train", "points_eval", "kto"):
        with (path / DATA_DIR / f"{name}.jsonl").open("w") as f:
            for row in getattr(data, name):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (path / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))


def train_reward_model(store, config: AppConfig, agent: int | str | None = None, job_id: Optional[int] = None,
                       progress: Optional[Progress] = None) -> RewardResult:
    """Train a reward model on the Store's current feedback, evaluate it, save it and register it."""
    from transformers import set_seed

    from rlhf.models import load_tokenizer

    t0 = time.perf_counter()
    report: Progress = progress or (lambda fraction, phase, metrics: None)
    cfg = config.reward
    agent_rec = store.get_agent(agent)
    report(0.0, "reward/data", None)
    snapshot = store.feedback_watermark(agent_rec.id)
    data = prepare_data(store.feedback_rows(agent_rec.id, until=snapshot), cfg)
    log.info("reward data for %s: %s, mode %s", agent_rec.name, data.counts, data.mode)

    report(0.02, "reward/load", None)
    device = pick_device(config.device)
    source = resolve_model(config.base_model, config.data_path)
    if agent_rec.base_model != config.base_model:
        log.warning("agent %s was created on %s; the reward backbone is the served base %s",
                    agent_rec.name, agent_rec.base_model, config.base_model)
    tokenizer = load_tokenizer(source)
    set_seed(cfg.seed)  # the scalar head starts random
    model = _load_backbone(source, device, cfg.load_in_4bit, tokenizer.pad_token_id)

    root = config.data_path / "reward_models"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".rm-", dir=root))
    work = tempfile.mkdtemp(prefix="rlhf-reward-trainer-")
    final: Optional[Path] = None
    try:
        train = _train_pairwise if data.mode == "pairwise" else _train_pointwise
        steps = _trainer_callback(report, 0.05, 0.75)
        model = train(model, tokenizer, data, cfg, device, work, steps)

        report(0.85, "reward/eval", None)
        held_out = evaluate(RewardScorer(model, tokenizer, device, cfg.max_length), data)
        counts = {**data.counts, "pairs_train": len(data.pairs_train), "pairs_eval": len(data.pairs_eval),
                  "points_train": len(data.points_train), "points_eval": len(data.points_eval),
                  "kto_rows": len(data.kto)}
        metrics = {f"reward/{k}": v for k, v in
                   {**held_out, **steps.last_epoch(cfg.epochs, data.mode), **counts}.items()}

        report(0.95, "reward/save", None)
        _write_reward_dir(tmp, model, tokenizer, data, {
            "format": FORMAT, "mode": data.mode, "base_model": config.base_model, "base_source": source,
            "max_length": cfg.max_length, "pad_token_id": tokenizer.pad_token_id, "agent": agent_rec.name,
            "trained_on": device, "lora": {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "layers": cfg.lora_layers},
            "data_snapshot": snapshot, "metrics": metrics,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        final = root / f"rm-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
        os.rename(tmp, final)  # the directory appears complete or not at all
        seconds = time.perf_counter() - t0
        metrics["reward/seconds"] = seconds
        rec = store.register_reward_model(agent_rec.id, str(final), data.mode, snapshot, config.to_dict(), metrics,
                                          job_id=job_id)
    except BaseException:
        if final is not None:
            shutil.rmtree(final, ignore_errors=True)  # renamed but not registered: nobody refers to it
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    report(1.0, "reward/done", metrics)
    return RewardResult(rec.id, str(final), data.mode, len(data.pairs_train), len(data.pairs_eval),
                        metrics.get("reward/eval_accuracy"), seconds, metrics)
