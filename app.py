"""RLHF Studio entry point (also the Hugging Face Spaces app file): config → Store → model → UI → launch."""
from __future__ import annotations

import sys

from cli import config_from_args, serve_parser
from rlhf.config import ConfigError
from rlhf.cpu import export_thread_env, thread_plan
from rlhf.serving.interface import EngineUnavailable


def build(argv: list[str] | None = None):
    """The app exactly as `python app.py` would serve it (config from env and args), without a server.

    The services (Store, model server, scheduler) ride on ``app.state.services``; close them when done.
    """
    from ui.webapp import build_services, create_app

    args = serve_parser().parse_args([] if argv is None else argv)
    services = build_services(config_from_args(args))
    app = create_app(services)
    app.state.services = services
    return app


def main(argv: list[str] | None = None) -> int:
    args = serve_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = config_from_args(args)
        export_thread_env(thread_plan(config).serving_idle)  # the CPU budget, before torch loads (ui.webapp imports it)
        from ui.webapp import serve

        serve(config)
    except ConfigError as exc:  # a config that cannot run safely: one clear line, no traceback
        print(f"config error: {exc}", file=sys.stderr, flush=True)
        return 2
    except EngineUnavailable as exc:  # no engine serves here, every reason given: one clear line, no traceback
        print(f"serving error: {exc}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
