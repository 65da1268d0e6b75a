"""The users a team server knows: parsed from ``server.users`` / ``server.users_file`` and kept in the Store."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlhf.config import AppConfig, ConfigError
from storage import Store
from storage.credentials import hash_password, is_password_hash, verify_password

ROLES = ("admin", "annotator")


class AuthConfigError(ConfigError):
    """A users spec or users file that cannot be used."""


# ---- users from config ------------------------------------------------------------------------------
def _check_user(name: Any, role: Any, where: str) -> tuple[str, str]:
    if not isinstance(name, str) or not name.strip() or len(name) > 64 or ":" in name:
        raise AuthConfigError(f"{where}: user name must be 1-64 characters without ':', got {name!r}")
    if role not in ROLES:
        raise AuthConfigError(f"{where}: role must be admin or annotator, got {role!r}")
    return name.strip(), role


def parse_users(spec: str) -> list[dict]:
    """``'alice:pw:admin,bob:pw'`` → [{name, password, role}]; the role defaults to annotator.

    The password is everything between the first ':' and a trailing ':admin' / ':annotator', so it may
    contain ':' but not ','; use a users file for anything else.
    """
    users = []
    for i, item in enumerate(p.strip() for p in (spec or "").split(",")):
        if not item:
            continue
        name, sep, rest = item.partition(":")
        if not sep:
            raise AuthConfigError(f"users entry {i + 1}: expected name:password[:role], got {name!r}")
        password, role = rest, "annotator"
        head, _, tail = rest.rpartition(":")
        if head and tail in ROLES:
            password, role = head, tail
        if not password:
            raise AuthConfigError(f"users entry {i + 1} ({name}): empty password")
        name, role = _check_user(name, role, f"users entry {i + 1}")
        users.append({"name": name, "password": password, "role": role})
    return users


def load_users_file(path: str | Path) -> list[dict]:
    """Users from a YAML/JSON file: a list (or ``{users: [...]}``) of {name, password | password_hash, role}."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise AuthConfigError(f"users file not found: {p}")
    try:
        tree = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise AuthConfigError(f"{p}: cannot parse: {exc}") from None
    if isinstance(tree, dict):
        tree = tree.get("users")
    if not isinstance(tree, list):
        raise AuthConfigError(f"{p}: expected a list of users (or a mapping with a 'users' list)")
    users = []
    for i, entry in enumerate(tree):
        where = f"{p} entry {i + 1}"
        if not isinstance(entry, dict):
            raise AuthConfigError(f"{where}: expected a mapping with name, password|password_hash, role")
        name, role = _check_user(entry.get("name"), entry.get("role", "annotator"), where)
        password, hashed = entry.get("password"), entry.get("password_hash")
        if (password is None) == (hashed is None):
            raise AuthConfigError(f"{where} ({name}): give exactly one of password or password_hash")
        if hashed is not None and not is_password_hash(hashed):
            raise AuthConfigError(f"{where} ({name}): password_hash is not a scrypt hash "
                                  "(make one with `rlhf-studio token --hash-password`)")
        if password is not None and (not isinstance(password, str) or not password):
            raise AuthConfigError(f"{where} ({name}): empty password")
        users.append({"name": name, "role": role, "password": password, "password_hash": hashed})
    return users


def configured_users(config: AppConfig) -> list[dict]:
    """Users from ``server.users`` and ``server.users_file`` (the file wins for a name in both)."""
    users = {u["name"]: u for u in parse_users(config.server.users)}
    if config.server.users_file:
        users.update({u["name"]: u for u in load_users_file(config.server.users_file)})
    return list(users.values())


def sync_users(store: Store, users: list[dict]) -> None:
    """Store each user's role and password hash (kept when the password is unchanged); forget removed users."""
    for u in users:
        stored = store.password_hash(u["name"])
        if u.get("password_hash"):
            new = u["password_hash"]
        elif stored and verify_password(u["password"], stored):
            new = stored  # same password: keep the hash instead of re-salting at every start
        else:
            new = hash_password(u["password"])
        store.set_password_hash(u["name"], new, role=u["role"])
    store.clear_passwords_except(u["name"] for u in users)
