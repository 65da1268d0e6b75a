"""Small helpers shared by the Store's parts: time, JSON, text validation."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

from storage.errors import InvalidInput


def utcnow() -> str:
    """Current UTC time as an ISO-8601 string with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def dumps(value: Any) -> str:
    """JSON for a TEXT column (NaN refused: it would not round-trip)."""
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False, default=str)
    except ValueError as exc:
        raise InvalidInput(f"value cannot be stored as JSON: {exc}") from None


def check_text(value: Any, what: str, limit: int, allow_empty: bool = False) -> str:
    """Validate user text: a string, not blank, no NUL bytes, at most ``limit`` characters, valid Unicode."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string")
    if not allow_empty and not value.strip():
        raise InvalidInput(f"{what} is empty")
    if "\x00" in value:
        raise InvalidInput(f"{what} contains a NUL byte")
    if len(value) > limit:
        raise InvalidInput(f"{what} is {len(value)} characters; the limit is {limit}")
    try:  # JSON may carry a lone surrogate ("\\ud800"): valid JSON, but not text SQLite can store
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} is not valid Unicode text (it contains a lone surrogate)") from None
    return value


SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_slug(value: Any, what: str) -> str:
    """A name that is safe anywhere (a URL, a file name, a shell word): 1-64 letters, digits, '.', '_' or '-',
    starting with a letter or digit. Anything else is refused, not cleaned up."""
    if not isinstance(value, str) or not SLUG.fullmatch(value):
        raise InvalidInput(f"{what} must be 1-64 letters, digits, '.', '_' or '-' starting with a letter or digit "
                           f"(e.g. 'support-bot'), got {value!r}")
    return value


def check_id(value: Any, what: str) -> int:
    """An integer id, or InvalidInput naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{what} must be an integer id, got {value!r}")
    return value
