"""`rlhf-studio bench fidelity`: is a version served by llama.cpp the policy PPO trained?

Greedy replies of two kernels on a 135M model part ways on near-ties within a few tokens, so identical text is
the wrong test. On held-out prompts of the shipped preference pool, for the base and for a trained version:

(a) teacher-forced top-1 agreement: torch's greedy reply is fed to both engines; at each reply position, does
    llama.cpp's most likely next token equal torch's?  (goal >= 95%)
(b) mean per-token KL(torch || llama.cpp) over those positions;
(c) the trained version's effect: the reward model's win rate of version vs base on llama.cpp's replies must lie
    inside the 95% bootstrap interval of the same figure on torch's replies.

The trained version is the newest version of ``--data DIR`` (a data dir after a retrain) or, without it, one
default retrain run here on 64 votes of the shipped pool.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

from bench.report import report
from rlhf.config import AppConfig


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def llama_reply_logits(ctx, batch, prompt: list[int], reply: list[int]) -> np.ndarray:
    """llama.cpp's logits at the positions that predict each reply token (teacher forcing), one sequence."""
    ctx.clear()
    batch.clear()
    ids = list(prompt) + list(reply)
    for i, t in enumerate(ids[:-1]):
        batch.add(t, i, 0, i >= len(prompt) - 1)
    if ctx.decode(batch) != 0:
        raise RuntimeError("llama_decode failed")
    first = len(prompt) - 1
    return np.stack([ctx.logits(i).copy() for i in range(first, len(ids) - 1)])


def torch_reply_logits(model, prompt: list[int], reply: list[int]) -> np.ndarray:
    import torch

    ids = torch.tensor([list(prompt) + list(reply)])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt) - 1:-1]
    return logits.float().numpy()


def agreement(model, gguf: str, lora: Optional[str], prompts: list[list[int]], replies: list[list[int]]) -> dict:
    """(a) top-1 agreement and (b) mean KL(torch || llama.cpp) per reply token, torch's replies fed to both.
    ``model`` is the torch policy as it should answer (adapter active, or the base); ``lora`` its GGUF LoRA."""
    from rlhf.serving.llama_cpp.lib import Batch, Context, Lora, Model

    llama = Model(gguf)
    width = max(len(p) + len(r) for p, r in zip(prompts, replies))
    ctx, batch = Context(llama, width + 8, 1, width + 8, 1), Batch(llama.lib, width + 8)
    adapter = Lora(llama, lora) if lora else None
    ctx.set_lora(adapter)
    same = total = 0
    kls = []
    try:
        for prompt, reply in zip(prompts, replies):
            if not reply:
                continue
            ours, theirs = llama_reply_logits(ctx, batch, prompt, reply), torch_reply_logits(model, prompt, reply)
            same += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
            total += len(reply)
            p, q = _log_softmax(theirs.astype(np.float64)), _log_softmax(ours.astype(np.float64))
            kls.extend((np.exp(p) * (p - q)).sum(-1).tolist())
    finally:
        for obj in (batch, ctx, adapter, llama):
            if obj is not None:
                obj.close()
    return {"top1_agreement": same / max(1, total), "mean_kl": float(np.mean(kls)) if kls else 0.0,
            "tokens": total}


def held_out_chats(system: str, n: int) -> list[list[dict]]:
    """``n`` held-out prompts of the shipped preference pool as chats under ``system``."""
    from rlhf.simulate.preference_pool import load_pool, split_prompts

    pool = load_pool()
    _, heldout = split_prompts(pool)
    by_id = {r["prompt_id"]: r["prompt"] for r in pool}
    head = [{"role": "system", "content": system}] if system else []
    return [head + [{"role": "user", "content": by_id[i]}] for i in heldout[:n]]


def trained_version(config: AppConfig, data: Optional[str], tmp: Path) -> tuple[str, str, str]:
    """(data dir, adapter dir, reward model dir) of the newest trained version: ``data``'s, or a fresh retrain's."""
    from storage import Store

    if data is None:
        from bench.retrain import RetrainRun, retrain_config

        run = RetrainRun(retrain_config(config, tmp / "retrain", quick=False), 64, label="fidelity")
        run.start()
        result = run.wait()
        if result["status"] != "succeeded":
            raise RuntimeError(f"the retrain failed: {result['error']}")
        data = str(tmp / "retrain")
    store = Store(Path(data) / "studio.db")
    try:
        versions = [p for p in store.list_policies("assistant") if p.adapter_path and p.reward_model_id]
        if not versions:
            raise RuntimeError(f"{data} holds no trained version with a reward model")
        version = max(versions, key=lambda p: p.version)
        return data, version.adapter_path, store.get_reward_model(version.reward_model_id).path
    finally:
        store.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench fidelity ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")
    p.add_argument("--data", help="a data dir whose newest version (and its reward model) is measured "
                                  "(default: run a default retrain first)")
    p.add_argument("--eval-prompts", type=int, help="held-out prompts to measure on")


