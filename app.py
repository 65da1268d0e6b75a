"""RLHF Studio entry point (also the Hugging Face Spaces app file): config → Store → model → UI → launch."""
from __future__ import annotations

import sys

from rlhf.cli import config_from_args, serve_parser
from ui.server import build_services, create_app, serve


def build(argv: list[str] | None = None):
    """The app exactly as `python app.py` would serve it (config from env and args), without a server.

    The services (Store, model server, scheduler) ride on ``app.state.services``; close them when done.
    """
    args = serve_parser().parse_args([] if argv is None else argv)
    services = build_services(config_from_args(args))
    app = create_app(services)
    app.state.services = services
    return app


def main(argv: list[str] | None = None) -> None:
    args = serve_parser().parse_args(sys.argv[1:] if argv is None else argv)
    serve(config_from_args(args))


if __name__ == "__main__":
    main()
