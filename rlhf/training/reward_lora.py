"""The LoRA reward model: the base model with a scalar head and a LoRA adapter, trained with TRL.

Pairs train with TRL's ``RewardTrainer`` on the Bradley–Terry loss with a margin,
``-log σ(r_chosen − r_rejected − margin)`` (Ouyang et al. 2022, Eq. 1; margin as in Touvron et al. 2023,
Llama 2, Eq. 2); scores alone train a regression with a plain ``transformers.Trainer``. This is the reward
model for plenty of data (``reward.method=lora``, or ``auto`` past ``reward.lora_min_pairs``): with tens of
pairs it gets too few optimizer steps to learn (see BENCHMARKS.md, bench reward), and the linear head on
frozen features (``rlhf.training.reward_head``) is used instead.

SmolLM2 pads with its end-of-turn token and a sequence classifier reads the last non-pad token, so a
sequence is ``chat template(prompt) + reply tokens`` with no closing ``<|im_end|>`` (``rlhf.training.tokens``).
``KIND`` is the ``lora`` reward-model kind (``rlhf.training.reward_kinds``).
"""
from __future__ import annotations

import contextlib
import tempfile
import shutil
from pathlib import Path
from typing import Callable, Optional

from rlhf.config import AppConfig, RewardConfig
from rlhf.base_models import load_tokenizer, pick_device, quantization, torch_dtype
from rlhf.training.reward_kinds import FitContext, Fitted
from rlhf.training.reward_metrics import heldout_metrics, split_interval
from rlhf.training.tokens import encode

Progress = Callable[[float, str, Optional[dict]], None]


class RewardModelError(RuntimeError):
    """A reward model directory that cannot be loaded (missing or corrupted files)."""


def load_backbone(source: str, device: str, load_in_4bit: bool, pad_token_id: int):
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


def lora_config(model, cfg: RewardConfig):
    from peft import LoraConfig

    from rlhf.base_models import lora_targets

    targets = lora_targets(model)
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
                 batch_size: int = 8, max_prompt_tokens: Optional[int] = None):
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.max_length, self.meta, self.batch_size = max_length, meta or {}, batch_size
        self.max_prompt_tokens = max_prompt_tokens

    def __call__(self, prompts: list[list[dict]], replies: list[str]) -> list[float]:
        if len(prompts) != len(replies):
            raise ValueError(f"{len(prompts)} prompts but {len(replies)} replies")
        return self.score_ids([encode(self.tokenizer, p, r, self.max_length, self.max_prompt_tokens)
                               for p, r in zip(prompts, replies)])

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


def trainer_callback(report: Progress, start: float, span: float):
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


def _train_pairwise(model, tokenizer, pairs: list[dict], cfg: RewardConfig, device: str, work: str, callback,
                    max_prompt_tokens: Optional[int] = None):
    from datasets import Dataset
    from trl import RewardConfig as TrlRewardConfig
    from trl import RewardTrainer

    rows = [{"chosen_ids": encode(tokenizer, p["prompt"], p["chosen"], cfg.max_length, max_prompt_tokens),
             "rejected_ids": encode(tokenizer, p["prompt"], p["rejected"], cfg.max_length, max_prompt_tokens),
             "margin": float(p["margin"])} for p in pairs]
    # max_length=None: rows are already fitted to it; TRL would silently drop longer ones.
    args = _training_args(TrlRewardConfig, cfg, device, work, max_length=None)
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                            peft_config=lora_config(model, cfg), callbacks=[callback])
    _quiet(trainer)
    trainer.train()
    return trainer.model


def _train_pointwise(model, tokenizer, points: list[dict], cfg: RewardConfig, device: str, work: str, callback,
                     max_prompt_tokens: Optional[int] = None):
    import torch
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import Trainer, TrainingArguments

    model.config.problem_type = "regression"
    model = get_peft_model(model, lora_config(model, cfg))
    rows = [{"input_ids": encode(tokenizer, p["prompt"], p["completion"], cfg.max_length, max_prompt_tokens),
             "labels": float(p["score"])} for p in points]
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


def train_lora(pairs: list[dict], points: list[dict], mode: str, cfg: RewardConfig, source: str, device: str,
               report: Progress, start: float = 0.05, span: float = 0.75, max_prompt_tokens: Optional[int] = None,
               template: str = ""):
    """Train the LoRA reward model on pairs (``mode="pairwise"``) or scores; (scorer, training-split metrics).
    ``max_prompt_tokens``: the prompt budget of ``rlhf.training.tokens.encode`` (PPO's)."""
    from transformers import set_seed

    from rlhf.base_models import load_tokenizer

    tokenizer = load_tokenizer(source, template)
    set_seed(cfg.seed)  # the scalar head starts random
    model = load_backbone(source, device, cfg.load_in_4bit, tokenizer.pad_token_id)
    work = tempfile.mkdtemp(prefix="rlhf-reward-trainer-")
    try:
        steps = trainer_callback(report, start, span)
        if mode == "pairwise":
            model = _train_pairwise(model, tokenizer, pairs, cfg, device, work, steps, max_prompt_tokens)
        else:
            model = _train_pointwise(model, tokenizer, points, cfg, device, work, steps, max_prompt_tokens)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return (RewardScorer(model, tokenizer, device, cfg.max_length, max_prompt_tokens=max_prompt_tokens),
            steps.last_epoch(cfg.epochs, mode))


def train_lora_on_pairs(pairs: list[dict], config: AppConfig, source: str) -> "RewardScorer":
    """A LoRA reward model fitted on raw pairs with the config's reward settings (for benchmarks)."""
    scorer, _ = train_lora(pairs, [], "pairwise", config.reward, source, pick_device(config.device),
                           lambda *a: None, template=config.chat_template)
    return scorer


class LoraKind:
    """LoRA fine-tuning of the base with a scalar head (TRL): for thousands of pairs; one held-out split."""

    name, format = "lora", 1
    adapter_dir, tokenizer_dir = "adapter", "tokenizer"

    def fit(self, data, cfg: RewardConfig, ctx: FitContext, report: Progress) -> Fitted:
        scorer, train_metrics = train_lora(data.pairs_train, data.points_train, data.mode, cfg, ctx.source,
                                           ctx.device, report, max_prompt_tokens=ctx.max_prompt_tokens,
                                           template=ctx.template)
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


KIND = LoraKind()
