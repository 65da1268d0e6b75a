"""Code named in the config by import path (``"package.module:function"``): ``ppo.reward_functions`` and
``scheduler.job_kinds``. One loader, so both refuse a bad path the same way, naming the config key."""
from __future__ import annotations

import importlib
from typing import Callable


def load_callable(path: str, key: str) -> Callable:
    """Import ``"package.module:function"``; ValueError naming ``key`` and the reason when it cannot be used."""
    module_name, sep, attr = str(path).partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{key}: {path!r} is not an import path like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{key}: cannot import {module_name!r} ({exc})") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"{key}: {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"{key}: {path!r} is not callable")
    return fn
