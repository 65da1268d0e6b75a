"""A wrapper around llama-cpp-python that faults for real (SIGSEGV), installed from outside like a bad build.

``install(root)`` writes a ``llama_cpp`` package into ``root``; a process with ``root`` first on its PYTHONPATH imports
it instead of the real one. It imports the real bindings, wraps ``llama_model_load_from_file`` and
``llama_decode``, and dereferences a null pointer (a genuine segmentation fault of the whole process, as a kernel
bug would) when the file ``mode`` beside the package says so (the engine process gets a minimal environment, so
the mode travels in a file, not in a variable):

* ``extra_buffers``: every decode of a model loaded with extra buffer types (what AMX repacking faults on);
* ``always``: every decode;
* ``after:N:MARKER``: the N-th decode call of a process, once (``MARKER`` is created before the fault, so the
  engine that starts again serves normally);
* ``every:N``: the N-th decode call of every process;
* ``slow:SECONDS``: no fault, every decode waits ``SECONDS`` first (a reply that stays in flight for a while).

Nothing in the app knows about it: the file is read by this wrapper alone.
"""
from __future__ import annotations

from pathlib import Path

SHIM = '''
import ctypes
import importlib
import os
import sys
import time

_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _root]
del sys.modules["llama_cpp"]
_real = importlib.import_module("llama_cpp")  # the real bindings; `import llama_cpp` returns this module

_mode_file = os.path.join(_root, "mode")
_mode = open(_mode_file).read().strip() if os.path.exists(_mode_file) else ""
_extra = [False]
_calls = [0]
_load = _real.llama_model_load_from_file
_decode = _real.llama_decode


def _segfault():
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def _should_fault():
    _calls[0] += 1
    if _mode == "always" or (_mode == "extra_buffers" and _extra[0]):
        return True
    if _mode.startswith("every:"):
        return _calls[0] == int(_mode.split(":")[1])
    if _mode.startswith("after:"):
        _, n, marker = _mode.split(":", 2)
        if _calls[0] >= int(n) and not os.path.exists(marker):
            open(marker, "w").close()
            return True
    return False


def llama_model_load_from_file(path, params):
    _extra[0] = bool(params.use_extra_bufts)
    return _load(path, params)


def llama_decode(ctx, batch):
    if _mode.startswith("slow:"):
        time.sleep(float(_mode.split(":")[1]))
    elif _should_fault():
        _segfault()
    return _decode(ctx, batch)


_real.llama_model_load_from_file = llama_model_load_from_file
_real.llama_decode = llama_decode
'''


def install(root: Path) -> Path:
    """Write the wrapper package under ``root``; put ``root`` first on PYTHONPATH to use it, and write its mode
    to ``root / "mode"``."""
    package = Path(root) / "llama_cpp"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(SHIM)
    return Path(root)
