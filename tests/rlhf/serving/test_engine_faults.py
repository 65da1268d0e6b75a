"""A fault in the engine's native code never takes the app down.

The faults are real segmentation faults in the engine process, injected from outside by a wrapper around
llama-cpp-python (tests/rlhf/serving/faulty_llama.py) that the engine process imports through PYTHONPATH, the way
a bad build on a user's CPU would fault: at the first decode of repacked (AMX) weights, at every decode, or once in
the middle of a reply.
"""
from __future__ import annotations

import json
import os

import pytest

from rlhf.config import apply_overrides
from rlhf.serving.interface import EngineFault, EngineUnavailable
from rlhf.serving.llama_cpp.spec import llama_cpp_installed
from rlhf.serving.policy_server import AdapterRef, GenParams, load_server
from tests.rlhf.serving import faulty_llama

pytestmark = [pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed"),
              pytest.mark.slow]  # engine processes start for real: the full suite only
HISTORY = [{"role": "user", "content": "Say something."}]


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    """Engine processes started from now on load the faulting wrapper; returns a setter for its mode."""
    root = faulty_llama.install(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))

    def mode(value: str) -> None:
        (root / "mode").write_text(value)
    return mode


def reply(server, n=6) -> str:
    return server.generate("", HISTORY, AdapterRef(0), GenParams(max_new_tokens=n, temperature=0))


def verdicts(config) -> dict:
    return json.loads((config.data_path / "serving" / "verdicts.json").read_text())


def test_a_cpu_where_repacked_weights_fault_is_served_by_the_safe_load_and_remembered(app_config, faulty):
    faulty("extra_buffers")
    server = load_server(app_config)
    try:
        assert server.engine_name == "llama_cpp" and "safe load" in server.engine_status
        assert "SIGSEGV" in server.engine_status  # why: the full load faulted on this CPU
        assert reply(server)
    finally:
        server.close()
    kept = verdicts(app_config)
    assert [v["fault"] is not None for v in sorted(kept.values(), key=lambda v: v["engine"])] == [True, False]
    again = load_server(app_config)  # the next start does not fault again: the verdict is kept per build and CPU
    try:
        assert "recorded earlier" in again.engine_status and reply(again)
    finally:
        again.close()


def test_when_llama_cpp_faults_every_way_auto_serves_with_transformers(app_config, faulty):
    faulty("always")
    server = load_server(app_config)
    try:
        assert server.engine_name == "transformers" and server.engine_status.count("SIGSEGV") == 2
        assert reply(server)
    finally:
        server.close()


def test_an_explicit_llama_cpp_that_cannot_run_stops_startup_with_the_reason(app_config, faulty):
    faulty("always")
    with pytest.raises(EngineUnavailable, match="SIGSEGV"):
        load_server(apply_overrides(app_config, {"serving.engine": "llama_cpp"}))


def test_a_reply_in_flight_when_the_engine_dies_ends_with_a_clear_error_and_the_next_one_is_served(
        app_config, faulty, tmp_path):
    marker = tmp_path / "faulted-once"
    faulty(f"after:40:{marker}")  # the proof takes a handful of decodes; the 40th is inside the long reply below
    server = load_server(app_config)
    try:
        long = server.stream("", HISTORY, AdapterRef(0), GenParams(max_new_tokens=200, temperature=1.0, seed=1))
        with pytest.raises(EngineFault, match="SIGSEGV"):
            long.text()
        assert marker.exists() and long.finished_at is not None
        assert reply(server)  # waits for the engine started again
        status = server.engine_status  # the same engine (its safe load on a CPU where AMX faults)
        assert status.startswith("llama.cpp") and "(proved in its own process" in status
        assert "started again 1x (last: SIGSEGV" in server.engine_status
    finally:
        server.close()


def test_an_engine_that_dies_twice_while_serving_falls_back(app_config, faulty):
    faulty("every:40")  # each engine process faults at its 40th decode: inside the first long reply it serves
    server = load_server(app_config)
    try:
        for seed in (1, 2):
            with pytest.raises(EngineFault):
                server.stream("", HISTORY, AdapterRef(0), GenParams(max_new_tokens=200, temperature=1.0,
                                                                    seed=seed)).text()
        assert reply(server)  # waits for the engine that replaced it
        assert "safe load" in server.engine_status and "died twice while serving" in server.engine_status
    finally:
        server.close()
