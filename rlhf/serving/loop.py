"""The engine loop: the queue, the worker thread and shutdown, written once for every backend.

One thread owns the core (``rlhf.serving.interface.EngineCore``) and alternates: take what arrived (requests, and
calls such as loading an adapter, which run between two steps), start waiting requests the core has room for,
advance every running reply by one step. The core is best built on that thread too (pass its factory): an OpenMP
runtime keeps one thread team per calling thread, and a second team left spinning beside the first halved
llama.cpp's decode rate on 2 cores (20 ms a step instead of 8.6). An idle loop waits for work, then a short window for company, so
replies that arrive together start together. The core is never touched from another thread, so backends keep no
locks. The same loop runs in this process (``EngineLoop``) or in an engine process (``rlhf.serving.child``).
"""
from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Optional

from rlhf.cpu import CpuMeter
from rlhf.serving.interface import Admission, Engine, EngineCore, EngineLoad, Request

log = logging.getLogger(__name__)

SHUTDOWN = "the model server is shutting down"


class EngineLoop(Engine):
    """Serves queued ``Request``s with ``core`` on a worker thread (see the module docstring).

    ``queue_size`` bounds requests waiting to start (``submit`` raises ``queue.Full`` beyond it);
    ``max_batch_size`` is only used for the retry hint (the core bounds its own rows); ``batch_window_ms`` is how
    long an idle loop waits for company before it starts the first request; ``observer(load)`` is called on the
    loop thread whenever the running/waiting counts change; ``adaptive_threads``: decode with fewer threads than
    the budget allows while other processes keep cores busy (``rlhf.cpu.CpuMeter``).
    """

    def __init__(self, core: EngineCore | Callable[[], EngineCore], *, queue_size: int = 64,
                 max_batch_size: int = 32, batch_window_ms: float = 10.0,
                 observer: Optional[Callable[[EngineLoad], None]] = None, adaptive_threads: bool = False,
                 start: bool = True):
        factory = None if isinstance(core, EngineCore) else core
        self.core: Optional[EngineCore] = None if factory else core
        self.name = getattr(self.core, "name", "engine")
        self.tokenizer = getattr(self.core, "tokenizer", None)
        self.admission = Admission(queue_size, max_batch_size)
        self.build = getattr(self.core, "build", "")
        self.batch_window_s = max(0.0, batch_window_ms) / 1000.0
        self.observer = observer
        self.budget = None
        # other processes: not this one, nor the app that started it (the engine's own process serves the app)
        self.meter = CpuMeter([os.getpid(), os.getppid()]) if adaptive_threads else None
        self.threads: Optional[int] = None
        self.status = self.name
        self._inbox: "queue.Queue" = queue.Queue()
        self._pending: collections.deque[Request] = collections.deque()  # taken off the inbox, not started yet
        self._live: dict[int, tuple[Request, float]] = {}  # started requests -> when they started
        self._count = threading.Lock()
        self._waiting = 0
        self._submitted = 0
        self._finished = 0
        self._running = 0
        self._active = False
        self._adapters: tuple[str, ...] = ()
        self._observed = (0, 0)
        self._stop = threading.Event()
        self._built = threading.Event()
        self._build_error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(factory,), name="engine-loop", daemon=True)
        if factory is not None:  # built on the loop thread; the constructor returns once it is (or failed)
            self.thread.start()
            self._built.wait()
            if self._build_error is not None:
                raise self._build_error
        elif start:
            self.thread.start()

    # ---- the Engine interface (any thread) -------------------------------------------------------
    def submit(self, request: Request) -> None:
        with self._count:
            self.admission.admit(self._waiting)
            self._waiting += 1
            self._submitted += 1
        if self.budget is not None:
            self.budget.serving_load(True)  # a job holding every core hears it now, not at the next step
        self._inbox.put(request)

    def load_adapter(self, name: str, path: str) -> None:
        self.call(self.core.load_adapter, name, path)

    def unload_adapter(self, name: str) -> None:
        self.call(self.core.unload_adapter, name)

    @property
    def adapters(self) -> list[str]:
        return list(self._adapters)

    def call(self, fn: Callable, *args):
        """Run ``fn(*args)`` on the loop thread between two steps; return its result or raise its error."""
        if threading.current_thread() is self.thread:
            return fn(*args)
        future: Future = Future()
        self._inbox.put((future, fn, args))
        while True:
            try:
                return future.result(timeout=1.0)
            except TimeoutError:
                if self._stop.is_set() and not self.thread.is_alive():
                    raise RuntimeError(SHUTDOWN) from None

    def load(self) -> EngineLoad:
        return EngineLoad(self._running, self._waiting, self._submitted, self._active)

    def profile(self) -> dict:
        core = self.call(self.core.profile) if self.thread.is_alive() else self.core.profile()
        return {**core, "submitted": self._submitted, "finished": self._finished}

    def use_budget(self, budget) -> None:
        """Follow ``budget.serving_threads()`` (read before every step, applied on the loop thread)."""
        self.budget = budget

    def start(self) -> None:
        if not self.thread.is_alive() and not self._stop.is_set():
            self.thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the current step; unfinished replies end with an error; the model is freed."""
        self._stop.set()
        self._inbox.put(None)  # wake an idle loop
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)
        elif not self.thread.is_alive():
            self._shutdown()

    # ---- the loop (its own thread) ----------------------------------------------------------------
    def _run(self, factory: Optional[Callable[[], EngineCore]] = None) -> None:
        if factory is not None:
            try:
                self.core = factory()
                self.name, self.tokenizer, self.status = self.core.name, self.core.tokenizer, self.core.name
                self.build = self.core.build
            except BaseException as exc:  # the constructor raises it
                self._build_error = exc
                return
            finally:
                self._built.set()
        try:
            while not self._stop.is_set():
                try:
                    self._iteration()
                except Exception:  # never let one bad step kill serving
                    log.exception("%s step failed; failing the running replies", self.name)
                    self._fail_running(RuntimeError("generation failed; please retry"))
                finally:
                    self._active = False
        finally:
            self._shutdown()

    def _iteration(self) -> None:
        self._follow_budget()
        idle = not self._running and not self._pending
        self._drain(0.2 if idle else None)
        if idle and self._pending and self.batch_window_s:
            time.sleep(self.batch_window_s)  # company: replies that arrive together start together
            self._drain(None)
        if idle and self._pending:
            self._follow_budget()  # the first step of a reply after a quiet spell runs on chat's share
        if self._pending:
            self._active = True
            self._start_pending()
        if self._running:
            self._active = True
            self.core.step()
            self._running = self.core.running
        self._settle()

    def _drain(self, timeout: Optional[float]) -> None:
        """Move what arrived into ``_pending`` (requests) or run it now (calls); wait up to ``timeout`` for a
        first item when nothing is there."""
        while True:
            try:
                item = self._inbox.get(timeout=timeout) if timeout else self._inbox.get_nowait()
            except queue.Empty:
                return
            timeout = None
            if item is None:  # close() woke us
                return
            if isinstance(item, Request):
                self._pending.append(item)
            else:
                self._run_call(*item)

    def _run_call(self, future: Future, fn: Callable, args: tuple) -> None:
        if not future.set_running_or_notify_cancel():
            return
        self._active = True
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # the caller gets the error; the loop goes on
            future.set_exception(exc)
        finally:
            self._adapters = tuple(self.core.adapters)

    def _start_pending(self) -> None:
        requests = []
        for req in self._pending:
            if req.stream.cancelled:
                req.stream.close()
            else:
                requests.append(req)
        left = self.core.admit(requests) if requests else []
        now = time.perf_counter()
        kept = {id(r) for r in left}
        for req in requests:
            if id(req) not in kept:
                self._live[id(req)] = (req, now)
        with self._count:
            self._waiting -= len(self._pending) - len(left)
        self._pending = collections.deque(left)
        self._running = self.core.running

    def _settle(self) -> None:
        """Count replies that ended, learn how long a reply takes, and tell the observer about changes."""
        done = [key for key, (req, _) in self._live.items() if req.stream.finished]
        for key in done:
            req, started = self._live.pop(key)
            self._finished += 1
            self.admission.learn(req.stream.finished_at - started)
        if self.observer is not None and (self._running, self._waiting) != self._observed:
            self._observed = (self._running, self._waiting)
            self.observer(self.load())

    def _follow_budget(self) -> None:
        if self.budget is None:
            return
        self.budget.serving_load(bool(self._running or self._waiting or self._pending))
        want = max(1, int(self.budget.serving_threads()))
        if self.meter is not None:
            want = self.meter.fit(want)
        if want != self.threads:
            self.core.set_threads(want)
            self.threads = want
            log.info("%s engine now uses %d CPU thread(s)", self.name, want)

    def _fail_running(self, error: BaseException) -> None:
        """End every reply the core holds with ``error``: through the core, then here for any it left open (a core
        whose own clean-up fails must not leave a person waiting on a reply forever)."""
        try:
            self.core.fail_all(error)
        except Exception:
            log.exception("the %s engine could not end its replies; ending them here", self.name)
        for req, _ in self._live.values():
            req.stream.close(error)  # a second close does nothing
        self._running = self.core.running

    def _shutdown(self) -> None:
        error = RuntimeError(SHUTDOWN)
        if self.core is not None:
            self._fail_running(error)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Request):
                self._pending.append(item)
            elif item is not None:
                item[0].set_exception(RuntimeError(SHUTDOWN))
        for req in self._pending:
            req.stream.close(error)
        self._pending.clear()
        with self._count:
            self._waiting = 0
        self._running = 0
        try:
            if self.core is not None:
                self.core.close()
        except Exception:
            log.exception("freeing the %s engine", self.name)
