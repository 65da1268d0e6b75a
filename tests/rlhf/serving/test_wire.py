"""The engine wire carries data, never code: typed JSON messages both ways, anything else refused unread, and an
engine process that holds none of the app's secrets."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import pickle
import socket
import subprocess
import sys
from multiprocessing.connection import Connection

import pytest

from rlhf.serving import wire
from rlhf.serving.child import child_env

SAMPLES = [
    wire.Start("transformers", {"model_source": "/m", "load_in_4bit": False, "cache": None}, {"queue_size": 4}, 2),
    wire.Submit(7, [1, 2, 3], "p12", 64, 0.7, 0.9, None, 2),
    wire.Submit(8, [], None, 1, 0, 1.0, 2**62, 0),
    wire.Cancel(7),
    wire.Threads(1),
    wire.Call(3, "load_adapter", ["p12", "/data/policies/12"]),
    wire.Close(),
    wire.Ready("6 tokens in 0.4 s", "CPU variant zen4 (portable build)"),
    wire.Failed("EngineUnavailable", "no such model"),
    wire.Delta(7, "héllo ✓", 3),
    wire.Done(7, 3, [11, 12, 13], None, None),
    wire.Done(8, 0, [], "EngineFault", "the engine stopped"),
    wire.Load(2),
    wire.Reply(3, {"decode_steps": 4, "ms_per_step": 8.5}, None, None),
    wire.Reply(4, None, "AdapterError", "missing"),
]


class Planted:
    """A pickle that, when loaded, creates ``path``: what a compromised peer would send instead of a message."""

    def __init__(self, path: pathlib.Path):
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (self.path,)


def planted(path: pathlib.Path) -> bytes:
    return pickle.dumps(Planted(path))


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_kind_round_trips(message):
    frame = wire.encode(message)
    assert wire.decode(frame) == message
    assert json.loads(frame)["kind"] == type(message).__name__.lower()


def test_the_samples_cover_every_kind():
    assert {type(m) for m in SAMPLES} == set(wire.KINDS.values()) and len(wire.KINDS) == 12


def test_the_planted_pickle_is_live_when_unpickled(tmp_path):
    """The payload the next tests send really runs code when unpickled (so their markers mean something)."""
    pickle.loads(planted(tmp_path / "ran"))
    assert (tmp_path / "ran").exists()


def test_a_pickle_frame_is_refused_without_being_unpickled(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(wire.ProtocolError, match="not a JSON message"):
        wire.decode(planted(marker))
    assert not marker.exists()


def test_a_pickle_sent_down_a_real_connection_is_refused_unread(tmp_path):
    """Both ways of pickling over a Connection: raw bytes, and ``Connection.send`` (which pickles)."""
    a, b = socket.socketpair()
    ours, theirs = wire.Channel(Connection(a.detach())), Connection(b.detach())
    try:
        theirs.send_bytes(planted(tmp_path / "raw"))
        theirs.send(Planted(tmp_path / "sent"))
        for _ in range(2):
            with pytest.raises(wire.ProtocolError):
                ours.recv()
        theirs.send_bytes(wire.encode(wire.Load(1)))  # the channel still reads the next, good frame
        assert ours.recv() == wire.Load(1)
    finally:
        ours.close()
        theirs.close()
    assert not (tmp_path / "raw").exists() and not (tmp_path / "sent").exists()


@pytest.mark.parametrize("body, why", [
    ({"kind": "exec", "code": "1"}, "unknown message kind"),
    ([1, 2], "JSON object"),
    ({"kind": "cancel"}, "fields"),
    ({"kind": "cancel", "rid": 1, "extra": 2}, "fields"),
    ({"kind": "cancel", "rid": "1"}, "cancel.rid"),
    ({"kind": "cancel", "rid": True}, "cancel.rid"),
    ({"kind": "submit", "rid": 1, "input_ids": [1, "2"], "adapter": None, "max_new_tokens": 4,
      "temperature": 0.5, "top_p": 1, "seed": None, "prefix_len": 0}, "submit.input_ids"),
    ({"kind": "call", "cid": 1, "method": "__init__", "args": []}, "call must be one of"),
    ({"kind": "reply", "cid": 1, "value": [1], "error": None, "message": None}, "reply.value"),
])
def test_a_frame_that_is_not_exactly_one_message_is_a_clear_protocol_error(body, why):
    with pytest.raises(wire.ProtocolError, match=why):
        wire.decode(json.dumps(body).encode())


def test_non_numbers_and_bad_text_are_refused():
    with pytest.raises(wire.ProtocolError):
        wire.decode(b'{"kind":"threads","threads":NaN}')
    with pytest.raises(wire.ProtocolError):
        wire.decode(b"\xff\xfe")
    with pytest.raises(TypeError):
        wire.encode(("delta", 1, "x", 1))


def test_the_engine_process_refuses_a_pickle_and_runs_nothing(tmp_path):
    """A real engine process, sent a pickle where its start message belongs: it answers with a protocol error
    and exits, and the pickle's code never ran."""
    marker = tmp_path / "ran"
    ours, child = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-m", "rlhf.serving.child", str(child.fileno())],
                            pass_fds=(child.fileno(),))
    child.close()
    channel = wire.Channel(Connection(ours.detach()))
    try:
        channel.conn.send_bytes(planted(marker))
        answer = channel.recv()
        assert proc.wait(60) == 2
    finally:
        channel.close()
        if proc.poll() is None:
            proc.kill()
    assert isinstance(answer, wire.Failed) and answer.error == "ProtocolError" and "JSON" in answer.message
    assert not marker.exists()


