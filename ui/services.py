"""What the handlers get injected: config, the Store, the policy server, and the background machinery."""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

from rlhf.config import AppConfig
from rlhf.serving import PolicyServer
from storage import Store


@dataclass
class Services:
    """Everything a UI or REST handler may use. Built once in ``ui.server.build_services``."""

    config: AppConfig
    store: Store
    server: PolicyServer
    scheduler: Optional[Any] = None  # rlhf.scheduler.StudioScheduler when running
    auth: Optional[Any] = None  # ui.auth.Auth when users are configured

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown()
        self.server.close()
        self.store.close()


def bind(fn: Callable, *args: Any) -> Callable:
    """``functools.partial`` that Gradio can introspect.

    Gradio reads a handler's signature and type hints to inject ``gr.Request`` / ``gr.LikeData`` and to
    tell streaming (generator) handlers apart; a bare partial hides both.
    """
    inner = functools.partial(fn, *args)
    if inspect.isgeneratorfunction(fn):
        def bound(*a, **k):
            yield from inner(*a, **k)
    else:
        def bound(*a, **k):
            return inner(*a, **k)
    functools.update_wrapper(bound, fn)
    sig = inspect.signature(fn)
    bound.__signature__ = sig.replace(parameters=list(sig.parameters.values())[len(args):])
    return bound
