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
import secrets
from typing import Iterable, Optional

from storage.errors import InvalidInput, NotFound
from storage.records import Annotator
from storage.util import check_text, utcnow

# scrypt cost: N=2^14, r=8, p=1 (16 MiB, ~50 ms here): the interactive-login setting of RFC 7914 §2.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
TOKEN_PREFIX = "rlhf_"


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

    def create_api_token(self, name: str, label: str = "") -> str:
        """A new API token for a user, returned once; only its digest is stored."""
        label = check_text(label, "token label", 200, allow_empty=True)
        annotator = self.ensure_annotator(name)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._tx() as db:
            self._insert(db, "api_tokens", {"annotator_id": annotator.id, "token_hash": hash_token(token),
                                            "label": label, "created": utcnow()})
        return token

    def token_owner(self, token: str) -> Optional[str]:
        """The user name an unrevoked API token belongs to, or None."""
        if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
            return None
        row = self._one("""SELECT a.name FROM api_tokens t JOIN annotators a ON a.id = t.annotator_id
                           WHERE t.token_hash = ? AND t.revoked = 0""", [hash_token(token)])
        return row["name"] if row else None

    def list_api_tokens(self, name: Optional[str] = None) -> list[dict]:
        """Tokens (id, user, label, created, revoked), never their digests."""
        sql = """SELECT t.id, a.name AS user, t.label, t.created, t.revoked FROM api_tokens t
                 JOIN annotators a ON a.id = t.annotator_id"""
        if name is None:
            return self._all(sql + " ORDER BY t.id")
        return self._all(sql + " WHERE a.name = ? ORDER BY t.id", [name])

    def revoke_api_token(self, token_id: int) -> None:
        """Revoke a token: it stops working at once (kept for the record)."""
        if self._one("SELECT id FROM api_tokens WHERE id = ?", [token_id]) is None:
            raise NotFound(f"unknown API token {token_id}")
        with self._tx() as db:
            db.execute("UPDATE api_tokens SET revoked = 1 WHERE id = ?", [token_id])
