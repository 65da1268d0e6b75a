"""The product's front door: app.py on the real default model answers, and what was stored survives a restart."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.slow


def start_app(data_dir, port):
    env = {**os.environ, "RLHF_DATA_DIR": str(data_dir), "RLHF_DEVICE": "cpu", "RLHF_SCHEDULER_ENABLED": "false"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError("app exited:\n" + proc.stdout.read())
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise AssertionError("app did not become healthy in 180 s")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_real_model_answers_and_data_survives_restart(tmp_path, smol_dir):
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    (data / "models" / "smollm2-135m-instruct").symlink_to(smol_dir)  # reuse the converted copy
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/v1"
    proc = start_app(data, port)
    try:
        health = httpx.get(f"{url}/health").json()
        assert health["model"] == "smollm2-135m-instruct"
        question = [{"role": "user", "content": "What is the capital of France?"}]
        reply = httpx.post(f"{url}/chat", json={"messages": question, "max_new_tokens": 24, "temperature": 0},
                           timeout=120).json()
        assert "Paris" in reply["content"]
        httpx.post(f"{url}/feedback", json={"message_id": reply["message_id"], "thumb": 1, "score": 5,
                                            "note": "correct", "annotator": "eve"}).raise_for_status()
        page = httpx.get(f"http://127.0.0.1:{port}/")
        assert page.status_code == 200 and "<html" in page.text.lower()
    finally:
        stop(proc)
    proc = start_app(data, port)
    try:
        back = httpx.get(f"{url}/messages/{reply['message_id']}").json()
        assert back["content"] == reply["content"]
        assert [(r["thumb"], r["score"], r["note"]) for r in back["ratings"]] == [(1, 5, "correct")]
    finally:
        stop(proc)
