"""`rlhf-studio simulate`: simulated annotators drive the REST API with an oracle preference; progress bars on
stderr, the figures as one JSON line on stdout."""
from __future__ import annotations

import argparse
import json
import sys

from cli.common import Command, config_from_args


def add_simulate_args(p: argparse.ArgumentParser) -> None:
    from rlhf.simulate.oracles import ORACLES

    p.add_argument("--oracle", required=True, choices=sorted(ORACLES), help="the built-in preference to play")
    p.add_argument("--votes", type=int, required=True, help="how many comparisons to post")
    p.add_argument("--retrain", action="store_true", help="then retrain, wait, and measure the new version")
    p.add_argument("--url", default=None, help="the running app (default: http://HOST:PORT from the config)")
    p.add_argument("--agent", help="agent name (default: the first agent)")
    p.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts for the oracle's verdict")
    p.add_argument("--samples", type=int, default=2, help="replies per held-out prompt and version")
    p.add_argument("--max-new-tokens", type=int, default=64, help="reply length while annotating")
    p.add_argument("--train-set", metavar="KEY=VALUE", action="append", default=[],
                   help="config override sent with the retrain request (repeatable)")
    p.add_argument("--token", help="API token when the app has users configured")
    p.add_argument("--active", action="store_true",
                   help="vote on the vote queue's items (GET /queue/next) instead of self-made pairs")


class Bars:
    """``rlhf.simulate.annotators.Progress`` drawn on stderr: one tqdm bar per phase, a new phase (or a log line)
    closes the previous one."""

    def __init__(self):
        self.phase, self.bar = None, None

    def __call__(self, phase: str, done: int, total: int, note: str = "") -> None:
        from tqdm import tqdm

        if phase != self.phase:
            self.close()
            self.phase, self.bar = phase, tqdm(total=total, desc=phase, file=sys.stderr)
        self.bar.n = done
        if note:
            self.bar.set_postfix_str(note, refresh=False)
        self.bar.refresh()

    def log(self, message: str) -> None:
        self.close()
        print(message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.phase, self.bar = None, None


def run_simulate(args: argparse.Namespace) -> int:
    from rlhf.simulate.annotators import simulate

    if args.votes < 1:
        print("--votes must be at least 1", file=sys.stderr)
        return 2
    config = config_from_args(args)
    url = args.url or f"http://{config.server.host}:{config.server.port}"
    overrides = dict(item.split("=", 1) for item in args.train_set)
    bars = Bars()
    try:
        out = simulate(url, args.oracle, args.votes, args.retrain, args.agent, args.eval_prompts, overrides,
                       args.max_new_tokens, args.token, log=bars.log, samples=args.samples, active=args.active,
                       progress=bars)
    except (RuntimeError, TimeoutError) as exc:
        bars.close()
        print(f"simulate: {exc}", file=sys.stderr)
        return 1
    bars.close()
    print(json.dumps(out))
    return 0


SIMULATE = Command("simulate", "simulated annotators drive the REST API with an oracle preference",
                   add_simulate_args, run_simulate)
