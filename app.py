"""RLHF Studio entry point (also the Hugging Face Spaces app file): config → Store → model → UI → launch."""
from __future__ import annotations

import sys

from rlhf.cli import config_from_args, serve_parser
from ui.server import serve


def main(argv: list[str] | None = None) -> None:
    args = serve_parser().parse_args(sys.argv[1:] if argv is None else argv)
    serve(config_from_args(args))


if __name__ == "__main__":
    main()
