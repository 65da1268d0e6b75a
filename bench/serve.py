"""`rlhf-studio bench serve`: simulated annotators chatting over HTTP against the real app, on each engine.

Each level starts the given number of annotator threads at once; each sends its chats one after another
through ``POST /api/v1/chat/stream`` (the same Store writes and engine as ``/chat``, streamed), so time to first
token is measured where a user feels it: at the client, over loopback HTTP.

transformers: its naive baseline (one request at a time through HF ``generate``) and the bare decode ceiling, in
the app's process. llama.cpp: the app as it serves (the engine in its own process, every core), beside the same app
on one thread (does the second core pay?) and with the engine in the app's process (what the process line costs),
and llama.cpp itself on the same GGUF: llama-cpp-python's ``Llama`` one stream at 1 and 2 threads (the anchor) and
its low-level batched decode, 8 sequences per ``llama_decode`` call (the ceiling no serving engine can pass).

The load and the yardsticks live in ``bench.serve_load``; this module measures each engine with them (its rows),
adds llama.cpp's anchors and settings, and turns the rows into the figures, notes and report.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bench.report import report
from bench.serve_load import (QUESTIONS, Level, LiveApp, baseline, bench_config, decode_ceiling, engine_direct,
                              load_policy_server, percentile, run_level)
from rlhf.config import AppConfig, apply_overrides


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
                 rows: list, extra=None, mode: str = "served: HTTP stream, batched") -> dict:
    """One engine's rows: (transformers: the naive baseline and the bare decode ceiling, and 8 users in-process),
    then every level over HTTP against the real app, its engine warmed with the agent's system prompt as the app
    does. ``extra(server, system_prompt, threads)`` runs before the app closes and returns more figures."""
    from ui.webapp import build_services, create_app

    t0 = time.perf_counter()
    server = load_policy_server(config, engine=kind, warmup=False)
    out = {"load_s": time.perf_counter() - t0, "levels": {}, "device": server.device, "status": server.engine_status}
    services = build_services(cfg, server=server)
    try:
        system_prompt = services.store.get_agent(None).system_prompt
        server.warmup([system_prompt])
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
                level = run_level(live.url, users, per_user * 4 if users == 1 else per_user, gen)  # 1 user: more
                tps = level.tokens / level.wall_s if level.wall_s else 0.0
                out["levels"][users] = (level, tps)
                rows.append({**level_row(level, tps, before, server.engine.profile(), kind), "mode": mode})
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
    p.add_argument("--engine", choices=("both", "transformers", "llama_cpp"), default="both",
                   help="which engine's rows (default both)")
    p.add_argument("--during-retrain", action="store_true",
                   help="the 1- and 8-user levels while a real retrain job runs, against idle in the same run")


# The llama.cpp app as it serves, then each setting it could have had instead, over the same levels.
LLAMA_VARIANTS = [
    ("as served: own process, every core", {}),
    ("own process, 1 thread", {"serving.threads": 1}),
    ("in the app's process, every core", {"serving.isolation": "thread"}),
    ("shipped Q4_1 weights as they are", {"serving.llama_weights": "shipped"}),
]


def run(config: AppConfig, args, path=None) -> dict:
    """The engines side by side, 1/8/32 annotators over HTTP (or ``--users N``); llama.cpp's rows with its
    variants and anchors; report and return the figures. (``bench serve --during-retrain`` runs
    ``bench.serve_retrain`` instead.)"""
    from rlhf.serving.llama_cpp.spec import llama_cpp_installed

    quick = bool(getattr(args, "quick", False))
    which = getattr(args, "engine", "both") or "both"
    levels = [args.users] if getattr(args, "users", None) else ([1, 8] if quick else [1, 8, 32])
    gen = {"max_new_tokens": 16 if quick else 64, "temperature": config.serving.temperature,
           "top_p": config.serving.top_p}
    per_user = 1 if quick else 3
    load_before = os.getloadavg()
    rows: list = []
    tf, lc = None, None
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        cfg = bench_config(config, tmp)
        if which in ("both", "transformers"):
            tf = serve_engine("transformers", config, cfg, levels, per_user, gen, rows)
        if which in ("both", "llama_cpp") and llama_cpp_installed():
            anchor_levels = [u for u in levels if u in (1, 8)] or [1]
            lc = serve_engine("llama_cpp", config, cfg, levels, per_user, gen, rows, mode=LLAMA_VARIANTS[0][0],
                              extra=lambda server, system, threads: llama_extras(
                                  server, system, threads, config, anchor_levels, per_user, gen, rows, tmp))
            lc["variants"] = {}
            for name, overrides in LLAMA_VARIANTS[1:] if not quick else []:
                variant = apply_overrides(config, overrides)
                lc["variants"][name] = serve_engine("llama_cpp", variant, apply_overrides(cfg, overrides),
                                                    anchor_levels, per_user, gen, rows, mode=name)
    load_after = os.getloadavg()
    figures, notes = summarize(config, tf, lc, levels, per_user, gen, load_before, load_after)
    return report("serve", rows, figures, notes, path=path)


def llama_extras(server, system_prompt: str, threads: int, config: AppConfig, levels: list[int], per_user: int,
                 gen: dict, rows: list, tmp: str) -> dict:
    """With the llama.cpp engine still up: llama.cpp itself on the same GGUF (llama-cpp-python's ``Llama`` one
    stream at 1 and 2 threads, its batched decode ceiling at the serving threads), our batch-1 greedy decode on
    the same prompts, and an adapter's conversion time."""
    out = {}
    anchor = anchor_rows(server, system_prompt, threads, config, levels, per_user, gen, rows)
    if anchor is not None:
        out["anchor"] = anchor
    out["adapter"] = adapter_timing(server, config, Path(tmp) / "adapter")
    return out


