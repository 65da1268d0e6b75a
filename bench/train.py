"""`rlhf-studio bench train`: our PPO vs TRL's RLOOTrainer, same model, prompts, batch and generation length.

Both trainers get the same LoRA (rank, alpha, target modules), the same starter prompts, the same cheap
synthetic reward (so the trainers are measured, not a reward model), the same number of completions per
rollout (``ppo.batch_size`` prompts x ``ppo.group_size`` replies; RLOO's ``num_generations`` = the group size,
at least 2, its leave-one-out baseline needs two), the same reply length (``ppo.max_new_tokens``), the same
passes over each rollout (``ppo.ppo_epochs``, RLOO's ``num_iterations``) in minibatches of
``ppo.mini_batch_size``. The first step of each warms up and is not timed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional

from rlhf.config import AppConfig, apply_overrides
from rlhf.cpu import thread_plan


def synthetic_reward(replies: list[str]) -> list[float]:
    """Prefer replies of about 200 characters: cheap, smooth and the same for both trainers."""
    return [1.0 - min(abs(len(r) - 200) / 200, 1.0) for r in replies]


def bench_settings(config: AppConfig, quick: bool) -> AppConfig:
    """The config both trainers run with (small in --quick mode)."""
    values = {"ppo.save_every": 0, "ppo.eval_every": 0, "ppo.report_to": "none"}
    if quick:
        values.update({"ppo.steps": 2, "ppo.batch_size": 2, "ppo.group_size": 2, "ppo.mini_batch_size": 2,
                       "ppo.max_new_tokens": 8, "eval.max_new_tokens": 8, "ppo.ppo_epochs": 1})
    else:
        values.update({"ppo.steps": 4})  # 1 warm-up + 3 timed steps per trainer
    return apply_overrides(config, values)


def completions(cfg) -> int:
    """Replies per rollout step: what both trainers generate and learn from in one step."""
    return cfg.batch_size * cfg.group_size if cfg.group_size > 1 else cfg.batch_size


def run_ours(config: AppConfig, source: str, prompts: list, work: Path, device: str) -> dict:
    """Our PPO: seconds per step after the first, and its phase split."""
    from rlhf.training.ppo.trainer import train_ppo

    result = train_ppo(config, source, lambda p, r: synthetic_reward(r), prompts, [], work / "ppo", device=device)
    timed = result.history[1:] or result.history
    phases = {k: statistics.mean(m[f"time/{k}"] for m in timed) for k in ("generate", "score", "reference", "update")}
    step_s = sum(phases.values())
    return {"step_s": step_s, "phases": phases,
            "response_len": statistics.mean(m["ppo/response_length"] for m in timed)}


def run_anchor(config: AppConfig, source: str, prompts: list, threads: int) -> dict:
    """The yardstick of PPO's rollouts: the same number of replies to the same prompts, of the same length, decoded
    by llama.cpp's batched decode (the serving engine, on the same threads): tokens per second."""
    from rlhf.base_models import load_tokenizer
    from rlhf.serving.policy_server import load_server
    from rlhf.training.generation import served_replies

    cfg = config.ppo
    rows = [prompts[i % len(prompts)] for i in range(completions(cfg))]
    server = load_server(config, threads=threads, warmup=False)
    try:
        started = time.perf_counter()
        replies = served_replies(server, load_tokenizer(source, config.chat_template), rows, None,
                                 cfg.max_new_tokens, 1.0, 0, cfg.max_prompt_tokens)
        seconds = time.perf_counter() - started
    finally:
        server.close()
    return {"tokens_per_s": sum(map(len, replies.token_ids)) / seconds, "engine": replies.sampled_by}


