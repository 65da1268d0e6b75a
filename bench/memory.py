"""`rlhf-studio bench memory`: resident memory of one serving process with 1 vs 10 policy versions.

Ten real LoRA adapters of the policy's shape (``ppo.lora_r``/``ppo.lora_alpha`` on q/k/v/o, random non-zero
weights) are written first; a fresh child process then loads the server, serves the base once, serves version 1
once (RSS "1 version"), then versions 2..10 once each (RSS "10 versions"). Versions share the base weights, so
each adds only its adapter. RSS is read from /proc after ``gc.collect()`` and glibc ``malloc_trim(0)``, so freed
heap the allocator kept does not count as memory in use.
"""
from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.report import ROOT, report
from rlhf.config import AppConfig

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def rss_mb() -> float:
    """This process's resident set size in MB (after a GC and returning free heap to the OS)."""
    import ctypes

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: measure as is
        pass
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak, the best portable figure


def make_adapters(source: str, root: Path, n: int, r: int, alpha: int) -> list[str]:
    """``n`` LoRA adapters (r, alpha, q/k/v/o, random weights) for the model at ``source``; their dirs."""
    import torch
    from peft import LoraConfig, get_peft_model

    from rlhf.base_models import load_causal_lm

    torch.manual_seed(0)
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=TARGETS, init_lora_weights=False)
    model = get_peft_model(load_causal_lm(source, "cpu"), cfg, adapter_name="v0")
    for i in range(1, n):
        model.add_adapter(f"v{i}", cfg)
    model.save_pretrained(str(root))  # named adapters land in root/<name>/
    dirs = [str(root / f"v{i}") for i in range(n)]
    missing = [d for d in dirs if not (Path(d) / "adapter_config.json").is_file()]
    if missing:
        raise RuntimeError(f"adapters were not written where expected: {missing}")
    del model
    gc.collect()
    return dirs


def measure(source: str, device: str, adapter_dirs: list[str], max_new_tokens: int, engine: str = "transformers",
            data_dir: str | None = None) -> dict:
    """Serve base, 1 version, then all versions in this process; RSS (and CUDA) figures after each."""
    import torch

    from rlhf.serving.policy_server import AdapterRef, GenParams, PolicyServer

    server = PolicyServer.load(source, device, "bench-memory", engine=engine, data_dir=data_dir)
    history = [{"role": "user", "content": "Hello! What can you do?"}]
    params = GenParams(max_new_tokens=max_new_tokens, temperature=0)

    def cuda_mb() -> float:
        return torch.cuda.memory_allocated() / 2**20 if device == "cuda" else 0.0

    server.generate("", history, AdapterRef(0), params)
    figures = {"rss_base_mb": rss_mb(), "cuda_base_mb": cuda_mb()}
    server.generate("", history, AdapterRef(1, adapter_dirs[0]), params)
    figures.update(rss_1_mb=rss_mb(), cuda_1_mb=cuda_mb())
    for i, path in enumerate(adapter_dirs[1:], start=2):
        server.generate("", history, AdapterRef(i, path), params)
    figures.update(rss_10_mb=rss_mb(), cuda_10_mb=cuda_mb(), loaded=len(server.loaded_adapters))
    server.close()
    return figures


def measure_in_child(source: str, device: str, adapter_dirs: list[str], max_new_tokens: int,
                     engine: str = "transformers", data_dir: str | None = None) -> dict:
    """``measure`` in a fresh interpreter (nothing this process loaded is counted); its JSON comes back."""
    spec = json.dumps({"source": source, "device": device, "adapter_dirs": adapter_dirs,
                       "max_new_tokens": max_new_tokens, "engine": engine, "data_dir": data_dir})
    done = subprocess.run([sys.executable, "-m", "bench.memory", spec], capture_output=True, text=True,
                          timeout=1800, cwd=ROOT)  # the checkout: bench is not an installed package
    if done.returncode != 0:
        raise RuntimeError(f"memory benchmark child failed ({done.returncode}): stderr {done.stderr[-2000:]!r}, "
                           f"stdout {done.stdout[-500:]!r}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench memory ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")


def run(config: AppConfig, args, path=None) -> dict:
    """Write 10 adapters, measure a fresh serving process with 1 and 10 versions; report the figures."""
    from rlhf.base_models import pick_device, resolve_model

    quick = bool(getattr(args, "quick", False))
    source = resolve_model(config.base_model, config.data_path)
    device = pick_device(config.device)
    from rlhf.serving.llama_cpp.spec import llama_cpp_installed

    engines = ["transformers"] + (["llama_cpp"] if llama_cpp_installed() and device == "cpu" else [])
    rows, figures = [], {"device": device}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        dirs = make_adapters(source, Path(tmp), 10, config.ppo.lora_r, config.ppo.lora_alpha)
        adapter_mb = sum(f.stat().st_size for f in Path(dirs[0]).iterdir()) / 2**20
        for engine in engines:
            # llama.cpp serves the base by name (the shipped GGUF itself) and converts each adapter on first use
            base = config.base_model if engine == "llama_cpp" else source
            result = measure_in_child(base, device, dirs, 2 if quick else 8, engine, str(Path(tmp) / "data"))
            ratio = result["rss_10_mb"] / result["rss_1_mb"]
            rows += [{"engine": engine, "versions": "base only", "rss_mb": result["rss_base_mb"],
                      "cuda_mb": result["cuda_base_mb"]},
                     {"engine": engine, "versions": "1", "rss_mb": result["rss_1_mb"], "cuda_mb": result["cuda_1_mb"]},
                     {"engine": engine, "versions": "10", "rss_mb": result["rss_10_mb"],
                      "cuda_mb": result["cuda_10_mb"]}]
            prefix = "" if engine == "transformers" else "llama_cpp_"
            figures.update({f"{prefix}rss_1_mb": round(result["rss_1_mb"], 1),
                            f"{prefix}rss_10_mb": round(result["rss_10_mb"], 1), f"{prefix}ratio": round(ratio, 3),
                            f"{prefix}mb_per_version": round((result["rss_10_mb"] - result["rss_1_mb"]) / 9, 1)})
    figures["adapter_file_mb"] = round(adapter_mb, 1)
    notes = (f"Model `{config.base_model}` on {device}, engines: {', '.join(engines)}; adapters r={config.ppo.lora_r}, "
             f"alpha={config.ppo.lora_alpha} on {'/'.join(t[0] for t in TARGETS)} ({adapter_mb:.1f} MB each on "
             f"disk; llama.cpp holds each as an f16 GGUF LoRA). Goal: ratio ≤ 1.1.")
    return report("memory", rows, figures, notes, path=path)


if __name__ == "__main__":  # the child of measure_in_child
    import faulthandler
    import os

    faulthandler.enable()  # a native crash prints where it happened instead of a bare signal
    print(json.dumps(measure(**json.loads(sys.argv[1]))), flush=True)
    sys.stderr.flush()
    # The figures are out; leave without interpreter teardown, where torch's and the server's threads were seen
    # to abort the process once in a full test run (SIGABRT, no message) after the work was done.
    os._exit(0)
