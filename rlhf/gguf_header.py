"""A GGUF file's metadata values, read from its header without decoding its vocabulary.

``gguf.GGUFReader`` builds Python objects for every field and tensor, among them a vocabulary of 49k-150k
strings: seconds per file, and the app asks a shipped GGUF for one or two small values (its pre-tokenizer name,
its weight type) on every start and every publish. ``read_fields`` walks the key/value section instead, stepping
over arrays without decoding them, and stops once it has the keys asked for.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, Iterable

MAGIC = b"GGUF"
# GGUF value types: the struct format of each fixed-size one; 8 is a string, 9 an array.
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFHeaderError(ValueError):
    """The file is not a GGUF this reader understands (wrong magic, an old version, big-endian, cut short)."""


def read_fields(path: str | Path, keys: Iterable[str]) -> dict[str, Any]:
    """The values of ``keys`` that the GGUF at ``path`` holds (a key it lacks is left out). Arrays come back
    as None: this reader is for the header's small values."""
    return _read(path, set(keys), tensors=False)[0]


def read_header(path: str | Path, keys: Iterable[str] = ()) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """``read_fields``'s values and every tensor's shape, name -> dims in the file's order (ne: [in, out])."""
    return _read(path, set(keys), tensors=True)


def _read(path: str | Path, wanted: set, tensors: bool) -> tuple[dict[str, Any], dict[str, list[int]]]:
    found: dict[str, Any] = {}
    shapes: dict[str, list[int]] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != MAGIC:
            raise GGUFHeaderError(f"{path} is not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if not 2 <= version < 256:  # version 1 had 32-bit counts; a huge number means big-endian
            raise GGUFHeaderError(f"{path}: GGUF version {version} is not read here")
        at = 24
        try:
            for _ in range(n_kv):
                key, at = _string(buf, at)
                (kind,), at = struct.unpack_from("<I", buf, at), at + 4
                value, at = _value(buf, at, kind, decode=key in wanted)
                if key in wanted:
                    found[key] = value
                    if len(found) == len(wanted) and not tensors:
                        break
            for _ in range(n_tensors if tensors else 0):  # name, dims, then type and data offset (skipped)
                name, at = _string(buf, at)
                (n_dims,) = struct.unpack_from("<I", buf, at)
                shapes[name] = list(struct.unpack_from(f"<{n_dims}Q", buf, at + 4))
                at += 4 + 8 * n_dims + 4 + 8
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise GGUFHeaderError(f"{path}: its metadata is cut short or damaged ({exc})") from exc
    return found, shapes


def _string(buf, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, at)
    end = at + 8 + n
    if end > len(buf):
        raise IndexError("a string runs past the end of the file")
    return buf[at + 8:end].decode("utf-8"), end


def _value(buf, at: int, kind: int, decode: bool) -> tuple[Any, int]:
    """The value of type ``kind`` at ``at`` (None for an array, or when not ``decode``) and the offset after it."""
    if kind in _FIXED:
        fmt = "<" + _FIXED[kind]
        return (struct.unpack_from(fmt, buf, at)[0] if decode else None), at + struct.calcsize(fmt)
    if kind == _STRING:
        if decode:
            return _string(buf, at)
        (n,) = struct.unpack_from("<Q", buf, at)
        return None, at + 8 + n
    if kind == _ARRAY:
        item, count = struct.unpack_from("<IQ", buf, at)
        at += 12
        if item in _FIXED:
            return None, at + count * struct.calcsize("<" + _FIXED[item])
        for _ in range(count):
            _, at = _value(buf, at, item, decode=False)
        return None, at
    raise GGUFHeaderError(f"unknown GGUF value type {kind}")
