"""What every command shares: the Command record, the config flags (--config, --set, and --host/--port of `serve`),
the config they build, and the Store under it."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from rlhf.config import AppConfig, load_config


@dataclass(frozen=True)
class Command:
    """One sub-command: its name, its help, its arguments, and the function that runs it (returns the exit code)."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


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


def open_data(config: AppConfig):
    """The Store under the config's data dir (created on first use)."""
    from storage import Store

    return Store(config.db_path, max_text_chars=config.serving.max_message_chars)
