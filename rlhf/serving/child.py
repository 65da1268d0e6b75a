"""The engine process (``python -m rlhf.serving.child FD``): build the core, prove it, serve the app's requests.

It reads typed messages (``rlhf.serving.wire``) from the socket ``FD`` and answers the same way. The app starts it
with ``child_env``: a minimal environment, without the app's secrets (``HF_TOKEN``, ``OAUTH_CLIENT_SECRET``, any
token, key or password), because a process that loads model files from outside should hold nothing worth stealing.
"""
from __future__ import annotations

import logging
import os
import queue
import re
import sys
import threading
import time
from typing import Callable, Mapping, Optional

from rlhf.cpu import thread_env
from rlhf.serving import wire
from rlhf.serving.interface import GenParams, ReplyStream, Request

log = logging.getLogger(__name__)

# what the engine process may inherit: the system's basics, Python's own, the model libraries' caches and switches
ENV_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
                       "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED",
                       "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "PYTHONWARNINGS", "VIRTUAL_ENV",
                       "XDG_CACHE_HOME", "CUDA_VISIBLE_DEVICES"})
ENV_PREFIXES = ("LC_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "PYTORCH_", "CUDA_",
                "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "RAYON_", "GGML_", "LLAMA_")
SECRET = re.compile(r"TOKEN|SECRET|KEY|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)  # never, whatever the prefix


def child_env(threads: int, base: Mapping[str, str]) -> dict:
    """The engine process's environment: what it needs from ``base`` (see ``ENV_NAMES``/``ENV_PREFIXES``), no
    secret, and every thread-pool size set to ``threads`` (its pools are sized before its libraries load)."""
    kept = {k: v for k, v in base.items()
            if (k in ENV_NAMES or k.startswith(ENV_PREFIXES)) and not SECRET.search(k)}
    return thread_env(threads, kept)


class ChildSink:
    """Where the core writes a reply, in the engine process: every delta and the end go straight to the app."""

    def __init__(self, rid: int, send: Callable[[wire.Message], None]):
        self.rid, self.send = rid, send
        self.n_tokens = 0
        self.token_ids: list = []
        self.cancelled = False
        self.finished_at: Optional[float] = None

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    def cancel(self) -> None:
        self.cancelled = True

    def emit(self, delta: str) -> None:
        self.send(wire.Delta(self.rid, delta, self.n_tokens))

    def close(self, error: Optional[BaseException] = None) -> None:
        if self.finished_at is not None:
            return
        self.finished_at = time.perf_counter()
        kind, message = (type(error).__name__, str(error)) if error is not None else (None, None)
        self.send(wire.Done(self.rid, self.n_tokens, [int(t) for t in self.token_ids], kind, message))


class _Threads:
    """The engine process's budget: the thread count the app sent last."""

    def __init__(self, threads: int):
        self.threads = threads

    def serving_threads(self) -> int:
        return self.threads

    def serving_load(self, busy: bool) -> None:
        """The app's budget hears about chat from the app's side of the engine; nothing to do here."""


def prove(loop, tokenizer) -> str:
    """Decode a few tokens through ``loop`` — one reply alone, then two in one batch — the way chat will, so a
    kernel that faults on this CPU faults now, before anyone waits on it; returns what was decoded."""
    from rlhf.prompting import encode_prompt  # the one prompt encoder: a base without a chat template proves too

    ids = encode_prompt(tokenizer, [{"role": "user", "content": "Hello! Say one word."}])
    t0 = time.perf_counter()
    streams = []
    for batch in (1, 2):
        wave = [ReplyStream() for _ in range(batch)]
        for stream in wave:
            loop.submit(Request(list(ids), None, GenParams(max_new_tokens=4, temperature=0), stream))
        for stream in wave:
            stream.text()
        streams += wave
    tokens = sum(s.n_tokens for s in streams)
    return f"{tokens} tokens in {time.perf_counter() - t0:.1f} s"


def child_main(fd: int) -> int:
    """The engine process: build the core, prove it, then serve the app's requests until told to close."""
    import faulthandler
    from multiprocessing.connection import Connection

    faulthandler.enable()  # a native fault prints where it happened before the process dies
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s")
    channel = wire.Channel(Connection(fd))

    def send(message: wire.Message) -> None:
        try:
            channel.send(message)
        except OSError:  # the app is gone
            os._exit(0)

    try:
        start = channel.recv()
        if not isinstance(start, wire.Start):
            raise wire.ProtocolError(f"engine wire: expected start, got {type(start).__name__.lower()}")
    except wire.ProtocolError as exc:
        log.error("%s", exc)
        send(wire.Failed("ProtocolError", str(exc)))
        return 2
    except (EOFError, OSError):
        return 0
    budget = _Threads(start.threads)
    loop = _build(start, budget, send)
    if loop is None:
        return 1
    _serve(channel, loop, budget, send)
    loop.close()
    return 0


def _build(start: wire.Start, budget: _Threads, send):
    """The engine loop of ``start``, proved; None (after telling the app why) when it cannot be built."""
    from rlhf.serving.interface import build_core
    from rlhf.serving.loop import EngineLoop

    try:
        loop = EngineLoop(lambda: build_core(start.engine, **start.settings),
                          observer=lambda load: send(wire.Load(load.running)), **start.loop)
        loop.use_budget(budget)
        proof = prove(loop, loop.tokenizer)
    except Exception as exc:  # a Python error, not a fault: the app says why and tries the next engine
        log.exception("the engine could not start")
        send(wire.Failed(type(exc).__name__, f"{type(exc).__name__}: {exc}"))
        return None
    send(wire.Ready(proof, getattr(loop, "build", "") or ""))
    return loop


def _serve(channel: wire.Channel, loop, budget: _Threads, send) -> None:
    """Serve the app's messages until it says close or is gone; a frame that is not a message ends serving."""
    sinks: dict[int, ChildSink] = {}
    while True:
        try:
            message = channel.recv()
        except (EOFError, OSError):
            return  # the app is gone
        except wire.ProtocolError as exc:
            log.error("%s; stopping", exc)
            return
        if isinstance(message, wire.Submit):
            sinks = {k: s for k, s in sinks.items() if not s.finished}
            sinks[message.rid] = sink = ChildSink(message.rid, send)
            params = GenParams(message.max_new_tokens, message.temperature, message.top_p, message.seed)
            try:
                loop.submit(Request(message.input_ids, message.adapter, params, sink, message.prefix_len))
            except queue.Full:
                sink.close(RuntimeError("the engine's queue is full; please retry"))
        elif isinstance(message, wire.Cancel):
            if message.rid in sinks:
                sinks[message.rid].cancel()
        elif isinstance(message, wire.Threads):
            budget.threads = message.threads
        elif isinstance(message, wire.Call):
            threading.Thread(target=_answer, args=(loop, send, message), daemon=True).start()
        elif isinstance(message, wire.Close):
            return


def _answer(loop, send, call: wire.Call) -> None:
    """Run one call of the app on the loop thread and send back its result or error."""
    try:
        if call.method == "profile":
            value = loop.profile()
        else:
            value = loop.call(getattr(loop.core, call.method), *call.args)
        reply = wire.Reply(call.cid, value, None, None)
        wire.encode(reply)  # a value the wire cannot carry is this call's error, not a call left unanswered
    except Exception as exc:
        reply = wire.Reply(call.cid, None, type(exc).__name__, str(exc))
    send(reply)


if __name__ == "__main__":
    sys.exit(child_main(int(sys.argv[1])))
