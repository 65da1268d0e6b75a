"""`rlhf-studio` command line (also `python -m cli` from a checkout): a thin entry over the app's own functions —
the config, the Store, the rlhf jobs and the server. It sits beside app.py, outside the packages: `rlhf` never imports
it, `ui` or `bench`."""
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
    from rlhf.cpu import export_thread_env, thread_plan

    config = config_from_args(args)
    export_thread_env(thread_plan(config).serving_idle)  # before torch loads (ui.webapp imports it)
    from ui.webapp import serve

    serve(config)
    return 0


@command("config", "show the effective config as YAML (show) or the manual's reference table (docs)",
         lambda p: p.add_argument("action", choices=["show", "docs"], help="show | docs"))
def cmd_config(args: argparse.Namespace) -> int:
    from rlhf.config import markdown_table

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


# ---- reward model (issue 3) ----
def add_reward_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", metavar="NAME", help="agent whose feedback is used (default: the first agent)")


@command("train-reward", "train a reward model on the Store's feedback; prints one JSON line last",
         add_reward_args)
def cmd_train_reward(args: argparse.Namespace) -> int:
    import contextlib
    import json

    from tqdm import tqdm

    from rlhf.training.data import DataError, NotEnoughData
    from rlhf.base_models import ModelNotFound
    from rlhf.training.reward import RewardModelError, train_reward_model
    from storage import NotFound, Store

    config = config_from_args(args)
    store = Store(config.db_path, max_text_chars=config.serving.max_message_chars)
    bar = tqdm(total=100, file=sys.stderr, desc="reward",
               bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed}{postfix}")

    def progress(fraction: float, phase: str, metrics: dict | None) -> None:
        bar.set_description(phase)
        if metrics and "reward/train_loss" in metrics:
            bar.set_postfix(loss=f"{metrics['reward/train_loss']:.4f}")
        bar.update(max(0, round(100 * fraction) - bar.n))

    try:
        with contextlib.redirect_stdout(sys.stderr):  # library prints must not mix with the JSON line
            result = train_reward_model(store, config, args.agent, progress=progress)
    except (NotEnoughData, NotFound) as exc:
        bar.close()
        print(f"cannot train a reward model: {exc}", file=sys.stderr)
        return 2
    except (DataError, ModelNotFound, RewardModelError) as exc:
        bar.close()
        print(f"reward model training failed: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    bar.close()
    print(json.dumps(result.summary()), flush=True)
    return 0


# ---- PPO (issue 4) ----
def _train_ppo_args(p: argparse.ArgumentParser) -> None:
    from rlhf.training.ppo.run import add_train_ppo_args

    add_train_ppo_args(p)


@command("train-ppo", "PPO-train an agent's policy (LoRA) against its reward model; prints one JSON line last",
         _train_ppo_args)
def cmd_train_ppo(args: argparse.Namespace) -> int:
    from rlhf.training.ppo.run import run_train_ppo

    return run_train_ppo(config_from_args(args), args)


# ---- jobs, simulate (issue 5) ----
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


@command("simulate", "simulated annotators drive the REST API with an oracle preference", add_simulate_args)
def cmd_simulate(args: argparse.Namespace) -> int:
    import json

    from rlhf.simulate.annotators import simulate

    if args.votes < 1:
        print("--votes must be at least 1", file=sys.stderr)
        return 2
    config = config_from_args(args)
    url = args.url or f"http://{config.server.host}:{config.server.port}"
    overrides = dict(item.split("=", 1) for item in args.train_set)
    try:
        out = simulate(url, args.oracle, args.votes, args.retrain, args.agent, args.eval_prompts, overrides,
                       args.max_new_tokens, args.token, samples=args.samples, active=args.active)
    except (RuntimeError, TimeoutError) as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


# ---- export, import (issue 7) ----
def open_data(config: AppConfig):
    """The Store under the config's data dir (created on first use)."""
    from storage import Store

    return Store(config.db_path, max_text_chars=config.serving.max_message_chars)


def add_export_args(p: argparse.ArgumentParser) -> None:
    from rlhf.interop.export import FORMATS

    p.add_argument("--format", required=True, choices=FORMATS, help="what to write (see docs/exports.md)")
    p.add_argument("--out", required=True, metavar="PATH", help="file to write, or a new directory for "
                   "hf / openrlhf / verl")
    p.add_argument("--agent", help="one agent's feedback (default: every agent)")
    p.add_argument("--push-to-hub", metavar="REPO", help="hf only: also push the dataset (private) to this "
                   "hub repo; needs HF_TOKEN")


@command("export", "export feedback as jsonl, parquet, hf, trl-preference, kto, openrlhf or verl", add_export_args)
def cmd_export(args: argparse.Namespace) -> int:
    import json

    from rlhf.interop.export import ExportError, export
    from storage import StoreError

    config = config_from_args(args)
    store = open_data(config)
    try:
        result = export(store, config, args.format, args.out, args.agent, args.push_to_hub)
    except (ExportError, StoreError) as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    print(json.dumps({"format": result.format, "path": str(result.path), "files": result.files,
                      "counts": result.counts}))
    return 0


def add_import_args(p: argparse.ArgumentParser) -> None:
    from rlhf.interop.import_policy import DEFAULT_TARGETS

    p.add_argument("path", help="a PEFT adapter directory or a full model directory (same architecture as the "
                   "agent's base)")
    p.add_argument("--agent", required=True, help="the agent that gets the new version")
    p.add_argument("--rank", type=int, default=16, help="full models only: LoRA rank of the extracted adapter")
    p.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                   help="full models only: comma-separated linear modules to extract")
    p.add_argument("--promote", action="store_true", help="make it the active version at once (default: candidate)")


