"""Continuous batching over one Hugging Face causal LM: many replies decoded together, each streamed on its own.

The loop (in the spirit of Orca's iteration-level scheduling, Yu et al., OSDI 2022) alternates two moves:
new requests are *prefilled* as one left-padded batch and merged into the running batch between decode steps;
then every running row advances by one token in a single forward pass over a shared KV cache. Rows that finish
(EOS, their own ``max_new_tokens``, or a cancelled client) leave at once, so a long reply never holds back a
short one. Each row keeps its own sampling settings, its own ``torch.Generator`` and its own LoRA adapter (peft's
mixed-adapter batches), so a batched reply is the reply that request would have got alone (the batch state
and sampling live in ``rlhf.serving.transformers.batch``). Prompts that start with the same prefix (an agent's system prompt) reuse
its KV cache, computed once per adapter.

This is the ``transformers`` engine of the seam in ``rlhf.serving.interface``: the GPU engine, the exact mode
(the same torch weights PPO trained) and the CPU fallback when llama.cpp is not installed.
"""
from __future__ import annotations

import collections
import logging
import random
import time
from dataclasses import dataclass
from typing import Optional

import torch

from rlhf.serving.interface import AdapterError, EngineCore, IncrementalDecoder, Request
from rlhf.serving.transformers.batch import DecodeBatch, GrowingLayer, cache_tensors, keep_rows, left_pad, merge, \
    new_cache, sample_next

log = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed-adapter batch


@dataclass
class EngineStats:
    """Where the decode loop's time goes (a cheap always-on profile)."""

    prefill_calls: int = 0
    prefill_rows: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_rows: int = 0  # sum of batch sizes over steps
    decode_s: float = 0.0  # model forward time of decode steps
    sample_s: float = 0.0  # sampling, detokenizing and emitting
    cache_s: float = 0.0  # merging and trimming KV caches
    max_rows: int = 0
    prefix_hits: int = 0  # prompts whose shared prefix came from the prefix cache
    prefix_tokens_saved: int = 0

    def to_dict(self) -> dict:
        """Counters plus derived means (rows per step, ms per step)."""
        out = dict(vars(self))
        out["mean_rows_per_step"] = self.decode_rows / self.decode_steps if self.decode_steps else 0.0
        out["ms_per_step"] = 1000 * self.decode_s / self.decode_steps if self.decode_steps else 0.0
        return out


@dataclass
class _Row:
    req: Request
    decoder: IncrementalDecoder
    generator: Optional[torch.Generator]
    generated: int = 0
    done: bool = False