def run(config: AppConfig, args, path=None) -> dict:
    """Measure (a), (b), (c) for the base and a trained version; report and return the figures."""
    from peft import PeftModel

    from rlhf.prompting import encode_prompt
    from rlhf.training.generation import generate_replies
    from rlhf.base_models import load_causal_lm, load_tokenizer, resolve_model, shipped_gguf
    from rlhf.serving.llama_cpp.base import llama_base
    from rlhf.serving.llama_cpp.convert import BaseInfo, lora_to_gguf
    from rlhf.training.reward import load_reward_model

    from rlhf.cpu import apply_torch_threads, thread_plan

    apply_torch_threads(thread_plan(config).job)  # a job's share of the cores: 2 torch threads collapse under load
    n = 16 if getattr(args, "quick", False) else max(64, getattr(args, "eval_prompts", None) or 64)
    max_new = config.ppo.max_new_tokens
    with tempfile.TemporaryDirectory(prefix="bench-fidelity-") as tmp:
        data, adapter, rm_path = trained_version(config, getattr(args, "data", None), Path(tmp))
        source = resolve_model(config.base_model, config.data_path)
        gguf = str(shipped_gguf(config.base_model) or llama_base(source, tmp)[0])
        tokenizer = load_tokenizer(source)
        chats = held_out_chats(_system(data), n)
        model = PeftModel.from_pretrained(load_causal_lm(source, "cpu"), adapter, adapter_name="v").eval()
        torch_replies = dict(zip(("v", None), generate_replies(model, tokenizer, chats, ["v", None], max_new, 0.0, 0)))
        lora = str(lora_to_gguf(adapter, BaseInfo.read(gguf), Path(tmp) / "v.gguf"))
        prompts = [encode_prompt(tokenizer, c) for c in chats]
        model.set_adapter("v")
        fid_v = agreement(model, gguf, lora, prompts, torch_replies["v"].token_ids)
        with model.disable_adapter():
            fid_b = agreement(model, gguf, None, prompts, torch_replies[None].token_ids)
        llama_texts = llama_replies(config, tmp, adapter, prompts, max_new)
        scorer = load_reward_model(rm_path, device="cpu")
        w_torch = version_wins(scorer, chats, torch_replies["v"].texts, torch_replies[None].texts)
        w_llama = version_wins(scorer, chats, llama_texts["v"], llama_texts[None])
    return _report(config, n, max_new, adapter, rm_path, {"base": fid_b, "trained": fid_v}, w_torch, w_llama, path)


def llama_replies(config: AppConfig, data_dir: str, adapter: str, prompts: list[list[int]],
                  max_new: int) -> dict:
    """The llama.cpp engine's greedy reply texts, as the app serves them, for the version (``"v"``) and the base
    (None)."""
    from rlhf.serving.policy_server import AdapterRef, GenParams, PolicyServer

    server = PolicyServer.load(config.base_model, "cpu", "fidelity", engine="llama_cpp", data_dir=data_dir)
    try:
        greedy = GenParams(max_new_tokens=max_new, temperature=0)
        refs = {"v": AdapterRef(1, adapter), None: AdapterRef(0)}
        return {k: [s.text() for s in [server.stream_ids(p, ref, greedy) for p in prompts]]
                for k, ref in refs.items()}
    finally:
        server.close()


def version_wins(scorer, chats: list, texts_v: list, texts_b: list) -> np.ndarray:
    """(prompts, members) wins of the version, scored as the retrain's gate scores them."""
    from rlhf.retrain.evaluation import win_matrix

    members = getattr(scorer, "member_scores", None)
    if members:
        both = np.asarray(members(chats + chats, texts_v + texts_b), dtype=float)
    else:
        both = np.asarray(scorer(chats + chats, texts_v + texts_b), dtype=float)[:, None]
    return win_matrix(both[:len(chats)], both[len(chats):])


def _report(config: AppConfig, n: int, max_new: int, adapter: str, rm_path: str, fid: dict, w_torch: np.ndarray,
            w_llama: np.ndarray, path) -> dict:
    """The table (base and trained), the figures and the notes, reported; the figures."""
    from rlhf.retrain.evaluation import bootstrap_interval

    fid_b, fid_v = fid["base"], fid["trained"]
    low, high = bootstrap_interval(w_torch)
    rate_t, rate_l = float(w_torch.mean()), float(w_llama.mean())
    rows = [{"version": "base", "prompts": n, "reply_tokens": fid_b["tokens"],
             "top1_agreement": fid_b["top1_agreement"], "mean_kl": fid_b["mean_kl"], "win_rate_torch": "",
             "win_rate_llama_cpp": ""},
            {"version": "trained", "prompts": n, "reply_tokens": fid_v["tokens"],
             "top1_agreement": fid_v["top1_agreement"], "mean_kl": fid_v["mean_kl"], "win_rate_torch": rate_t,
             "win_rate_llama_cpp": rate_l}]
    figures = {"prompts": n, "base_top1": round(fid_b["top1_agreement"], 4), "base_kl": round(fid_b["mean_kl"], 5),
               "trained_top1": round(fid_v["top1_agreement"], 4), "trained_kl": round(fid_v["mean_kl"], 5),
               "win_rate_torch": round(rate_t, 3), "win_rate_torch_interval": [round(low, 3), round(high, 3)],
               "win_rate_llama_cpp": round(rate_l, 3), "effect_survives": bool(low <= rate_l <= high)}
    notes = (f"Base `{config.base_model}` (llama.cpp serves the shipped GGUF; torch the same weights dequantized to "
             f"fp32). Trained version: {adapter} (reward model {rm_path}). {n} held-out prompts of the shipped pool, "
             f"greedy, max_new_tokens={max_new}. (a)/(b): torch's greedy reply teacher-forced through both engines. "
             f"(c): win rate of the trained version vs the base under the version's own reward model (ensemble "
             f"members resampled in the bootstrap), on each engine's replies; goal: llama.cpp's inside torch's 95% "
             f"interval.")
    return report("fidelity", rows, figures, notes, path=path)


def _system(data: str) -> str:
    from storage import Store

    store = Store(Path(data) / "studio.db")
    try:
        return store.get_agent("assistant").system_prompt or ""
    finally:
        store.close()
