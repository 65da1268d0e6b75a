"""`rlhf-studio bench serve`: simulated annotators chatting over HTTP against the real app, on each engine.

Each level starts the given number of annotator threads at once; each sends its chats one after another
through ``POST /api/v1/chat/stream`` (the same Store writes and engine as ``/chat``, streamed), so time to first
token is measured where a user feels it: at the client, over loopback HTTP. Both engines run in the same run,
one after the other: transformers (with its naive baseline, one request at a time through HF ``generate``, and
the bare decode ceiling) and llama.cpp (with llama-cpp-python's own ``Llama`` on the same GGUF and threads).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import report, run_together
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
    """A PolicyServer for the configured base model with the config's batching settings, on ``engine``
    (default: what ``serving.engine`` picks on this device)."""
    from rlhf.models import pick_device, resolve_model
    from rlhf.serving.interface import choose_engine
    from rlhf.serving.server import PolicyServer, llama_options

    s = config.serving
    device = pick_device(config.device)
    kind = engine or choose_engine(s.engine, device)
    if kind == "llama_cpp":
        server = PolicyServer.load(config.base_model, device, config.base_model, s.max_context_tokens,
                                   queue_size=s.queue_size, max_batch_size=s.max_batch_size,
                                   batch_window_ms=s.batch_window_ms, engine="llama_cpp",
                                   data_dir=str(config.data_path), options=llama_options(config))
    else:
        server = PolicyServer.load(resolve_model(config.base_model, config.data_path), device, config.base_model,
                                   s.max_context_tokens, s.load_in_4bit, queue_size=s.queue_size,
                                   max_batch_size=s.max_batch_size, batch_window_ms=s.batch_window_ms)
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
                except Exception as exc:  # recorded, reported, never hidden
                    with lock:
                        level.errors.append(f"{type(exc).__name__}: {exc}")
                    break
                with lock:
                    level.requests += 1
                    level.tokens += done["n_tokens"] if done else 0
                    if first is not None:
                        level.ttft.append(first)
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
    from rlhf.serving.server import AdapterRef, GenParams

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


def level_row(level: Level, tps: float, before: dict, after: dict, engine: str = "transformers") -> dict:
    """A table row for one level, with the engine's mean batch size and step time over it."""
    steps = after["decode_steps"] - before["decode_steps"]
    return {"engine": engine, "mode": "served: HTTP stream, batched", "users": level.users, "requests": level.requests,
            "tokens": level.tokens, "wall_s": level.wall_s, "tokens_per_s": tps,
            "ttft_p50_s": percentile(level.ttft, 50), "ttft_p95_s": percentile(level.ttft, 95),
            "busy": level.busy, "errors": len(level.errors),
            "rows_per_step": (after["decode_rows"] - before["decode_rows"]) / steps if steps else 0.0,
            "ms_per_step": 1000 * (after["decode_s"] - before["decode_s"]) / steps if steps else 0.0}


def _row(engine: str, mode: str, users: int, tokens_per_s: float, **extra) -> dict:
    """A table row with every column (blank where a figure does not apply)."""
    row = {"engine": engine, "mode": mode, "users": users, "requests": 0, "tokens": 0, "wall_s": 0.0,
           "tokens_per_s": tokens_per_s, "ttft_p50_s": 0.0, "ttft_p95_s": 0.0, "busy": 0, "errors": 0,
           "rows_per_step": 1.0, "ms_per_step": 0.0}
    row.update(extra)
    return row


