"""Backup and restore of a data dir: one checksummed archive, verified before anything is restored.

The end-to-end version (a running app backed up mid-retrain, restored and served elsewhere) is
tests/e2e/test_backup_restore.py.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from rlhf.backup import MANIFEST, BackupError, backup, restore
from cli import main
from rlhf.config import apply_overrides
from rlhf.retrain.publish import check_adapters, clean_leftovers, publish_version
from storage import Store
from storage.backup import BACKUP_INTERRUPTED, check_database
from tests.conftest import make_adapter

FEEDBACK = ("conversations", "messages", "ratings", "comparisons", "annotators", "policies", "reward_models")


@pytest.fixture
def filled(app_config, tiny_model_dir, tmp_path):
    """A data dir with two published versions, a reward model dir, feedback, a running job and leftovers of writes
    in flight (a temp version dir, a temp file)."""
    store = Store(app_config.db_path)
    store.ensure_default_agent(str(tiny_model_dir))
    v0 = store.active_policy("assistant")
    adapters = [make_adapter(tiny_model_dir, tmp_path / f"a{i}", seed=i) for i in range(2)]
    versions = [publish_version(store, app_config, "assistant", a, parent_id=v0.id, promote=i == 0, name=f"v{i + 1}")
                for i, a in enumerate(adapters)]
    rm_dir = app_config.data_path / "reward_models" / "rm-1"
    rm_dir.mkdir(parents=True)
    (rm_dir / "meta.json").write_text('{"method": "head"}')
    store.register_reward_model("assistant", str(rm_dir), "pairwise", {}, {}, {"reward/cv_accuracy": 0.8})
    conv = store.create_conversation("assistant", "ann", messages=[{"role": "user", "content": "hi"}])
    a = store.record_reply(store.leaf(conv.id).id, "one", versions[0].id)
    b = store.record_reply(a.parent_id, "two", v0.id)
    store.record_rating(a.id, "ann", thumb=1)
    store.record_comparison(a.id, b.id, "a", "ann")
    job = store.enqueue_job("retrain", "assistant")
    store.claim_job(os.getpid())
    temp = app_config.data_path / "policies" / "assistant" / ".job9.tmp-abc"
    shutil.copytree(versions[0].adapter_path, temp)
    (Path(versions[0].adapter_path) / ".README.md.tmp-xyz").write_text("half")
    yield {"store": store, "versions": versions, "job": job}
    store.close()


def counts(store: Store) -> dict:
    return {t: store.count(t) for t in FEEDBACK}


def test_a_backup_restores_into_another_path_with_everything(filled, app_config, tmp_path):
    store = filled["store"]
    summary = backup(app_config, tmp_path / "b.tar.gz")
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile(MANIFEST).read())
    assert names[-1] == MANIFEST and names[0] == "studio.db"
    assert not [n for n in names if ".tmp-" in n]  # writes in flight stay out
    assert {"policies/assistant/v1/adapter_model.safetensors", "policies/assistant/v1/README.md",
            "reward_models/rm-1/meta.json"} <= set(manifest["files"])
    assert all(len(f["sha256"]) == 64 for f in manifest["files"].values())
    assert summary["tables"]["ratings"] == 1 and summary["files"] == len(manifest["files"])

    target = tmp_path / "elsewhere" / "data"
    restored = restore(tmp_path / "b.tar.gz", target)
    assert restored["tables"] == summary["tables"]
    copy = Store(target / "studio.db")
    assert counts(copy) == counts(store)
    config = apply_overrides(app_config, {"data_dir": str(target)})
    assert clean_leftovers(copy, config) == [] and check_adapters(copy) == []
    for v in filled["versions"]:
        path = Path(copy.get_policy(v.id).adapter_path)
        assert path.parent.parent.parent == target and (path / "adapter_model.safetensors").read_bytes() == \
            (Path(v.adapter_path) / "adapter_model.safetensors").read_bytes()
    assert Path(copy.list_reward_models()[0].path) == target / "reward_models" / "rm-1"
    # The job the original app was running belongs to its process: in the copy it is over.
    job = copy.get_job(filled["job"].id)
    assert job.status == "failed" and job.error == BACKUP_INTERRUPTED
    assert store.get_job(filled["job"].id).status == "running"  # the original is untouched
    copy.close()


def test_restore_refuses_a_non_empty_target_unless_forced(filled, app_config, tmp_path):
    archive = tmp_path / "b.tar"
    backup(app_config, archive)
    target = tmp_path / "busy"
    (target / "runs" / "job1" / "checkpoints").mkdir(parents=True)  # another database's run: must not survive
    (target / "models").mkdir()
    with pytest.raises(BackupError, match="not empty"):
        restore(archive, target)
    assert sorted(p.name for p in target.iterdir()) == ["models", "runs"]
    restore(archive, target, force=True)
    assert (target / "studio.db").is_file() and (target / "models").is_dir() and not (target / "runs").exists()
    with pytest.raises(BackupError, match="already exists"):
        backup(app_config, archive)


def tamper(archive: Path, out: Path, name: str, data: bytes | None = None, manifest: dict | None = None) -> Path:
    """A copy of ``archive`` with one member's bytes (or the manifest) replaced."""
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for member in src.getmembers():
            blob = src.extractfile(member).read()
            if member.name == name and data is not None:
                blob = data
            if member.name == MANIFEST and manifest is not None:
                blob = json.dumps(manifest).encode()
            member.size = len(blob)
            dst.addfile(member, io.BytesIO(blob))
    return out


