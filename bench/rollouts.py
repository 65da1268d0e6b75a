"""`rlhf-studio bench rollouts`: how fast a retrain samples the policy's replies (online DPO's rollouts), side by
side on the same prompts, threads and settings: the job's own torch model (``online_dpo.sample_with: torch``) against
the serving engine (``serving``: llama.cpp's batched decode on a CPU, loaded by the job). The figure is reply tokens
per second over the sampling alone; the engine's start (a GGUF conversion the first time) is reported apart.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Optional

from bench.fidelity import held_out_chats
from bench.report import report
from rlhf.config import AppConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=16, help="prompts sampled")
    p.add_argument("--samples", type=int, default=4, help="replies per prompt")
    p.add_argument("--max-new-tokens", type=int, default=96, help="longest reply")
    p.add_argument("--threads", type=int, default=0, help="threads of both samplers (0: a job's, from the CPU plan)")
    p.add_argument("--quick", action="store_true", help="4 prompts x 2 replies of 16 tokens (a smoke test)")


def run(config: AppConfig, args: argparse.Namespace, path: Optional[Path] = None) -> dict:
    import torch

    from rlhf.base_models import load_causal_lm, load_tokenizer, resolve_model
    from rlhf.cpu import apply_torch_threads, thread_plan
    from rlhf.serving.policy_server import load_server
    from rlhf.training.generation import generate_replies, served_replies

    prompts, samples, max_new = (4, 2, 16) if args.quick else (args.prompts, args.samples, args.max_new_tokens)
    threads = args.threads or thread_plan(config).job
    apply_torch_threads(threads)
    rows = [chat for chat in held_out_chats("You are a helpful assistant.", prompts) for _ in range(samples)]
    source = resolve_model(config.base_model, config.data_path)
    tokenizer = load_tokenizer(source, config.chat_template)
    limit = config.ppo.max_prompt_tokens

    model = load_causal_lm(source, "cpu").eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        (torch_out,) = generate_replies(model, tokenizer, rows, [None], max_new, 1.0, 0, max_prompt_tokens=limit)
    torch_s = time.perf_counter() - t0
    del model

    t0 = time.perf_counter()
    server = load_server(config, threads=threads, warmup=False)
    start_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        served = served_replies(server, tokenizer, rows, None, max_new, 1.0, 0, limit,
                                window=min(64, config.serving.queue_size))
        served_s = time.perf_counter() - t0
    finally:
        server.close()

    rate = lambda replies, s: sum(map(len, replies.token_ids)) / s  # noqa: E731
    rows_out = [{"sampler": "torch (the job's model)", "replies": len(rows),
                 "tokens": sum(map(len, torch_out.token_ids)), "seconds": round(torch_s, 1),
                 "tokens/s": round(rate(torch_out, torch_s), 1), "vs torch": "1.00x"},
                {"sampler": f"serving engine ({served.sampled_by})", "replies": len(rows),
                 "tokens": sum(map(len, served.token_ids)), "seconds": round(served_s, 1),
                 "tokens/s": round(rate(served, served_s), 1),
                 "vs torch": f"{rate(served, served_s) / rate(torch_out, torch_s):.2f}x"}]
    figures = {"torch_tokens_per_s": round(rate(torch_out, torch_s), 1),
               "served_tokens_per_s": round(rate(served, served_s), 1), "engine": served.sampled_by,
               "engine_start_s": round(start_s, 1), "threads": threads, "replies": len(rows), "max_new_tokens": max_new}
    notes = (f"Model `{config.base_model}`; {prompts} held-out prompts x {samples} replies of up to {max_new} tokens "
             f"at temperature 1, {threads} thread(s) each, one after the other. The engine's start (load, and a "
             f"GGUF conversion the first time) took {start_s:.1f} s and is not in its figure.")
    return report("rollouts (online DPO's sampling)", rows_out, figures, notes, path)
