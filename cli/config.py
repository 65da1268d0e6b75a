"""`rlhf-studio config show|docs`: the effective config as YAML, or the manual's reference table."""
from __future__ import annotations

import argparse

from cli.common import Command, config_from_args


def add_config_action(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["show", "docs"], help="show | docs")


def run_config(args: argparse.Namespace) -> int:
    from rlhf.config import markdown_table, to_yaml

    if args.action == "docs":
        print(markdown_table(), end="")
        return 0
    import json

    from rlhf.cpu import thread_plan

    config = config_from_args(args)
    plan = thread_plan(config)
    # The budget as YAML comments: the output stays a config file that `--config` accepts.
    print(to_yaml(config) + f"# CPU budget on this machine: {plan.describe()}\n"
          f"# {json.dumps(plan.to_dict())}", flush=True)
    return 0


CONFIG = Command("config", "show the effective config as YAML (show) or the manual's reference table (docs)",
                 add_config_action, run_config)
