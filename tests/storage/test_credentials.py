"""Password hashes and API tokens: only hashes are stored, verification is exact, revocation is immediate."""
from __future__ import annotations

import pytest

from storage import InvalidInput, NotFound, Store
from storage.credentials import hash_password, hash_token, is_password_hash, verify_password


def test_password_hash_roundtrip_and_salt():
    h1, h2 = hash_password("s3cret"), hash_password("s3cret")
    assert is_password_hash(h1) and h1 != h2  # a fresh salt each time
    assert verify_password("s3cret", h1) and verify_password("s3cret", h2)
    assert not verify_password("s3cret ", h1) and not verify_password("", h1)
    assert not verify_password("s3cret", None) and not verify_password("s3cret", "plain")


def test_store_accepts_only_hashes_and_never_plaintext(store, tmp_path):
    with pytest.raises(InvalidInput, match="plaintext"):
        store.set_password_hash("alice", "hunter2")
    store.set_password_hash("alice", hash_password("hunter2"), role="admin")
    assert verify_password("hunter2", store.password_hash("alice"))
    assert store.get_agent("assistant")  # the store still works after the migration
    raw = (tmp_path / "studio.db").read_bytes() + (tmp_path / "studio.db-wal").read_bytes()
    assert b"hunter2" not in raw
    assert [a.role for a in store.list_annotators() if a.name == "alice"] == ["admin"]


def test_clear_passwords_of_removed_users(store):
    store.set_password_hash("alice", hash_password("a"))
    store.set_password_hash("bob", hash_password("b"))
    assert store.clear_passwords_except(["alice"]) == ["bob"]
    assert store.password_hash("bob") is None and store.password_hash("alice")


def test_api_tokens_are_stored_as_digests_and_revocable(store, tmp_path):
    token = store.create_api_token("carol", label="ci")
    assert token.startswith("rlhf_") and store.token_owner(token) == "carol"
    assert store.token_owner(token + "x") is None and store.token_owner("nope") is None
    rows = store.db.execute("SELECT token_hash FROM api_tokens").fetchall()
    assert rows == [(hash_token(token),)]
    listed = store.list_api_tokens("carol")
    assert listed[0]["label"] == "ci" and "token_hash" not in listed[0]
    store.revoke_api_token(listed[0]["id"])
    assert store.token_owner(token) is None
    with pytest.raises(NotFound):
        store.revoke_api_token(999)


def test_migration_adds_auth_schema_to_an_existing_database(tmp_path):
    s = Store(tmp_path / "a.db")
    assert "api_tokens" in s.db.table_names()
    assert "password_hash" in s.db["annotators"].columns_dict
    assert s.schema_version() >= 2
    s.close()
