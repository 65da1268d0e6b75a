"""`rlhf-studio backup` and `rlhf-studio restore`: the data dir into one checksummed archive and back (rlhf/backup.py);
each prints one JSON line."""
from __future__ import annotations

import argparse
import json
import sys

from cli.common import Command, config_from_args


def add_backup_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", help="archive to write (.tar, or .tar.gz / .tgz for gzip); must not exist")


def run_backup(args: argparse.Namespace) -> int:
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


def run_restore(args: argparse.Namespace) -> int:
    from rlhf.backup import BackupError, restore

    target = args.data or config_from_args(args).data_dir
    try:
        print(json.dumps(restore(args.archive, target, force=args.force, keep_tokens=args.keep_tokens)))
    except BackupError as exc:
        print(f"restore: {exc}", file=sys.stderr)
        return 1
    return 0


BACKUP = Command("backup", "back up the data dir (database, adapters, reward models) into one checksummed archive; "
                 "the app may keep running", add_backup_args, run_backup)
RESTORE = Command("restore", "verify a backup's checksums and restore it into a new or empty data dir",
                  add_restore_args, run_restore)
