"""Serving: ONE base model in memory, one LoRA adapter per policy version, replies streamed token by token.

A policy is stateless: it maps a full state (system prompt + history) to a reply. ``PolicyServer`` turns it into
prompt token ids and hands them to an engine through the seam in ``rlhf.serving.interface`` (llama.cpp on CPU,
transformers on CUDA or as the fallback), which decodes concurrent replies together (continuous batching,
per-request adapters and settings); a full queue says "busy, retry in N s" instead of hanging.
"""
from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from rlhf.config import AppConfig
from rlhf.base_models import pick_device
from rlhf.prompting import encode_prompt, template_ids
from rlhf.serving.interface import AdapterError, Busy, Engine, EngineLoad, EngineUnavailable, GenParams, ReplyStream, \
    Request, build_core
from rlhf.serving.loop import EngineLoop
from rlhf.serving.process import EngineProcess, EngineSpec
from rlhf.serving.transformers.spec import NAME as TORCH_ENGINE  # serves the torch weights as trained

__all__ = ["AdapterError", "AdapterRef", "Busy", "GenParams", "PolicyServer", "ReplyStream", "load_server"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdapterRef:
    """Which weights answer: a policy id and its adapter dir (None = the base model)."""

    policy_id: int
    path: Optional[str] = None

    @property
    def name(self) -> str:
        return f"p{self.policy_id}"


class PolicyServer:
    """Builds prompts, loads a version's adapter on demand, and answers generation requests through an engine."""

    def __init__(self, engine: Engine, tokenizer, model_name: str = "", max_context_tokens: int = 2048,
                 device: str = "cpu"):
        self.engine = engine
        self.tokenizer = tokenizer
        self.device = device
        self.model_name = model_name
        self.max_context_tokens = max_context_tokens
        self._system_ids: dict[tuple, list[int]] = {}  # (system prompt, template) -> its templated ids (the shared prefix)

    @classmethod
    def from_model(cls, model, tokenizer, device: str = "cpu", model_name: str = "", max_context_tokens: int = 2048,
                   **settings) -> "PolicyServer":
        """A server over a torch model already in memory, decoded by the transformers engine in this process."""
        return cls(local_engine(model, tokenizer, device, **settings), tokenizer, model_name, max_context_tokens,
                   device)

    @classmethod
    def load(cls, source: str, device: str, model_name: str, max_context_tokens: int = 2048, queue_size: int = 64,
             max_batch_size: int = 32, batch_window_ms: float = 10.0, engine: str = TORCH_ENGINE,
             data_dir: Optional[str] = None, options: Optional[dict] = None,
             isolation: str = "thread") -> "PolicyServer":
        """Load base model ``source`` and its tokenizer and start backend ``engine`` on it (the specs its spec module
        offers, as ``load_server`` does from a config), in this process (``isolation="thread"``) or in its own
        (``"process"``, falling back along those specs). EngineUnavailable when the engine cannot run here.

        ``source``: a shipped model name, a model directory, a hub id or (llama.cpp) a ``.gguf`` file, converted
        once under ``data_dir`` when the engine needs it; ``options``: the backend's options (its ``options(config)``
        keys, e.g. llama.cpp's ``weights``) and its factory's settings, e.g. ``load_in_4bit`` or ``kv_cache_tokens``.
        """
        from rlhf.base_models import load_tokenizer
        from rlhf.serving.startup import backend_specs

        specs = backend_specs(engine, source, device, data_dir, required=True,
                              **{"max_batch_size": max_batch_size, **(options or {})})
        tokenizer_source = next(s.settings.get("tokenizer_source") for s in specs if not s.unavailable) or source
        loop_settings = {"queue_size": queue_size, "max_batch_size": max_batch_size,
                         "batch_window_ms": batch_window_ms}
        return cls(start_engine(specs, isolation, loop_settings), load_tokenizer(tokenizer_source), model_name,
                   max_context_tokens, device)

    def use_budget(self, budget) -> None:
        """Follow a ``rlhf.cpu.CpuBudget``: serve with all its threads, fewer while a training job runs."""
        self.engine.use_budget(budget)

    @property
    def engine_name(self) -> str:
        """The serving backend's name (a key of ``rlhf.registry.ENGINES``)."""
        return self.engine.name

    @property
    def engine_build(self) -> str:
        """What the engine's native code runs on (the CPU variant of a portable llama.cpp build; "" if unknown)."""
        return self.engine.build

    @property
    def engine_status(self) -> str:
        """Which engine serves and why (for the start-up log, /health and the Training tab)."""
        return self.engine.status

    @property
    def model(self):
        """The torch model when the transformers engine runs in this process (a ``PeftModel`` once an adapter is
        loaded); None otherwise."""
        return getattr(getattr(self.engine, "core", None), "model", None)

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
    def build_prompt(self, system_prompt: str, history: list[dict], template: Optional[str] = None) -> list[int]:
        """Token ids of the chat-templated state, dropping the oldest turns to fit the context limit; ``template``:
        the agent's own chat template (None: the tokenizer's)."""
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return encode_prompt(self.tokenizer, system + list(history), self.max_context_tokens, template=template)

    def shared_prefix_len(self, system_prompt: str, ids: list[int], template: Optional[str] = None) -> int:
        """How many leading ``ids`` are the templated system prompt alone (0 if none): the engine computes
        that prefix's KV cache once per adapter and reuses it for every chat of the agent."""
        if not system_prompt:
            return 0
        prefix = self._system_ids.get((system_prompt, template))
        if prefix is None:
            prefix = template_ids(self.tokenizer, [{"role": "system", "content": system_prompt}],
                                  add_generation_prompt=False, template=template)
            if len(self._system_ids) > 256:  # agents are few; this only guards against unbounded growth
                self._system_ids.clear()
            self._system_ids[(system_prompt, template)] = prefix
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
               params: GenParams, template: Optional[str] = None) -> ReplyStream:
        """Queue a reply and return its stream at once (``template``: the agent's own chat template, None: the
        tokenizer's); raises Busy when the queue is full."""
        params.validated()
        self.ensure_adapter(adapter)
        ids = self.build_prompt(system_prompt, history, template)
        return self.stream_ids(ids, adapter, params, prefix_len=self.shared_prefix_len(system_prompt, ids, template))

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

    def warmup(self, system_prompts: Sequence[str] = ("",)) -> float:
        """One short generation per system prompt, so the first user pays neither for lazy initialisation nor for
        computing an agent's system prompt (the engine keeps it as a shared prefix); returns seconds."""
        t0 = time.perf_counter()
        for system_prompt in dict.fromkeys(system_prompts or ("",)):
            self.generate(system_prompt, [{"role": "user", "content": "Hello"}], AdapterRef(0),
                          GenParams(max_new_tokens=4, temperature=0))
        return time.perf_counter() - t0

    def close(self) -> None:
        """Stop the engine; replies still running end with an error."""
        self.engine.close()


