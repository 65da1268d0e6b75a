"""The retrain's policy methods (``retrain.method``): one module each, one line each in ``METHODS``
(``rlhf.registry``).

A method is a ``PolicyMethod`` (``rlhf.training.methods.base``): how it trains the policy, its config section, how
its work is counted for the time estimate, and the metrics its result adds. The retrain asks the method named in
the config for all of that and never compares method names, so a method added here cannot fall into another's
branch; ``retrain.method`` accepts exactly the names below. This module imports nothing heavy: the retrain,
the dashboard and the model card read it.
"""
from __future__ import annotations

import importlib

from rlhf.registry import METHODS  # name -> "module:attribute" of its PolicyMethod (imported on first use)


def get_method(name: str):
    """The registered method called ``name`` (ValueError naming the choices when there is none)."""
    if name not in METHODS:
        raise ValueError(f"retrain.method must be one of {', '.join(METHODS)}, got {name!r}")
    module, _, attr = METHODS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def method_title(name: str) -> str:
    """How a version's card and dashboard name its method ("PPO on the reward model"); the bare name when the
    version was trained by a method this install no longer has."""
    return get_method(name).title if name in METHODS else str(name)
