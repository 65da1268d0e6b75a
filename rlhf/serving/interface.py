"""The engine seam: the types every part of serving shares, the one interface a backend implements, and the
registry of backends.

* ``GenParams``, ``Request``, ``ReplyStream``: one reply to generate, its settings and where its text goes.
* ``EngineCore``: what a backend implements (start requests, advance them one step, adapters, threads). It is
  called from one thread only, so a backend needs no locks of its own.
* ``Engine``: what ``PolicyServer`` talks to. Two implementations drive any core: ``rlhf.serving.loop.EngineLoop``
  (the queue, the worker thread and shutdown, in this process) and ``rlhf.serving.process.EngineProcess`` (the
  same loop in a child process, so a fault in native code ends replies, not the app).
* ``ENGINES``: backend name -> ``Backend`` (import paths only), in the order ``serving.engine: auto`` tries them;
  the table lives in ``rlhf.registry`` (the config check reads it there). A new backend is one package (a factory
  that takes keyword settings and returns an ``EngineCore``, and a light spec module that says what to try for a
  config) plus one line in that table.
"""
from __future__ import annotations

import abc
import importlib
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, Protocol, runtime_checkable

from rlhf.registry import ENGINES, Backend  # noqa: F401  (the backends' table, shared here)

# HF ``generate`` applies top-k 50 when a model sets none; the server sampled that way before batching existed,
# so every engine keeps it: replies keep their character, and a 50-way top-p sort is far cheaper than a 49k-way one.
TOP_K = 50


class AdapterError(RuntimeError):
    """A policy version's adapter cannot be loaded (missing, corrupted, or not convertible for this engine)."""


class EngineUnavailable(RuntimeError):
    """The configured engine cannot run here (its library is not installed, or the base model is unsupported)."""


