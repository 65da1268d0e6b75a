"""The engine in its own process: a fault in native code ends the replies in flight, not the app.

``EngineProcess`` is the app's side. It starts ``python -m rlhf.serving.child`` (``rlhf.serving.child``) with one
end of a socket pair and a minimal environment (no secrets), sends it the engine to build (an ``EngineSpec``), and
waits until the child has loaded the base and decoded a few tokens (the proof that this engine works on this CPU
with this library build). Requests, cancels, adapter loads and thread counts then cross the socket as typed JSON
messages (``rlhf.serving.wire``, never pickles); text deltas come back the same way. A frame from the child that is
not one of those messages is treated like a death: the child is killed and its replies end with the reason. The
child runs the same ``EngineLoop`` as an in-process engine, so queueing, batching and shutdown are the loop's.

When the child dies (SIGSEGV in a kernel, SIGILL from a wheel built for another CPU, the OOM killer), every reply in
flight ends with a clear error (the caller stores nothing), requests still waiting are kept, and the child is
started again; a second death within ``FAULT_WINDOW_S`` — or a death before the child was ready — moves on to the
next engine of ``specs`` (the safe llama.cpp load, then transformers). Each verdict is recorded (``verdicts``) so the
next start skips an engine that faults here.
"""
from __future__ import annotations

import collections
import logging
import queue
import subprocess
import threading
import time
from typing import Optional

from rlhf.serving import wire
from rlhf.serving.interface import Admission, Engine, EngineFault, EngineLoad, EngineUnavailable, Request, \
    ReplyStream
from rlhf.serving.spawn import EngineSpec, describe_exit, spawn

__all__ = ["EngineProcess", "EngineSpec", "describe_exit"]

log = logging.getLogger(__name__)

