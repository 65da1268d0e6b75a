"""`rlhf-studio token`: the admin tool for per-user API tokens (create, list, revoke) and password hashes."""
from __future__ import annotations

import argparse
import json
import sys

from cli.common import Command, config_from_args, open_data


def add_token_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="user to create an API token for (printed once)")
    p.add_argument("--label", default="", help="a note stored with the token (e.g. 'ci')")
    p.add_argument("--expires-in-days", type=float, metavar="DAYS", help="the token stops working after DAYS days")
    p.add_argument("--list", action="store_true", help="list tokens (of NAME, or all) without their secrets")
    p.add_argument("--revoke", type=int, metavar="ID", help="revoke the token with this id")
    p.add_argument("--hash-password", action="store_true",
                   help="read a password from stdin and print its hash for a users file's password_hash")


def print_password_hash() -> int:
    """`token --hash-password`: a password from the terminal (or one line of stdin) -> its hash."""
    import getpass

    from storage.credentials import hash_password

    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password:
        print("token: empty password", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0


def run_token(args: argparse.Namespace) -> int:
    from storage import StoreError

    if args.hash_password:
        return print_password_hash()
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


TOKEN = Command("token", "admin tool: create, list or revoke per-user API tokens; hash a password", add_token_args,
                run_token)
