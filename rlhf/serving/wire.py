"""The engine wire: the messages the app and its engine process exchange, one small frozen dataclass per kind.

A message crosses the socket as one JSON object (``{"kind": ..., <fields>}``) in one length-prefixed frame
(``Connection.send_bytes`` / ``recv_bytes``), never as a pickle: whatever the other side sends is data, so a process
that went wrong (a memory-corruption bug while loading a hostile GGUF or LoRA) cannot make this one run code. A frame
that is not JSON, names an unknown kind, lacks a field, has one too many or one of the wrong type is refused with a
``ProtocolError`` that says why.

App -> engine process: ``Start``, ``Submit``, ``Cancel``, ``Threads``, ``Call``, ``Close``.
Engine process -> app: ``Ready``, ``Failed``, ``Delta``, ``Done``, ``Load``, ``Reply``.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import typing
from multiprocessing.connection import Connection
from typing import Any, Optional, Union

MAX_FRAME_BYTES = 16 * 2**20  # a prompt of 100k token ids is < 1 MiB: anything near this is not ours
CALLS = ("load_adapter", "unload_adapter", "profile")  # what the app may ask the engine process to run


class ProtocolError(ValueError):
    """A frame on the engine wire that is not one of our messages (it is refused, never executed)."""


@dataclasses.dataclass(frozen=True)
class Start:
    """Build backend ``engine`` with ``settings`` behind a loop with ``loop`` settings, on ``threads`` threads."""

    engine: str
    settings: dict
    loop: dict
    threads: int


@dataclasses.dataclass(frozen=True)
class Submit:
    """Generate a reply (``rid``) for ``input_ids`` with ``adapter`` (None = the base) and these settings."""

    rid: int
    input_ids: list[int]
    adapter: Optional[str]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: Optional[int]
    prefix_len: int


@dataclasses.dataclass(frozen=True)
class Cancel:
    """Stop generating reply ``rid``."""

    rid: int


@dataclasses.dataclass(frozen=True)
class Threads:
    """Decode with this many CPU threads from now on."""

    threads: int


@dataclasses.dataclass(frozen=True)
class Call:
    """Run ``method`` (one of ``CALLS``) with ``args`` on the loop thread; answered by a ``Reply`` with ``cid``."""

    cid: int
    method: str
    args: list[str]

    def __post_init__(self):
        if self.method not in CALLS:
            raise ValueError(f"call must be one of {', '.join(CALLS)}, got {self.method!r}")


@dataclasses.dataclass(frozen=True)
class Close:
    """End the replies in flight and exit."""


@dataclasses.dataclass(frozen=True)
class Ready:
    """The engine process loaded the model and decoded its first tokens (``proof`` says what it decoded; ``build``
    which build of the backend runs, e.g. llama.cpp's CPU variant)."""

    proof: str
    build: str


@dataclasses.dataclass(frozen=True)
class Failed:
    """The engine could not be built (a Python error, not a fault): ``error`` is its type, ``message`` why."""

    error: str
    message: str


@dataclasses.dataclass(frozen=True)
class Delta:
    """New text of reply ``rid``; ``n_tokens`` generated so far."""

    rid: int
    text: str
    n_tokens: int


@dataclasses.dataclass(frozen=True)
class Done:
    """Reply ``rid`` ended: its token ids, and the error type and message when it failed."""

    rid: int
    n_tokens: int
    token_ids: list[int]
    error: Optional[str]
    message: Optional[str]


@dataclasses.dataclass(frozen=True)
class Load:
    """Replies decoding now in the engine process."""

    running: int


@dataclasses.dataclass(frozen=True)
class Reply:
    """The answer to ``Call`` ``cid``: its value, or the error type and message when it failed."""

    cid: int
    value: Optional[dict]
    error: Optional[str]
    message: Optional[str]


Message = Union[Start, Submit, Cancel, Threads, Call, Close, Ready, Failed, Delta, Done, Load, Reply]
KINDS: dict[str, type] = {cls.__name__.lower(): cls for cls in typing.get_args(Message)}
_HINTS = {cls: typing.get_type_hints(cls) for cls in KINDS.values()}


def encode(message: Message) -> bytes:
    """One message as the bytes of a frame."""
    kind = type(message).__name__.lower()
    if KINDS.get(kind) is not type(message):
        raise TypeError(f"not an engine wire message: {type(message).__name__}")
    body = {"kind": kind, **{f.name: getattr(message, f.name) for f in dataclasses.fields(message)}}
    return json.dumps(body, allow_nan=False, separators=(",", ":")).encode("utf-8")


def decode(frame: bytes) -> Message:
    """The message in ``frame``; ProtocolError when it is not exactly one of ours."""
    try:
        body = json.loads(bytes(frame).decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"engine wire: a frame of {len(frame)} bytes that is not a JSON message ({exc})") \
            from None
    if not isinstance(body, dict):
        raise ProtocolError(f"engine wire: a message must be a JSON object, got {type(body).__name__}")
    kind = body.pop("kind", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"engine wire: unknown message kind {str(kind)[:40]!r}")
    hints = _HINTS[cls]
    if set(body) != set(hints):
        raise ProtocolError(f"engine wire: {kind} has fields {sorted(hints)}, got {sorted(body)[:20]}")
    for name, hint in hints.items():
        if not _fits(body[name], hint):
            raise ProtocolError(f"engine wire: {kind}.{name} must be {hint}")
    try:
        return cls(**body)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"engine wire: bad {kind}: {exc}") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number here")


def _fits(value: Any, hint: Any) -> bool:
    """Whether a decoded JSON value has the type a message field declares."""
    origin = typing.get_origin(hint)
    if origin is Union:
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is dict or origin is dict:
        return isinstance(value, dict)
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    return False


class Channel:
    """One end of the wire: ``send`` a message (from any thread), ``recv`` the next one (one reader thread).
    ``recv`` raises ProtocolError for a frame that is not a message, EOFError/OSError when the other side is gone."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: Message) -> None:
        frame = encode(message)
        with self._lock:
            self.conn.send_bytes(frame)

    def recv(self) -> Message:
        return decode(self.conn.recv_bytes(MAX_FRAME_BYTES))

    def poll(self, timeout: float) -> bool:
        return self.conn.poll(timeout)

    def close(self) -> None:
        self.conn.close()


# ---- errors across the line --------------------------------------------------------------------------------
def _errors() -> dict[str, type]:
    from rlhf.serving.interface import AdapterError, EngineFault, EngineUnavailable

    return {cls.__name__: cls for cls in (AdapterError, EngineFault, EngineUnavailable, ValueError, KeyError,
                                          RuntimeError)}


def error_from(kind: Optional[str], message: Optional[str]) -> BaseException:
    """An error of the other side, rebuilt here: its type when it is one we know, else RuntimeError."""
    return _errors().get(kind or "", RuntimeError)(message or "")
