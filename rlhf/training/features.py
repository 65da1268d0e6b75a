"""Frozen features of a reply: the base model's hidden states, pooled over the reply's tokens.

A reward model that must learn from 16–256 votes cannot fine-tune a 135M-parameter network without
overfitting (or without hundreds of optimizer steps): it learns a small head on top of features the base model
already computes. Each reply is read in its context (chat template of the prompt + the reply) and its tokens'
hidden states are averaged at a few depths, plus the last token's state at the top and the reply's log length.
The same features are computed for every version's replies by the same frozen base, so a score never drifts
with the policy being trained.

``reply_features`` is the one way to build them: the retrain's reward model, the gate's judge and the vote queue's
scoring all read a reply through it, and ``reward_features`` gives each the app config's settings (the prompt fitted
to ``ppo.max_prompt_tokens``, ``reward.max_length`` in all), so the queue's "least sure" is about the very inputs
the reward model it feeds will read.
"""
from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from rlhf.training.tokens import encode_with_reply

if TYPE_CHECKING:
    from rlhf.config import AppConfig

DEFAULT_DEPTHS = (0.5, 0.75, 1.0)  # fractions of the layer stack whose reply-mean hidden states are kept


class ReplyFeatures:
    """``features(prompts, replies) -> ndarray (n, d)``: pooled hidden states of the frozen base model."""

    def __init__(self, model, tokenizer, device: str = "cpu", max_length: int = 512,
                 depths: Sequence[float] = DEFAULT_DEPTHS, batch_size: int = 8,
                 max_prompt_tokens: Optional[int] = None):
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.max_length, self.batch_size, self.max_prompt_tokens = max_length, batch_size, max_prompt_tokens
        n_layers = model.config.get_text_config().num_hidden_layers
        self.layers = sorted({max(1, min(n_layers, round(d * n_layers))) for d in depths})
        self.hidden = model.config.get_text_config().hidden_size

    @classmethod
    def load(cls, source: str, device: str = "cpu", max_length: int = 512, depths: Sequence[float] = DEFAULT_DEPTHS,
             batch_size: int = 8, load_in_4bit: bool = False, max_prompt_tokens: Optional[int] = None,
             template: str = "") -> "ReplyFeatures":
        """The base model (no LM head) and tokenizer from a model directory (``template``: the chat template
        prompts are encoded with, "" = the model's)."""
        from transformers import AutoModel

        from rlhf.base_models import load_tokenizer, quantization, torch_dtype

        quant = quantization(load_in_4bit, device)
        model = AutoModel.from_pretrained(source, dtype=torch_dtype(device), quantization_config=quant,
                                          device_map={"": device} if quant is not None else None)
        if quant is None:
            model.to(device)
        model.eval()
        return cls(model, load_tokenizer(source, template), device, max_length, depths, batch_size, max_prompt_tokens)

    @property
    def dim(self) -> int:
        return self.hidden * (len(self.layers) + 1) + 1

    def __call__(self, prompts: Sequence[list[dict]], replies: Sequence[str]) -> np.ndarray:
        if len(prompts) != len(replies):
            raise ValueError(f"{len(prompts)} prompts but {len(replies)} replies")
        rows = [encode_with_reply(self.tokenizer, p, r, self.max_length, self.max_prompt_tokens)
                for p, r in zip(prompts, replies)]
        out = np.zeros((len(rows), self.dim), dtype=np.float32)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))  # similar lengths pad less
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            out[idx] = self._batch([rows[i] for i in idx])
        return out

    def _batch(self, rows: list[tuple[list[int], int]]) -> np.ndarray:
        import torch

        batch = self.tokenizer.pad({"input_ids": [ids for ids, _ in rows]}, padding_side="right",
                                   return_tensors="pt").to(self.device)
        with torch.inference_mode(), base_only(self.model):
            states = self.model(**batch, output_hidden_states=True).hidden_states
        lengths = batch["attention_mask"].sum(1)
        reply = torch.zeros_like(batch["attention_mask"], dtype=torch.float32)
        for row, (ids, n_reply) in enumerate(rows):  # the reply's tokens (at least the last token)
            end = int(lengths[row])
            reply[row, max(0, end - max(n_reply, 1)):end] = 1.0
        weights = (reply / reply.sum(1, keepdim=True)).unsqueeze(-1)
        parts = [(states[layer].float() * weights).sum(1) for layer in self.layers]
        last = states[-1].float()[torch.arange(len(rows)), lengths - 1]
        n_tokens = torch.tensor([[math.log1p(n)] for _, n in rows], dtype=torch.float32, device=last.device)
        return torch.cat(parts + [last, n_tokens], dim=1).cpu().numpy()


@contextlib.contextmanager
def base_only(model):
    """Switch off every LoRA layer inside ``model`` for the block: the frozen base's own outputs, also when a
    policy's adapters were put on the same weights (the retrain shares one base between the reward features and
    PPO's policy). The same switch ``PeftModel.disable_adapter`` uses for PPO's reference; a no-op without them."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        yield
        return
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer) and not m.disable_adapters]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def reply_features(source: str, device: str, max_length: int, load_in_4bit: bool = False,
                   max_prompt_tokens: Optional[int] = None, depths: Sequence[float] = DEFAULT_DEPTHS,
                   batch_size: int = 8, model=None, tokenizer=None, memo: bool = True, template: str = ""):
    """Frozen reply features of the base: on ``model``/``tokenizer`` when given (a base body already loaded in
    this process), else loaded from ``source``; memoised (``feature_cache``) unless ``memo`` is False (a caller
    that keeps its own, bounded memo)."""
    if model is not None:
        features = ReplyFeatures(model, tokenizer, device, max_length, depths, batch_size, max_prompt_tokens)
    else:
        features = ReplyFeatures.load(source, device, max_length, depths, batch_size, load_in_4bit, max_prompt_tokens,
                                      template)
    return feature_cache(features) if memo else features


def reward_features(config: "AppConfig", device: str, source: Optional[str] = None, **kwargs):
    """``reply_features`` under the app config: the base ``source`` (default: the configured base, resolved),
    ``reward.max_length``, ``reward.load_in_4bit`` and the prompt budget ``ppo.max_prompt_tokens`` every reward model
    is trained and scored under. ``kwargs`` as ``reply_features`` (``model``, ``batch_size``, ``memo``...)."""
    if source is None:
        from rlhf.base_models import resolve_model

        source = resolve_model(config.base_model, config.data_path)
    return reply_features(source, device, config.reward.max_length, config.reward.load_in_4bit,
                          config.ppo.max_prompt_tokens, **{"template": config.chat_template, **kwargs})


def feature_key(prompt: list[dict], reply: str) -> tuple:
    """The memo key of one (prompt, reply)."""
    return tuple((m["role"], m["content"]) for m in prompt), reply


def feature_cache(features: ReplyFeatures):
    """A memoising wrapper: each distinct (prompt, reply) is encoded once per process."""
    memo: dict[tuple, np.ndarray] = {}

    def cached(prompts: Sequence[list[dict]], replies: Sequence[str]) -> np.ndarray:
        keys = [feature_key(p, r) for p, r in zip(prompts, replies)]
        todo = [i for i, k in enumerate(keys) if k not in memo]
        if todo:
            fresh = features([prompts[i] for i in todo], [replies[i] for i in todo])
            for i, row in zip(todo, fresh):
                memo[keys[i]] = row
        return np.stack([memo[k] for k in keys]) if keys else np.zeros((0, features.dim), np.float32)

    cached.dim = features.dim  # type: ignore[attr-defined]
    return cached