def run_rloo(config: AppConfig, source: str, prompts: list, work: Path, device: str) -> dict:
    """TRL's RLOOTrainer on the same settings: seconds per rollout step after the first."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import RLOOConfig, RLOOTrainer

    from rlhf.base_models import load_causal_lm, load_tokenizer
    from rlhf.base_models import lora_targets

    cfg = config.ppo
    per_rollout = completions(cfg) // cfg.mini_batch_size  # optimizer steps per rollout and epoch
    model = load_causal_lm(source, device)
    tokenizer = load_tokenizer(source)
    marks: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % (per_rollout * cfg.ppo_epochs) == 0:  # a rollout's last update is done
                marks.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    def reward(prompts, completions, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return synthetic_reward(texts)

    args = RLOOConfig(
        output_dir=str(work / "rloo"), use_cpu=device == "cpu", bf16=device == "cuda", learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.mini_batch_size, steps_per_generation=per_rollout,
        num_generations=max(2, cfg.group_size), num_iterations=cfg.ppo_epochs,
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0,
        beta=cfg.kl_init, epsilon=cfg.clip_range, max_grad_norm=cfg.max_grad_norm,
        max_steps=cfg.steps * per_rollout * cfg.ppo_epochs, logging_steps=1, save_strategy="no", report_to="none",
        seed=cfg.seed, disable_tqdm=True,
        # TRL turns activation checkpointing on by default; ours does not recompute, so neither does RLOO here.
        gradient_checkpointing=False)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules=lora_targets(model),
                      task_type="CAUSAL_LM")
    trainer = RLOOTrainer(model=model, reward_funcs=reward, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]), peft_config=lora,
                          callbacks=[Clock()])
    start = time.perf_counter()
    trainer.train()
    marks.insert(0, start)
    gaps = [b - a for a, b in zip(marks, marks[1:])]
    timed = gaps[1:] or gaps
    return {"step_s": statistics.mean(timed),
            "response_len": statistics.mean(lengths) if lengths else float("nan")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench train ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")


def run(config: AppConfig, args: argparse.Namespace, path: Optional[Path] = None) -> dict:
    """Measure both trainers and report samples/s of each, the ratio and our phase split."""
    from bench.report import report
    from rlhf.base_models import pick_device, resolve_model
    from rlhf.training.prompts import build_prompt_sets

    quick = bool(getattr(args, "quick", False))
    app_config, config = config, bench_settings(config, quick)  # the job runs as the app runs it, not as the trainers
    cfg = config.ppo
    device = pick_device(config.device)
    source = resolve_model(config.base_model, config.data_path)
    train, _ = build_prompt_sets(None, "", n_eval=0)
    prompts = [s.as_messages() for s in train]
    import torch

    threads_before = torch.get_num_threads()
    # Both trainers get the CPU threads a retrain job gets (rlhf.cpu budget): that is how PPO runs in the app,
    # and one thread per trainer is far less disturbed by other work on a small shared machine.
    threads = thread_plan(config).job
    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
            ours = run_ours(config, source, prompts, Path(tmp), device)
            rloo = run_rloo(config, source, prompts, Path(tmp), device)
        anchor = run_anchor(config, source, prompts, threads)
    finally:
        torch.set_num_threads(threads_before)
    retrain = run_retrain(app_config, quick)
    ours_sps = completions(cfg) / ours["step_s"]
    rloo_sps = completions(cfg) / rloo["step_s"]
    split = {k: round(v / ours["step_s"], 3) for k, v in ours["phases"].items()}
    rollout_tps = completions(cfg) * ours["response_len"] / ours["phases"]["generate"]
    rows = [{"trainer": "ours (PPO)", "samples_per_s": ours_sps, "s_per_step": ours["step_s"],
             "reply_tokens": ours["response_len"]},
            {"trainer": "TRL RLOOTrainer", "samples_per_s": rloo_sps, "s_per_step": rloo["step_s"],
             "reply_tokens": rloo["response_len"]}]
    figures = {"ppo_samples_per_s": round(ours_sps, 4), "rloo_samples_per_s": round(rloo_sps, 4),
               "ratio": round(ours_sps / rloo_sps, 3), "phase_split": split,
               "batch_size": cfg.batch_size, "completions_per_step": completions(cfg),
               "max_new_tokens": cfg.max_new_tokens, "steps": cfg.steps,
               "threads": threads, "retrain_seconds": retrain["seconds"],
               "retrain_peak_rss_mb": retrain["peak_rss_mb"], "retrain_phase_seconds": retrain["phase_seconds"],
               "load_average": [round(x, 2) for x in os.getloadavg()],
               "retrain_ppo_phase_seconds": retrain["ppo_phase_seconds"], "retrain_ppo_steps": retrain["ppo_steps"],
               "eval_share": retrain["eval_share"],
               "eval_share_with_ppo": retrain["eval_share_with_ppo"],
               "rollout_tokens_per_s": round(rollout_tps, 1), "anchor_tokens_per_s": round(anchor["tokens_per_s"], 1),
               "anchor_engine": anchor["engine"], "rollout_vs_anchor": round(rollout_tps / anchor["tokens_per_s"], 2)}
    notes = describe(config, device, threads, split, retrain, quick, rollout_tps, anchor)
    return report("train", rows, figures, notes, path=path)


def describe(config: AppConfig, device: str, threads: int, split: dict, retrain: dict, quick: bool,
             rollout_tps: float, anchor: dict) -> str:
    """The report's notes: the settings measured, the rollouts against their yardstick and the retrain's split."""
    cfg = config.ppo
    return (f"Model `{config.base_model}` on {device}; {completions(cfg)} completions per rollout "
            f"({cfg.batch_size} prompts x {cfg.group_size}), "
            f"{cfg.max_new_tokens} new tokens, {cfg.ppo_epochs} epoch(s) in minibatches of {cfg.mini_batch_size}, "
            f"LoRA r={cfg.lora_r}; {cfg.steps} steps, the first untimed; {threads} CPU thread(s). "
            f"Rollouts: {rollout_tps:.1f} reply tokens/s in our generate phase against {anchor['tokens_per_s']:.1f} "
            f"for the same replies through the serving engine's batched decode ({anchor['engine']}, same threads): "
            f"{rollout_tps / anchor['tokens_per_s']:.2f}x (goal >= 0.5x). "
            "Our phase split (share of a step): "
            + ", ".join(f"{k} {v:.0%}" for k, v in split.items()) + ". "
            + f"A whole retrain job ({'the --quick config' if quick else 'the default config'}, "
            f"{retrain['pairs']} votes, {retrain['ppo_steps']} PPO steps "
            f"from the shipped preference pool, its own process) took {retrain['seconds']:.0f} s and peaked at "
            f"{retrain['peak_rss_mb'] or float('nan'):.0f} MB resident: "
            + ", ".join(f"{k} {v:.0f} s" for k, v in retrain["phase_seconds"].items())
            + f"; the eval phase is {retrain['eval_share']:.0%} of it ({retrain['eval_share_with_ppo']:.0%} with PPO's "
            "own before/after evaluations, which the ppo phase contains). Goal: eval <= 25%. Load average "
            + "/".join(f"{x:.1f}" for x in os.getloadavg()) + " (1/5/15 min) at the end.")


def peak_child_rss_mb() -> float:
    """Largest peak resident set size of this process's ended children so far (MB): the job process's, when it
    is the largest child this process has waited for."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux


def run_retrain(config: AppConfig, quick: bool) -> dict:
    """One real retrain job on votes from the shipped preference pool: its wall time, phase split and the job
    process's peak memory (None when an earlier child of this process was larger, so the figure would be its)."""
    from bench.retrain import RetrainRun, retrain_config

    before = peak_child_rss_mb()
    with tempfile.TemporaryDirectory(prefix="bench-retrain-") as tmp:
        run = RetrainRun(retrain_config(config, Path(tmp), quick), n_pairs=16 if quick else 64)
        run.start()
        result = run.wait()
    if result["status"] != "succeeded":
        raise RuntimeError(f"the benchmark retrain failed: {result['error']}")
    after = peak_child_rss_mb()
    return {**result, "peak_rss_mb": round(after, 1) if after > before else None, "ppo_steps": run.config.ppo.steps}
