"""`rlhf-studio` command line (also `python -m rlhf`): a thin layer over the config, Store and rlhf jobs."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from rlhf.config import AppConfig, ConfigError, load_config, to_yaml

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help: str, arguments: Callable[[argparse.ArgumentParser], None] = lambda p: None):
    """Register a sub-command: its help, its arguments, and the function that runs it."""
    def register(fn):
        COMMANDS[name] = (help, arguments, fn)
        return fn
    return register


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML config file (sections as in `config show`)")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                   help="override a config field, e.g. --set ppo.steps=4 (repeatable)")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="interface to listen on (server.host)")
    p.add_argument("--port", type=int, help="port to listen on (server.port)")


def serve_parser() -> argparse.ArgumentParser:
    """Arguments of `serve` (and of app.py)."""
    p = argparse.ArgumentParser(prog="rlhf-studio serve", description="Start the RLHF Studio app.")
    add_config_args(p)
    add_serve_args(p)
    return p


def config_from_args(args: argparse.Namespace) -> AppConfig:
    """Config from --config, RLHF_* env and --set (plus --host/--port when given)."""
    overrides = list(getattr(args, "set", []) or [])
    if getattr(args, "host", None):
        overrides.append(f"server.host={args.host}")
    if getattr(args, "port", None):
        overrides.append(f"server.port={args.port}")
    return load_config(getattr(args, "config", None), overrides)


@command("serve", "start the app (UI + REST API)", add_serve_args)
def cmd_serve(args: argparse.Namespace) -> int:
    from ui.server import serve

    serve(config_from_args(args))
    return 0


@command("config", "show the effective config as YAML (show) or the README's reference table (docs)",
         lambda p: p.add_argument("action", choices=["show", "docs"], help="show | docs"))
def cmd_config(args: argparse.Namespace) -> int:
    from rlhf.config import markdown_table

    print(to_yaml(config_from_args(args)) if args.action == "show" else markdown_table(), end="")
    return 0


# ---- reward model (issue 3) ----

# ---- PPO (issue 4) ----

# ---- jobs, simulate (issue 5) ----

# ---- export, import (issue 7) ----

# ---- benchmarks (issue 8) ----
BENCHES = {"serve": "rlhf.bench_serve", "ingest": "rlhf.bench_ingest", "train": "rlhf.bench_train",
           "memory": "rlhf.bench_memory"}


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=sorted(BENCHES), help="which benchmark")
    p.add_argument("--users", type=int, help="serve: one concurrency level instead of 1, 8 and 32")
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")


@command("bench", "run a benchmark; prints a table, appends to BENCHMARKS.md, prints one JSON line last",
         add_bench_args)
def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    try:
        module = importlib.import_module(BENCHES[args.what])
    except ModuleNotFoundError as exc:
        if exc.name != BENCHES[args.what]:
            raise
        print(f"benchmark {args.what!r} is not available yet", file=sys.stderr)
        return 2
    module.run(config_from_args(args), args)  # each module calls rlhf.bench.report(...)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf-studio", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help, arguments, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        add_config_args(p)
        arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rlhf-studio` console script."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command][2](args) or 0
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