def serve_engine(kind: str, config: AppConfig, cfg: AppConfig, levels: list[int], per_user: int, gen: dict,
                 rows: list, extra=None) -> dict:
    """One engine's rows: (transformers: the naive baseline and the bare decode ceiling), 8 users in-process,
    then every level over HTTP against the real app. ``extra(server, system_prompt)`` runs before the app
    closes and returns more figures. Returns the figures of this engine."""
    from ui.server import build_services, create_app

    t0 = time.perf_counter()
    server = load_policy_server(config, engine=kind)
    out = {"load_s": time.perf_counter() - t0, "levels": {}, "device": server.device}
    services = build_services(cfg, server=server)
    try:
        system_prompt = services.store.get_agent(None).system_prompt
        if kind == "transformers":
            base = baseline(server, system_prompt, 2 if per_user == 1 else 4, gen)
            out["baseline"] = base
            rows.append(_row(kind, "baseline: generate, one at a time", 1, base["tokens_per_s"],
                             requests=base["requests"], tokens=base["tokens"], wall_s=base["wall_s"],
                             ttft_p50_s=base["ttft_p50_s"], ttft_p95_s=base["ttft_p95_s"]))
            out["ceiling"] = decode_ceiling(server, [1, 8] if per_user == 1 else [1, 8, 32])
            rows += [_row(kind, "ceiling: bare decode step", c["batch"], c["tokens_per_s"],
                          rows_per_step=float(c["batch"]), ms_per_step=c["ms_per_step"]) for c in out["ceiling"]]
        direct_users = 8 if 8 in levels else levels[-1]
        before = server.engine.profile()
        direct = engine_direct(server, system_prompt, direct_users, per_user, gen)
        rows.append({**level_row(direct, direct.tokens / direct.wall_s, before, server.engine.profile(), kind),
                     "mode": "engine in-process (no HTTP), batched"})
        with LiveApp(create_app(services)) as live:
            for users in levels:
                before = server.engine.profile()
                level = run_level(live.url, users, per_user, gen)
                tps = level.tokens / level.wall_s if level.wall_s else 0.0
                out["levels"][users] = (level, tps)
                rows.append(level_row(level, tps, before, server.engine.profile(), kind))
        out["profile"] = server.engine.profile()
        out["threads"] = services.scheduler.runner.budget.plan.serving_idle
        if extra is not None:
            out.update(extra(server, system_prompt, out["threads"]))
    finally:
        services.close()
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench serve ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")
    p.add_argument("--users", type=int, help="one concurrency level instead of 1, 8 and 32")
    p.add_argument("--during-retrain", action="store_true",
                   help="the 1- and 8-user levels while a real retrain job runs, against idle in the same run")


def run(config: AppConfig, args, path=None) -> dict:
    """Both engines side by side (transformers rows kept), llama-cpp-python's own ``Llama`` on the same GGUF and
    threads, 1/8/32 annotators over HTTP (or ``--users N``); report and return the figures. (``bench serve
    --during-retrain`` runs ``bench.serve_retrain`` instead.)"""
    from rlhf.serving.interface import llama_cpp_installed

    quick = bool(getattr(args, "quick", False))
    levels = [args.users] if getattr(args, "users", None) else ([1, 8] if quick else [1, 8, 32])
    gen = {"max_new_tokens": 16 if quick else 64, "temperature": config.serving.temperature,
           "top_p": config.serving.top_p}
    per_user = 1 if quick else 2
    load_before = os.getloadavg()
    rows: list = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        cfg = bench_config(config, tmp)
        tf = serve_engine("transformers", config, cfg, levels, per_user, gen, rows)
        lc = None
        if llama_cpp_installed():
            lc = serve_engine("llama_cpp", config, cfg, levels, per_user, gen, rows,
                              extra=lambda server, system, threads: llama_extras(
                                  server, system, threads, config, [u for u in levels if u in (1, 8)] or [1],
                                  per_user, gen, rows, tmp))
    load_after = os.getloadavg()
    figures, notes = summarize(config, tf, lc, levels, per_user, gen, load_before, load_after)
    return report("serve", rows, figures, notes, path=path)


def llama_extras(server, system_prompt: str, threads: int, config: AppConfig, levels: list[int], per_user: int,
                 gen: dict, rows: list, tmp: str) -> dict:
    """With the llama.cpp engine still up: llama-cpp-python's ``Llama`` on the same GGUF and threads (batch-1
    decode and one stream), our batch-1 decode on the same prompts, and an adapter's conversion time."""
    out = {}
    anchor = anchor_rows(server, system_prompt, threads, config.base_model, levels, per_user, gen, rows)
    if anchor is not None:
        out["anchor"] = anchor
    out["adapter"] = adapter_timing(server, config, Path(tmp) / "adapter")
    return out


def adapter_timing(server, config: AppConfig, root: Path) -> dict:
    """Seconds from a fresh rank-``ppo.lora_r`` q/k/v/o adapter dir to its first reply (conversion included)."""
    from bench.memory import make_adapters
    from rlhf.models import resolve_model
    from rlhf.serving.server import AdapterRef, GenParams

    (path,) = make_adapters(resolve_model(config.base_model, config.data_path), root, 1, config.ppo.lora_r,
                            config.ppo.lora_alpha)
    t0 = time.perf_counter()
    server.ensure_adapter(AdapterRef(999, path))
    loaded = time.perf_counter() - t0
    server.generate("", [{"role": "user", "content": "Hi"}], AdapterRef(999, path),
                    GenParams(max_new_tokens=4, temperature=0))
    return {"convert_and_load_s": loaded, "first_reply_s": time.perf_counter() - t0}