@command("import-policy", "register a policy trained elsewhere (PEFT adapter or full model dir) as a version",
         add_import_args)
def cmd_import_policy(args: argparse.Namespace) -> int:
    import json

    from rlhf.interop.import_policy import PolicyImportError, import_policy
    from storage import StoreError

    config = config_from_args(args)
    store = open_data(config)
    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    try:
        result = import_policy(store, config, args.path, args.agent, args.rank, targets, args.promote)
    except (PolicyImportError, StoreError, FileNotFoundError) as exc:
        print(f"import-policy: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    p = result.policy
    print(json.dumps({"policy_id": p.id, "version": p.version, "status": p.status, "kind": result.kind,
                      "rank": result.rank, "metrics": result.metrics}))
    return 0


def add_token_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="user to create an API token for (printed once)")
    p.add_argument("--label", default="", help="a note stored with the token (e.g. 'ci')")
    p.add_argument("--expires-in-days", type=float, metavar="DAYS", help="the token stops working after DAYS days")
    p.add_argument("--list", action="store_true", help="list tokens (of NAME, or all) without their secrets")
    p.add_argument("--revoke", type=int, metavar="ID", help="revoke the token with this id")
    p.add_argument("--hash-password", action="store_true",
                   help="read a password from stdin and print its hash for a users file's password_hash")


