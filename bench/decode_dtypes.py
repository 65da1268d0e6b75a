"""Where a batch-1 decode step's time goes, and what cheaper weights would buy (#16).

    python -m bench.decode_dtypes [--threads 1] [--tokens 48]

Greedy decode of the served base model, one prompt at a time, in fp32 (what the app serves: the replies PPO
trained), bf16 weights, and int8 weight-only (per output channel, ``aten._weight_int8pack_mm``, bf16
activations); for each, decode tokens/s and how many replies are token-for-token those of fp32. Then a
``torch.profiler`` table of fp32 decode steps, and llama.cpp on the shipped GGUF with the same prompts and
threads when `make bench-anchors` built it. Prints one JSON line last. Not imported by the app.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn

PROMPTS = ["Explain photosynthesis to a ten-year-old.", "What is the capital of France?",
           "Give me three tips for sleeping better.", "Write a haiku about autumn.", "What does a compiler do?",
           "Why is the sky blue?"]


class Int8WeightLinear(nn.Module):
    """A linear layer whose weight is stored as int8 with one scale per output channel."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0
        self.register_buffer("weight_int8", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scale.to(x.dtype))
        y = y.reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def int8_weights(model: nn.Module) -> nn.Module:
    """Every linear layer but the (tied) output projection turned into ``Int8WeightLinear``."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and name != "lm_head":
                setattr(module, name, Int8WeightLinear(child))
    return model


def greedy(model, ids: torch.Tensor, n: int, eos: int) -> tuple[list[int], float]:
    """Greedy tokens (EOS not included) and decode tokens/s (tokens after the first / time from the first to the
    last)."""
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        tokens = []
        t0 = time.perf_counter()
        while int(nxt) != eos:
            tokens.append(int(nxt))
            if len(tokens) == 1:
                t0 = time.perf_counter()
            if len(tokens) >= n:
                break
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        seconds = time.perf_counter() - t0
    return tokens, (len(tokens) - 1) / seconds if len(tokens) > 1 and seconds > 0 else 0.0


def llama_cpp_decode(base_model: str, prompts: list[list[int]], threads: int, tokens: int,
                     reference: list[list[int]]) -> dict | None:
    """llama.cpp's batch-1 decode on the shipped GGUF with the same prompts and threads (when
    `make bench-anchors` built it), and how many of its greedy replies are those of fp32."""
    import subprocess
    from pathlib import Path

    from bench.anchors import anchor_python, shipped_gguf

    python, gguf = anchor_python(), shipped_gguf(base_model)
    if python is None or gguf is None:
        return None
    spec = {"gguf": str(gguf), "threads": threads, "max_tokens": tokens, "prompts": prompts, "levels": [1],
            "per_user": len(prompts)}
    done = subprocess.run([str(python), str(Path(__file__).with_name("llama_anchor.py"))], input=json.dumps(spec),
                          capture_output=True, text=True, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    same = sum(a == b for a, b in zip(out["greedy"], reference))
    return {"decode_tokens_per_s": round(out["levels"][0]["decode_tokens_per_s"], 2),
            "greedy_identical_to_fp32": f"{same}/{len(prompts)}"}


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM

    from rlhf.config import load_config
    from rlhf.base_models import load_tokenizer, resolve_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=48)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_config()
    source = resolve_model(config.base_model, config.data_path)
    tok = load_tokenizer(source)
    inputs = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                      return_dict=True, return_tensors="pt")["input_ids"] for q in PROMPTS]
    variants = {"fp32": lambda: AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32),
                "bf16": lambda: AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16),
                "int8_weights_bf16_act": lambda: int8_weights(AutoModelForCausalLM.from_pretrained(
                    source, dtype=torch.bfloat16))}
    figures, reference = {"threads": args.threads, "tokens": args.tokens}, None
    for name, load in variants.items():
        model = load().eval()
        greedy(model, inputs[0], 4, tok.eos_token_id)  # warm-up
        runs = [greedy(model, ids, args.tokens, tok.eos_token_id) for ids in inputs]
        replies = [r[0] for r in runs]
        reference = reference or replies
        figures[name] = {"decode_tokens_per_s": round(sum(r[1] for r in runs) / len(runs), 2),
                         "greedy_identical_to_fp32": f"{sum(a == b for a, b in zip(replies, reference))}/{len(runs)}"}
        print(name, figures[name], file=sys.stderr, flush=True)
        if name == "fp32":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                greedy(model, inputs[0], 16, -1)
            total = sum(e.self_cpu_time_total for e in prof.key_averages())
            top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:6]
            figures["fp32_profile_self_cpu_share"] = {e.key: round(e.self_cpu_time_total / total, 3) for e in top}
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), file=sys.stderr)
        del model
    figures["llama_cpp"] = llama_cpp_decode(config.base_model, [ids[0].tolist() for ids in inputs], args.threads,
                                            args.tokens, reference)
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
