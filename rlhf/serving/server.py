"""Serving: ONE base model in memory, one LoRA adapter per policy version, replies streamed token by token.

A policy is stateless: it maps a full state (system prompt + history) to a reply. ``PolicyServer`` turns it into
prompt token ids and hands them to an engine through the seam in ``rlhf.serving.interface`` (llama.cpp on CPU,
transformers on CUDA or as the fallback), which decodes concurrent replies together (continuous batching,
per-request adapters and settings); a full queue says "busy, retry in N s" instead of hanging.
"""
from __future__ import annotations

import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

from rlhf.config import AppConfig
from rlhf.models import pick_device, resolve_model
from rlhf.prompting import encode_prompt
from rlhf.serving.interface import AdapterError, Engine, EngineLoad, EngineUnavailable, IncrementalDecoder, Request, \
    choose_engine

__all__ = ["AdapterError", "AdapterRef", "Busy", "GenParams", "IncrementalDecoder", "PolicyServer", "ReplyStream",
           "load_server"]

log = logging.getLogger(__name__)


class Busy(RuntimeError):
    """The generation queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: float):
        super().__init__(f"the model is busy; retry in {retry_after:.0f} s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class GenParams:
    """Per-request generation settings."""

    max_new_tokens: int = 128
    temperature: float = 0.7
    top_p: float = 0.9
    seed: Optional[int] = None

    def validated(self, max_tokens_limit: int = 2048) -> "GenParams":
        """Self, or ValueError naming the bad field."""
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or not 1 <= self.max_new_tokens <= max_tokens_limit:
            raise ValueError(f"max_new_tokens must be an integer in 1..{max_tokens_limit}")
        for name, lo, hi in (("temperature", 0.0, 5.0), ("top_p", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not lo <= value <= hi:
                raise ValueError(f"{name} must be a number in [{lo}, {hi}]")
        if self.top_p == 0:
            raise ValueError("top_p must be > 0")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**63):
            raise ValueError("seed must be a non-negative integer")
        return self

    def to_dict(self) -> dict:
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "seed": self.seed}


@dataclass(frozen=True)
class AdapterRef:
    """Which weights answer: a policy id and its adapter dir (None = the base model)."""

    policy_id: int
    path: Optional[str] = None

    @property
    def name(self) -> str:
        return f"p{self.policy_id}"


@dataclass
class ReplyStream:
    """Text deltas of one reply as they are generated; iterate it, or call ``text()`` to wait."""

    prompt_tokens: int = 0
    _queue: "queue.Queue" = field(default_factory=queue.Queue)
    _cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    first_token_at: Optional[float] = None
    finished_at: Optional[float] = None
    n_tokens: int = 0
    token_ids: list = field(default_factory=list)  # the reply's token ids (EOS not included), set when it ends
    parts: list = field(default_factory=list)
    _done: bool = False

    def __iter__(self) -> Iterator[str]:
        while not self._done:
            item = self._queue.get()
            if item is None:
                self._done = True
                break
            if isinstance(item, BaseException):
                self._done = True
                raise item
            self.parts.append(item)
            yield item

    def text(self) -> str:
        """Block until the reply is complete and return it."""
        for _ in self:
            pass
        return "".join(self.parts)

    def cancel(self) -> None:
        """Stop generating this reply (other requests are not affected)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def latency_ms(self) -> float:
        end = self.finished_at or time.perf_counter()
        return (end - self.submitted) * 1000.0

    # called by the worker
    def _emit(self, delta: str) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self._queue.put(delta)

    def _close(self, error: Optional[BaseException] = None) -> None:
        self.finished_at = time.perf_counter()
        if error is not None:
            self._queue.put(error)
        self._queue.put(None)


