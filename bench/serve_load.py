"""The load the serve benchmarks put on the app, and the yardsticks they read it against.

The real app (FastAPI + Gradio) live on a loopback port; simulated annotators, each a thread sending its chats one
after another through ``POST /api/v1/chat/stream``, started together per concurrency level (time to first token
measured at the client, where a user feels it); and, in the app's process, the batching engine called directly (no
HTTP, no Store), plain HF ``generate`` one request at a time (the naive baseline) and the bare decode step per batch
size (the ceiling). ``bench serve``, ``bench serve --during-retrain``, ``bench ingest`` and ``bench queue`` use it.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field

from bench.report import run_together
from rlhf.config import AppConfig, apply_overrides

QUESTIONS = [
    "What is the capital of France?", "Give me three tips for sleeping better.",
    "Explain photosynthesis to a ten-year-old.", "Write a haiku about autumn.",
    "How do I reverse a list in Python?", "What causes the seasons on Earth?",
    "Suggest a name for a friendly robot.", "Why is the sky blue?",
    "How many legs does a spider have?", "What is a good breakfast before a run?",
    "Summarise the plot of Romeo and Juliet in two sentences.", "What does a compiler do?",
    "Translate 'good morning' into Spanish.", "Tell me a fun fact about octopuses.",
    "How can I make my tea less bitter?", "What is the difference between weather and climate?",
]


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


class LiveApp:
    """The real app (FastAPI + Gradio) served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, app):
        import socket

        import uvicorn

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveApp":
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the benchmark app did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def bench_config(config: AppConfig, data_dir: str) -> AppConfig:
    """The run's config with a throwaway data dir, no scheduler and no per-user rate limit."""
    return apply_overrides(config, {"data_dir": data_dir, "scheduler.enabled": False,
                                    "server.rate_limit_per_minute": 0, "server.users": "",
                                    "server.users_file": ""})


def load_policy_server(config: AppConfig, warmup: bool = True, engine: str | None = None):
    """A PolicyServer for the configured base model with the config's batching settings, on ``engine`` (default:
    what ``serving.engine`` picks here), isolated as ``serving.isolation`` says (transformers: in this process, so
    the baseline can call its model)."""
    from rlhf.base_models import load_tokenizer, pick_device
    from rlhf.serving.policy_server import PolicyServer, start_engine
    from rlhf.cpu import thread_plan
    from rlhf.serving.startup import engine_specs, loop_settings

    s = config.serving
    device = pick_device(config.device)
    specs, tokenizer_source = engine_specs(config, device)
    name = engine or specs[0].name  # one engine, with its own fallbacks (llama.cpp's safe load where AMX faults)
    specs = [spec for spec in specs if spec.name == name]
    isolation = "thread" if specs[0].name == "transformers" else s.isolation
    engine_ = start_engine(specs, isolation, loop_settings(config), threads=thread_plan(config).serving_idle)
    server = PolicyServer(engine_, load_tokenizer(tokenizer_source), config.base_model, s.max_context_tokens, device)
    if warmup:
        server.warmup()
    return server


@dataclass
class Level:
    """What the annotators of one concurrency level saw."""

    users: int
    ttft: list = field(default_factory=list)
    tokens: int = 0
    requests: int = 0
    busy: int = 0
    errors: list = field(default_factory=list)
    wall_s: float = 0.0
    decode_rates: list = field(default_factory=list)  # per reply: tokens after the first / first to last token


def _annotator(url: str, user: int, n_requests: int, gen: dict, level: Level, lock: threading.Lock) -> None:
    import httpx

    with httpx.Client(base_url=url, timeout=600) as client:
        for k in range(n_requests):
            question = QUESTIONS[(user * n_requests + k) % len(QUESTIONS)]
            body = {"messages": [{"role": "user", "content": question}], "annotator": f"bench-{user}",
                    "seed": user * 1000 + k, **gen}
            while True:
                t0 = time.perf_counter()
                first = None
                done = None
                try:
                    with client.stream("POST", "/api/v1/chat/stream", json=body) as r:
                        if r.status_code == 503:  # busy: wait as told, like a polite client
                            retry = float(r.headers.get("retry-after", "1"))
                            with lock:
                                level.busy += 1
                            time.sleep(min(retry, 5.0))
                            continue
                        if r.status_code != 200:
                            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
                        for line in r.iter_lines():
                            if not line:
                                continue
                            event = json.loads(line)
                            if "delta" in event and first is None:
                                first = time.perf_counter() - t0
                            elif "error" in event:
                                raise RuntimeError(event["error"])
                            elif event.get("done"):
                                done = event
                                last = time.perf_counter() - t0
                except Exception as exc:  # recorded, reported, never hidden
                    with lock:
                        level.errors.append(f"{type(exc).__name__}: {exc}")
                    break
                with lock:
                    level.requests += 1
                    level.tokens += done["n_tokens"] if done else 0
                    if first is not None:
                        level.ttft.append(first)
                        if done and done["n_tokens"] > 1 and last > first:
                            level.decode_rates.append((done["n_tokens"] - 1) / (last - first))
                break


