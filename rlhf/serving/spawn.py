"""Starting one engine process and waiting for its proof: the engine to try (``EngineSpec``), how a process
ended in words (``describe_exit``), and ``spawn``, which starts ``python -m rlhf.serving.child`` with a minimal
environment and returns once the child has loaded its model and decoded a few tokens.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Optional

from rlhf.serving import wire
from rlhf.serving.child import child_env
from rlhf.serving.interface import EngineFault, EngineUnavailable

SIGNALS = {signal.SIGSEGV: "segmentation fault", signal.SIGILL: "illegal instruction", signal.SIGBUS: "bus error",
           signal.SIGABRT: "aborted", signal.SIGFPE: "arithmetic fault", signal.SIGKILL: "killed (out of memory?)"}


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """One engine to try: the backend (``rlhf.registry.ENGINES``), its factory's keyword settings
    (JSON values) and a label for people (``llama.cpp``, ``llama.cpp, safe load``, ``transformers``).
    ``unavailable``: why it cannot run here, known before trying it: it is passed over with that reason, which the
    status and the log show (an engine is never dropped silently). ``build``: what its native code is (a library
    build's fingerprint; "" when the backend has none), so a fault recorded for one build is not held against the
    next."""

    name: str
    settings: dict
    label: str
    unavailable: str = ""
    build: str = ""


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


def spawn(spec: EngineSpec, loop_settings: dict, threads: int,
          ready_timeout_s: float) -> tuple[subprocess.Popen, wire.Channel, wire.Ready]:
    """Start an engine process for ``spec`` and wait until it proved itself (loaded, decoded): the process, its
    channel and its ``Ready``. EngineUnavailable when it says it cannot start (a Python error), EngineFault when it
    dies, breaks the wire or is not ready within ``ready_timeout_s``; the process is gone then."""
    parent, child = socket.socketpair()
    env = child_env(threads, os.environ)  # no secrets; thread pools sized before its libraries load
    try:
        proc = subprocess.Popen([sys.executable, "-m", "rlhf.serving.child", str(child.fileno())],
                                pass_fds=(child.fileno(),), env=env, start_new_session=True)
    finally:
        child.close()
    channel = wire.Channel(Connection(parent.detach()))
    try:
        channel.send(wire.Start(spec.name, spec.settings, loop_settings, threads))
        ready = _await_ready(channel, proc, ready_timeout_s)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        channel.close()
        raise
    return proc, channel, ready


def _await_ready(channel: wire.Channel, proc: subprocess.Popen, ready_timeout_s: float) -> wire.Ready:
    t0 = time.monotonic()
    while True:
        if channel.poll(0.1):
            try:
                message = channel.recv()
            except (EOFError, OSError):
                message = None
            except wire.ProtocolError as exc:
                raise EngineFault(f"its process broke the engine wire while starting: {exc}") from None
            if isinstance(message, wire.Ready):
                return message
            if isinstance(message, wire.Failed):
                proc.wait()
                raise EngineUnavailable(message.message)
        if proc.poll() is not None:
            raise EngineFault(f"its process died while loading the model and decoding its first tokens: "
                              f"{describe_exit(proc.returncode)}")
        if time.monotonic() - t0 > ready_timeout_s:
            raise EngineFault(f"not ready after {ready_timeout_s:.0f} s")
