"""`rlhf-studio` command line (also `python -m cli` from a checkout): a thin entry over the app's own functions —
the config, the Store, the rlhf jobs and the server. It sits beside app.py, outside the packages: `rlhf` never imports
it, `ui` or `bench`."""
from __future__ import annotations

import argparse
import sys

from cli import backup, bench, config, interop, serve, simulate, train, users
from cli.common import Command, add_config_args, config_from_args, serve_parser
from rlhf.config import ConfigError

__all__ = ["COMMANDS", "build_parser", "config_from_args", "main", "serve_parser"]

# Every sub-command, in the order `rlhf-studio --help` lists them; each module holds its commands' bodies.
COMMANDS: dict[str, Command] = {c.name: c for c in (
    serve.SERVE, config.CONFIG, train.TRAIN_REWARD, train.TRAIN_PPO, simulate.SIMULATE, interop.EXPORT,
    interop.IMPORT_POLICY, users.TOKEN, backup.BACKUP, backup.RESTORE, interop.PUSH_POLICY, bench.BENCH)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf-studio", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, c in COMMANDS.items():
        p = sub.add_parser(name, help=c.help, description=c.help)
        add_config_args(p)
        c.arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rlhf-studio` console script."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args) or 0
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
