"""One error path for the Gradio handlers, beside REST's (``ui.api.errors``).

A handler lets the errors a person can act on go up: the Store's refusals (``StoreError`` and its subclasses),
``Forbidden``, the model server's ``Busy``, a setting that cannot work (``ConfigError``) and the serving seam's
errors. ``handles_errors`` turns them into what every tab shows: a toast (``gr.Warning``) and ``⚠️ message`` in the
handler's status line. Any other exception is a bug: its traceback goes to the server log and the person reads one
short line, never a traceback. A handler that must do something of its own on an error (a stream that unlocks its
buttons, a vote that goes on to the next item) catches ``Exception`` and asks ``error_status`` for the words, so no
tab words an error its own way.
"""
from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Callable, Optional

import gradio as gr

from rlhf.config import ConfigError
from rlhf.serving.interface import AdapterError, Busy, EngineUnavailable
from storage import StoreError
from ui.permissions import Forbidden

log = logging.getLogger(__name__)

# Errors whose message is written for the person who clicked (the REST API answers them as 4xx / 503).
REFUSALS = (StoreError, Forbidden, Busy, ConfigError, EngineUnavailable, AdapterError)
UNEXPECTED = "Something went wrong on the server ({name}); the server log has the details."


def error_text(exc: BaseException, also: tuple = ()) -> str:
    """What a person reads about ``exc``: a refusal's own message (``also``: more types a handler treats as
    refusals, e.g. ValueError from a number typed in a box); for anything else one short line, and the traceback
    goes to the server log."""
    if isinstance(exc, REFUSALS + tuple(also)):
        return str(exc)
    log.error("a Gradio handler failed", exc_info=exc)
    return UNEXPECTED.format(name=type(exc).__name__)


def error_status(exc: BaseException, warn: bool = True, also: tuple = (), lead: str = "") -> str:
    """The status line for ``exc``: ``⚠️ {lead}{error_text}``; also shown as a toast when ``warn``."""
    text = lead + error_text(exc, also)
    if warn:
        gr.Warning(text)
    return f"⚠️ {text}"


def _status_only(status: str) -> str:
    return status


def handles_errors(fallback: Optional[Callable[[str], Any]] = None, *, warn: bool = True,
                   also: tuple = ()) -> Callable:
    """Decorator for a Gradio handler (plain or streaming): an error becomes ``fallback(status)``, the handler's
    outputs around the status line from ``error_status`` (default: the status itself, for a handler whose one output
    is its status). ``warn=False`` for handlers that only fill a status line (no toast), as they did before."""
    fallback = fallback or _status_only

    def wrap(fn: Callable) -> Callable:
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def handler(*args, **kwargs):
                try:
                    yield from fn(*args, **kwargs)
                except Exception as exc:
                    yield fallback(error_status(exc, warn, also))
        else:
            @functools.wraps(fn)
            def handler(*args, **kwargs):
                try:
                    return fn(*args, **kwargs)
                except Exception as exc:
                    return fallback(error_status(exc, warn, also))
        return handler
    return wrap
