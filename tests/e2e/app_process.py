"""The real app (`python app.py`) as a child process on loopback, for the fault, browser and load tests.

Not a test module: a small harness that writes a YAML config, starts the app with a data dir and a base
model, waits for `/health`, and stops it politely (SIGTERM) or the hard way (SIGKILL, as a crash would).
The app's output goes to a log file (a pipe nobody reads could fill up and stall the app).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import httpx
import yaml

from tests.conftest import ROOT, free_port

# A retrain that takes seconds on the tiny model (same knobs as tests/rlhf/test_pipeline.FAST).
FAST_RETRAIN = {"reward": {"epochs": 1, "min_pairs": 4, "min_pointwise": 4, "batch_size": 4, "max_length": 128},
                "ppo": {"steps": 2, "batch_size": 4, "mini_batch_size": 2, "max_new_tokens": 8, "eval_prompts": 4,
                        "save_every": 1},
                "retrain": {"min_win_rate": 0.0, "max_kl": 1000.0, "heartbeat_seconds": 0.5}}
# A test app: no warm-up, short replies, the job queue drained every second, no vote-queue refill (its background
# replies would land among the messages a test counts; tests/e2e/test_vote_queue.py turns it on).
TEST_APP = {"device": "cpu", "serving": {"warmup": False, "max_new_tokens": 16},
            "scheduler": {"enabled": True, "poll_seconds": 1.0}, "queue": {"refill": False}}


def merged(*trees: dict) -> dict:
    """Config sections merged left to right (later values win)."""
    out: dict = {}
    for tree in trees:
        for key, value in tree.items():
            out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


def write_config(path: Path, *trees: dict) -> Path:
    """A YAML config file for `app.py --config`."""
    path.write_text(yaml.safe_dump(merged(*trees), sort_keys=False))
    return path


def pid_alive(pid: Optional[int]) -> bool:
    """True while a process exists and is not a zombie."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def wait_until(predicate, timeout: float, what: str, poll: float = 0.2):
    """Poll ``predicate`` until it returns something truthy; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def seed_gguf(model_dir: Path, data_dir: Path) -> None:
    """Put a model directory's llama.cpp conversion (made once per test process, beside the model) into a data dir
    that lacks it, under the name the app looks for: every app start of a test would otherwise convert the same
    tiny model again. The app converts only what it does not find, so what it serves is the same. Best effort: a
    data dir that cannot take the file is left as it was."""
    if not (model_dir / "config.json").is_file():
        return
    from rlhf.serving.llama_cpp.base import convert_dir, gguf_dir

    made = convert_dir(model_dir, model_dir.parent / f"{model_dir.name}-gguf")
    target = gguf_dir(data_dir) / made.name
    if target.exists():
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made, target)
    except OSError:  # a read-only or full data dir (the fault tests): the app meets it as it is
        target.unlink(missing_ok=True)


class AppProcess:
    """`python app.py` with a data dir, a base model and a config file, on a free loopback port."""

    def __init__(self, data_dir: Path, base_model: str | Path, config_file: Optional[Path] = None,
                 env: Optional[dict] = None, log_file: Optional[Path] = None, port: Optional[int] = None):
        self.data_dir = Path(data_dir)
        self.base_model = str(base_model)
        self.config_file = config_file
        self.extra_env = dict(env or {})
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = self.url + "/api/v1"
        self.log_file = log_file or self.data_dir.parent / f"app-{self.port}.log"
        self.proc: Optional[subprocess.Popen] = None

    def launch(self) -> subprocess.Popen:
        """Start the process without waiting for it to serve."""
        seed_gguf(Path(self.base_model), self.data_dir)
        env = {**os.environ, "RLHF_DATA_DIR": str(self.data_dir), "RLHF_BASE_MODEL": self.base_model,
               "RLHF_DEVICE": "cpu", **self.extra_env}
        args = [sys.executable, str(ROOT / "app.py"), "--port", str(self.port)]
        if self.config_file is not None:
            args += ["--config", str(self.config_file)]
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        return self.proc

    def start(self, timeout: float = 180.0) -> "AppProcess":
        """Start and wait until `/health` answers 200 (AssertionError with the app's output otherwise)."""
        self.launch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"app exited with code {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.api + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.kill()
        raise AssertionError(f"app did not become healthy in {timeout:.0f} s:\n{self.output()}")

    def wait_exit(self, timeout: float = 180.0) -> int:
        """Wait for the process to end by itself; its exit code."""
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    def engine_pids(self) -> list[int]:
        """The app's engine processes (``python -m rlhf.serving.child``, its children) running now."""
        found = []
        for proc in Path("/proc").iterdir():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):  # not a process, or one that just ended
                continue
            if parent == self.pid and b"rlhf.serving.child" in cmdline:
                found.append(int(proc.name))
        return found

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash or an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the app does not exit within 20 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> "AppProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- REST shortcuts -------------------------------------------------------------------------
    def client(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.api, timeout=timeout)


def seed_preferences(http: httpx.Client, n: int, annotator: str = "seed", agent: Optional[str] = None) -> list[int]:
    """``n`` prompts answered twice (a reply and its regeneration), the first preferred and thumbed up, over
    REST: enough pairs for a FAST_RETRAIN. Returns the comparison ids."""
    ids = []
    for i in range(n):
        body = {"messages": [{"role": "user", "content": f"question {i}: how do I say thanks?"}], "seed": i,
                "max_new_tokens": 8, "annotator": annotator, **({"agent": agent} if agent else {})}
        first = http.post("/chat", json=body)
        first.raise_for_status()
        reply = first.json()["message_id"]
        second = http.post(f"/messages/{reply}/regenerate", json={"seed": 1000 + i})
        second.raise_for_status()
        vote = http.post("/comparisons", json={"message_a_id": reply, "message_b_id": second.json()["message_id"],
                                                "winner": "a", "annotator": annotator})
        vote.raise_for_status()
        http.post("/feedback", json={"message_id": reply, "thumb": 1, "annotator": annotator}).raise_for_status()
        ids.append(vote.json()["id"])
    return ids


def queue_studio(root: Path, tiny_model_dir: Path, queue: dict, ready: int, seconds: float):
    """A module fixture's body: ``python app.py`` on the tiny model with the vote queue's ``queue`` settings, once at
    least ``ready`` items are generated; yields (app, a Store on its database)."""
    from storage import Store

    config = write_config(root / "app.yaml", TEST_APP, queue)
    with AppProcess(root / "data", tiny_model_dir, config) as app:
        http = app.client()
        wait_until(lambda: http.get("/queue/stats").json()["ready"] >= ready, seconds, "the refill to fill the queue")
        store = Store(root / "data" / "studio.db")
        yield app, store
        store.close()