def run_level(url: str, users: int, n_requests: int, gen: dict) -> Level:
    """``users`` annotators start together; each sends ``n_requests`` chats in sequence."""
    level = Level(users)
    lock = threading.Lock()
    level.wall_s = run_together(lambda u: _annotator(url, u, n_requests, gen, level, lock), users)
    return level


def baseline(server, system_prompt: str, n_requests: int, gen: dict) -> dict:
    """One request at a time through plain HF ``generate`` on the served model (no engine, no batching)."""
    import torch

    model, tok = server.model, server.tokenizer
    sampling = (dict(do_sample=True, temperature=gen["temperature"], top_p=gen["top_p"])
                if gen["temperature"] > 0 else dict(do_sample=False))
    tokens, ttfts = 0, []
    t0 = time.perf_counter()
    for k in range(n_requests):
        ids = server.build_prompt(system_prompt, [{"role": "user", "content": QUESTIONS[k % len(QUESTIONS)]}])
        x = torch.tensor([ids], device=server.device)
        torch.manual_seed(k)
        started = time.perf_counter()
        with torch.inference_mode():  # the engine is idle: nothing else is submitted meanwhile
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=gen["max_new_tokens"],
                                 pad_token_id=tok.pad_token_id, **sampling)
        ttfts.append(time.perf_counter() - started)  # without streaming, the reply arrives all at once
        tokens += sum(1 for t in out[0, len(ids):].tolist() if t not in (tok.eos_token_id, tok.pad_token_id))
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "requests": n_requests,
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p95_s": percentile(ttfts, 95)}


def decode_ceiling(server, batch_sizes: list[int], context: int = 120, steps: int = 8) -> list[dict]:
    """The bare model's decode step at each batch size (random tokens, a ``context``-token KV cache, no engine,
    no HTTP): how much batching can give on this machine at best, to read the served ratio against."""
    import torch

    model = server.model
    rows = []
    for bs in batch_sizes:
        gen = torch.Generator().manual_seed(bs)
        ids = torch.randint(100, 20000, (bs, context), generator=gen).to(server.device)
        step_ids = ids[:, -1:]
        with torch.inference_mode():  # the engine is idle: nothing else is submitted meanwhile
            past = model(ids, use_cache=True).past_key_values
            past = model(step_ids, past_key_values=past, use_cache=True).past_key_values  # warm-up step
            t0 = time.perf_counter()
            for _ in range(steps):
                past = model(step_ids, past_key_values=past, use_cache=True).past_key_values
            per_step = (time.perf_counter() - t0) / steps
        rows.append({"batch": bs, "ms_per_step": 1000 * per_step, "tokens_per_s": bs / per_step})
    return rows


def engine_direct(server, system_prompt: str, users: int, n_requests: int, gen: dict) -> Level:
    """``users`` threads calling the engine in-process (no HTTP, no Store), like run_level otherwise: what the
    batching engine gives on its own, to split the served figure into engine and web-stack costs."""
    from rlhf.serving.policy_server import AdapterRef, GenParams

    level, lock = Level(users), threading.Lock()

    def annotator(user: int) -> None:
        for k in range(n_requests):
            question = QUESTIONS[(user * n_requests + k) % len(QUESTIONS)]
            params = GenParams(max_new_tokens=gen["max_new_tokens"], temperature=gen["temperature"],
                               top_p=gen["top_p"], seed=user * 1000 + k)
            t0 = time.perf_counter()
            stream = server.stream(system_prompt, [{"role": "user", "content": question}], AdapterRef(0), params)
            first = None
            for _ in stream:
                if first is None:
                    first = time.perf_counter() - t0
            with lock:
                level.requests += 1
                level.tokens += stream.n_tokens
                if first is not None:
                    level.ttft.append(first)

    level.wall_s = run_together(annotator, users)
    return level
