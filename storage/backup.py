"""The database half of a backup: an online copy while the app runs, and a check of a copy before it is used.

SQLite's online backup API copies a consistent snapshot of a live database (WAL readers never block the
app's writers). The copy is a single self-contained file (rollback journal); the Store turns WAL back on
when it opens it.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlite_utils import Database

from storage.errors import StorageUnavailable
from storage.migrations import schema_version
from storage.util import utcnow

BACKUP_INTERRUPTED = "interrupted: the backup was taken while it ran"


def _tables(conn: sqlite3.Connection) -> dict[str, int]:
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                        "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    return {name: conn.execute(f'SELECT COUNT(*) FROM "{name}"').fetchone()[0] for name in names}


def _schema_version(conn: sqlite3.Connection) -> int:
    return schema_version(Database(conn))


def backup_database(source: str | Path, dest: str | Path, busy_timeout_s: float = 5.0) -> dict:
    """Copy the database at ``source`` to the new file ``dest`` while others may write to it.

    Jobs that were running at that moment belong to processes of the original app: in the copy they are
    failed as interrupted, so a restored app never waits for them. Returns the copy's table counts and schema.
    """
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists")
    if not Path(source).is_file():
        raise StorageUnavailable(f"no database at {source}")
    src = sqlite3.connect(str(source), timeout=busy_timeout_s)  # read only; a WAL reader needs the -shm
    dst = sqlite3.connect(str(dest))
    try:
        src.backup(dst)  # all pages in one step: one consistent read snapshot
        dst.execute("UPDATE jobs SET status = 'failed', error = ?, finished = ?, pid = NULL WHERE status = 'running'",
                    [BACKUP_INTERRUPTED, utcnow()])
        dst.commit()
        dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
        return {"tables": _tables(dst), "schema_version": _schema_version(dst)}
    except sqlite3.Error as exc:
        raise StorageUnavailable(f"cannot back up the database at {source}: {exc}") from exc
    finally:
        src.close()
        dst.close()


def check_database(path: str | Path) -> dict:
    """Open a database copy read-only and check it: SQLite's integrity check, table counts, schema version.

    Raises StorageUnavailable when the file is not a sound database."""
    try:
        conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StorageUnavailable(f"cannot open {path}: {exc}") from exc
    try:
        verdict = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if verdict != "ok":
            raise StorageUnavailable(f"{path} fails SQLite's integrity check: {verdict}")
        return {"tables": _tables(conn), "schema_version": _schema_version(conn)}
    except sqlite3.Error as exc:
        raise StorageUnavailable(f"{path} is not a readable database: {exc}") from exc
    finally:
        conn.close()


def revoked_tokens(path: str | Path) -> set[str]:
    """Digests of the API tokens revoked in the database at ``path`` (empty when there is none, or no tokens)."""
    if not Path(path).is_file():
        return set()
    conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    try:
        if "api_tokens" not in _tables(conn):
            return set()
        return {r[0] for r in conn.execute("SELECT token_hash FROM api_tokens WHERE revoked = 1")}
    except sqlite3.Error:
        return set()
    finally:
        conn.close()


def strip_credentials(path: str | Path, keep_tokens: bool = False, revoked: set[str] = frozenset()) -> dict:
    """Sign-in secrets of a restored database, which its archive cannot vouch for: stored password hashes are
    cleared (the users config sets them again at the next start) and API tokens deleted, unless ``keep_tokens``:
    then they stay, except that a token revoked in ``revoked`` (the database being replaced) stays revoked.
    Returns ``{"passwords_cleared", "tokens_removed", "tokens_kept", "tokens_revoked"}``."""
    conn = sqlite3.connect(str(path))
    out = {"passwords_cleared": 0, "tokens_removed": 0, "tokens_kept": 0, "tokens_revoked": 0}
    try:
        tables = _tables(conn)
        columns = {r[1] for r in conn.execute("PRAGMA table_info(annotators)")}
        if "password_hash" in columns:
            out["passwords_cleared"] = conn.execute(
                "UPDATE annotators SET password_hash = NULL WHERE password_hash IS NOT NULL").rowcount
        if "api_tokens" in tables:
            if keep_tokens:
                marks = ",".join("?" for _ in revoked)
                out["tokens_revoked"] = conn.execute(
                    f"UPDATE api_tokens SET revoked = 1 WHERE revoked = 0 AND token_hash IN ({marks})",
                    list(revoked)).rowcount if revoked else 0
                out["tokens_kept"] = conn.execute("SELECT COUNT(*) FROM api_tokens WHERE revoked = 0").fetchone()[0]
            else:
                out["tokens_removed"] = conn.execute("DELETE FROM api_tokens").rowcount
                if conn.execute("SELECT COUNT(*) FROM api_tokens").fetchone()[0]:  # a trigger put rows back
                    raise StorageUnavailable(f"{path}: API tokens remain after they were removed")
        conn.commit()
        return out
    except sqlite3.Error as exc:
        raise StorageUnavailable(f"cannot clear the sign-in data of {path}: {exc}") from exc
    finally:
        conn.close()
