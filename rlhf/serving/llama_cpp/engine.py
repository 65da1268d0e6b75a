"""The llama.cpp engine: continuous batching over one GGUF base with one LoRA per policy version, on CPU.

The engine loop (``rlhf.serving.loop``) calls ``step``: in a step every busy lane (``rlhf.serving.llama_cpp.lanes``: a context bound to one
version) decodes ONE ``llama_batch`` holding the next token of each of its running replies plus a slice of the
prompts that joined (chunked prefill, at most ``max_prefill_tokens`` prompt tokens per step, so a long prompt
never freezes the replies already streaming). Replies join between steps and leave the moment they finish or are
cancelled. Each keeps its own temperature, top_p, seed and max tokens. An agent's system prompt is computed once
per lane and shared by the sequences that start with it (llama.cpp's unified KV cache lets sequences share cells).

A version's PEFT adapter is converted to a GGUF LoRA on first use (cached by content hash under
``<cache_dir>/gguf/loras``) and loaded beside the base; an adapter that cannot be converted raises
``AdapterError`` (the caller marks the version broken). Threads follow the CPU budget (``rlhf.cpu``).
"""
from __future__ import annotations

import collections
import logging
import os
import random
import time
from pathlib import Path
from typing import Optional

from rlhf.serving.interface import AdapterError, EngineCore, Request
from rlhf.serving.llama_cpp import lib as lib_module
from rlhf.serving.llama_cpp.lanes import Lane, Seq, decode_order, sample_token
from rlhf.serving.llama_cpp.lib import Batch, Context, Lora, Model

log = logging.getLogger(__name__)