FAULT_WINDOW_S = 600.0  # two deaths of one engine within this window: it is not a fluke, fall back
CLOSE_TIMEOUT_S = 5.0


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
        self.admission = Admission(queue_size, max_batch_size)
        self.verdicts = verdicts
        self.ready_timeout_s = ready_timeout_s
        self.threads: Optional[int] = max(1, int(threads))
        self.budget = None
        self.spec: Optional[EngineSpec] = None
        self.name = "none"
        self.status = "starting"
        self.history: list[str] = []  # what happened to each engine tried, for people
        self.restarts: list[str] = []  # how and when the serving engine's process died and was started again
        self._lock = threading.Lock()  # the maps below
        self._streams: dict[int, ReplyStream] = {}  # every request not finished yet
        self._started: dict[int, float] = {}
        self._held: collections.deque = collections.deque()  # (rid, Submit) not sent yet (no child ready)
        self._calls: dict[int, tuple[threading.Event, list]] = {}  # cid -> (answered, [Reply])
        self._ids = iter(range(1, 2**62))
        self._submitted = 0
        self._running = 0
        self._adapters: dict[str, str] = {}  # name -> path: what the child serves, loaded again after a restart
        self._deaths: list[float] = []
        self._proc: Optional[subprocess.Popen] = None
        self._channel: Optional[wire.Channel] = None
        self._broken: Optional[str] = None  # how the child broke the wire, when it did
        self._link = threading.Event()  # a child is connected and its reader runs: calls may go out
        self._ready = threading.Event()  # ... and it serves the adapters it had: requests go straight out
        self._budget_checked = 0.0
        self._closing = threading.Event()
        self._reader: Optional[threading.Thread] = None

    # ---- starting, and starting again -------------------------------------------------------------
    def start(self, trust_verdicts: bool = True) -> "EngineProcess":
        """Start the first spec that works here (blocking); EngineUnavailable with every reason when none does.

        When no engine starts and some were skipped only for a fault recorded earlier, those are proved again, once:
        a verdict file that faults every engine (stale, or written by someone else) never keeps the app down."""
        skipped = []
        while self.specs:
            spec = self.specs[0]
            if spec.unavailable:
                self._give_up(spec, spec.unavailable, record=False)
                continue
            recorded = self.verdicts.fault(spec) if self.verdicts is not None and trust_verdicts else None
            if recorded:
                skipped.append(spec)
                self._give_up(spec, f"{recorded} (recorded earlier on this CPU with this build)", record=False)
                continue
            try:
                ready = self._spawn(spec)
            except EngineFault as exc:
                self._give_up(spec, str(exc))
                continue
            except EngineUnavailable as exc:
                self._give_up(spec, str(exc), record=False)
                continue
            if self.verdicts is not None:
                self.verdicts.record(spec, None)
            self._serving(spec, ready)
            return self
        if skipped:
            log.warning("no serving engine left but %d skipped for a recorded fault: proving them again", len(skipped))
            self.history.append("no engine left to try: proving again those skipped for a recorded fault")
            self.specs = skipped
            return self.start(trust_verdicts=False)
        raise EngineUnavailable("no serving engine works here: " + "; ".join(self.history))

    def _give_up(self, spec: EngineSpec, reason: str, record: bool = True) -> None:
        log.warning("serving engine %s cannot serve here: %s", spec.label, reason)
        self.history.append(f"{spec.label}: {reason}")
        if record and self.verdicts is not None:
            self.verdicts.record(spec, reason)
        self.specs.pop(0)

    def _spawn(self, spec: EngineSpec) -> wire.Ready:
        """Start a child for ``spec`` and wait until it proved itself (loaded, decoded); its ready message."""
        self._proc, self._channel, ready = spawn(spec, self.loop_settings, self.threads, self.ready_timeout_s)
        return ready

    def _serving(self, spec: EngineSpec, ready: wire.Ready) -> None:
        if self._closing.is_set():  # closed while this engine started (after a fault): stop it too
            self._channel.send(wire.Close())
            try:
                self._proc.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            return
        self.spec, self.name, self.build = spec, spec.name, ready.build
        why = f"; {'; '.join(self.history)}" if self.history else ""
        again = (f"; started again {len(self.restarts)}x (last: {self.restarts[-1]})" if self.restarts else "")
        on = f"; {self.build}" if self.build else ""
        self.status = f"{spec.label} (proved in its own process: {ready.proof}{on}){again}{why}"
        log.info("serving engine: %s", self.status)
        self._running = 0
        self._reader = threading.Thread(target=self._read, args=(self._channel, self._proc), name="engine-process",
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
                    stream.close()
                else:
                    self._send(message)

    def _died(self, proc: subprocess.Popen) -> None:
        """The child is gone: end what it was decoding, then start it again or fall back (in this thread)."""
        proc.wait()
        how = self._broken or describe_exit(proc.returncode)
        self._broken = None
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
            stream.close(error)
        for event, box in calls:
            box[:] = [wire.Reply(0, None, "EngineFault", str(error))]
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
                stream.close(exc)

    # ---- the Engine interface ----------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        if not self.specs:  # every engine failed here: "busy" to the caller, the reason in status and the log
            raise queue.Full
        with self._lock:
            self.admission.admit(len(self._streams) - self._running)
            rid = next(self._ids)
            self._streams[rid] = request.stream
            self._started[rid] = time.perf_counter()
            self._submitted += 1
            p = request.params
            message = wire.Submit(rid, [int(t) for t in request.input_ids], request.adapter, p.max_new_tokens,
                                  p.temperature, p.top_p, p.seed, request.prefix_len)
            ready = self._ready.is_set()
            if not ready:
                self._held.append((rid, message))
        request.stream.on_cancel = lambda: self._send(wire.Cancel(rid))
        if self.budget is not None:  # a job holding every core hears it now, and the child gets chat's share first
            self._follow_budget()
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
    def pid(self) -> Optional[int]:
        """The engine process's id while one runs (for operators: ``ps``, ``/proc/<pid>``)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

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

    def use_budget(self, budget) -> None:
        self.budget = budget
        self._follow_budget()

    def close(self) -> None:
        """Tell the child to stop (it ends its replies), wait a few seconds, then kill it."""
        self._closing.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                self._send(wire.Close())
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
            stream.close(error)

    # ---- talking to the child -----------------------------------------------------------------------
    def _send(self, message: wire.Message) -> None:
        channel = self._channel
        if channel is None or not self._link.is_set():
            return  # the child is being replaced: submits wait in _held, cancels are seen before they go out
        try:
            channel.send(message)
        except OSError:  # it just died: the reader ends its replies
            pass

    def _call(self, method: str, *args):
        if not self._link.wait(self.ready_timeout_s):
            raise EngineUnavailable(self.status)
        event, box = threading.Event(), []
        cid = next(self._ids)
        with self._lock:
            self._calls[cid] = (event, box)
        self._send(wire.Call(cid, method, [str(a) for a in args]))
        event.wait()
        (reply,) = box
        if reply.error is not None:
            raise wire.error_from(reply.error, reply.message)
        return reply.value

    def _follow_budget(self) -> None:
        self._budget_checked = time.monotonic()
        if self.budget is not None:
            self.budget.serving_load(bool(self._streams))  # a chat in flight: a running job gives its cores back
            want = max(1, int(self.budget.serving_threads()))
            if want != self.threads and self._link.is_set():
                self.threads = want
                self._send(wire.Threads(want))

    def _read(self, channel: wire.Channel, proc: subprocess.Popen) -> None:
        """The reader thread: deliver the child's messages; follow the budget; notice the child's death. A frame
        that is not a message kills the child: what it sends can no longer be trusted."""
        while True:
            try:
                if time.monotonic() - self._budget_checked > 0.1:
                    self._follow_budget()
                if not channel.poll(0.1):
                    if proc.poll() is None:
                        continue
                    raise EOFError
                message = channel.recv()
            except wire.ProtocolError as exc:
                log.error("serving engine %s: %s; stopping its process", self.spec.label, exc)
                self._broken = f"it broke the engine wire ({exc})"
                proc.kill()
                message = None
            except (EOFError, OSError):
                message = None
            if message is None:
                channel.close()
                self._died(proc)
                return
            self._deliver(message)

    def _deliver(self, message: wire.Message) -> None:
        if isinstance(message, wire.Delta):
            stream = self._streams.get(message.rid)
            if stream is not None:
                stream.n_tokens = message.n_tokens
                stream.emit(message.text)
        elif isinstance(message, wire.Done):
            self._finish(message)
        elif isinstance(message, wire.Load):
            self._running = message.running
        elif isinstance(message, wire.Reply):
            with self._lock:
                event, box = self._calls.pop(message.cid, (None, None))
            if event is not None:
                box[:] = [message]
                event.set()

    def _finish(self, done: wire.Done) -> None:
        with self._lock:
            stream = self._streams.pop(done.rid, None)
            started = self._started.pop(done.rid, None)
        if stream is None:
            return
        stream.n_tokens, stream.token_ids = done.n_tokens, done.token_ids
        stream.close(wire.error_from(done.error, done.message) if done.error is not None else None)
        if started is not None and done.error is None:
            self.admission.learn(time.perf_counter() - started)
