"""The Store: one class over one SQLite file, safe from threads and processes."""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Iterator, Optional

from sqlite_utils import Database

from storage.agents import AgentsMixin
from storage.credentials import CredentialsMixin
from storage.errors import Conflict, InvalidInput, NotFound, StorageUnavailable, StoreBusy
from storage.comparisons import ComparisonsMixin
from storage.conversations import ConversationsMixin
from storage.feedback_rows import FeedbackExportMixin
from storage.jobs import JobsMixin
from storage.migrations import MIGRATIONS, schema_version
from storage.paths import DataDir, to_absolute, to_stored
from storage.ratings import RatingsMixin
from storage.vote_queue import QueueMixin
from storage.records import Annotator, Policy
from storage.util import check_text, dumps, utcnow

BUSY_TIMEOUT_S = 5.0  # the one bound on waiting for another writer (no retry loop on top)


def _private(path: Path) -> None:
    """Owner-only data: the data dir 0700, the database 0600 (created so when new; SQLite gives its -wal and -shm
    files the database's mode). Where that cannot be done (a read-only mount), opening the database says why."""
    try:
        if stat.S_IMODE(path.parent.stat().st_mode) != 0o700:
            os.chmod(path.parent, 0o700)
        if not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            if p.exists() and stat.S_IMODE(p.stat().st_mode) != 0o600:
                os.chmod(p, 0o600)
    except OSError:
        pass


