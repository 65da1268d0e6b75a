"""The engine in its own process: a fault in native code ends the replies in flight, not the app.

``EngineProcess`` is the app's side. It starts ``python -m rlhf.serving.process`` with one end of a socket pair,
sends it the engine to build (an ``EngineSpec``), and waits until the child has loaded the base and decoded a few
tokens (the proof that this engine works on this CPU with this library build). Requests, cancels, adapter loads and
thread counts then cross the socket as small pickled tuples; text deltas come back the same way. The child runs the
same ``EngineLoop`` as an in-process engine, so queueing, batching and shutdown are the loop's.

When the child dies (SIGSEGV in a kernel, SIGILL from a wheel built for another CPU, the OOM killer), every reply in
flight ends with a clear error (the caller stores nothing), requests still waiting are kept, and the child is
started again; a second death within ``FAULT_WINDOW_S`` — or a death before the child was ready — moves on to the
next engine of ``specs`` (the safe llama.cpp load, then transformers). Each verdict is recorded (``verdicts``) so the
next start skips an engine that faults here.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Callable, Optional

from rlhf.serving.interface import AdapterError, Engine, EngineFault, EngineLoad, EngineUnavailable, GenParams, \
    Request, ReplyStream

log = logging.getLogger(__name__)

FAULT_WINDOW_S = 600.0  # two deaths of one engine within this window: it is not a fluke, fall back
CLOSE_TIMEOUT_S = 5.0
ERRORS = {cls.__name__: cls for cls in (AdapterError, EngineFault, EngineUnavailable, ValueError, KeyError,
                                        RuntimeError)}
SIGNALS = {signal.SIGSEGV: "segmentation fault", signal.SIGILL: "illegal instruction", signal.SIGBUS: "bus error",
           signal.SIGABRT: "aborted", signal.SIGFPE: "arithmetic fault", signal.SIGKILL: "killed (out of memory?)"}


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """One engine to try: the backend (``rlhf.serving.interface.ENGINES``), its factory's keyword settings
    (picklable) and a label for people (``llama.cpp``, ``llama.cpp, safe load``, ``transformers``)."""

    name: str
    settings: dict
    label: str


def describe_exit(code: Optional[int]) -> str:
    """``-11`` -> ``SIGSEGV (segmentation fault)``; a plain exit code as it is."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"signal {-code}"
        return f"{sig.name} ({SIGNALS.get(sig, 'signal')})"
    return f"exit code {code}"


def _error(kind: str, message: str) -> BaseException:
    """An error of the child's, rebuilt on this side of the line (its type, when it is one we know)."""
    return ERRORS.get(kind, RuntimeError)(message)


