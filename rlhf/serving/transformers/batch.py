"""Batch state for continuous batching: the running rows' shared left-padded KV cache, merging batches and
dropping rows, and per-row sampling. Pure tensor code; ``rlhf.serving.transformers.engine`` schedules it.

Padding is exact, not approximate: pad columns are masked out of attention and every row's position ids count
only its real tokens, so a row in a batch computes what it would alone, up to rounding.
"""
from __future__ import annotations

from typing import Optional

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from rlhf.serving.interface import TOP_K



def sample_next(logits: torch.Tensor, temperatures: list[float], top_ps: list[float],
                generators: list[Optional[torch.Generator]]) -> list[int]:
    """Next token per row: argmax where temperature is 0, else temperature → top-k → top-p sampling.

    Same filters and order as HF ``generate`` (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper;
    nucleus sampling: Holtzman et al., 2020), but each row draws from its own generator so a seeded request
    samples the same reply whatever else shares the batch.
    """
    logits = logits.float()
    sampled = [i for i, t in enumerate(temperatures) if t > 0]
    out = logits.argmax(dim=-1).tolist() if len(sampled) < len(temperatures) else [0] * len(temperatures)
    if not sampled:
        return out
    dev = logits.device
    temps = torch.tensor([temperatures[i] for i in sampled], dtype=logits.dtype, device=dev)[:, None]
    index = torch.tensor(sampled, device=dev)
    values, ids = torch.topk(logits.index_select(0, index) / temps, k=min(TOP_K, logits.shape[-1]), dim=-1)
    probs = torch.softmax(values, dim=-1)  # top-k values come sorted, largest first
    # Keep a token while the mass strictly before it is below top_p; the first token always stays.
    tops = torch.tensor([top_ps[i] for i in sampled], dtype=probs.dtype, device=dev)[:, None]
    probs = probs.masked_fill(torch.cumsum(probs, dim=-1) - probs >= tops, 0.0)
    for j, i in enumerate(sampled):  # one draw per row from the row's own generator
        pick = torch.multinomial(probs[j], 1, generator=generators[i])
        out[i] = int(ids[j, pick])
    return out


class DecodeBatch:
    """The running rows with their shared, left-padded KV cache, attention mask and next position ids."""

    def __init__(self, rows: list, cache, mask: torch.Tensor, positions: torch.Tensor,
                 last: torch.Tensor):
        self.rows = rows
        self.cache = cache  # transformers DynamicCache, [rows, heads, columns, dim] per layer
        self.mask = mask  # [rows, columns] 1 = real token, 0 = padding
        self.positions = positions  # [rows] position id of the next token = real tokens so far
        self.last = last  # [rows, 1] the token each row feeds next

    def __len__(self) -> int:
        return len(self.rows)


class GrowingLayer(DynamicLayer):
    """A KV cache layer that appends into spare capacity (amortised growth) instead of concatenating the whole
    cache at every step as ``DynamicLayer`` does: that copy was ~10% of a batched CPU decode step."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, spare: int = 64):
        super().__init__()
        self._k = self._v = None
        self._n = 0
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._reserve(keys, values, keys.shape[-2] + spare)
        self._append(keys, values)

    def _reserve(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        shape = list(keys.shape)
        shape[-2] = capacity
        new_k, new_v = keys.new_empty(shape), values.new_empty(shape)
        if self._n:
            new_k[:, :, :self._n] = self._k[:, :, :self._n]
            new_v[:, :, :self._n] = self._v[:, :, :self._n]
        self._k, self._v = new_k, new_v

    def _append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        n = keys.shape[-2]
        if self._n + n > self._k.shape[-2]:
            self._reserve(keys, values, self._n + n + max(64, self._n // 2))
        self._k[:, :, self._n:self._n + n] = keys
        self._v[:, :, self._n:self._n + n] = values
        self._n += n
        self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append this step's keys/values; return all of them (views into the buffer)."""
        self._append(key_states, value_states)
        return self.keys, self.values


def cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def new_cache(tensors):
    """A cache over per-layer (keys, values), every layer growing in place."""
    cache = DynamicCache()
    cache.layers = [GrowingLayer(k, v) for k, v in tensors]
    return cache


def left_pad(t: torch.Tensor, columns: int, dim: int) -> torch.Tensor:
    if columns == 0:
        return t
    shape = list(t.shape)
    shape[dim] = columns
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def merge(a: DecodeBatch, b: DecodeBatch) -> DecodeBatch:
    """One batch holding the rows of both: the shorter cache is padded on the left (masked), then stacked."""
    ta, tb = a.mask.shape[1], b.mask.shape[1]
    width = max(ta, tb)
    layers = []
    for (ka, va), (kb, vb) in zip(cache_tensors(a.cache), cache_tensors(b.cache)):
        layers.append((torch.cat([left_pad(ka, width - ta, 2), left_pad(kb, width - tb, 2)]),
                       torch.cat([left_pad(va, width - ta, 2), left_pad(vb, width - tb, 2)])))
    mask = torch.cat([left_pad(a.mask, width - ta, 1), left_pad(b.mask, width - tb, 1)])
    return DecodeBatch(a.rows + b.rows, new_cache(layers), mask, torch.cat([a.positions, b.positions]),
                       torch.cat([a.last, b.last]))


def keep_rows(batch: DecodeBatch, keep: list[int]) -> DecodeBatch:
    """The batch restricted to rows ``keep``, with padding columns no remaining row needs cut off."""
    index = torch.tensor(keep, device=batch.mask.device)
    mask = batch.mask.index_select(0, index)
    start = int(mask.any(dim=0).int().argmax())  # first column some remaining row really uses
    layers = [(k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
              for k, v in cache_tensors(batch.cache)]
    return DecodeBatch([batch.rows[i] for i in keep], new_cache(layers), mask[:, start:],
                       batch.positions.index_select(0, index), batch.last.index_select(0, index))