SECRETS = {"HF_TOKEN": "hf_x", "OAUTH_CLIENT_SECRET": "s", "HUGGING_FACE_HUB_TOKEN": "t", "OPENAI_API_KEY": "k",
           "AWS_SECRET_ACCESS_KEY": "a", "HF_API_KEY": "k2", "DB_PASSWORD": "p", "RLHF_SERVER__SECRET": "r",
           "OAUTH_CLIENT_ID": "id", "GITHUB_TOKEN": "g"}
NEEDED = {"PATH": "/usr/bin", "HOME": "/home/a", "LD_LIBRARY_PATH": "/opt/lib", "HF_HOME": "/cache/hf",
          "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": "/src", "LANG": "C.UTF-8",
          "CUDA_VISIBLE_DEVICES": "0", "GGML_NUM_THREADS": "2"}


def test_the_engine_environment_keeps_what_it_needs_and_no_secret():
    env = child_env(3, {**SECRETS, **NEEDED, "RLHF_DATA_DIR": "/d", "SSH_AUTH_SOCK": "/tmp/a", "OMP_NUM_THREADS": "16"})
    assert not set(SECRETS) & set(env)
    assert {k: env[k] for k in NEEDED} == NEEDED
    assert "RLHF_DATA_DIR" not in env and "SSH_AUTH_SOCK" not in env and env["OMP_NUM_THREADS"] == "3"


@pytest.mark.slow  # starts an engine process on the tiny model
def test_a_running_engine_process_holds_none_of_the_apps_secrets(tiny_model_dir, monkeypatch):
    from rlhf.serving.process import EngineProcess, EngineSpec

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    engine = EngineProcess([EngineSpec("transformers", {"model_source": str(tiny_model_dir)}, "transformers")],
                           threads=1).start()
    try:
        raw = pathlib.Path(f"/proc/{engine.pid}/environ").read_bytes()
    finally:
        engine.close()
    names = {item.split(b"=", 1)[0].decode() for item in raw.split(b"\0") if item}
    assert "PATH" in names and "OMP_NUM_THREADS" in names
    assert not names & set(SECRETS), names & set(SECRETS)


def test_messages_are_frozen_dataclasses():
    for cls in wire.KINDS.values():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


# A stand-in engine process (the test's own, swapped in for ``spawn``): proves itself, then answers a request with
# a pickle ("hostile") or with a real reply ("good").
FAKE_CHILD = '''
import pathlib, pickle, sys
from multiprocessing.connection import Connection
from rlhf.serving import wire
from tests.rlhf.serving.test_wire import Planted

channel, mode, marker = wire.Channel(Connection(int(sys.argv[1]))), sys.argv[2], pathlib.Path(sys.argv[3])
channel.recv()
channel.send(wire.Ready("stand-in", ""))
while True:
    try:
        message = channel.recv()
    except EOFError:
        break
    if isinstance(message, wire.Submit) and mode == "hostile":
        channel.conn.send_bytes(pickle.dumps(Planted(marker)))
    elif isinstance(message, wire.Submit):
        channel.send(wire.Delta(message.rid, "fine", 1))
        channel.send(wire.Done(message.rid, 1, [5], None, None))
    elif isinstance(message, wire.Close):
        break
'''


def test_the_app_refuses_a_pickle_from_its_engine_ends_that_reply_and_starts_a_clean_one(tmp_path, monkeypatch):
    from rlhf.serving import process
    from rlhf.serving.interface import EngineFault, GenParams, ReplyStream, Request

    marker, modes = tmp_path / "ran", ["hostile", "good"]

    def stand_in(spec, loop_settings, threads, ready_timeout_s):
        ours, theirs = socket.socketpair()
        proc = subprocess.Popen([sys.executable, "-c", FAKE_CHILD, str(theirs.fileno()), modes.pop(0), str(marker)],
                                pass_fds=(theirs.fileno(),))
        theirs.close()
        channel = wire.Channel(Connection(ours.detach()))
        channel.send(wire.Start(spec.name, spec.settings, loop_settings, threads))
        return proc, channel, channel.recv()

    monkeypatch.setattr(process, "spawn", stand_in)
    engine = process.EngineProcess([process.EngineSpec("transformers", {}, "stand-in")]).start()
    try:
        first, second = ReplyStream(), ReplyStream()
        engine.submit(Request([1, 2], None, GenParams(max_new_tokens=2), first))
        with pytest.raises(EngineFault, match="broke the engine wire"):
            first.text()
        engine.submit(Request([1, 2], None, GenParams(max_new_tokens=2), second))  # served by the clean one
        assert second.text() == "fine" and "broke the engine wire" in engine.status
    finally:
        engine.close()
    assert not marker.exists() and modes == []