def adapter_timing(server, config: AppConfig, root: Path) -> dict:
    """Seconds from a fresh rank-``ppo.lora_r`` q/k/v/o adapter dir to its first reply (conversion included)."""
    from bench.memory import make_adapters
    from rlhf.base_models import resolve_model
    from rlhf.serving.policy_server import AdapterRef, GenParams

    (path,) = make_adapters(resolve_model(config.base_model, config.data_path), root, 1, config.ppo.lora_r,
                            config.ppo.lora_alpha)
    t0 = time.perf_counter()
    server.ensure_adapter(AdapterRef(999, path))
    loaded = time.perf_counter() - t0
    server.generate("", [{"role": "user", "content": "Hi"}], AdapterRef(999, path),
                    GenParams(max_new_tokens=4, temperature=0))
    return {"convert_and_load_s": loaded, "first_reply_s": time.perf_counter() - t0}


def decode_rate(level: Level) -> float:
    """Tokens after the first over the time from first to last token, per reply, averaged (at the client)."""
    return sum(level.decode_rates) / len(level.decode_rates) if level.decode_rates else 0.0


def summarize(config: AppConfig, tf, lc, levels: list[int], per_user: int, gen: dict, load_before,
              load_after) -> tuple[dict, str]:
    """The figures (goals) and the notes of a run."""
    pick = 8 if 8 in levels else levels[-1]
    s = config.serving
    figures = {"users": pick, "load_avg_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)]}
    notes = (f"Model `{config.base_model}`; {per_user} chat(s) per annotator, max_new_tokens={gen['max_new_tokens']}, "
             f"temperature={gen['temperature']}, top_p={gen['top_p']}; max_batch_size={s.max_batch_size}, "
             f"queue_size={s.queue_size}, batch_window_ms={s.batch_window_ms}. Load average (1/5/15 min) before "
             f"{tuple(round(x, 2) for x in load_before)}, after {tuple(round(x, 2) for x in load_after)}. TTFT is "
             f"measured by the client over HTTP (/api/v1/chat/stream); the baseline's 'TTFT' is its whole reply.")
    if tf is not None:
        level, tps = tf["levels"][pick]
        base_tps = tf["baseline"]["tokens_per_s"]
        figures.update({"ttft_p50_s": round(percentile(level.ttft, 50), 3),
                        "ttft_p95_s": round(percentile(level.ttft, 95), 3), "tokens_per_s": round(tps, 2),
                        "baseline_tokens_per_s": round(base_tps, 2),
                        "ratio": round(tps / base_tps, 2) if base_tps else 0.0})
        notes += f" transformers engine profile: {_brief(tf['profile'])}."
    if lc is not None:
        figures.update(llama_figures(lc, pick, tf))
        notes += f" llama.cpp engine: {lc['status']}; profile: {_brief(lc['profile'])}."
        if lc.get("anchor"):
            anchor = lc["anchor"]
            notes += (f" Anchor: llama-cpp-python {anchor['version']}'s `Llama` on the served GGUF and the shipped "
                      f"one, greedy, the same prompt token ids, one sequence at a time, at 1 and 2 threads (the best "
                      f"is 'the stream'); llama.cpp's "
                      f"ceiling: {anchor['ceiling_sequences']} sequences per `llama_decode` call at the serving "
                      f"threads, greedy, no HTTP. Batch-1 decode = tokens after the first / time from first to "
                      f"last token, at the client over HTTP (1 user).")
    return figures, notes


def llama_figures(lc: dict, pick: int, tf) -> dict:
    """The llama.cpp figures: the app against llama.cpp's best stream and ceiling, and what each setting costs."""
    level, tps = lc["levels"][pick]
    out = {"llama_cpp_tokens_per_s": round(tps, 2), "llama_cpp_ttft_p95_s": round(percentile(level.ttft, 95), 3),
           "adapter_convert_and_load_s": round(lc["adapter"]["convert_and_load_s"], 3)}
    if tf is not None:
        out["llama_cpp_vs_transformers"] = round(tps / tf["levels"][pick][1], 2) if tf["levels"][pick][1] else 0.0
    one = lc["levels"].get(1)
    if one is not None:
        out["batch1_decode_tokens_per_s"] = round(decode_rate(one[0]), 2)
    for name, variant in lc.get("variants", {}).items():
        key = "one_thread" if "1 thread" in name else "in_process" if "app's process" in name else "shipped_weights"
        if pick in variant["levels"]:
            out[f"{key}_users{pick}_tokens_per_s"] = round(variant["levels"][pick][1], 2)
            out[f"as_served_vs_{key}_users{pick}"] = round(tps / variant["levels"][pick][1], 3)
        if 1 in variant["levels"] and one is not None:
            out[f"{key}_batch1_decode_tokens_per_s"] = round(decode_rate(variant["levels"][1][0]), 2)
    anchor = lc.get("anchor")
    if anchor:
        best = anchor["best_stream_tokens_per_s"]
        out.update({"best_stream_tokens_per_s": round(best, 2), "best_stream_threads": anchor["best_stream_threads"],
                    "best_stream_gguf": anchor["best_stream_gguf"],
                    "ceiling_tokens_per_s": round(anchor["ceiling_tokens_per_s"], 2),
                    f"users{pick}_vs_best_stream": round(tps / best, 2) if best else 0.0,
                    f"users{pick}_vs_ceiling": round(tps / anchor["ceiling_tokens_per_s"], 2),
                    "ceiling_vs_best_stream": round(anchor["ceiling_tokens_per_s"] / best, 2) if best else 0.0,
                    "greedy_identical": f"{anchor['agreement']['identical']}/{anchor['agreement']['of']}"})
        if "batch1_decode_tokens_per_s" in out:
            out["batch1_vs_best_stream"] = round(out["batch1_decode_tokens_per_s"] / best, 3) if best else 0.0
    return out


def _brief(profile: dict) -> str:
    return json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in profile.items()})