class TransformersCore(EngineCore):
    """Continuous batching over ``model`` (see the module docstring); driven by ``rlhf.serving.loop``.

    ``max_batch_size`` bounds rows decoded together; ``max_prefill_tokens`` bounds prompt tokens prefilled
    between two decode steps, so a burst of long prompts does not freeze the replies already streaming;
    ``max_prefixes`` bounds the shared-prefix KV cache (entries keyed by adapter and prefix ids, least recently
    used evicted first).
    """

    name = "transformers"

    def __init__(self, model, tokenizer, device: str, *, max_batch_size: int = 32, max_prefill_tokens: int = 1024,
                 max_prefixes: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch_size = max(1, int(max_batch_size))
        self.max_prefill_tokens = max(1, int(max_prefill_tokens))
        self.stats = EngineStats()
        eos = getattr(model.config, "eos_token_id", None)  # an int or, for some models, a list
        self.eos = {i for i in [tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])]
                    if isinstance(i, int)}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos or {0})
        self.max_prefixes = max(0, int(max_prefixes))
        self._prefixes: collections.OrderedDict[tuple, list] = collections.OrderedDict()  # LRU
        self._batch: Optional[DecodeBatch] = None
        self._loaded: dict[str, str] = {}  # adapter name -> path

    # ---- the core interface (rlhf.serving.interface.EngineCore) -------------------------------------
    @property
    def running(self) -> int:
        batch = self._batch
        return len(batch) if batch is not None else 0

    def admit(self, requests: list[Request]) -> list[Request]:
        """Prefill as many requests as there are free rows, within the prefill token budget; return the rest."""
        free = self.max_batch_size - self.running
        take, tokens = [], 0
        for req in requests[:max(0, free)]:
            cost = self._prefill_cost(req)
            if take and tokens + cost > self.max_prefill_tokens:
                break
            take.append(req)
            tokens += cost
        if take:
            with torch.inference_mode():
                self._prefill(take)
        return requests[len(take):]

    def step(self) -> None:
        if self._batch is not None:
            with torch.inference_mode():
                self._decode_step()

    def set_threads(self, threads: int) -> None:
        """torch's intra-op thread count belongs to the calling thread: the loop calls this on its own thread."""
        torch.set_num_threads(max(1, int(threads)))

    def profile(self) -> dict:
        return self.stats.to_dict()

    @property
    def adapters(self) -> list[str]:
        return sorted(self._loaded)

    def load_adapter(self, name: str, path: str) -> None:
        """Load a PEFT adapter dir onto the shared base under ``name``."""
        from pathlib import Path

        if name in self._loaded:
            return
        if not (Path(path) / "adapter_config.json").is_file():
            raise AdapterError(f"adapter {name} is missing: {path}/adapter_config.json")
        try:
            from peft import PeftModel

            if not isinstance(self.model, PeftModel):
                self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=name)
            else:
                self.model.load_adapter(str(path), adapter_name=name)
            self.model.eval()
        except Exception as exc:  # a corrupted file can raise many kinds of errors
            raise AdapterError(f"adapter at {path} cannot be loaded: {type(exc).__name__}: {exc}") from exc
        self._loaded[name] = str(path)

    def unload_adapter(self, name: str) -> None:
        """Delete an adapter from the peft model (a request naming it afterwards fails with KeyError)."""
        if self._loaded.pop(name, None) is not None and hasattr(self.model, "delete_adapter"):
            self.model.delete_adapter(name)

    def fail_all(self, error: BaseException) -> None:
        batch, self._batch = self._batch, None
        for row in batch.rows if batch is not None else []:
            self._finish(row, error)

    def close(self) -> None:
        self._prefixes.clear()
        self.model = None

    def _prefill_cost(self, req: Request) -> int:
        """Prompt tokens a prefill must compute for ``req`` (a cached shared prefix is free)."""
        key = self._prefix_key(req)
        return len(req.input_ids) - (req.prefix_len if key is not None and key in self._prefixes else 0)

    # ---- model calls --------------------------------------------------------------------------
    def _forward(self, adapters: list[Optional[str]], **inputs):
        """One forward pass with each row on its own adapter."""
        model = self.model
        known = getattr(model, "peft_config", {})  # a plain model has no adapters to choose from
        unknown = {a for a in adapters if a is not None and a not in known}
        if unknown:
            raise KeyError(f"adapter(s) not loaded: {sorted(unknown)}")
        if not known:
            return model(**inputs)
        distinct = set(adapters)
        if distinct == {None}:
            with model.disable_adapter():
                return model(**inputs)
        if len(distinct) == 1:
            model.set_adapter(adapters[0])
            return model(**inputs)
        return model(**inputs, adapter_names=[a or BASE_ADAPTER for a in adapters])

    def _new_row(self, req: Request) -> _Row:
        gen = None
        if req.params.temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(req.params.seed if req.params.seed is not None else random.getrandbits(63))
        return _Row(req, IncrementalDecoder(self.tokenizer), gen)

    def _prefill(self, requests: list[Request]) -> None:
        """Run the prompts of ``requests`` as one left-padded batch, emit first tokens, join the running batch.

        A row whose shared prefix is cached feeds only its suffix; the batch's cache starts as every row's cached
        prefix (left-padded), so a row reads [pad, prefix, pad, suffix], the pads masked out.
        """
        t0 = time.perf_counter()
        rows = [self._new_row(r) for r in requests]
        cached = [self._cached_prefix(r) for r in requests]
        plen = [0 if c is None else r.prefix_len for r, c in zip(requests, cached)]
        suffixes = [r.input_ids[n:] for r, n in zip(requests, plen)]
        n, p_width, s_width = len(rows), max(plen), max(map(len, suffixes))
        ids = torch.full((n, s_width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, p_width + s_width), dtype=torch.long)
        position_ids = torch.zeros((n, s_width), dtype=torch.long)
        for i, (suffix, p) in enumerate(zip(suffixes, plen)):
            ids[i, s_width - len(suffix):] = torch.tensor(suffix, dtype=torch.long)
            mask[i, p_width - p:p_width] = 1
            mask[i, p_width + s_width - len(suffix):] = 1
            # Position ids count real tokens only, so a padded row sees the positions it would see alone.
            position_ids[i, s_width - len(suffix):] = torch.arange(p, p + len(suffix))
        ids, mask, position_ids = ids.to(self.device), mask.to(self.device), position_ids.to(self.device)
        past = None
        if p_width:
            past = new_cache([self._stack_prefixes(cached, plen, p_width, layer) for layer in
                               range(len(next(c for c in cached if c is not None)))])
        try:
            out = self._forward([r.adapter for r in requests], input_ids=ids, attention_mask=mask,
                                position_ids=position_ids, past_key_values=past, use_cache=True, logits_to_keep=1)
            self._join(rows, out, mask, ids, plen, t0)
        except Exception as exc:  # these rows fail; the running batch is untouched
            log.exception("prefill failed")
            for row in rows:
                self._finish(row, exc)

    def _join(self, rows: list[_Row], out, mask: torch.Tensor, ids: torch.Tensor, plen: list[int],
              t0: float) -> None:
        """After a prefill forward: keep new shared prefixes, emit first tokens, merge into the running batch."""
        self._remember_prefixes([row.req for row in rows], plen, out.past_key_values, mask.shape[1])
        self.stats.prefill_calls += 1
        self.stats.prefill_rows += len(rows)
        self.stats.prefill_tokens += int(mask.sum()) - sum(plen)
        self.stats.prefix_hits += sum(1 for p in plen if p)
        self.stats.prefix_tokens_saved += sum(plen)
        self.stats.prefill_s += time.perf_counter() - t0
        cache = out.past_key_values
        if not all(isinstance(layer, GrowingLayer) for layer in cache.layers):
            cache = new_cache(cache_tensors(cache))  # the model made a plain DynamicCache: one copy, then grow
        batch = DecodeBatch(rows, cache, mask, mask.sum(-1), ids[:, -1:].clone())
        batch = self._advance(batch, out.logits[:, -1, :])
        if batch is None:
            return
        t1 = time.perf_counter()
        self._batch = batch if self._batch is None else merge(self._batch, batch)
        self.stats.cache_s += time.perf_counter() - t1
        self.stats.max_rows = max(self.stats.max_rows, len(self._batch))

    # ---- shared-prefix cache ----------------------------------------------------------------------
    def _prefix_key(self, req: Request) -> Optional[tuple]:
        if not self.max_prefixes or not 0 < req.prefix_len < len(req.input_ids):
            return None  # at least one token must be left to prefill: it yields the first logits
        return (req.adapter, tuple(req.input_ids[:req.prefix_len]))

    def _cached_prefix(self, req: Request) -> Optional[list]:
        key = self._prefix_key(req)
        if key is None or key not in self._prefixes:
            return None
        self._prefixes.move_to_end(key)
        return self._prefixes[key]

    @staticmethod
    def _stack_prefixes(cached: list, plen: list, width: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's prefix keys/values for the whole prefill batch, left-padded to ``width``."""
        ref_k, ref_v = next(c for c in cached if c is not None)[layer]
        keys, values = [], []
        for c, p in zip(cached, plen):
            k, v = c[layer] if c is not None else (ref_k[:, :, :0], ref_v[:, :, :0])
            keys.append(left_pad(k, width - p, 2))
            values.append(left_pad(v, width - p, 2))
        return torch.cat(keys), torch.cat(values)

    def _remember_prefixes(self, requests: list[Request], plen: list[int], cache, width: int) -> None:
        """Keep the prefix KV of rows whose shared prefix was not cached yet (causal: it depends on nothing else)."""
        layers = None
        for i, (req, p) in enumerate(zip(requests, plen)):
            key = self._prefix_key(req)
            if p or key is None or key in self._prefixes:
                continue
            if layers is None:
                layers = cache_tensors(cache)
            start = width - len(req.input_ids)  # this row's prompt is right-aligned in the batch
            self._prefixes[key] = [(k[i:i + 1, :, start:start + req.prefix_len].clone(),
                                    v[i:i + 1, :, start:start + req.prefix_len].clone()) for k, v in layers]
            while len(self._prefixes) > self.max_prefixes:
                self._prefixes.popitem(last=False)

    def _decode_step(self) -> None:
        """Drop cancelled rows, then advance every running row by one token."""
        batch = self._batch
        live = [i for i, row in enumerate(batch.rows) if not row.req.stream.cancelled]
        if len(live) < len(batch):
            for i, row in enumerate(batch.rows):
                if row.req.stream.cancelled:
                    self._finish(row)
            if not live:
                self._batch = None
                return
            batch = self._batch = keep_rows(batch, live)
        t0 = time.perf_counter()
        mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch), 1))], dim=1)
        out = self._forward([r.req.adapter for r in batch.rows], input_ids=batch.last, attention_mask=mask,
                            position_ids=batch.positions[:, None], past_key_values=batch.cache, use_cache=True)
        self.stats.decode_s += time.perf_counter() - t0
        self.stats.decode_steps += 1
        self.stats.decode_rows += len(batch)
        batch.cache, batch.mask = out.past_key_values, mask
        batch.positions = batch.positions + 1
        self._batch = self._advance(batch, out.logits[:, -1, :])

    def _advance(self, batch: DecodeBatch, logits: torch.Tensor) -> Optional[DecodeBatch]:
        """Sample each row's next token, stream its text, and drop rows that are done."""
        t0 = time.perf_counter()
        rows = batch.rows
        tokens = sample_next(logits, [r.req.params.temperature for r in rows],
                             [r.req.params.top_p for r in rows], [r.generator for r in rows])
        keep = []
        for i, (row, tok) in enumerate(zip(rows, tokens)):
            row.generated += 1
            if tok in self.eos:
                self._finish(row)
                continue
            stream = row.req.stream
            stream.n_tokens += 1
            delta = row.decoder.push(tok)
            if delta:
                stream.emit(delta)
            if row.generated >= row.req.params.max_new_tokens or stream.cancelled:
                self._finish(row)
            else:
                keep.append(i)
        batch.last = torch.tensor(tokens, dtype=torch.long, device=batch.mask.device)[:, None]
        self.stats.sample_s += time.perf_counter() - t0
        if not keep:
            return None
        if len(keep) == len(rows):
            return batch
        t1 = time.perf_counter()
        batch = keep_rows(batch, keep)
        self.stats.cache_s += time.perf_counter() - t1
        return batch

    def _finish(self, row: _Row, error: Optional[BaseException] = None) -> None:
        if row.done:
            return
        row.done = True
        row.req.stream.token_ids = row.decoder.tokens
        row.req.stream.close(error)


def build(model_source: str, device: str = "cpu", tokenizer_source: Optional[str] = None, load_in_4bit: bool = False,
          data_dir: Optional[str] = None, **settings) -> TransformersCore:
    """The factory behind ``ENGINES["transformers"]``: the base model (a shipped name is converted once under
    ``data_dir``) and its tokenizer."""
    from rlhf.base_models import load_causal_lm, load_tokenizer, resolve_model

    if data_dir is not None:
        model_source = resolve_model(model_source, data_dir)
    tokenizer = load_tokenizer(tokenizer_source or model_source)
    model = load_causal_lm(model_source, device, load_in_4bit=load_in_4bit)
    return TransformersCore(model, tokenizer, device, **settings)