class PolicyServer:
    """Builds prompts, loads a version's adapter on demand, and answers generation requests through an engine."""

    def __init__(self, model=None, tokenizer=None, device: str = "cpu", model_name: str = "",
                 max_context_tokens: int = 2048, queue_size: int = 64, max_batch_size: int = 32,
                 batch_window_ms: float = 10.0, engine: Optional[Engine] = None):
        from rlhf.serving.engine import TransformersEngine

        self.tokenizer = tokenizer
        self.device = device
        self.model_name = model_name
        self.max_context_tokens = max_context_tokens
        self.engine: Engine = engine or TransformersEngine(model, tokenizer, device, max_batch_size=max_batch_size,
                                                           queue_size=queue_size, batch_window_ms=batch_window_ms)
        self._system_ids: dict[str, list[int]] = {}  # system prompt -> its templated ids (the shared prefix)

    @classmethod
    def load(cls, source: str, device: str, model_name: str, max_context_tokens: int = 2048,
             load_in_4bit: bool = False, queue_size: int = 64, max_batch_size: int = 32,
             batch_window_ms: float = 10.0, engine: str = "transformers", data_dir: Optional[str] = None,
             options: Optional[dict] = None) -> "PolicyServer":
        """Load a base model + tokenizer and start an engine on it.

        ``engine="transformers"``: ``source`` is what ``from_pretrained`` loads. ``engine="llama_cpp"``: ``source``
        is a shipped model name, a ``.gguf`` file or a model directory (converted to GGUF once, cached under
        ``data_dir``); ``options`` are the llama.cpp engine's settings (``rlhf.serving.llama_cpp.engine``).
        """
        from rlhf.models import load_causal_lm, load_tokenizer

        if engine == "llama_cpp":
            from rlhf.serving.llama_cpp.base import llama_base
            from rlhf.serving.llama_cpp.engine import LlamaCppEngine

            options = dict(options or {})
            gguf, tokenizer_source = llama_base(source, data_dir, options.pop("weights", "shipped"))
            tokenizer = load_tokenizer(tokenizer_source)
            eng = LlamaCppEngine(gguf, tokenizer, queue_size=queue_size, max_batch_size=max_batch_size,
                                 batch_window_ms=batch_window_ms, cache_dir=data_dir, **options)
            return cls(None, tokenizer, "cpu", model_name, max_context_tokens, engine=eng)
        tokenizer = load_tokenizer(source)
        model = load_causal_lm(source, device, load_in_4bit=load_in_4bit)
        return cls(model, tokenizer, device, model_name, max_context_tokens, queue_size=queue_size,
                   max_batch_size=max_batch_size, batch_window_ms=batch_window_ms)

    def use_budget(self, budget) -> None:
        """Follow a ``rlhf.cpu.CpuBudget``: serve with all its threads, fewer while a training job runs."""
        self.engine.use_budget(budget)

    @property
    def engine_name(self) -> str:
        """``llama_cpp`` or ``transformers``."""
        return self.engine.name

    @property
    def model(self):
        """The transformers engine's torch model (a ``PeftModel`` once an adapter is loaded); None on llama.cpp."""
        return getattr(self.engine, "model", None)

    def engine_load(self) -> EngineLoad:
        """The engine's running / waiting / submitted counts and whether it is inside a model call."""
        return self.engine.load()

    # ---- giving way to chat (the vote queue's refill asks these, never the engine) ------------
    def idle(self) -> bool:
        """No reply running or waiting and no model call under way."""
        return self.engine.load().idle

    def requests_seen(self) -> int:
        """How many replies were ever asked of this server: a mark to count later arrivals from."""
        return self.engine.load().submitted

    def others(self, mark: int, mine: Sequence["ReplyStream"]) -> tuple[int, int]:
        """Replies that are not ``mine`` (all asked for after ``requests_seen()`` gave ``mark``): how many were asked
        for since the mark, and how many are running or waiting now (a reply of ``mine`` that just finished may
        still count for a moment)."""
        load = self.engine.load()
        open_mine = sum(s.finished_at is None for s in mine)
        return load.submitted - mark - len(mine), load.running + load.waiting - open_mine

    # ---- prompts ----------------------------------------------------------------------------
    def build_prompt(self, system_prompt: str, history: list[dict]) -> list[int]:
        """Token ids of the chat-templated state, dropping the oldest turns to fit the context limit."""
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return encode_prompt(self.tokenizer, system + list(history), self.max_context_tokens)

    def shared_prefix_len(self, system_prompt: str, ids: list[int]) -> int:
        """How many leading ``ids`` are the templated system prompt alone (0 if none): the engine computes
        that prefix's KV cache once per adapter and reuses it for every chat of the agent."""
        if not system_prompt:
            return 0
        prefix = self._system_ids.get(system_prompt)
        if prefix is None:
            prefix = list(self.tokenizer.apply_chat_template([{"role": "system", "content": system_prompt}],
                                                             tokenize=True, return_dict=True)["input_ids"])
            if len(self._system_ids) > 256:  # agents are few; this only guards against unbounded growth
                self._system_ids.clear()
            self._system_ids[system_prompt] = prefix
        return len(prefix) if len(prefix) < len(ids) and ids[:len(prefix)] == prefix else 0

    # ---- adapters ---------------------------------------------------------------------------
    def ensure_adapter(self, adapter: AdapterRef) -> None:
        """Make a version's LoRA adapter servable beside the shared base (once); AdapterError if it cannot be."""
        if adapter.path is None or adapter.name in self.engine.adapters:
            return
        from pathlib import Path

        path = Path(adapter.path)
        if not (path / "adapter_config.json").is_file():
            raise AdapterError(f"adapter of policy {adapter.policy_id} is missing: {path}/adapter_config.json")
        try:
            self.engine.load_adapter(adapter.name, str(path))
        except AdapterError as exc:
            raise AdapterError(f"policy {adapter.policy_id}: {exc}") from exc

    def unload_adapter(self, adapter: AdapterRef) -> None:
        """Forget a version's adapter (e.g. an archived version)."""
        self.engine.unload_adapter(adapter.name)

    @property
    def loaded_adapters(self) -> list[str]:
        return self.engine.adapters

    # ---- requests ---------------------------------------------------------------------------
    def stream(self, system_prompt: str, history: list[dict], adapter: AdapterRef,
               params: GenParams) -> ReplyStream:
        """Queue a reply and return its stream at once; raises Busy when the queue is full."""
        params.validated()
        self.ensure_adapter(adapter)
        ids = self.build_prompt(system_prompt, history)
        return self.stream_ids(ids, adapter, params, prefix_len=self.shared_prefix_len(system_prompt, ids))

    def stream_ids(self, ids: list[int], adapter: AdapterRef, params: GenParams, prefix_len: int = 0) -> ReplyStream:
        """Queue a reply to prompt token ids as they are (already templated); raises Busy when the queue is full."""
        params.validated()
        self.ensure_adapter(adapter)
        stream = ReplyStream(prompt_tokens=len(ids))
        try:
            self.engine.submit(Request(list(ids), None if adapter.path is None else adapter.name, params, stream,
                                       prefix_len=prefix_len))
        except queue.Full:
            raise Busy(retry_after=self.engine.retry_after()) from None
        return stream

    def generate(self, system_prompt: str, history: list[dict], adapter: AdapterRef, params: GenParams) -> str:
        """The whole reply (blocking)."""
        return self.stream(system_prompt, history, adapter, params).text()

    def warmup(self) -> float:
        """One short generation so the first user does not pay for lazy initialisation; returns seconds."""
        t0 = time.perf_counter()
        self.generate("", [{"role": "user", "content": "Hello"}], AdapterRef(0), GenParams(max_new_tokens=4,
                                                                                           temperature=0))
        return time.perf_counter() - t0

    def close(self) -> None:
        """Stop the engine; replies still running end with an error."""
        self.engine.close()