def anchor_rows(server, system_prompt: str, threads: int, config: AppConfig, levels: list[int], per_user: int,
                gen: dict, rows: list) -> dict | None:
    """llama.cpp's own rows — llama-cpp-python's ``Llama`` at 1 and 2 threads on the GGUF the app serves and on the
    shipped one (the best of them is "the stream"), llama.cpp's batched ceiling on the served GGUF at the serving
    threads — and our batch-1 greedy decode, appended to ``rows``; the anchor's figures, or None when
    llama-cpp-python or a GGUF is missing."""
    from bench.anchors import llama_cpp, shipped_gguf
    from rlhf.serving.llama_cpp.spec import llama_files

    prompts = [server.build_prompt(system_prompt, [{"role": "user", "content": q}]) for q in QUESTIONS[:8]]
    served = llama_files(config)[0]
    files = {"served": served, "shipped": shipped_gguf(config.base_model)}
    runs = {}
    for label, gguf in files.items():
        if gguf is None or (label == "shipped" and Path(gguf) == Path(served)):
            continue
        for n in sorted({1, 2, threads}):
            main = label == "served" and n == threads
            run = llama_cpp(server, prompts, gguf, n, levels if main else [1], per_user, gen["max_new_tokens"],
                            ceiling=[1, 8] if main else [], app=main)
            if run is None:
                return None
            runs[(label, n)] = run
    anchor = runs[("served", threads)]
    best = max(runs, key=lambda k: runs[k]["levels"][0]["decode_tokens_per_s"])
    anchor["best_stream_threads"], anchor["best_stream_gguf"] = best[1], Path(files[best[0]]).name
    anchor["best_stream_tokens_per_s"] = runs[best]["levels"][0]["decode_tokens_per_s"]
    ceiling = max(anchor["ceiling"], key=lambda c: c["sequences"])
    anchor["ceiling_sequences"], anchor["ceiling_tokens_per_s"] = ceiling["sequences"], ceiling["tokens_per_s"]
    ours = anchor["app_decode_tokens_per_s"]
    rows.append(_row(server.engine_name, "engine, greedy, one at a time (decode rate, no HTTP)", 1, ours,
                     requests=len(prompts), ms_per_step=1000 / max(ours, 1e-9)))
    for (label, n), run in sorted(runs.items()):
        lv = run["levels"][0]
        rows.append(_row("llama-cpp-python Llama", f"{Path(files[label]).name}: greedy, one sequence, {n} thread(s) "
                         f"(decode rate)", 1, lv["decode_tokens_per_s"], requests=lv["requests"],
                         ms_per_step=1000 / max(lv["decode_tokens_per_s"], 1e-9)))
    for lv in anchor["levels"][1:]:
        rows.append(_row("llama-cpp-python Llama", "greedy, requests queue (one sequence at a time)", lv["users"],
                         lv["tokens_per_s"], requests=lv["requests"], tokens=lv["tokens"], wall_s=lv["wall_s"],
                         ttft_p50_s=lv["ttft_p50_s"], ttft_p95_s=lv["ttft_p95_s"],
                         ms_per_step=1000 / max(lv["decode_tokens_per_s"], 1e-9)))
    for c in anchor["ceiling"]:
        rows.append(_row("llama.cpp llama_decode", f"ceiling: {c['sequences']} sequence(s) per decode call, "
                         f"{c['threads']} thread(s), no HTTP", c["sequences"], c["tokens_per_s"],
                         rows_per_step=float(c["sequences"]), ms_per_step=1000 * c["sequences"] / c["tokens_per_s"]))
    return anchor
