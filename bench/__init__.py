"""Benchmarks of RLHF Studio (`rlhf-studio bench WHAT`): part of the checkout, not of the installed package.

Each benchmark is a module with ``add_arguments(parser)`` (its own flags) and ``run(config, args)`` (measures,
prints a table, appends to BENCHMARKS.md through ``bench.report.report`` and returns its figures).
"""
from __future__ import annotations

import importlib
from types import ModuleType

BENCHMARKS: tuple[str, ...] = ("serve", "ingest", "train", "memory", "reward", "queue", "loop", "gate", "decide",
                               "fidelity", "model", "rollouts")
# A benchmark flag that runs a sibling module instead (the flag is declared by the benchmark's add_arguments).
VARIANTS: dict[tuple[str, str], str] = {("serve", "during_retrain"): "serve_retrain", ("reward", "active"): "reward_active"}


def benchmark(name: str) -> ModuleType:
    """The module of one benchmark, by its `rlhf-studio bench` name (its flags: ``add_arguments``)."""
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}")
    return importlib.import_module(f"bench.{name}")


def runner(name: str, args) -> ModuleType:
    """The module whose ``run(config, args)`` measures what the parsed flags ask for."""
    for (bench, flag), module in VARIANTS.items():
        if bench == name and getattr(args, flag, False):
            return importlib.import_module(f"bench.{module}")
    return benchmark(name)