def summarize(config: AppConfig, tf: dict, lc, levels: list[int], per_user: int, gen: dict, load_before,
              load_after) -> tuple[dict, str]:
    """The figures (goals) and the notes of a run."""
    pick = 8 if 8 in levels else levels[-1]
    level, tps = tf["levels"][pick]
    base_tps = tf["baseline"]["tokens_per_s"]
    figures = {"users": pick, "ttft_p50_s": round(percentile(level.ttft, 50), 3),
               "ttft_p95_s": round(percentile(level.ttft, 95), 3), "tokens_per_s": round(tps, 2),
               "baseline_tokens_per_s": round(base_tps, 2), "ratio": round(tps / base_tps, 2) if base_tps else 0.0,
               "load_avg_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)]}
    s = config.serving
    notes = (f"Model `{config.base_model}`; {per_user} chat(s) per annotator, max_new_tokens={gen['max_new_tokens']}, "
             f"temperature={gen['temperature']}, top_p={gen['top_p']}; max_batch_size={s.max_batch_size}, "
             f"queue_size={s.queue_size}, batch_window_ms={s.batch_window_ms}. Load average (1/5/15 min) before "
             f"{tuple(round(x, 2) for x in load_before)}, after {tuple(round(x, 2) for x in load_after)}: other "
             f"work shared the cores. TTFT is measured by the client over HTTP (/api/v1/chat/stream); the "
             f"baseline's 'TTFT' is its whole reply. transformers engine profile: {_brief(tf['profile'])}.")
    if lc is not None:
        lc_level, lc_tps = lc["levels"][pick]
        figures.update({"llama_cpp_tokens_per_s": round(lc_tps, 2),
                        "llama_cpp_ttft_p95_s": round(percentile(lc_level.ttft, 95), 3),
                        "llama_cpp_vs_transformers": round(lc_tps / tps, 2) if tps else 0.0,
                        "adapter_convert_and_load_s": round(lc["adapter"]["convert_and_load_s"], 3)})
        notes += f" llama.cpp engine profile: {_brief(lc['profile'])}."
        anchor = lc.get("anchor")
        if anchor:
            one_stream = anchor["levels"][0]["tokens_per_s"]
            ours = anchor["app_decode_tokens_per_s"]
            theirs = anchor["levels"][0]["decode_tokens_per_s"]
            figures.update({"batch1_decode_tokens_per_s": round(ours, 2),
                            "llama_cpp_python_decode_tokens_per_s": round(theirs, 2),
                            "batch1_vs_llama_cpp_python": round(ours / theirs, 3) if theirs else 0.0,
                            "one_llama_stream_tokens_per_s": round(one_stream, 2),
                            f"users{pick}_vs_one_llama_stream": round(lc_tps / one_stream, 2) if one_stream else 0.0,
                            "greedy_identical": f"{anchor['agreement']['identical']}/{anchor['agreement']['of']}"})
            notes += (f" Anchor: llama-cpp-python {anchor['version']}'s `Llama` on the same GGUF, {anchor['threads']} "
                      f"thread(s) (the serving engine's), greedy, the same prompt token ids; it decodes one sequence "
                      f"at a time. Batch-1 decode = tokens after the first / time from first to last token, "
                      f"in-process, both engines on the same prompts.")
    return figures, notes


def _brief(profile: dict) -> str:
    return json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in profile.items()})


def anchor_rows(server, system_prompt: str, threads: int, base_model: str, levels: list[int], per_user: int,
                gen: dict, rows: list) -> dict | None:
    """llama-cpp-python's rows and our engine's batch-1 greedy decode, appended to ``rows``; the anchor's
    figures, or None when llama-cpp-python or the shipped GGUF is missing."""
    from bench.anchors import llama_cpp

    prompts = [server.build_prompt(system_prompt, [{"role": "user", "content": q}]) for q in QUESTIONS[:8]]
    anchor = llama_cpp(server, prompts, base_model, threads, levels, per_user, gen["max_new_tokens"])
    if anchor is None:
        return None
    ours, theirs = anchor["app_decode_tokens_per_s"], anchor["levels"][0]["decode_tokens_per_s"]
    rows.append(_row(server.engine_name, "engine in-process, greedy, one at a time (decode rate)", 1, ours,
                     requests=len(prompts), ms_per_step=1000 / max(ours, 1e-9)))
    rows.append(_row("llama-cpp-python Llama", "greedy, one at a time (decode rate)", 1, theirs,
                     requests=len(prompts), ms_per_step=1000 / max(theirs, 1e-9)))
    for lv in anchor["levels"]:
        rows.append(_row("llama-cpp-python Llama", "greedy, requests queue (one sequence at a time)", lv["users"],
                         lv["tokens_per_s"], requests=lv["requests"], tokens=lv["tokens"], wall_s=lv["wall_s"],
                         ttft_p50_s=lv["ttft_p50_s"], ttft_p95_s=lv["ttft_p95_s"],
                         ms_per_step=1000 / max(lv["decode_tokens_per_s"], 1e-9)))
    return anchor