def load_server(config: "AppConfig") -> PolicyServer:
    """The base model behind the configured engine (``serving.engine``; base converted and cached on first use),
    warmed up. ``auto`` falls back to transformers when llama.cpp cannot serve this base (logged)."""
    t0 = time.perf_counter()
    s = config.serving
    device = pick_device(config.device)
    kind = choose_engine(s.engine, device)
    server = None
    if kind == "llama_cpp":
        try:
            server = PolicyServer.load(config.base_model, device, config.base_model, s.max_context_tokens,
                                       queue_size=s.queue_size, max_batch_size=s.max_batch_size,
                                       batch_window_ms=s.batch_window_ms, engine="llama_cpp",
                                       data_dir=str(config.data_path), options=llama_options(config))
        except (EngineUnavailable, OSError) as exc:  # OSError: e.g. no room in the data dir for the converted base
            if s.engine == "llama_cpp":
                raise
            log.warning("llama.cpp cannot serve %s (%s); serving with transformers", config.base_model, exc)
    if server is None:
        source = resolve_model(config.base_model, config.data_path)
        server = PolicyServer.load(source, device, config.base_model, s.max_context_tokens, s.load_in_4bit,
                                   queue_size=s.queue_size, max_batch_size=s.max_batch_size,
                                   batch_window_ms=s.batch_window_ms)
    log.info("model %s served by %s, loaded in %.1f s", config.base_model, server.engine_name,
             time.perf_counter() - t0)
    if config.serving.warmup:
        log.info("warm-up generation took %.1f s", server.warmup())
    return server


def llama_options(config: "AppConfig") -> dict:
    """The llama.cpp engine's settings from the config."""
    s = config.serving
    return {"kv_cache_tokens": max(s.kv_cache_tokens, s.max_context_tokens + 64), "max_contexts": s.llama_contexts,
            "weights": s.llama_weights}
