"""The engine seam: the one small interface ``PolicyServer`` (and the vote queue, and the retrain's evaluation)
talk to, whatever decodes underneath.

An engine takes ``Request``s (prompt token ids, an adapter name or None for the base, per-request settings and a
stream to write text to), decodes them (streaming, honouring ``stream.cancelled``), loads and unloads a
version's adapter without a restart, reports its load (running, waiting, idle) and follows a CPU thread budget.
Two engines implement it: ``transformers`` (``rlhf.serving.engine``: torch, GPU, exact mode, fallback) and
``llama_cpp`` (``rlhf.serving.llama_cpp``: the CPU default). A new backend is one new module registered in
``ENGINES``; nothing outside an engine touches its locks, threads or counters.
"""
from __future__ import annotations

import abc
import importlib
import importlib.util
import logging
from dataclasses import dataclass
from typing import Any, Optional

log = logging.getLogger(__name__)

ENGINE_CHOICES = ("auto", "llama_cpp", "transformers")
# HF ``generate`` applies top-k 50 when a model sets none; the server sampled that way before batching existed,
# so every engine keeps it: replies keep their character, and a 50-way top-p sort is far cheaper than a 49k-way one.
TOP_K = 50


class AdapterError(RuntimeError):
    """A policy version's adapter cannot be loaded (missing, corrupted, or not convertible for this engine)."""


class EngineUnavailable(RuntimeError):
    """The configured engine cannot run here (its library is not installed, or the base model is unsupported)."""


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

    ``params`` needs ``max_new_tokens``, ``temperature``, ``top_p``, ``seed``; ``stream`` needs ``_emit(str)``,
    ``_close(error=None)``, ``cancelled``, ``n_tokens`` and ``token_ids`` (set to the reply's ids when it ends)
    (``rlhf.serving.server.GenParams`` / ``ReplyStream``).
    ``prefix_len`` marks the first ids as a prefix many requests share (an agent's system prompt): an engine may
    compute it once per adapter and reuse it.
    """

    input_ids: list
    adapter: Optional[str]
    params: Any
    stream: Any
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


class Engine(abc.ABC):
    """The interface every serving engine implements (see the module docstring)."""

    name: str = "engine"
    threads: Optional[int] = None  # CPU threads the engine decodes with now (None until it applied a budget)

    @abc.abstractmethod
    def submit(self, request: Request) -> None:
        """Queue a request; raises ``queue.Full`` when the engine's queue is full."""

    @abc.abstractmethod
    def load_adapter(self, name: str, path: str) -> None:
        """Make a version's PEFT adapter (a directory) servable under ``name``; AdapterError if it cannot be."""

    @abc.abstractmethod
    def unload_adapter(self, name: str) -> None:
        """Forget an adapter (requests already decoding with it finish first or fail cleanly)."""

    @property
    @abc.abstractmethod
    def adapters(self) -> list[str]:
        """Names of the adapters loaded now."""

    @abc.abstractmethod
    def load(self) -> EngineLoad:
        """Running / waiting / submitted counts and whether a model call is under way."""

    @abc.abstractmethod
    def profile(self) -> dict:
        """Cumulative counters of where the engine's time went (decode steps, rows per step, ...)."""

    @abc.abstractmethod
    def retry_after(self) -> float:
        """Seconds until a newly queued request would likely start (the busy answer's hint)."""

    @abc.abstractmethod
    def use_budget(self, budget) -> None:
        """Follow a ``rlhf.cpu.CpuBudget``: serve with its threads, fewer while a training job runs."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start the worker (engines built with ``start=False`` queue requests until then)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop after the current step; unfinished replies end with an error."""


# name -> "module:factory"; a factory takes (tokenizer, device, **settings) plus engine-specific keywords.
ENGINES = {
    "transformers": "rlhf.serving.engine:TransformersEngine",
    "llama_cpp": "rlhf.serving.llama_cpp.engine:LlamaCppEngine",
}


def engine_class(name: str) -> type:
    """The class registered under ``name``; ValueError for an unknown name."""
    if name not in ENGINES:
        raise ValueError(f"unknown serving engine {name!r}; choose one of {', '.join(ENGINE_CHOICES)}")
    module, _, attr = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def llama_cpp_installed() -> bool:
    """True when llama-cpp-python can be imported here (``make setup`` builds it)."""
    return importlib.util.find_spec("llama_cpp") is not None


def choose_engine(setting: str, device: str) -> str:
    """The engine a ``serving.engine`` setting means on ``device``: ``auto`` is llama.cpp on CPU when it is
    installed, else transformers (CUDA, or llama.cpp missing). An explicit ``llama_cpp`` that cannot run raises."""
    if setting not in ENGINE_CHOICES:
        raise ValueError(f"serving.engine must be one of {', '.join(ENGINE_CHOICES)}, got {setting!r}")
    if setting == "transformers":
        return "transformers"
    if setting == "llama_cpp":
        if not llama_cpp_installed():
            raise EngineUnavailable("serving.engine=llama_cpp but llama-cpp-python is not installed "
                                    "(`make setup` builds it)")
        return "llama_cpp"
    if device == "cpu" and llama_cpp_installed():
        return "llama_cpp"
    return "transformers"