class Store(AgentsMixin, ConversationsMixin, RatingsMixin, ComparisonsMixin, FeedbackExportMixin, JobsMixin, CredentialsMixin,
            QueueMixin):
    """All reads and writes of RLHF Studio's data. Records go in and out as frozen dataclasses."""

    def __init__(self, path: str | Path, max_text_chars: int = 8000, busy_timeout_s: float = BUSY_TIMEOUT_S):
        self.path = Path(path)
        self.root = DataDir.of_database(self.path).root  # the data dir: stored paths are relative to it
        self.busy_timeout_s = busy_timeout_s
        self.max_text_chars = max_text_chars
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _private(self.path)
            db = self.db
            with db.ensure_autocommit_on():
                db.execute("PRAGMA journal_mode=WAL")
            with self._tx():
                MIGRATIONS.apply(db)
        except (sqlite3.OperationalError, OSError) as exc:
            # SQLite says only "unable to open database file" when it cannot create its -wal/-shm files
            hint = " (the data directory is read-only)" \
                if self.path.parent.is_dir() and not os.access(self.path.parent, os.W_OK) else ""
            raise StorageUnavailable(f"cannot open the database at {self.path}: {exc}{hint}") from exc

    # ---- connections and transactions -------------------------------------------------------
    @property
    def db(self) -> Database:
        """This thread's sqlite-utils Database (one connection per thread)."""
        db = getattr(self._local, "db", None)
        if db is None:
            conn = sqlite3.connect(str(self.path), timeout=self.busy_timeout_s, check_same_thread=False)
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            conn.execute("PRAGMA synchronous=NORMAL")
            db = Database(conn, execute_plugins=False)
            self._local.db = db
            with self._conns_lock:
                self._conns.append(conn)
        return db

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Several Store calls as one write: all or none of them. Nested, it is a SAVEPOINT (a failed inner block
        undoes only its own writes); every named write method runs in one itself."""
        with self._tx():
            yield

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Several reads as one moment: a read transaction, in which a WAL reader sees the store as it was at its
        first read, whatever other connections write meanwhile. Inside a caller's transaction, that one."""
        conn = self.db.conn
        if conn.in_transaction:
            yield
            return
        conn.execute("BEGIN")
        try:
            yield
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")  # reads only: nothing to roll back

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Database]:
        """A write transaction: BEGIN IMMEDIATE outside, a SAVEPOINT when nested (an inner failure rolls back
        only its own writes). Waiting for another writer is bounded by ``busy_timeout``; past it: StoreBusy."""
        db = self.db
        if db.conn.in_transaction:
            self._local.depth = depth = getattr(self._local, "depth", 0) + 1
            name = f"sp{depth}"
            db.conn.execute(f"SAVEPOINT {name}")
            try:
                yield db
            except BaseException:
                db.conn.execute(f"ROLLBACK TO {name}")
                db.conn.execute(f"RELEASE {name}")
                raise
            else:
                db.conn.execute(f"RELEASE {name}")
            finally:
                self._local.depth = depth - 1
            return
        try:
            db.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise self._refused(exc) from exc
        try:
            yield db
        except BaseException:
            if db.conn.in_transaction:
                db.conn.execute("ROLLBACK")
            raise
        try:
            db.conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if db.conn.in_transaction:
                db.conn.execute("ROLLBACK")
            raise self._refused(exc) from exc

    def _refused(self, exc: sqlite3.OperationalError) -> StorageUnavailable:
        """The error for a write SQLite refused: StoreBusy when another writer held the lock too long."""
        if "locked" in str(exc) or "busy" in str(exc):
            return StoreBusy(retry_after=max(1.0, self.busy_timeout_s))
        return StorageUnavailable(f"database write refused: {exc}")

    def _insert(self, db: Database, table: str, row: dict) -> int:
        try:
            cur = db.execute(
                f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                list(row.values()))
        except sqlite3.IntegrityError as exc:
            raise InvalidInput(f"{table}: {exc}") from exc
        except sqlite3.OperationalError as exc:
            raise StorageUnavailable(f"cannot write to {table}: {exc}") from exc
        except (OverflowError, UnicodeEncodeError) as exc:
            raise InvalidInput(f"{table}: a value cannot be stored: {exc}") from exc
        return cur.lastrowid

    def _one(self, sql: str, params: list | tuple = ()) -> Optional[dict]:
        rows = self._all(sql, params)
        return rows[0] if rows else None

    def _all(self, sql: str, params: list | tuple = ()) -> list[dict]:
        try:
            return list(self.db.query(sql, params))
        except (OverflowError, UnicodeEncodeError):
            # A parameter SQLite cannot even bind (an id beyond 64 bits, text with a lone surrogate) names no
            # stored record: a lookup by it is a 404, not a crash.
            raise NotFound("no record matches: a number beyond SQLite's 64-bit range or invalid Unicode text") \
                from None

    def _stored_path(self, path: str | Path) -> str:
        """A path as it is kept in the database: relative to the data dir when it lies under it."""
        return to_stored(path, self.root)

    def _located(self, row: Optional[dict], column: str) -> Optional[dict]:
        """A row whose path ``column`` is absolute again (records always carry absolute paths)."""
        return None if row is None else {**row, column: to_absolute(row[column], self.root)}

    def close(self) -> None:
        """Close every connection this Store opened."""
        with self._conns_lock:
            for conn in self._conns:
                with contextlib.suppress(Exception):
                    conn.close()
            self._conns.clear()
        self._local = threading.local()

    def schema_version(self) -> int:
        """How many migrations have been applied."""
        return schema_version(self.db)

    def count(self, table: str) -> int:
        """Rows in a table (for health checks and tests)."""
        if table not in self.db.table_names():
            raise NotFound(f"no table {table!r}")
        return self.db[table].count

    # ---- annotators ------------------------------------------------------------------------
    def ensure_annotator(self, name: str, role: Optional[str] = None) -> Annotator:
        """The annotator with this name, created on first use."""
        name = check_text(name, "annotator name", 64).strip()
        with self._tx() as db:
            row = self._one("SELECT * FROM annotators WHERE name = ?", [name])
            if row is None:
                self._insert(db, "annotators", {"name": name, "role": role or "annotator", "created": utcnow()})
            elif role and row["role"] != role:
                db.execute("UPDATE annotators SET role = ? WHERE id = ?", [role, row["id"]])
            row = self._one("SELECT * FROM annotators WHERE name = ?", [name])
        return Annotator.from_row(row)

    def annotator_id(self, name: Optional[str]) -> Optional[int]:
        """Id for an optional annotator name (None stays None)."""
        if name is None or (isinstance(name, str) and not name.strip()):
            return None
        return self.ensure_annotator(name).id

    def list_annotators(self) -> list[Annotator]:
        return [Annotator.from_row(r) for r in self._all("SELECT * FROM annotators ORDER BY id")]

    def set_annotator_excluded(self, name: str, excluded: bool) -> Annotator:
        """Keep an annotator's feedback but leave it out of training (or bring it back)."""
        with self._tx() as db:
            row = self._one("SELECT * FROM annotators WHERE name = ?", [name])
            if row is None:
                raise NotFound(f"unknown annotator {name!r}")
            db.execute("UPDATE annotators SET excluded = ? WHERE id = ?", [int(bool(excluded)), row["id"]])
        return Annotator.from_row(self._one("SELECT * FROM annotators WHERE name = ?", [name]))

    # ---- policies ----------------------------------------------------------------------------
    def get_policy(self, policy_id: int) -> Policy:
        if not isinstance(policy_id, int) or isinstance(policy_id, bool):
            raise InvalidInput("policy_id must be an integer")
        row = self._one("SELECT * FROM policies WHERE id = ?", [policy_id])
        if row is None:
            raise NotFound(f"unknown policy {policy_id}")
        return Policy.from_row(self._located(row, "adapter_path"))

    def list_policies(self, agent: int | str | None = None) -> list[Policy]:
        """Versions of one agent (or all), oldest first."""
        if agent is None:
            rows = self._all("SELECT * FROM policies ORDER BY agent_id, version")
        else:
            rows = self._all("SELECT * FROM policies WHERE agent_id = ? ORDER BY version",
                             [self.get_agent(agent).id])
        return [Policy.from_row(self._located(r, "adapter_path")) for r in rows]

    def active_policy(self, agent: int | str) -> Policy:
        """The version an agent serves by default."""
        agent_id = self.get_agent(agent).id
        row = self._one("SELECT * FROM policies WHERE agent_id = ? AND status = 'active'", [agent_id])
        if row is None:  # every agent keeps one active version; guard against hand-edited DBs
            row = self._one("SELECT * FROM policies WHERE agent_id = ? AND status != 'broken' "
                            "ORDER BY version LIMIT 1", [agent_id])
        if row is None:
            raise NotFound(f"agent {agent!r} has no usable version")
        return Policy.from_row(self._located(row, "adapter_path"))

    def register_policy_version(self, agent: int | str, adapter_path: str, parent_id: Optional[int],
                                promote: bool, reward_model_id: Optional[int] = None,
                                job_id: Optional[int] = None, data_snapshot: Optional[dict] = None,
                                config: Optional[dict] = None, metrics: Optional[dict] = None) -> Policy:
        """Publish a trained version in ONE transaction (its adapter dir must already be in place)."""
        agent_id = self.get_agent(agent).id
        if not Path(adapter_path).is_dir():
            raise InvalidInput(f"adapter directory {adapter_path} does not exist")
        with self._tx() as db:
            version = self._one("SELECT COALESCE(MAX(version), 0) + 1 AS v FROM policies WHERE agent_id = ?",
                                [agent_id])["v"]
            if promote:
                db.execute("UPDATE policies SET status = 'candidate' WHERE agent_id = ? AND status = 'active'",
                           [agent_id])
            policy_id = self._insert(db, "policies", {
                "agent_id": agent_id, "version": version, "parent_id": parent_id,
                "adapter_path": self._stored_path(adapter_path),
                "status": "active" if promote else "candidate", "reward_model_id": reward_model_id,
                "job_id": job_id, "data_snapshot": dumps(data_snapshot or {}), "config": dumps(config or {}),
                "metrics": dumps(metrics or {}), "created": utcnow()})
        return self.get_policy(policy_id)

    def promote_policy(self, policy_id: int) -> Policy:
        """Make a version its agent's active one (rollback = promote an older version)."""
        policy = self.get_policy(policy_id)
        if policy.status == "broken":
            raise Conflict(f"policy {policy_id} is broken ({policy.error}); it cannot be promoted")
        with self._tx() as db:
            db.execute("UPDATE policies SET status = 'candidate' WHERE agent_id = ? AND status = 'active'",
                       [policy.agent_id])
            db.execute("UPDATE policies SET status = 'active' WHERE id = ?", [policy_id])
        return self.get_policy(policy_id)

    def archive_policy(self, policy_id: int) -> Policy:
        """Retire a version: kept for history, no longer served or offered in the arena."""
        policy = self.get_policy(policy_id)
        if policy.status == "active":
            raise Conflict("the active version cannot be archived; promote another version first")
        with self._tx() as db:
            db.execute("UPDATE policies SET status = 'archived' WHERE id = ?", [policy_id])
        return self.get_policy(policy_id)

    def unarchive_policy(self, policy_id: int) -> Policy:
        """An archived version back as a candidate (a reopened decision); Conflict for any other status."""
        policy = self.get_policy(policy_id)
        if policy.status != "archived":
            raise Conflict(f"policy {policy_id} is {policy.status}, not archived")
        with self._tx() as db:
            db.execute("UPDATE policies SET status = 'candidate' WHERE id = ? AND status = 'archived'", [policy_id])
        return self.get_policy(policy_id)

    def merge_policy_metrics(self, policy_id: int, values: dict) -> Policy:
        """Add or replace keys of a version's metrics (e.g. the outcome of people's votes); other keys stay."""
        self.get_policy(policy_id)
        with self._tx() as db:
            row = self._one("SELECT metrics FROM policies WHERE id = ?", [policy_id])
            merged = {**json.loads(row["metrics"] or "{}"), **values}
            db.execute("UPDATE policies SET metrics = ? WHERE id = ?", [dumps(merged), policy_id])
        return self.get_policy(policy_id)

    def mark_policy_broken(self, policy_id: int, reason: str) -> Policy:
        """A version whose adapter cannot be loaded; the agent falls back to its base if it was active."""
        policy = self.get_policy(policy_id)
        with self._tx() as db:
            db.execute("UPDATE policies SET status = 'broken', error = ? WHERE id = ?", [reason[:2000], policy_id])
            if policy.status == "active":
                db.execute("UPDATE policies SET status = 'active' WHERE agent_id = ? AND version = 0 "
                           "AND status != 'broken'", [policy.agent_id])
        return self.get_policy(policy_id)
