"""Code named in the config by import path (``"package.module:function"``): ``ppo.reward_functions`` and
``scheduler.job_kinds``. One loader, so both refuse a bad path the same way, naming the config key.

Code comes only from the running app's own config (its file and environment): a job row's saved config, a
restored database or a REST override never names what a job process imports. ``CODE_KEYS`` are those settings;
``refuse_code_overrides`` turns them away from job overrides, ``with_app_code`` puts the app's own values back
into a job's saved config, and ``refuse_imports_under`` keeps a job process from importing anything that lies in
the data dir (a module planted there, or the data dir seen as a namespace package from the project root).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

CODE_KEYS = ("scheduler.job_kinds", "ppo.reward_functions")  # config keys that name code to import


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


def code_keys_in(dotted_keys: list[str]) -> list[str]:
    """The keys among ``dotted_keys`` (as ``rlhf.config.override_keys`` gives them) that name code."""
    return [k for k in dotted_keys if any(k.strip() == c or k.strip().startswith(c + ".") for c in CODE_KEYS)]


def code_settings(app_config: Any) -> dict:
    """The app's own code settings, as overrides: ``{"scheduler.job_kinds": {...}, "ppo.reward_functions": {...}}``."""
    return {"scheduler.job_kinds": dict(app_config.scheduler.job_kinds),
            "ppo.reward_functions": dict(app_config.ppo.reward_functions)}


def with_app_code(job_config: Any, code: Mapping[str, dict]) -> None:
    """Replace in place the code settings of a job's saved config with the app's (``code_settings``)."""
    job_config.scheduler.job_kinds = dict(code.get("scheduler.job_kinds") or {})
    job_config.ppo.reward_functions = dict(code.get("ppo.reward_functions") or {})


def _inside(path: str | os.PathLike, root: Path) -> bool:
    try:
        return Path(os.path.abspath(path)).is_relative_to(root)
    except (TypeError, ValueError):
        return False


class _RefuseUnder(importlib.abc.MetaPathFinder):
    """Refuses a top-level import that would load from under ``root`` (its submodules live there too)."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if path is not None:  # a submodule: found through its parent's __path__, which this finder already vetted
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname)
        if spec is None:
            return None
        places = [spec.origin] if spec.origin and spec.has_location else []
        places += list(spec.submodule_search_locations or [])
        if any(_inside(p, self.root) for p in places):
            raise ImportError(f"refusing to import {fullname!r} from the data dir {self.root}: the job process "
                              "runs only the app's own code", name=fullname)
        return None


def refuse_imports_under(root: str | os.PathLike) -> None:
    """From now on this process imports nothing from ``root`` (the data dir): its entries leave ``sys.path``
    and a top-level module or namespace package found under it is refused with ImportError."""
    root = Path(os.path.abspath(root))
    if any(_inside(own, root) for own in (Path(__file__).resolve().parents[1], sys.prefix)):
        return  # the app itself lies in its data dir (an odd layout): refusing would refuse the app
    sys.path[:] = [p for p in sys.path if not (p and _inside(p, root))]
    if not any(isinstance(f, _RefuseUnder) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _RefuseUnder(root))