class EngineProcess(Engine):
    """The engine of the first working spec of ``specs``, in a child process (see the module docstring).

    ``verdicts`` (optional) has ``fault(spec) -> str | None`` (a recorded fault: skip it) and
    ``record(spec, fault: str | None)``; ``threads`` is the child's thread count until a budget says otherwise.
    """

    def __init__(self, specs: list[EngineSpec], *, queue_size: int = 64, max_batch_size: int = 32,
                 batch_window_ms: float = 10.0, adaptive_threads: bool = False, threads: int = 1, verdicts=None,
                 ready_timeout_s: float = 900.0):
        if not specs:
            raise EngineUnavailable("no engine to start")
        self.specs = list(specs)
        self.loop_settings = {"queue_size": queue_size, "max_batch_size": max_batch_size,
                              "batch_window_ms": batch_window_ms, "adaptive_threads": adaptive_threads}
        self.queue_size, self.max_batch_size = max(1, int(queue_size)), max(1, int(max_batch_size))
        self.verdicts = verdicts
        self.ready_timeout_s = ready_timeout_s
        self.threads: Optional[int] = max(1, int(threads))
        self.budget = None
        self.spec: Optional[EngineSpec] = None
        self.name = "none"
        self.status = "starting"
        self.history: list[str] = []  # what happened to each engine tried, for people
        self.restarts: list[str] = []  # how and when the serving engine's process died and was started again
        self.avg_reply_s = 2.0
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # the maps below
        self._streams: dict[int, ReplyStream] = {}  # every request not finished yet
        self._started: dict[int, float] = {}
        self._held: collections.deque = collections.deque()  # (rid, message) not sent yet (no child ready)
        self._calls: dict[int, tuple[threading.Event, list]] = {}
        self._ids = iter(range(1, 2**62))
        self._submitted = 0
        self._running = 0
        self._adapters: dict[str, str] = {}  # name -> path: what the child serves, loaded again after a restart
        self._deaths: list[float] = []
        self._proc: Optional[subprocess.Popen] = None
        self._conn: Optional[Connection] = None
        self._link = threading.Event()  # a child is connected and its reader runs: calls may go out
        self._ready = threading.Event()  # ... and it serves the adapters it had: requests go straight out
        self._budget_checked = 0.0
        self._closing = threading.Event()
        self._reader: Optional[threading.Thread] = None

    # ---- starting, and starting again -------------------------------------------------------------
    def start(self) -> "EngineProcess":
        """Start the first spec that works here (blocking); EngineUnavailable with every reason when none does."""
        while self.specs:
            spec = self.specs[0]
            recorded = self.verdicts.fault(spec) if self.verdicts is not None else None
            if recorded:
                self._give_up(spec, f"{recorded} (recorded earlier on this CPU with this build)", record=False)
                continue
            try:
                info = self._spawn(spec)
            except EngineFault as exc:
                self._give_up(spec, str(exc))
                continue
            except EngineUnavailable as exc:
                self._give_up(spec, str(exc), record=False)
                continue
            if self.verdicts is not None:
                self.verdicts.record(spec, None)
            self._serving(spec, info)
            return self
        raise EngineUnavailable("no serving engine works here: " + "; ".join(self.history))

    def _give_up(self, spec: EngineSpec, reason: str, record: bool = True) -> None:
        log.warning("serving engine %s cannot serve here: %s", spec.label, reason)
        self.history.append(f"{spec.label}: {reason}")
        if record and self.verdicts is not None:
            self.verdicts.record(spec, reason)
        self.specs.pop(0)

    def _spawn(self, spec: EngineSpec) -> dict:
        """Start a child for ``spec`` and wait until it proved itself (loaded, decoded); its ready info."""
        from rlhf.cpu import thread_env

        parent, child = socket.socketpair()
        env = thread_env(self.threads, os.environ)  # the child's thread pools are sized before its libraries load
        try:
            proc = subprocess.Popen([sys.executable, "-m", "rlhf.serving.process", str(child.fileno())],
                                    pass_fds=(child.fileno(),), env=env, start_new_session=True)
        finally:
            child.close()
        conn = Connection(parent.detach())
        conn.send(("start", spec.name, spec.settings, self.loop_settings, self.threads))
        t0 = time.monotonic()
        while True:
            if conn.poll(0.1):
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    message = None
                if message is not None and message[0] == "ready":
                    break
                if message is not None and message[0] == "error":
                    conn.close()
                    proc.wait()
                    raise EngineUnavailable(message[2])
            if proc.poll() is not None:
                conn.close()
                raise EngineFault(f"its process died while loading the model and decoding its first tokens: "
                                  f"{describe_exit(proc.returncode)}")
            if time.monotonic() - t0 > self.ready_timeout_s:
                proc.kill()
                conn.close()
                raise EngineFault(f"not ready after {self.ready_timeout_s:.0f} s")
        self._proc, self._conn = proc, conn
        return message[1]

    def _serving(self, spec: EngineSpec, info: dict) -> None:
        if self._closing.is_set():  # closed while this engine started (after a fault): stop it too
            self._conn.send(("close",))
            try:
                self._proc.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            return
        self.spec, self.name = spec, spec.name
        why = f"; {'; '.join(self.history)}" if self.history else ""
        again = (f"; started again {len(self.restarts)}x (last: {self.restarts[-1]})" if self.restarts else "")
        self.status = f"{spec.label} (proved in its own process: {info.get('proof', 'decoded')}){again}{why}"
        log.info("serving engine: %s", self.status)
        self._running = 0
        self._reader = threading.Thread(target=self._read, args=(self._conn, self._proc), name="engine-process",
                                        daemon=True)
        self._link.set()
        self._reader.start()
        for name, path in list(self._adapters.items()):  # after a restart: what was served before (cached GGUFs)
            try:
                self._call("load_adapter", name, path)
            except Exception as exc:  # loaded again on demand, with the error for that version
                log.warning("adapter %s not reloaded: %s", name, exc)
                self._adapters.pop(name, None)
        with self._lock:
            held, self._held = list(self._held), collections.deque()
            self._ready.set()
            for rid, message in held:
                stream = self._streams.get(rid)
                if stream is not None and stream.cancelled:
                    self._streams.pop(rid)
                    stream._close()
                else:
                    self._send(message)

    def _died(self, proc: subprocess.Popen) -> None:
        """The child is gone: end what it was decoding, then start it again or fall back (in this thread)."""
        proc.wait()
        how = describe_exit(proc.returncode)
        self._ready.clear()
        self._link.clear()
        if not self._closing.is_set():
            self.status = f"{self.spec.label}: starting again, its process died ({how})"
        error = EngineFault(f"the model engine stopped ({how}); this reply was not finished — please retry")
        with self._lock:
            held = {rid for rid, _ in self._held}
            lost = [(rid, s) for rid, s in self._streams.items() if rid not in held]
            for rid, _ in lost:
                self._streams.pop(rid)
                self._started.pop(rid, None)
            calls, self._calls = list(self._calls.values()), {}
        for _, stream in lost:
            stream._close(error)
        for event, box in calls:
            box[:] = [False, ("EngineFault", str(error))]
            event.set()
        if self._closing.is_set():
            return
        log.error("serving engine %s died (%s); %d repl%s in flight ended", self.spec.label, how, len(lost),
                  "y" if len(lost) == 1 else "ies")
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < FAULT_WINDOW_S] + [now]
        self.restarts.append(f"{how} at {time.strftime('%H:%M:%S UTC', time.gmtime())}")
        if len(self._deaths) >= 2:
            self._give_up(self.spec, f"its process died twice while serving ({how})")
            self._deaths, self.restarts = [], []
        try:
            self.start()
        except EngineUnavailable as exc:
            self.status = str(exc)
            log.error("%s", exc)
            with self._lock:
                waiting = [self._streams.pop(rid) for rid, _ in self._held]
                self._held.clear()
            for stream in waiting:
                stream._close(exc)

    # ---- the Engine interface ----------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        if not self.specs:  # every engine failed here: "busy" to the caller, the reason in status and the log
            raise queue.Full
        with self._lock:
            if len(self._streams) - self._running >= self.queue_size:
                raise queue.Full
            rid = next(self._ids)
            self._streams[rid] = request.stream
            self._started[rid] = time.perf_counter()
            self._submitted += 1
            message = ("submit", rid, list(request.input_ids), request.adapter,
                       dataclasses.asdict(request.params), request.prefix_len)
            ready = self._ready.is_set()
            if not ready:
                self._held.append((rid, message))
        request.stream.on_cancel = lambda: self._send(("cancel", rid))
        if ready:
            self._send(message)

    def load_adapter(self, name: str, path: str) -> None:
        self._call("load_adapter", name, path)
        self._adapters[name] = path

    def unload_adapter(self, name: str) -> None:
        self._adapters.pop(name, None)
        if self._link.is_set():
            self._call("unload_adapter", name)

    @property
    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    def load(self) -> EngineLoad:
        with self._lock:
            outstanding, running = len(self._streams), min(self._running, len(self._streams))
        return EngineLoad(running, outstanding - running, self._submitted, bool(outstanding or self._calls))

    def profile(self) -> dict:
        out = self._call("profile") if self._link.is_set() else {}
        return {**out, "submitted": self._submitted, "restarts": len(self.restarts), "fallbacks": len(self.history)}

    def retry_after(self) -> float:
        load = self.load()
        return max(1.0, self.avg_reply_s * (1 + (load.waiting + load.running) // self.max_batch_size))

    def use_budget(self, budget) -> None:
        self.budget = budget
        self._follow_budget()

    def close(self) -> None:
        """Tell the child to stop (it ends its replies), wait a few seconds, then kill it."""
        self._closing.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                self._send(("close",))
            except OSError:
                pass
            try:
                proc.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(CLOSE_TIMEOUT_S)
        error = RuntimeError("the model server is shutting down")
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
            self._held.clear()
        for stream in streams:
            stream._close(error)

    # ---- talking to the child -----------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        conn = self._conn
        if conn is None or not self._link.is_set():
            return  # the child is being replaced: submits wait in _held, cancels are seen before they go out
        with self._send_lock:
            try:
                conn.send(message)
            except OSError:  # it just died: the reader ends its replies
                pass

    def _call(self, method: str, *args):
        if not self._link.wait(self.ready_timeout_s):
            raise EngineUnavailable(self.status)
        event, box = threading.Event(), []
        cid = next(self._ids)
        with self._lock:
            self._calls[cid] = (event, box)
        self._send(("call", cid, method, args))
        event.wait()
        ok, value = box
        if not ok:
            raise _error(*value)
        return value

    def _follow_budget(self) -> None:
        self._budget_checked = time.monotonic()
        if self.budget is not None:
            want = max(1, int(self.budget.serving_threads()))
            if want != self.threads and self._link.is_set():
                self.threads = want
                self._send(("threads", want))

    def _read(self, conn: Connection, proc: subprocess.Popen) -> None:
        """The reader thread: deliver the child's messages; follow the budget; notice the child's death."""
        while True:
            try:
                if time.monotonic() - self._budget_checked > 0.1:
                    self._follow_budget()
                if not conn.poll(0.1):
                    if proc.poll() is None:
                        continue
                    raise EOFError
                message = conn.recv()
            except (EOFError, OSError):
                conn.close()
                self._died(proc)
                return
            self._deliver(message)

    def _deliver(self, message: tuple) -> None:
        kind = message[0]
        if kind == "delta":
            _, rid, text, n_tokens = message
            stream = self._streams.get(rid)
            if stream is not None:
                stream.n_tokens = n_tokens
                stream._emit(text)
        elif kind == "done":
            _, rid, n_tokens, token_ids, error = message
            with self._lock:
                stream = self._streams.pop(rid, None)
                started = self._started.pop(rid, None)
            if stream is not None:
                stream.n_tokens, stream.token_ids = n_tokens, token_ids
                stream._close(_error(*error) if error else None)
                if started is not None and not error:
                    self.avg_reply_s = 0.8 * self.avg_reply_s + 0.2 * (time.perf_counter() - started)
        elif kind == "load":
            self._running = message[1]
        elif kind == "reply":
            _, cid, ok, value = message
            with self._lock:
                event, box = self._calls.pop(cid, (None, None))
            if event is not None:
                box[:] = [ok, value]
                event.set()


# ---- the child ------------------------------------------------------------------------------------------
class _ChildStream:
    """What the core writes a reply to, in the child: every delta and the end go straight to the app."""

    def __init__(self, rid: int, send: Callable[[tuple], None]):
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

    def _emit(self, delta: str) -> None:
        self.send(("delta", self.rid, delta, self.n_tokens))

    def _close(self, error: Optional[BaseException] = None) -> None:
        if self.finished_at is not None:
            return
        self.finished_at = time.perf_counter()
        problem = (type(error).__name__, str(error)) if error is not None else None
        self.send(("done", self.rid, self.n_tokens, list(self.token_ids), problem))


class _Threads:
    """The child's budget: the thread count the app sent last."""

    def __init__(self, threads: int):
        self.threads = threads

    def serving_threads(self) -> int:
        return self.threads


def prove(loop, tokenizer) -> str:
    """Decode a few tokens through ``loop`` — one reply alone, then two in one batch — the way chat will, so a
    kernel that faults on this CPU faults now, before anyone waits on it; returns what was decoded."""
    from rlhf.prompting import encode_prompt

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

    from rlhf.serving.interface import build_core
    from rlhf.serving.loop import EngineLoop

    faulthandler.enable()  # a native fault prints where it happened before the process dies
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s")
    conn = Connection(fd)
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        with send_lock:
            try:
                conn.send(message)
            except OSError:  # the app is gone
                os._exit(0)

    _, name, settings, loop_settings, threads = conn.recv()
    budget = _Threads(threads)
    try:
        loop = EngineLoop(lambda: build_core(name, **settings),
                          observer=lambda load: send(("load", load.running, load.waiting)), **loop_settings)
        loop.use_budget(budget)
        proof = prove(loop, loop.tokenizer)
    except Exception as exc:  # a Python error, not a fault: the app says why and tries the next engine
        logging.getLogger(__name__).exception("the engine could not start")
        send(("error", type(exc).__name__, f"{type(exc).__name__}: {exc}"))
        return 1
    send(("ready", {"proof": proof}))
    streams: dict[int, _ChildStream] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break  # the app is gone
        kind = message[0]
        if kind == "submit":
            _, rid, ids, adapter, params, prefix_len = message
            stream = _ChildStream(rid, send)
            streams = {k: s for k, s in streams.items() if not s.finished}
            streams[rid] = stream
            loop.submit(Request(ids, adapter, GenParams(**params), stream, prefix_len))
        elif kind == "cancel":
            if message[1] in streams:
                streams[message[1]].cancel()
        elif kind == "threads":
            budget.threads = message[1]
        elif kind == "call":
            _, cid, method, args = message
            threading.Thread(target=_answer, args=(loop, send, cid, method, args), daemon=True).start()
        elif kind == "close":
            break
    loop.close()
    return 0


def _answer(loop, send, cid: int, method: str, args: tuple) -> None:
    """Run one call of the app on the loop thread and send back its result or error."""
    try:
        value = loop.profile() if method == "profile" else loop.call(getattr(loop.core, method), *args)
        send(("reply", cid, True, value))
    except Exception as exc:
        send(("reply", cid, False, (type(exc).__name__, str(exc))))


if __name__ == "__main__":
    sys.exit(child_main(int(sys.argv[1])))
