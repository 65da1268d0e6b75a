"""Back up a data dir into one checksummed archive while the app runs, and restore it anywhere.

The archive (tar, gzip when the name ends in .gz or .tgz) holds ``studio.db`` (an online SQLite copy,
``storage.backup``), every version adapter under ``policies/`` and every reward model under
``reward_models/``, and last ``MANIFEST.json``: the SHA-256 and size of every file, the schema version and
the table counts. The database is copied first: a directory is renamed into place before its row is
inserted, so every directory the copy names is already complete on disk. Temp dirs of writes in flight
(``rlhf.files.is_temp_dir``) are left out. Converted base models (``models/``), PPO runs and job logs are
not in it: they are rebuilt or belong to the machine. Stored paths are relative to the data dir, so the
restored data dir works at any path.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator

from rlhf.config import AppConfig
from rlhf.files import atomic_file, is_temp_dir
from storage.backup import backup_database, check_database, revoked_tokens, strip_credentials
from storage.errors import StorageUnavailable
from storage.paths import DataDir
from storage.rebuild import rebuild_database
from storage.util import utcnow

FORMAT = "rlhf-studio-backup"
FORMAT_VERSION = 1
MANIFEST = "MANIFEST.json"
DATABASE = DataDir.DATABASE
FILE_TREES = DataDir.BACKED_UP  # data-dir sub-directories that travel in a backup
CHUNK = 1 << 20
MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists names and digests: megabytes at most
SHA256 = re.compile(r"[0-9a-f]{64}")


class BackupError(RuntimeError):
    """A backup or restore that cannot be done; the message says why and what to do."""


class _Hashing:
    """A read-only file wrapper that hashes what ``tarfile`` reads through it."""

    def __init__(self, f: BinaryIO):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        chunk = self.f.read(n)
        self.sha.update(chunk)
        self.size += len(chunk)
        return chunk


def _files(data: Path) -> Iterator[tuple[Path, str]]:
    """(path, archive name) of every regular file of the data dir that travels, skipping temp dirs and links."""
    for tree in FILE_TREES:
        root = data / tree
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not is_temp_dir(Path(d)))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if path.is_file() and not path.is_symlink() and not is_temp_dir(path):
                    yield path, PurePosixPath(*path.relative_to(data).parts).as_posix()


def _add(tar: tarfile.TarFile, path: Path, name: str) -> dict:
    info = tar.gettarinfo(str(path), arcname=name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    with open(path, "rb") as f:
        reader = _Hashing(f)
        tar.addfile(info, reader)
    return {"sha256": reader.sha.hexdigest(), "size": reader.size}


def _write_mode(out: Path) -> str:
    return "w:gz" if out.name.endswith((".gz", ".tgz")) else "w"


def backup(config: AppConfig, out: str | Path) -> dict:
    """Write the data dir of ``config`` (the app may be running) to the archive ``out``; returns a summary."""
    data, out = config.paths, Path(out).expanduser()
    if out.exists():
        raise BackupError(f"{out} already exists; choose a new file name")
    if not data.db.is_file():
        raise BackupError(f"no database at {data.db}: is {data.root} the app's data dir (RLHF_DATA_DIR)?")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlhf-backup-", dir=out.parent) as work:
        db_copy = Path(work) / DATABASE
        try:
            db_info = backup_database(data.db, db_copy)
        except StorageUnavailable as exc:
            raise BackupError(str(exc)) from exc
        files, vanished = {}, []
        with atomic_file(out) as tmp, tarfile.open(tmp, _write_mode(out)) as tar:
            files[DATABASE] = _add(tar, db_copy, DATABASE)
            for path, name in _files(data.root):
                if not DataDir.is_artefact(name):  # not a file the app wrote: a restore would refuse it
                    vanished.append(name)
                    continue
                try:
                    files[name] = _add(tar, path, name)
                except FileNotFoundError:  # an unregistered leftover removed while we read (never a version)
                    vanished.append(name)
            manifest = {"format": FORMAT, "version": FORMAT_VERSION, "created": utcnow(), "source": str(data.root),
                        **db_info, "files": files}
            blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime = len(blob), int(Path(db_copy).stat().st_mtime)
            tar.addfile(info, io.BytesIO(blob))
    return {"archive": str(out), "files": len(files), "bytes": out.stat().st_size,
            "schema_version": db_info["schema_version"], "tables": db_info["tables"], "skipped": vanished}


def read_manifest(tar: tarfile.TarFile) -> dict:
    """The archive's manifest, checked for its format, its shape (every entry ``{"sha256", "size"}``) and for safe
    file names; BackupError naming what is wrong."""
    try:
        member = tar.getmember(MANIFEST)
        if member.size > MAX_MANIFEST_BYTES:
            raise BackupError(f"{MANIFEST} is {member.size:,} bytes; a manifest is far smaller: not a backup of ours")
        manifest = json.loads(tar.extractfile(member).read(MAX_MANIFEST_BYTES))
    except (KeyError, AttributeError, ValueError) as exc:
        raise BackupError(f"not an RLHF Studio backup, or an incomplete one (no readable {MANIFEST})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"),
                                                                                            dict):
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise BackupError(f"not an RLHF Studio backup ({MANIFEST} has format {found!r})")
    version = manifest.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise BackupError(f"{MANIFEST}: the format version must be a whole number, got {version!r}")
    if version > FORMAT_VERSION:
        raise BackupError(f"this backup has format version {manifest['version']}; this release reads up to "
                          f"{FORMAT_VERSION}: restore it with a newer rlhf-studio")
    for name, entry in manifest["files"].items():
        p = PurePosixPath(name)
        if p.is_absolute() or ".." in p.parts or (name != DATABASE and p.parts[0] not in FILE_TREES):
            raise BackupError(f"the backup names an unsafe or unknown path {name!r}; refusing to restore it")
        if not DataDir.is_artefact(name):
            raise BackupError(f"the backup holds {name!r}, which is not a file the app writes (a restore brings back "
                              f"{DATABASE} and, under {' and '.join(FILE_TREES)}/, files ending in "
                              f"{', '.join(DataDir.ARTEFACT_SUFFIXES)}); refusing to restore it")
        size = entry.get("size") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                or not SHA256.fullmatch(entry["sha256"]) or not isinstance(size, int) or isinstance(size, bool) \
                or size < 0:
            raise BackupError(f"{MANIFEST}: the entry of {name!r} must be {{\"sha256\": 64 hex digits, \"size\": "
                              f"bytes}}, got {str(entry)[:80]!r}; refusing to restore")
    if DATABASE not in manifest["files"]:
        raise BackupError(f"the backup holds no {DATABASE}")
    return manifest


def _check_room(manifest: dict, staging: Path) -> None:
    """Refuse an archive whose files would not fit where they are staged (before a byte is written)."""
    need = sum(entry["size"] for entry in manifest["files"].values())
    free = shutil.disk_usage(staging).free
    if need > free:
        raise BackupError(f"the backup's files take {need:,} bytes and only {free:,} are free beside the target; "
                          "nothing was restored")


def _extract(tar: tarfile.TarFile, manifest: dict, staging: Path) -> list[str]:
    """Write every listed file under ``staging``, checking its size and SHA-256; the names that do not match."""
    members = {m.name: m for m in tar.getmembers()}
    bad = []
    for name, want in sorted(manifest["files"].items()):
        member = members.get(name)
        if member is None or not member.isfile():
            bad.append(f"{name} (missing)")
            continue
        if member.size != want["size"]:  # checked before writing: a small archive cannot fill the disk
            bad.append(f"{name} ({member.size:,} bytes where the manifest says {want['size']:,})")
            continue
        target = staging / name
        target.parent.mkdir(parents=True, exist_ok=True)
        sha, size = hashlib.sha256(), 0
        with tar.extractfile(member) as src, open(target, "wb") as dst:
            while size < want["size"] and (chunk := src.read(min(CHUNK, want["size"] - size))):
                sha.update(chunk)
                size += len(chunk)
                dst.write(chunk)
        if sha.hexdigest() != want["sha256"] or size != want["size"]:
            bad.append(f"{name} (checksum mismatch)")
    extra = sorted(set(members) - set(manifest["files"]) - {MANIFEST})
    return bad + [f"{name} (not in the manifest)" for name in extra]


def _clear_target(target: Path) -> None:
    """Remove what a restore replaces in ``target``: the database (and its WAL), adapters, reward models and runs
    (a PPO run dir of another database's job would be taken for this one's checkpoint)."""
    for path in DataDir(target).db_files:
        path.unlink(missing_ok=True)
    for tree in (*FILE_TREES, DataDir.RUNS):
        if (target / tree).exists():
            aside = target / f".{tree}.tmp-restore-old"
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(target / tree, aside)
            shutil.rmtree(aside, ignore_errors=True)


def _rebuild(staging: Path) -> dict:
    """Replace the staged database with its rows copied into a fresh schema (``storage.rebuild``): the archive's
    own triggers, views and tables are left behind, its queued and running jobs failed."""
    rebuilt = staging.parent / f".{staging.name}.rebuilt.db"
    try:
        out = rebuild_database(staging / DATABASE, rebuilt)
        os.replace(rebuilt, staging / DATABASE)
    finally:
        rebuilt.unlink(missing_ok=True)
    return {"jobs_failed": out["jobs_failed"], "schema_dropped": out["dropped"]}


def restore(archive: str | Path, target: str | Path, force: bool = False, keep_tokens: bool = False) -> dict:
    """Verify every checksum of ``archive`` and restore it into the data dir ``target``.

    A non-empty ``target`` is refused unless ``force``: then its database, adapters, reward models and PPO runs
    are replaced (converted base models stay). Nothing in ``target`` changes unless every file checks out.
    Only data comes back: files the app writes (``DataDir.is_artefact``; a ``.py`` is refused), and the database's
    rows, copied into a freshly migrated schema; its queued and running jobs are failed with the reason.
    The archive cannot vouch for sign-in secrets: stored password hashes are cleared (the users config sets them
    at the next start) and API tokens removed, unless ``keep_tokens``; then a token the replaced database had
    revoked stays revoked. Stop the app that uses ``target`` first."""
    archive, target = Path(archive).expanduser(), Path(target).expanduser()
    if not archive.is_file():
        raise BackupError(f"no backup archive at {archive}")
    if target.exists() and not target.is_dir():
        raise BackupError(f"{target} is a file, not a data dir")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise BackupError(f"{target} is not empty; restore into a new or empty directory, or pass --force to "
                          "replace its database, adapters and reward models")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-restore-", dir=target.parent))
    try:
        try:
            with tarfile.open(archive, "r:*") as tar:
                manifest = read_manifest(tar)
                _check_room(manifest, staging)
                bad = _extract(tar, manifest, staging)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise BackupError(f"cannot read {archive}: {exc}") from exc
        if bad:
            raise BackupError(f"{archive} is damaged; nothing was restored. Files that do not check out: "
                              + ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else ""))
        try:
            check_database(staging / DATABASE)
            rebuilt = _rebuild(staging)
            revoked = revoked_tokens(DataDir(target).db) if force else set()
            credentials = strip_credentials(staging / DATABASE, keep_tokens, revoked)
            db_info = check_database(staging / DATABASE)
        except StorageUnavailable as exc:
            raise BackupError(f"the database in {archive} is damaged: {exc}") from exc
        target.mkdir(parents=True, exist_ok=True, mode=0o700)
        if force:
            _clear_target(target)
        for entry in sorted(staging.iterdir()):
            os.rename(entry, target / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"data_dir": str(target), "files": len(manifest["files"]), "backup_created": manifest.get("created"),
            "schema_version": db_info["schema_version"], "tables": db_info["tables"], **rebuilt, **credentials}
