"""`rlhf-studio bench WHAT`: the checkout's bench/ package (benchmarks are not installed), each benchmark with its
own flags."""
from __future__ import annotations

import argparse
import sys

from cli.common import Command, config_from_args


class BenchUnavailable(RuntimeError):
    """`rlhf-studio bench` ran from an installed package: the benchmarks are not in it."""


def checkout_bench():
    """The `bench` package of the source checkout this command runs from (benchmarks are not installed)."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not ((root / "bench" / "__init__.py").is_file() and (root / "pyproject.toml").is_file()):
        raise BenchUnavailable(f"the benchmarks live in the source checkout (bench/ beside cli/), and this "
                               f"command is installed without one ({root}); clone the repository and run "
                               f"`rlhf-studio bench` from it (make setup installs it editable)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module("bench")


def add_bench_args(p: argparse.ArgumentParser) -> None:
    try:
        names = sorted(checkout_bench().BENCHMARKS)
    except BenchUnavailable:
        names = None  # `bench` then says why it cannot run
    p.add_argument("what", choices=names, help="which benchmark; `rlhf-studio bench WHAT --help` lists its flags")
    p.add_argument("flags", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def bench_parser(what: str, module) -> argparse.ArgumentParser:
    """The parser of one benchmark: the config flags (given before WHAT or after it) and the benchmark's own."""
    p = argparse.ArgumentParser(prog=f"rlhf-studio bench {what}", description=(module.__doc__ or "").split("\n")[0])
    p.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help="YAML config file")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=argparse.SUPPRESS,
                   help="override a config field (repeatable)")
    module.add_arguments(p)
    return p


def run_bench(args: argparse.Namespace) -> int:
    try:
        bench = checkout_bench()
    except BenchUnavailable as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    bench_parser(args.what, bench.benchmark(args.what)).parse_args(args.flags, namespace=args)
    bench.runner(args.what, args).run(config_from_args(args), args)  # each calls bench.report.report(...)
    return 0


BENCH = Command("bench", "run a benchmark (from a source checkout); prints a table, appends to BENCHMARKS.md, prints "
                "one JSON line last", add_bench_args, run_bench)