class Busy(RuntimeError):
    """The generation queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: float, message: Optional[str] = None):
        super().__init__(message or f"the model is busy; retry in {retry_after:.0f} s")
        self.retry_after = retry_after


class EngineFault(Busy):
    """The engine's process died (a native fault such as SIGSEGV or SIGILL, or it was killed) while this reply was
    decoding: the reply is lost, the engine starts again on its own, so the caller may retry (a busy answer)."""

    def __init__(self, message: str, retry_after: float = 5.0):
        super().__init__(retry_after, message)


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


@runtime_checkable
class ReplySink(Protocol):
    """Where an engine writes one reply: text deltas, then the end (once). It reads ``cancelled`` between steps
    and keeps ``n_tokens`` (so far) and ``token_ids`` (at the end) up to date."""

    n_tokens: int
    token_ids: list

    @property
    def cancelled(self) -> bool: ...

    @property
    def finished(self) -> bool: ...

    def emit(self, delta: str) -> None: ...

    def close(self, error: Optional[BaseException] = None) -> None: ...


@dataclass
class ReplyStream:
    """Text deltas of one reply as they are generated; iterate it, or call ``text()`` to wait.

    It is a ``ReplySink``: an engine writes to it with ``emit`` and ``close`` and reads ``cancelled``; it sets
    ``n_tokens`` as it goes and ``token_ids`` (the reply's ids, EOS not included) when the reply ends.
    """

    prompt_tokens: int = 0
    _queue: "queue.Queue" = field(default_factory=queue.Queue)
    _cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    first_token_at: Optional[float] = None
    finished_at: Optional[float] = None
    n_tokens: int = 0
    token_ids: list = field(default_factory=list)
    parts: list = field(default_factory=list)
    on_cancel: Optional[object] = None  # called once by cancel(): an engine in another process is told at once
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
        if not self._cancel.is_set():
            self._cancel.set()
            if callable(self.on_cancel):
                self.on_cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def latency_ms(self) -> float:
        end = self.finished_at or time.perf_counter()
        return (end - self.submitted) * 1000.0

    # the sink side, called by the engine
    def emit(self, delta: str) -> None:
        """Add a text delta (the engine's side)."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self._queue.put(delta)

    def close(self, error: Optional[BaseException] = None) -> None:
        """End the reply, with ``error`` when it failed (the engine's side; a second call does nothing)."""
        if self.finished_at is not None:
            return
        self.finished_at = time.perf_counter()
        if error is not None:
            self._queue.put(error)
        self._queue.put(None)


class IncrementalDecoder:
    """Turns a growing token list into text deltas without splitting multi-byte characters.

    Only a short window of tokens is re-decoded per push (the trick of Hugging Face's text-generation-inference),
    so a long reply costs O(1) per token instead of re-decoding everything.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.emitted = ""
        self._prefix = 0  # window start: decoding from here gives stable text for tokens[prefix:read]
        self._read = 0  # tokens before this index have been turned into emitted text

    def push(self, token_id: int) -> str:
        """Add one token; return the new text it completes ('' while a character is still incomplete)."""
        self.tokens.append(int(token_id))
        decode = self.tokenizer.decode
        before = decode(self.tokens[self._prefix:self._read], skip_special_tokens=True)
        after = decode(self.tokens[self._prefix:], skip_special_tokens=True)
        if len(after) <= len(before) or after.endswith("\ufffd"):  # incomplete UTF-8: wait for the next token
            return ""
        delta = after[len(before):]
        self._prefix, self._read = self._read, len(self.tokens)
        self.emitted += delta
        return delta


@dataclass
class Request:
    """One reply to generate: prompt ids, adapter name (None = base model), settings, and where text goes.

    ``prefix_len`` marks the first ids as a prefix many requests share (an agent's system prompt): an engine may
    compute it once per adapter and reuse it.
    """

    input_ids: list
    adapter: Optional[str]
    params: GenParams
    stream: ReplySink
    prefix_len: int = 0


@dataclass(frozen=True)
class EngineLoad:
    """What an engine is doing now: rows decoding, requests waiting, requests ever submitted, and whether it is
    inside a model call (a request it took off its queue but has not counted as running yet shows up here)."""

    running: int
    waiting: int
    submitted: int
    active: bool = False

    @property
    def idle(self) -> bool:
        """Nothing running, nothing waiting, no model call under way."""
        return self.running == 0 and self.waiting == 0 and not self.active


class EngineCore(abc.ABC):
    """What a serving backend implements. Every method is called from ONE thread (the loop's), so a core keeps
    no locks; it finishes a reply by closing its sink (``stream.close(error=None)``)."""

    name: str = "core"
    tokenizer = None
    build: str = ""  # what its native code runs on, for people (the CPU variant of a portable llama.cpp)

    @abc.abstractmethod
    def admit(self, requests: list[Request]) -> list[Request]:
        """Start as many of ``requests`` (in order) as fit now; return the rest, which wait for a later step.
        A request that can never run is closed with its error and not returned."""

    @abc.abstractmethod
    def step(self) -> None:
        """Advance every running reply by one token (dropping cancelled ones); a no-op when none runs."""

    @property
    @abc.abstractmethod
    def running(self) -> int:
        """Replies decoding now."""

    @abc.abstractmethod
    def set_threads(self, threads: int) -> None:
        """Decode with this many CPU threads from the next step on."""

    @abc.abstractmethod
    def load_adapter(self, name: str, path: str) -> None:
        """Make a version's PEFT adapter (a directory) servable under ``name``; AdapterError if it cannot be."""

    @abc.abstractmethod
    def unload_adapter(self, name: str) -> None:
        """Forget an adapter (replies already decoding with it finish first)."""

    @property
    @abc.abstractmethod
    def adapters(self) -> list[str]:
        """Names of the adapters loaded now."""

    @abc.abstractmethod
    def fail_all(self, error: BaseException) -> None:
        """End every running reply with ``error`` and forget their state."""

    def profile(self) -> dict:
        """Cumulative counters of where the time went (decode steps, rows per step, ...)."""
        return {}

    def close(self) -> None:
        """Free the model (after ``fail_all``)."""


class Admission:
    """Admission, written once for every engine: at most ``queue_size`` requests wait to start, and the busy
    answer's hint comes from a moving average of how long a reply takes and how many batches are ahead."""

    def __init__(self, queue_size: int = 64, max_batch_size: int = 32):
        self.queue_size = max(1, int(queue_size))
        self.max_batch_size = max(1, int(max_batch_size))
        self.avg_reply_s = 2.0

    def admit(self, waiting: int) -> None:
        """Raise ``queue.Full`` when ``waiting`` requests already wait to start."""
        if waiting >= self.queue_size:
            raise queue.Full

    def learn(self, reply_s: float) -> None:
        """One reply took ``reply_s`` seconds."""
        self.avg_reply_s = 0.8 * self.avg_reply_s + 0.2 * reply_s

    def retry_after(self, load: "EngineLoad") -> float:
        """Seconds until a request queued behind ``load`` would likely start (at least 1)."""
        return max(1.0, self.avg_reply_s * (1 + (load.waiting + load.running) // self.max_batch_size))


class Engine(abc.ABC):
    """What ``PolicyServer`` talks to: a queue in front of a core, in this process or in a child process."""

    name: str = "engine"
    admission: "Admission"  # the queue bound and the busy answer's hint
    threads: Optional[int] = None  # CPU threads the engine decodes with now (None until it applied a budget)
    status: str = ""  # which engine serves and why, for people (health, the Training tab)
    build: str = ""  # what the serving core's native code runs on (``EngineCore.build``), for people

    @abc.abstractmethod
    def submit(self, request: Request) -> None:
        """Queue a request; raises ``queue.Full`` when the engine's queue is full."""

    @abc.abstractmethod
    def load_adapter(self, name: str, path: str) -> None:
        """Make a version's PEFT adapter servable under ``name`` (blocks until done); AdapterError if it cannot."""

    @abc.abstractmethod
    def unload_adapter(self, name: str) -> None:
        """Forget an adapter."""

    @property
    @abc.abstractmethod
    def adapters(self) -> list[str]:
        """Names of the adapters loaded now."""

    @abc.abstractmethod
    def load(self) -> EngineLoad:
        """Running / waiting / submitted counts and whether a model call is under way."""

    @abc.abstractmethod
    def profile(self) -> dict:
        """The core's counters plus the queue's."""

    def retry_after(self) -> float:
        """Seconds until a newly queued request would likely start (the busy answer's hint)."""
        return self.admission.retry_after(self.load())

    @abc.abstractmethod
    def use_budget(self, budget) -> None:
        """Follow a ``rlhf.cpu.CpuBudget``: serve with its threads, fewer while a training job runs."""

    @abc.abstractmethod
    def start(self):
        """Start serving (an engine built not to start queues requests until then)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop within seconds; unfinished replies end with an error."""


def backend(name: str) -> Backend:
    """The registry entry of backend ``name``; ValueError for a name the registry does not know."""
    if name not in ENGINES:
        raise ValueError(f"unknown serving engine {name!r}; choose one of {', '.join(('auto', *ENGINES))}")
    return ENGINES[name]


def spec_module(name: str):
    """Backend ``name``'s spec module (``options``, ``specs``; see ``Backend``): light, it imports no library."""
    return importlib.import_module(backend(name).specs)


def build_core(name: str, **settings) -> EngineCore:
    """The core of backend ``name`` built with ``settings``; ValueError for an unknown name."""
    module, _, attr = backend(name).core.partition(":")
    return getattr(importlib.import_module(module), attr)(**settings)