def local_engine(model, tokenizer, device: str = "cpu", *, queue_size: int = 64, max_batch_size: int = 32,
                 batch_window_ms: float = 10.0, start: bool = True, **core_settings) -> EngineLoop:
    """The transformers engine over a torch model already in memory, in this process (a job's evaluation
    decodes its own peft model's adapters this way)."""
    from rlhf.serving.transformers.engine import TransformersCore

    core = TransformersCore(model, tokenizer, device, max_batch_size=max_batch_size, **core_settings)
    return EngineLoop(core, queue_size=queue_size, max_batch_size=max_batch_size, batch_window_ms=batch_window_ms,
                      start=start)


def start_engine(specs: list[EngineSpec], isolation: str, loop_settings: dict, threads: int = 1,
                 verdicts=None) -> Engine:
    """The first engine of ``specs`` that works: proved in its own process (``isolation="process"``, falling back
    along ``specs``), or built in this process (``"thread"``: no protection from native faults, so where there is
    a fallback to choose, e.g. llama.cpp's safe load where its AMX kernels fault, a child process proves which)."""
    if isolation == "process":
        return EngineProcess(specs, threads=threads, verdicts=verdicts, **loop_settings).start()
    if isolation != "thread":
        raise ValueError(f"serving.isolation must be process or thread, got {isolation!r}")
    skipped = "".join(f"; {s.label}: {s.unavailable}" for s in specs if s.unavailable)
    usable = [s for s in specs if not s.unavailable]
    if not usable:
        raise EngineUnavailable("no serving engine works here" + skipped)
    spec = usable[0] if len(usable) == 1 else proved(usable, loop_settings, threads)
    loop = EngineLoop(lambda: build_core(spec.name, **spec.settings), **loop_settings)
    on = f"; {loop.build}" if loop.build else ""
    loop.status = f"{spec.label} (in the app's process{on}){skipped}"
    return loop


def proved(specs: list[EngineSpec], loop_settings: dict, threads: int = 1) -> EngineSpec:
    """The first of ``specs`` that loads and decodes in a child process (EngineUnavailable when none does)."""
    probe = EngineProcess(list(specs), threads=threads, **loop_settings).start()
    try:
        return probe.spec
    finally:
        probe.close()


def load_server(config: "AppConfig", system_prompts: Sequence[str] = ("",), threads: Optional[int] = None,
                warmup: Optional[bool] = None) -> PolicyServer:
    """The base model behind the engine that works here (``serving.engine``, proved in its own process unless
    ``serving.isolation`` is ``thread``), warmed up with the agents' ``system_prompts``; the log says which engine
    serves and why. ``threads``: the engine's (default: the CPU plan's for serving); ``warmup``: overrides
    ``serving.warmup`` (a job's rollouts need none)."""
    from rlhf.cpu import thread_plan
    from rlhf.base_models import load_tokenizer
    from rlhf.serving.startup import Verdicts, engine_specs, loop_settings

    t0 = time.perf_counter()
    s = config.serving
    device = pick_device(config.device)
    specs, tokenizer_source = engine_specs(config, device)
    engine = start_engine(specs, s.isolation, loop_settings(config),
                          threads=thread_plan(config).serving_idle if threads is None else threads,
                          verdicts=Verdicts(config.paths.serving_verdicts))
    server = PolicyServer(engine, load_tokenizer(tokenizer_source), config.base_model, s.max_context_tokens, device)
    log.info("model %s served by %s, ready in %.1f s", config.base_model, server.engine_status,
             time.perf_counter() - t0)
    if config.serving.warmup if warmup is None else warmup:
        log.info("warm-up generation took %.1f s", server.warmup(system_prompts))
    return server
