"""A restored database is data, never code: its rows are copied into a freshly migrated schema.

A database file from an archive can hold more than rows: triggers (``AFTER DELETE ON api_tokens ... INSERT``
would undo the removal of its tokens), views, tables of its own, and queued jobs whose saved config the archive's
author wrote. ``rebuild_database`` builds a new file from this release's own migrations, up to the ones the
archive had applied (the Store applies the rest when it opens it, data migrations included), and copies only
the rows of the tables that schema knows, column by column. Nothing else of the archive's schema survives.
Jobs that were queued or running are failed with the reason: a restore never runs work it did not queue.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlite_utils import Database

from storage.errors import StorageUnavailable
from storage.migrations import MIGRATIONS
from storage.util import utcnow

RESTORED_JOB = "not run: the job was queued or running in a restored backup (queue it again if it is wanted)"


def _applied(conn: sqlite3.Connection) -> list[str]:
    """The names of the archive's applied migrations of our set, in order; StorageUnavailable for one we do not
    know (a newer release's database, or not ours)."""
    has_table = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                             [MIGRATIONS.migrations_table]).fetchone()
    if not has_table:
        raise StorageUnavailable("the database records no schema migrations: not an RLHF Studio database")
    names = [r[0] for r in conn.execute(f'SELECT name FROM "{MIGRATIONS.migrations_table}" '
                                        "WHERE migration_set = ? ORDER BY rowid", [MIGRATIONS.name])]
    known = _registered()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise StorageUnavailable(f"the database has schema migrations this release does not know ({', '.join(unknown)}"
                                 "): restore it with the release that wrote it, or a newer one")
    if names != known[:len(names)]:
        raise StorageUnavailable(f"the database's schema migrations {names} are not in this release's order")
    return names


def _registered() -> list[str]:
    """This release's migrations, in order (those an empty database would apply)."""
    return [m.name for m in MIGRATIONS.pending(Database(memory=True))]


def _columns(conn: sqlite3.Connection, schema: str, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA "{schema}".table_info("{table}")')]


def _objects(conn: sqlite3.Connection, schema: str) -> dict[str, str]:
    """name -> type of every table, view, trigger and index in ``schema`` (SQLite's own objects left out)."""
    return {r[0]: r[1] for r in conn.execute(f'SELECT name, type FROM "{schema}".sqlite_master '
                                             "WHERE name NOT LIKE 'sqlite_%'")}


def rebuild_database(source: str | Path, dest: str | Path) -> dict:
    """Copy the rows of the known tables of ``source`` into a new database ``dest`` with this release's schema;
    fail its queued and running jobs. Returns ``{"jobs_failed", "dropped"}`` (the names of the archive's schema
    objects that were not copied). StorageUnavailable when ``source`` is not a database this app can read."""
    source, dest = Path(source), Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists")
    try:
        archive = source.resolve().as_uri() + "?mode=ro"
        src = sqlite3.connect(archive, uri=True)
        try:
            src.execute("PRAGMA trusted_schema=OFF")
            applied = _applied(src)
        finally:
            src.close()
        pending = [name for name in _registered() if name not in applied]
        fresh = Database(str(dest), execute_plugins=False)
        MIGRATIONS.apply(fresh, stop_before=pending[:1] or None)
        fresh.close()
        conn = sqlite3.connect(str(dest), uri=True)
    except sqlite3.Error as exc:
        raise StorageUnavailable(f"cannot read the database {source}: {exc}") from exc
    try:
        conn.execute("PRAGMA trusted_schema=OFF")  # nothing in the archive's schema runs while its rows are read
        conn.execute("ATTACH DATABASE ? AS archive", [archive])
        ours, theirs = _objects(conn, "main"), _objects(conn, "archive")
        dropped = sorted(n for n, kind in theirs.items() if ours.get(n) != kind)
        with conn:
            for table in sorted(n for n, kind in ours.items() if kind == "table" and theirs.get(n) == "table"):
                if table == MIGRATIONS.migrations_table:
                    continue
                cols = ", ".join(f'"{c}"' for c in _columns(conn, "main", table)
                                 if c in _columns(conn, "archive", table))
                conn.execute(f'INSERT INTO main."{table}" ({cols}) SELECT {cols} FROM archive."{table}"')
            failed = conn.execute("UPDATE jobs SET status = 'failed', error = ?, finished = ?, pid = NULL "
                                  "WHERE status IN ('queued', 'running')", [RESTORED_JOB, utcnow()]).rowcount
        conn.execute("DETACH DATABASE archive")
        return {"jobs_failed": failed, "dropped": dropped}
    except sqlite3.Error as exc:
        raise StorageUnavailable(f"cannot copy the rows of {source}: {exc}") from exc
    finally:
        conn.close()