class LlamaCppCore(EngineCore):
    """Continuous batching with llama.cpp (see the module docstring); driven by ``rlhf.serving.loop``.

    ``kv_cache_tokens``: KV cells per context; ``max_contexts``: contexts (versions decoding at once);
    ``max_batch_size``: replies decoding at once over all contexts; ``extra_buffers``: let llama.cpp repack the
    weights into its extra buffer types (AMX, CPU repack) at load; False (the default: a fault kills the process)
    is the safe load for CPUs where those kernels fault. The app's specs ask for the repack first and fall back.
    """

    name = "llama_cpp"

    def __init__(self, gguf: str | Path, tokenizer, *, max_batch_size: int = 32, max_prefill_tokens: int = 512,
                 max_prefixes: int = 8, kv_cache_tokens: int = 4096, max_contexts: int = 4, threads: int = 1,
                 cache_dir: Optional[str | Path] = None, lora_dtype: str = "f16", extra_buffers: bool = False):
        from rlhf.serving.llama_cpp.base import gguf_dir
        from rlhf.serving.llama_cpp.convert import BaseInfo

        self.tokenizer = tokenizer
        self.gguf = str(gguf)
        self.llama = Model(gguf, extra_buffers=extra_buffers)
        self.build = lib_module.CPU_BACKEND
        self.base_info = BaseInfo.read(gguf)
        self.lora_dir = gguf_dir(cache_dir) / "loras"
        self.lora_dtype = lora_dtype
        self.max_batch_size = max(1, int(max_batch_size))
        self.max_prefill_tokens = max(16, int(max_prefill_tokens))
        self.max_prefixes = max(0, int(max_prefixes))
        self.kv_cache_tokens = int(kv_cache_tokens)
        self.max_contexts = max(1, int(max_contexts))
        self.eos = {i for i in (tokenizer.eos_token_id, self.llama.eos) if isinstance(i, int) and i >= 0}
        self.threads = max(1, int(threads))
        self._lanes: list[Lane] = []
        self._batch = Batch(self.llama.lib, self.max_prefill_tokens + self.max_batch_size)
        self._loras: dict[str, Lora] = {}
        self._order = random.SystemRandom()  # the lanes' decode order, new every step (lanes.decode_order)
        self.stats = collections.Counter()
        self.timings = collections.defaultdict(float)

    # ---- the core interface (rlhf.serving.interface.EngineCore) -------------------------------------
    @property
    def running(self) -> int:
        return sum(len(lane.seqs) for lane in self._lanes)

    def admit(self, requests: list[Request]) -> list[Request]:
        """Place requests in lanes until one has no room yet; return it and the ones after it."""
        for i, req in enumerate(requests):
            if self._place(req) is False:
                return requests[i:]
        return []

    def step(self) -> None:
        for lane in decode_order(self._lanes, self._order):
            self._step(lane)

    def set_threads(self, threads: int) -> None:
        self.threads = max(1, int(threads))
        for lane in self._lanes:
            lane.ctx.set_threads(self.threads)

    def profile(self) -> dict:
        out = {**self.stats, **{k: round(v, 4) for k, v in self.timings.items()}}
        steps = self.stats["decode_steps"]
        out["mean_rows_per_step"] = self.stats["decode_rows"] / steps if steps else 0.0
        out["ms_per_step"] = 1000 * self.timings["decode_s"] / steps if steps else 0.0
        out["contexts"] = len(self._lanes)
        return out

    @property
    def adapters(self) -> list[str]:
        return sorted(self._loras)

    def load_adapter(self, name: str, path: str) -> None:
        """Convert the PEFT adapter at ``path`` to a GGUF LoRA (once per content) and load it beside the base."""
        from rlhf.serving.llama_cpp.convert import adapter_fingerprint, lora_to_gguf

        if name in self._loras:
            return
        t0 = time.perf_counter()
        if not (Path(path) / "adapter_config.json").is_file():
            raise AdapterError(f"adapter {name} is missing: {path}/adapter_config.json")
        target = self.lora_dir / f"{adapter_fingerprint(path)}-{self.lora_dtype}.gguf"
        if not target.is_file():
            self.lora_dir.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                lora_to_gguf(path, self.base_info, tmp, self.lora_dtype)
                tmp.replace(target)
            except AdapterError as exc:
                raise AdapterError(f"adapter at {path} cannot be loaded: {exc}") from exc
            finally:
                tmp.unlink(missing_ok=True)
            self.stats["adapters_converted"] += 1
        try:
            self._loras[name] = Lora(self.llama, target)
        except ValueError as exc:
            raise AdapterError(f"adapter at {path} cannot be loaded: {exc}") from exc
        self.timings["adapter_load_s"] += time.perf_counter() - t0
        log.info("adapter %s served by llama.cpp (%.2f s)", name, time.perf_counter() - t0)

    def unload_adapter(self, name: str) -> None:
        """Forget ``name``: new requests for it fail; lanes bound to it let their replies finish, then rebind."""
        lora = self._loras.pop(name, None)
        self._free_if_unloaded(lora)

    def fail_all(self, error: BaseException) -> None:
        for lane in self._lanes:
            self._fail_lane(lane, error)

    def close(self) -> None:
        for lane in self._lanes:
            lane.ctx.close()
        self._lanes.clear()
        self._batch.close()
        for lora in list(self._loras.values()):
            lora.close()
        self._loras.clear()
        self.llama.close()

    def _place(self, req: Request) -> Optional[bool]:
        """True: admitted; False: no room yet; None: refused (the stream got the error)."""
        running = sum(len(lane.seqs) for lane in self._lanes)
        if running >= self.max_batch_size:
            return False
        need = len(req.input_ids) + int(req.params.max_new_tokens)
        if need > self.kv_cache_tokens or not req.input_ids:
            req.stream.close(ValueError(f"prompt ({len(req.input_ids)} tokens) + max_new_tokens do not fit "
                                         f"serving.kv_cache_tokens={self.kv_cache_tokens}"))
            return None
        lora = None
        if req.adapter is not None:
            lora = self._loras.get(req.adapter)
            if lora is None:
                req.stream.close(KeyError(f"adapter not loaded: {req.adapter}"))
                return None
        key = tuple(req.input_ids[:req.prefix_len]) if self.max_prefixes and 0 < req.prefix_len < need else None
        lane = self._lane_for(req.adapter, lora, need, key)
        if lane is None:
            return False
        seq = lane.admit(req, self.tokenizer, key)
        if seq.pos:
            self.stats["prefix_hits"] += 1
            self.stats["prefix_tokens_saved"] += seq.pos
        return True

    def _lane_for(self, adapter: Optional[str], lora: Optional[Lora], need: int, key) -> Optional[Lane]:
        """A lane bound to ``adapter`` with room, else an idle lane rebound to it, else a new one (up to
        ``max_contexts``); None: wait."""
        mine = [lane for lane in self._lanes if lane.adapter == adapter and lane.lora is lora]
        for lane in sorted(mine, key=lambda ln: ln.cached_prefix(key) is None):
            if lane.fits(need - (len(key) if lane.cached_prefix(key) is not None else 0)):
                return lane
        for lane in self._lanes:
            if not lane.seqs and lane not in mine:
                old = lane.lora
                lane.bind(adapter, lora)
                self._free_if_unloaded(old)
                self.stats["context_rebinds"] += 1
                return lane if lane.fits(need) else None
        if len(self._lanes) < self.max_contexts:
            n_seq = min(256, self.max_batch_size + self.max_prefixes)
            ctx = Context(self.llama, self.kv_cache_tokens, n_seq, self._batch.capacity, self.threads)
            lane = Lane(ctx, self.max_batch_size, n_seq - self.max_batch_size)
            lane.bind(adapter, lora)
            self._lanes.append(lane)
            return lane if lane.fits(need) else None
        return None

    def _free_if_unloaded(self, lora: Optional[Lora]) -> None:
        """Free an unloaded adapter's tensors once no context uses it any more."""
        if lora is None or any(lora is held for held in self._loras.values()) \
                or any(lane.lora is lora for lane in self._lanes):
            return
        lora.close()

    # ---- one step of one lane ---------------------------------------------------------------------
    def _step(self, lane: Lane) -> None:
        for seq in [s for s in lane.seqs if s.req.stream.cancelled]:
            self._finish(lane, seq)
        if not lane.seqs:
            return
        batch = self._batch
        batch.clear()
        for seq in lane.seqs:  # running replies: their next token
            seq.out = -1
            if not seq.todo:
                seq.out = batch.add(seq.last, seq.pos, seq.seq, True)
                seq.pos += 1
        decode_rows = batch.n
        budget = self.max_prefill_tokens
        for seq in lane.seqs:  # joining replies: a slice of their prompt
            if not seq.todo or budget <= 0:
                continue
            chunk, seq.todo = seq.todo[:budget], seq.todo[budget:]
            budget -= len(chunk)
            for j, token in enumerate(chunk):
                last = not seq.todo and j == len(chunk) - 1
                index = batch.add(token, seq.pos, seq.seq, last)
                seq.pos += 1
                if last:
                    seq.out = index
        t0 = time.perf_counter()
        rc = lane.ctx.decode(batch)
        self.timings["decode_s"] += time.perf_counter() - t0
        if rc != 0:
            log.error("llama_decode returned %d; failing this context's replies", rc)
            self._fail_lane(lane, RuntimeError("generation failed; please retry"))
            return
        self.stats["decode_steps"] += 1
        self.stats["decode_rows"] += decode_rows
        self.stats["prefill_tokens"] += batch.n - decode_rows
        self.stats["max_rows"] = max(self.stats["max_rows"], len(lane.seqs))
        t1 = time.perf_counter()
        for seq in list(lane.seqs):
            if seq.out >= 0:
                if seq.prefix_key is not None and seq.generated == 0:
                    lane.remember_prefix(seq)
                self._advance(lane, seq, lane.ctx.logits(seq.out))
        self.timings["sample_s"] += time.perf_counter() - t1

    def _advance(self, lane: Lane, seq: Seq, logits) -> None:
        params = seq.req.params
        token = sample_token(logits, params.temperature, params.top_p, seq.rng)
        seq.generated += 1
        if token in self.eos:
            self._finish(lane, seq)
            return
        stream = seq.req.stream
        stream.n_tokens += 1
        delta = seq.decoder.push(token)
        if delta:
            stream.emit(delta)
        seq.last = token
        if seq.generated >= params.max_new_tokens or stream.cancelled:
            self._finish(lane, seq)

    def _finish(self, lane: Lane, seq: Seq, error: Optional[BaseException] = None) -> None:
        if seq.done:
            return
        seq.done = True
        lane.release(seq)
        seq.req.stream.token_ids = seq.decoder.tokens
        seq.req.stream.close(error)

    def _fail_lane(self, lane: Lane, error: BaseException) -> None:
        for seq in list(lane.seqs):
            self._finish(lane, seq, error)
        lane.reset()


def build(gguf: str, tokenizer_source: str, **settings) -> LlamaCppCore:
    """The factory behind ``ENGINES["llama_cpp"]``: the GGUF base (memory-mapped) and its tokenizer."""
    from rlhf.base_models import load_tokenizer

    return LlamaCppCore(gguf, load_tokenizer(tokenizer_source), **settings)
