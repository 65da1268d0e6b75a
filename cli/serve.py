"""`rlhf-studio serve`: start the app (UI + REST API)."""
from __future__ import annotations

import argparse

from cli.common import Command, add_serve_args, config_from_args


def run_serve(args: argparse.Namespace) -> int:
    from rlhf.cpu import export_thread_env, thread_plan

    config = config_from_args(args)
    export_thread_env(thread_plan(config).serving_idle)  # before torch loads (ui.webapp imports it)
    from ui.webapp import serve

    serve(config)
    return 0


SERVE = Command("serve", "start the app (UI + REST API)", add_serve_args, run_serve)