def test_a_damaged_or_foreign_archive_restores_nothing(filled, app_config, tmp_path):
    archive = tmp_path / "b.tar"
    backup(app_config, archive)
    weights = "policies/assistant/v1/adapter_model.safetensors"
    with tarfile.open(archive) as tar:
        good = tar.extractfile(weights).read()
        manifest = json.loads(tar.extractfile(MANIFEST).read())
    flipped = good[:-1] + bytes([good[-1] ^ 1])
    cases = {
        "flipped": (tamper(archive, tmp_path / "flipped.tar", weights, flipped), "checksum mismatch"),
        "unsafe": (tamper(archive, tmp_path / "unsafe.tar", weights, manifest={
            **manifest, "files": {**manifest["files"], "../../etc/evil": {"sha256": "0" * 64, "size": 1}}}),
                   "unsafe"),
        "foreign": (tamper(archive, tmp_path / "foreign.tar", weights, manifest={"format": "zip"}),
                    "not an RLHF Studio backup"),
    }
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    cases["truncated"] = (truncated, "")
    for name, (path, message) in cases.items():
        target = tmp_path / f"target-{name}"
        with pytest.raises(BackupError, match=message):
            restore(path, target)
        assert not target.exists() or not any(target.iterdir()), name
    assert not [p for p in tmp_path.iterdir() if ".tmp-restore-" in p.name]  # no staging dir left


def test_the_database_copy_is_checked(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)
    from storage import StorageUnavailable

    with pytest.raises(StorageUnavailable):
        check_database(bad)


