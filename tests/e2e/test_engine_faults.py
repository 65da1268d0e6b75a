"""The real app (`python app.py`) on a machine whose llama.cpp faults, faults injected from outside: the engine
process loads a wrapper around llama-cpp-python (tests/rlhf/serving/faulty_llama.py) through PYTHONPATH that
segfaults for real. The app starts, serves, says over REST which engine serves and why, and a fault in the middle
of a reply ends that reply, stores nothing half-made, and the next chat is answered.
"""
from __future__ import annotations

import json
import os

import pytest

from rlhf.serving.llama_cpp.spec import llama_cpp_installed
from storage import Store
from tests.conftest import ROOT
from tests.e2e.app_process import TEST_APP, AppProcess, write_config
from tests.rlhf.serving import faulty_llama

pytestmark = pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed")


def faulty_env(tmp_path, mode: str) -> dict:
    """The environment of an app whose engine processes load the faulting wrapper in ``mode`` (written beside it:
    the engine process gets a minimal environment, so the mode cannot travel in a variable)."""
    shim = faulty_llama.install(tmp_path / "shim")
    (shim / "mode").write_text(mode)
    path = os.pathsep.join([str(shim), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"PYTHONPATH": path}


def stream_chat(http, content: str, max_new_tokens: int, **extra) -> list[dict]:
    body = {"messages": [{"role": "user", "content": content}], "max_new_tokens": max_new_tokens,
            "temperature": 1.0, "seed": 3, **extra}
    with http.stream("POST", "/chat/stream", json=body) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line) for line in r.iter_lines() if line]


def test_a_fault_mid_reply_ends_that_reply_and_the_app_answers_the_next_chat(tmp_path, tiny_model_dir):
    data = tmp_path / "data"
    marker = tmp_path / "faulted-once"
    env = faulty_env(tmp_path, f"after:40:{marker}")  # the engine's proof takes a few decodes; #40 is mid-reply
    with AppProcess(data, tiny_model_dir, write_config(tmp_path / "c.yaml", TEST_APP), env=env) as app, \
            app.client() as http:
        health = http.get("/health").json()
        assert health["engine"] == "llama_cpp" and "proved in its own process" in health["engine_status"]
        events = stream_chat(http, "Tell me a very long story.", 200)
        assert marker.exists() and "delta" in events[0]  # it was streaming when the engine died
        assert "SIGSEGV" in events[-1]["error"] and not any(e.get("done") for e in events)
        after = http.post("/chat", json={"messages": [{"role": "user", "content": "Still there?"}],
                                         "max_new_tokens": 4})
        assert after.status_code == 200 and after.json()["content"] is not None
        assert app.proc.poll() is None and http.get("/health").json()["engine"] == "llama_cpp"
    store = Store(data / "studio.db")
    try:  # the next question and its reply: a REST turn is stored with its reply, so the lost one left nothing
        assert store.count("messages") == 2 and store.get_message(after.json()["message_id"]).role == "assistant"
    finally:
        store.close()


def test_where_llama_cpp_faults_on_every_load_the_app_serves_with_transformers_and_says_why(tmp_path,
                                                                                           tiny_model_dir):
    with AppProcess(tmp_path / "data", tiny_model_dir, write_config(tmp_path / "c.yaml", TEST_APP),
                    env=faulty_env(tmp_path, "always")) as app, app.client() as http:
        health = http.get("/health").json()
        assert health["engine"] == "transformers" and health["engine_status"].count("SIGSEGV") == 2
        reply = http.post("/chat", json={"messages": [{"role": "user", "content": "Hi"}], "max_new_tokens": 4})
        assert reply.status_code == 200
    assert "llama.cpp, safe load" in app.output() and "serving engine: transformers" in app.output()
