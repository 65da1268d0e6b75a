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
