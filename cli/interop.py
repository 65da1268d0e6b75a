"""`rlhf-studio export`, `import-policy` and `push-policy`: feedback and versions in and out of the studio (the
command side of rlhf/interop/: export.py, import_policy.py, hub.py). Each prints one JSON line."""
from __future__ import annotations

import argparse
import json
import sys

from cli.common import Command, config_from_args, open_data


def add_export_args(p: argparse.ArgumentParser) -> None:
    from rlhf.interop.export import FORMATS

    p.add_argument("--format", required=True, choices=FORMATS, help="what to write (see docs/exports.md)")
    p.add_argument("--out", required=True, metavar="PATH", help="file to write, or a new directory for "
                   "hf / openrlhf / verl")
    p.add_argument("--agent", help="one agent's feedback (default: every agent)")
    p.add_argument("--push-to-hub", metavar="REPO", help="hf only: also push the dataset (private) to this "
                   "hub repo; needs HF_TOKEN")


def run_export(args: argparse.Namespace) -> int:
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


def run_import_policy(args: argparse.Namespace) -> int:
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


def add_push_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("policy_id", metavar="ID", type=int, help="the version's policy id (GET /api/v1/policies)")
    p.add_argument("--repo", required=True, metavar="NAME", help="Hub model repo, e.g. your-name/assistant-rlhf")
    p.add_argument("--public", action="store_true", help="create the repo public, or push into a public one "
                   "(default: private; an existing public repo is refused)")
    p.add_argument("--with-system-prompt", action="store_true", help="quote the agent's system prompt in the model "
                   "card (default: the card says there is one, without it)")


def run_push_policy(args: argparse.Namespace) -> int:
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


EXPORT = Command("export", "export feedback as jsonl, parquet, hf, trl-preference, kto, openrlhf or verl",
                 add_export_args, run_export)
IMPORT_POLICY = Command("import-policy", "register a policy trained elsewhere (PEFT adapter or full model dir) as a "
                        "version", add_import_args, run_import_policy)
PUSH_POLICY = Command("push-policy", "push a version to the Hugging Face Hub as a PEFT model with its model card; "
                      "needs HF_TOKEN", add_push_args, run_push_policy)