@command("token", "admin tool: create, list or revoke per-user API tokens; hash a password", add_token_args)
def cmd_token(args: argparse.Namespace) -> int:
    import getpass
    import json

    from storage import StoreError
    from storage.credentials import hash_password

    if args.hash_password:
        password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
        if not password:
            print("token: empty password", file=sys.stderr)
            return 2
        print(hash_password(password))
        return 0
    config = config_from_args(args)
    store = open_data(config)
    try:
        if args.revoke is not None:
            store.revoke_api_token(args.revoke)
            print(json.dumps({"revoked": args.revoke}))
        elif args.list:
            print(json.dumps(store.list_api_tokens(args.name)))
        elif args.name:
            token = store.create_api_token(args.name, args.label, args.expires_in_days)
            print(token)
            print(f"API token for {args.name!r}: send it as 'Authorization: Bearer <token>'. It is shown only now; "
                  "the user must be configured (server.users / users_file) or, on Spaces, signed in by that name.",
                  file=sys.stderr)
        else:
            print("token: give a NAME, --list, --revoke ID or --hash-password", file=sys.stderr)
            return 2
    except StoreError as exc:
        print(f"token: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return 0


# ---- backup, restore, publishing a version (issue 28) ----
def add_backup_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", help="archive to write (.tar, or .tar.gz / .tgz for gzip); must not exist")


@command("backup", "back up the data dir (database, adapters, reward models) into one checksummed archive; the app "
         "may keep running", add_backup_args)
def cmd_backup(args: argparse.Namespace) -> int:
    import json

    from rlhf.backup import BackupError, backup

    try:
        print(json.dumps(backup(config_from_args(args), args.out)))
    except BackupError as exc:
        print(f"backup: {exc}", file=sys.stderr)
        return 1
    return 0


def add_restore_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("archive", metavar="ARCHIVE", help="a backup written by `rlhf-studio backup`")
    p.add_argument("--data", metavar="DIR", help="data dir to restore into (default: the config's data_dir)")
    p.add_argument("--force", action="store_true", help="replace the database, adapters, reward models and runs of "
                   "a non-empty data dir (stop its app first)")
    p.add_argument("--keep-tokens", action="store_true", help="keep the archive's API tokens (default: removed, as "
                   "the archive cannot vouch for them; tokens the replaced database revoked stay revoked)")


@command("restore", "verify a backup's checksums and restore it into a new or empty data dir", add_restore_args)
def cmd_restore(args: argparse.Namespace) -> int:
    import json

    from rlhf.backup import BackupError, restore

    target = args.data or config_from_args(args).data_dir
    try:
        print(json.dumps(restore(args.archive, target, force=args.force, keep_tokens=args.keep_tokens)))
    except BackupError as exc:
        print(f"restore: {exc}", file=sys.stderr)
        return 1
    return 0


def add_push_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("policy_id", metavar="ID", type=int, help="the version's policy id (GET /api/v1/policies)")
    p.add_argument("--repo", required=True, metavar="NAME", help="Hub model repo, e.g. your-name/assistant-rlhf")
    p.add_argument("--public", action="store_true", help="create the repo public, or push into a public one "
                   "(default: private; an existing public repo is refused)")
    p.add_argument("--with-system-prompt", action="store_true", help="quote the agent's system prompt in the model "
                   "card (default: the card says there is one, without it)")


@command("push-policy", "push a version to the Hugging Face Hub as a PEFT model with its model card; needs "
         "HF_TOKEN", add_push_args)
def cmd_push_policy(args: argparse.Namespace) -> int:
    import json

    from rlhf.interop.hub import HubError, push_policy
    from storage import StoreError

    config = config_from_args(args)
    if not config.server.hf_token:
        print("push-policy: needs a Hugging Face token with write access: set HF_TOKEN (or server.hf_token)",
              file=sys.stderr)
        return 2
    store = open_data(config)
    try:
        print(json.dumps(push_policy(store, config, args.policy_id, args.repo, private=not args.public,
                                     with_system_prompt=args.with_system_prompt)))
    except (HubError, StoreError) as exc:
        print(f"push-policy: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return 0


# ---- benchmarks (issue 8): the checkout's bench/ package, each benchmark with its own flags ----
class BenchUnavailable(RuntimeError):
    """`rlhf-studio bench` ran from an installed package: the benchmarks are not in it."""


def checkout_bench():
    """The `bench` package of the source checkout this command runs from (benchmarks are not installed)."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parent
    if not ((root / "bench" / "__init__.py").is_file() and (root / "pyproject.toml").is_file()):
        raise BenchUnavailable(f"the benchmarks live in the source checkout (bench/ beside cli.py), and this "
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


@command("bench", "run a benchmark (from a source checkout); prints a table, appends to BENCHMARKS.md, prints one "
         "JSON line last", add_bench_args)
def cmd_bench(args: argparse.Namespace) -> int:
    try:
        bench = checkout_bench()
    except BenchUnavailable as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    bench_parser(args.what, bench.benchmark(args.what)).parse_args(args.flags, namespace=args)
    bench.runner(args.what, args).run(config_from_args(args), args)  # each calls bench.report.report(...)
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