def test_backup_and_restore_commands(filled, app_config, tmp_path, capsys):
    archive = tmp_path / "cli.tar.gz"
    assert main(["backup", str(archive), "--set", f"data_dir={app_config.data_dir}"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["archive"] == str(archive) and out["tables"]["comparisons"] == 1
    target = tmp_path / "restored"
    assert main(["restore", str(archive), "--data", str(target)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["data_dir"] == str(target)
    assert main(["restore", str(archive), "--data", str(target)]) == 1
    assert "not empty" in capsys.readouterr().err
    assert main(["backup", str(tmp_path / "x.tar"), "--set", f"data_dir={tmp_path / 'nothing'}"]) == 1
    assert "no database" in capsys.readouterr().err


def test_a_manifest_of_the_wrong_shape_is_a_clear_error(filled, app_config, tmp_path):
    """Issue #33: a non-object manifest entry raised a traceback; a manifest that is not an object too."""
    archive = tmp_path / "b.tar"
    backup(app_config, archive)
    with tarfile.open(archive) as tar:
        manifest = json.loads(tar.extractfile(MANIFEST).read())
    weights = "policies/assistant/v1/adapter_model.safetensors"
    for bad, message in (({**manifest, "files": {**manifest["files"], weights: "abc"}}, "must be"),
                         ({**manifest, "files": {**manifest["files"], weights: {"sha256": "x", "size": 1}}}, "must be"),
                         ({**manifest, "version": "2"}, "whole number")):
        path = tamper(archive, tmp_path / f"bad-{len(message)}.tar", weights, manifest=bad)
        with pytest.raises(BackupError, match=message):
            restore(path, tmp_path / "t")
    listed = tmp_path / "list.tar"
    with tarfile.open(archive) as src, tarfile.open(listed, "w") as dst:
        for member in src.getmembers():
            blob = b"[1, 2]" if member.name == MANIFEST else src.extractfile(member).read()
            member.size = len(blob)
            dst.addfile(member, io.BytesIO(blob))
    with pytest.raises(BackupError, match="not an RLHF Studio backup"):
        restore(listed, tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_a_small_archive_cannot_write_more_than_its_manifest_says(filled, app_config, tmp_path):
    """Issue #33: 0.4 MB of gzip wrote 315 MB before the size check. A member larger than its manifest entry is
    refused before a byte of it is written."""
    archive = tmp_path / "b.tar"
    backup(app_config, archive)
    bomb = tmp_path / "bomb.tar.gz"
    weights = "policies/assistant/v1/adapter_model.safetensors"
    with tarfile.open(archive) as src, tarfile.open(bomb, "w:gz") as dst:
        for member in src.getmembers():
            if member.name == weights:  # 16 MB of zeros where the manifest promises the real weights
                member.size = 16 << 20
                dst.addfile(member, io.BytesIO(bytes(member.size)))
            else:
                dst.addfile(member, src.extractfile(member))
    assert bomb.stat().st_size < 4 << 20  # a few MB of gzip (the version's own tokenizer files included) for 16 MB
    with pytest.raises(BackupError, match="16,777,216 bytes where the manifest says"):  # refused before writing it
        restore(bomb, tmp_path / "t")
    assert not (tmp_path / "t").exists() and not [p for p in tmp_path.iterdir() if ".tmp-restore-" in p.name]


def test_restore_brings_back_no_sign_in_secrets_it_cannot_vouch_for(filled, app_config, tmp_path):
    """Issue #33: a token row planted in an archive worked after restore, and a token revoked since came back."""
    from storage.credentials import hash_password

    store = filled["store"]
    store.set_password_hash("alice", hash_password("planted"), role="admin")
    planted = store.create_api_token("alice", "planted")
    revoked_since = store.create_api_token("alice", "later revoked")
    archive = tmp_path / "b.tar"
    backup(app_config, archive)
    target = tmp_path / "restored"
    out = restore(archive, target)
    assert out["tokens_removed"] == 2 and out["passwords_cleared"] == 1
    copy = Store(target / "studio.db")
    assert copy.token_owner(planted) is None and copy.list_api_tokens() == [] and copy.password_hash("alice") is None
    copy.close()
    # With --keep-tokens the archive's tokens stay, but one the replaced database revoked stays revoked.
    again = restore(archive, target, force=True, keep_tokens=True)
    assert again["tokens_kept"] == 2
    copy = Store(target / "studio.db")
    revoke = next(t["id"] for t in copy.list_api_tokens("alice") if t["label"] == "later revoked")
    copy.revoke_api_token(revoke)
    copy.close()
    third = restore(archive, target, force=True, keep_tokens=True)
    assert third["tokens_revoked"] == 1 and third["tokens_kept"] == 1
    copy = Store(target / "studio.db")
    assert copy.token_owner(revoked_since) is None and copy.token_owner(planted) == "alice"
    copy.close()


def craft(archive: Path, out: Path, db: Path, extra: dict[str, bytes]) -> Path:
    """A copy of ``archive`` whose database is ``db`` and which holds ``extra`` files, with a manifest to match."""
    import hashlib

    with tarfile.open(archive) as src:
        blobs = {m.name: src.extractfile(m).read() for m in src.getmembers()}
    manifest = json.loads(blobs.pop(MANIFEST))
    blobs.update({"studio.db": db.read_bytes(), **extra})
    manifest["files"] = {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for n, b in blobs.items()}
    with tarfile.open(out, "w") as dst:
        for name, blob in [*blobs.items(), (MANIFEST, json.dumps(manifest).encode())]:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            dst.addfile(info, io.BytesIO(blob))
    return out


def test_a_crafted_archive_restores_as_data_only(filled, app_config, tmp_path):
    """Issue #41: a trigger kept API tokens through restore, a queued job named code in its config, and restore
    accepted any file under policies/. Restore rebuilds the database from its rows, fails its jobs, refuses files
    that the app does not write."""
    import sqlite3

    from storage.credentials import hash_password

    store = filled["store"]
    store.set_password_hash("alice", hash_password("planted"), role="admin")
    tokens = [store.create_api_token("alice", "planted"), store.create_api_token("alice", "second")]
    archive = tmp_path / "b.tar"
    backup(app_config, archive)
    db = tmp_path / "hostile.db"
    with tarfile.open(archive) as tar:
        db.write_bytes(tar.extractfile("studio.db").read())
    conn = sqlite3.connect(db)
    conn.executescript("""
        CREATE TRIGGER keep_tokens AFTER DELETE ON api_tokens BEGIN
            INSERT INTO api_tokens (annotator_id, token_hash, label, created, revoked, expires)
            VALUES (old.annotator_id, old.token_hash, old.label, old.created, 0, NULL);
        END;
        CREATE TABLE extra (x TEXT);
        CREATE VIEW spy AS SELECT token_hash FROM api_tokens;
    """)
    hostile = {"app": {"scheduler": {"job_kinds": {"pwn": "data.policies.pwn:run"}}}}
    conn.execute("INSERT INTO jobs (kind, status, config, created) VALUES ('pwn', 'queued', ?, '2026-01-01')",
                 [json.dumps(hostile)])
    conn.commit()
    conn.close()
    planted = b"open('/tmp/pwned', 'w')\ndef run(ctx):\n    return {}\n"
    with_code = craft(archive, tmp_path / "code.tar", db, {"policies/pwn.py": planted})
    with pytest.raises(BackupError, match="'policies/pwn.py', which is not a file the app writes"):
        restore(with_code, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()

    target = tmp_path / "restored"
    out = restore(craft(archive, tmp_path / "rows.tar", db, {}), target)
    assert out["tokens_removed"] == 2 and out["jobs_failed"] == 1
    assert {"keep_tokens", "extra", "spy"} <= set(out["schema_dropped"])
    check = sqlite3.connect(target / "studio.db")
    names = {r[0] for r in check.execute("SELECT name FROM sqlite_master")}
    check.close()
    assert not names & {"keep_tokens", "extra", "spy"}
    copy = Store(target / "studio.db")
    assert all(copy.token_owner(t) is None for t in tokens) and copy.list_api_tokens() == []
    job = next(j for j in copy.list_jobs() if j.kind == "pwn")
    assert job.status == "failed" and "restored backup" in job.error
    assert counts(copy) == counts(store)
    copy.close()
    assert not list(target.rglob("*.py"))
