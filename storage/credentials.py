"""Sign-in secrets: password hashes (scrypt) and per-user API tokens (stored as SHA-256 digests only).

Plaintext never reaches the database: callers hash a password with ``hash_password`` before
``set_password_hash``, and ``create_api_token`` hands the token back once and keeps only its digest.
A token is 32 random bytes, so a fast digest is enough for it; a password may be guessable, so it
gets a slow, salted KDF (scrypt, RFC 7914).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import math
import secrets
from datetime import datetime, timedelta, timezone
from typing import Iterable, Optional

from storage.errors import InvalidInput, NotFound
from storage.records import Annotator
from storage.util import check_text, utcnow

# scrypt cost: N=2^14, r=8, p=1 (16 MiB, ~50 ms here): the interactive-login setting of RFC 7914 §2.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
TOKEN_PREFIX = "rlhf_"
MAX_TOKEN_DAYS = 3650


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str) -> str:
    """A salted scrypt hash as ``scrypt$N$r$p$salt$digest`` (the only form the Store accepts)."""
    if not isinstance(password, str) or not password:
        raise InvalidInput("a password must be a non-empty string")
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32,
                            maxmem=2**26)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def is_password_hash(value: object) -> bool:
    """True for a string in ``hash_password``'s format."""
    if not isinstance(value, str):
        return False
    parts = value.split("$")
    return len(parts) == 6 and parts[0] == "scrypt" and all(p.isdigit() for p in parts[1:4])


def verify_password(password: str, stored: Optional[str]) -> bool:
    """Constant-time check of a password against a stored hash (False for a missing or malformed hash)."""
    if not stored or not is_password_hash(stored) or not isinstance(password, str):
        return False
    _, n, r, p, salt, digest = stored.split("$")
    try:
        got = hashlib.scrypt(password.encode(), salt=_unb64(salt), n=int(n), r=int(r), p=int(p),
                             dklen=len(_unb64(digest)), maxmem=2**26)
    except (ValueError, MemoryError):
        return False
    return hmac.compare_digest(got, _unb64(digest))


def hash_token(token: str) -> str:
    """SHA-256 digest of an API token (hex)."""
    return hashlib.sha256(token.encode()).hexdigest()


class CredentialsMixin:
    """Methods of Store for password hashes and API tokens."""

    def set_password_hash(self, name: str, password_hash: Optional[str], role: Optional[str] = None) -> Annotator:
        """Store (or clear, with None) a user's password hash; creates the annotator on first use."""
        if password_hash is not None and not is_password_hash(password_hash):
            raise InvalidInput("expected a hash from storage.credentials.hash_password, not a plaintext password")
        if role is not None and role not in ("admin", "annotator"):
            raise InvalidInput(f"role must be 'admin' or 'annotator', got {role!r}")
        annotator = self.ensure_annotator(name, role)
        with self._tx() as db:
            db.execute("UPDATE annotators SET password_hash = ? WHERE id = ?", [password_hash, annotator.id])
        return annotator

    def password_hash(self, name: str) -> Optional[str]:
        """A user's stored password hash, or None."""
        row = self._one("SELECT password_hash FROM annotators WHERE name = ?", [name])
        return row["password_hash"] if row else None

    def clear_passwords_except(self, names: Iterable[str]) -> list[str]:
        """Remove the password hashes of users no longer configured; returns their names."""
        keep = set(names)
        rows = self._all("SELECT id, name FROM annotators WHERE password_hash IS NOT NULL")
        gone = [r for r in rows if r["name"] not in keep]
        if gone:
            with self._tx() as db:
                for r in gone:
                    db.execute("UPDATE annotators SET password_hash = NULL WHERE id = ?", [r["id"]])
        return [r["name"] for r in gone]

    def create_api_token(self, name: str, label: str = "", expires_in_days: Optional[float] = None) -> str:
        """A new API token for a user, returned once; only its digest is stored. ``expires_in_days``: it stops
        working that long from now (None = never)."""
        label = check_text(label, "token label", 200, allow_empty=True)
        expires = None
        if expires_in_days is not None:
            if isinstance(expires_in_days, bool) or not isinstance(expires_in_days, (int, float)) \
                    or not math.isfinite(expires_in_days) or not 0 < expires_in_days <= MAX_TOKEN_DAYS:
                raise InvalidInput(f"expires_in_days must be a number of days in (0, {MAX_TOKEN_DAYS}], "
                                   f"got {expires_in_days!r}")
            expires = (datetime.now(timezone.utc) + timedelta(days=expires_in_days)).isoformat(timespec="milliseconds")
        annotator = self.ensure_annotator(name)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._tx() as db:
            self._insert(db, "api_tokens", {"annotator_id": annotator.id, "token_hash": hash_token(token),
                                            "label": label, "created": utcnow(), "expires": expires})
        return token

    def token_owner(self, token: str) -> Optional[str]:
        """The user name an unrevoked, unexpired API token belongs to, or None."""
        if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
            return None
        row = self._one("""SELECT a.name FROM api_tokens t JOIN annotators a ON a.id = t.annotator_id
                           WHERE t.token_hash = ? AND t.revoked = 0 AND (t.expires IS NULL OR t.expires > ?)""",
                        [hash_token(token), utcnow()])
        return row["name"] if row else None

    def list_api_tokens(self, name: Optional[str] = None) -> list[dict]:
        """Tokens (id, user, label, created, expires, expired, revoked), never their digests."""
        sql = """SELECT t.id, a.name AS user, t.label, t.created, t.expires,
                        (t.expires IS NOT NULL AND t.expires <= ?) AS expired, t.revoked FROM api_tokens t
                 JOIN annotators a ON a.id = t.annotator_id"""
        if name is None:
            rows = self._all(sql + " ORDER BY t.id", [utcnow()])
        else:
            rows = self._all(sql + " WHERE a.name = ? ORDER BY t.id", [utcnow(), name])
        return [{**r, "expired": bool(r["expired"]), "revoked": bool(r["revoked"])} for r in rows]

    def api_token_user(self, token_id: int) -> str:
        """The user a token (by id) belongs to; NotFound for an unknown id."""
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            raise InvalidInput(f"token id must be an integer, got {token_id!r}")
        row = self._one("""SELECT a.name FROM api_tokens t JOIN annotators a ON a.id = t.annotator_id
                           WHERE t.id = ?""", [token_id])
        if row is None:
            raise NotFound(f"unknown API token {token_id}")
        return row["name"]

    def revoke_api_token(self, token_id: int) -> None:
        """Revoke a token: it stops working at once (kept for the record)."""
        self.api_token_user(token_id)
        with self._tx() as db:
            db.execute("UPDATE api_tokens SET revoked = 1 WHERE id = ?", [token_id])
