"""Our PPO for LLM RLHF (TRL 1.16 has none), in the spirit of CleanRL's ppo.py: this module runs it, one iteration
reads as one page in ``rlhf.training.ppo.step``.

Each step: Rollout (batched sampling, KV cache; each prompt ``ppo.group_size`` times) -> Score (reward model +
rule terms) -> KL (per-token penalty against the reference = the same base with the LoRA adapter disabled) ->
Advantages -> several epochs of clipped policy updates on shuffled minibatches. Advantages (``ppo.advantage``):
``group``, the default, is each reply's KL-penalised return minus the mean of the other replies to its prompt
(RLOO; no value head, no value loss); ``gae`` puts a value head on the policy's hidden states and uses GAE with a
clipped value loss. Guards skip minibatches with NaN/inf, runaway ratios or KL and fail the run after
``ppo.max_guard_events``; a failed run never writes ``final/``.

References: Ziegler et al. 2019 (RL fine-tuning of LMs from human preferences, adaptive KL);
Stiennon et al. 2020; Ouyang et al. 2022 (InstructGPT); Schulman et al. 2016 (GAE), 2017 (PPO);
Huang et al. 2024, "The N+ implementation details of RLHF with PPO"; Ahmadian et al. 2024 (RLOO baselines).
"""
from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from rlhf.files import atomic_dir
from rlhf.training.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint, save_policy
from rlhf.config import AppConfig
from rlhf.training.ppo.core import AdaptiveKLController, FixedKLController
from rlhf.training.ppo.rollout import build_policy, encode_prompts, generate, reply_relevance, score_tokens
from rlhf.training.ppo.step import Guard, PPOFailed, ppo_step, seed_step
from rlhf.training.ppo.voice_watch import VoiceCheck, VoiceProbe, VoiceWatch
from rlhf.training.ppo.votes import VoteTerm
from rlhf.training.prompts import PromptBuffer
from rlhf.training.run_metrics import MetricsLog, finite_numbers, start_trackers, tracker_for
from rlhf.training.shaping import RewardShaper

log = logging.getLogger(__name__)
TIMED_PHASES = ("generate", "score", "reference", "update", "eval")
EVAL_BATCH = 32  # held-out prompts sampled together in an evaluation


@dataclass
class PPOResult:
    """What a finished run produced and measured."""

    run_dir: Path
    steps: int
    reward_before: float
    reward_after: float
    kl: float
    seconds: float
    phase_seconds: dict
    final_dir: Path  # the PEFT adapter dir (``final/adapter``), ready for PeftModel.from_pretrained / publishing
    best_dir: Path  # ``best/adapter``: the evaluated-best policy (the final one unless eval_every found better)
    eval_samples: list = field(default_factory=list)
    history: list = field(default_factory=list)
    guard_events: int = 0
    voice_stop: Optional[dict] = None  # {step, kept, reason} when the voice watch stopped the run early
    voice_probe: Optional[dict] = None  # {step, reason, losses, kl_coef}: the voice probe found the voice lost
    policy: Any = field(default=None, repr=False, compare=False)  # the trained PolicyWithValue, in memory

    def summary(self) -> dict:
        """The JSON line `train-ppo` prints last."""
        return {"run_dir": str(self.run_dir), "steps": self.steps, "reward_before": self.reward_before,
                "reward_after": self.reward_after, "kl": self.kl, "seconds": round(self.seconds, 2),
                "phase_seconds": {k: round(v, 2) for k, v in self.phase_seconds.items()}}


def evaluate_policy(policy, tokenizer, shaper: RewardShaper, prompts: Sequence[list[dict]], cfg, device,
             seed: int) -> dict:
    """Mean score and KL to the base (nats per reply) of sampled replies to held-out prompts."""
    rewards, kls, samples = [], [], []
    ids = encode_prompts(tokenizer, list(prompts), cfg.max_prompt_tokens)
    seed_step(seed, 0, 1_000_000)  # the same sampling noise for every evaluation of a run
    size = max(cfg.batch_size, EVAL_BATCH)  # a dozen eval prompts in one batch: one decode loop, not two
    for i in range(0, len(ids), size):
        chunk = list(prompts[i:i + size])
        ro = generate(policy, tokenizer, ids[i:i + size], cfg.max_new_tokens, cfg.temperature,
                      cfg.top_p, device, keep_stats=True, with_values=False)
        logp = ro.logprobs if ro.logprobs is not None else \
            score_tokens(policy, ro, cfg.temperature, cfg.mini_batch_size, with_values=False)[0]
        ref, _ = score_tokens(policy, ro, cfg.temperature, cfg.mini_batch_size, reference=True)
        rel = reply_relevance(policy, tokenizer, ro, ids[i:i + size], ref, cfg.temperature, cfg.mini_batch_size,
                              1) if cfg.relevance_weight != 0 else None
        scores, _ = shaper(chunk, ro.replies, ro.n_tokens, ro.finished, rel)
        kls += ((logp - ref) * ro.mask).sum(1).tolist()  # k1 on samples: unbiased for KL(policy || base)
        rewards += scores
        samples += [{"prompt": p, "reply": r, "reward": s} for p, r, s in zip(chunk, ro.replies, scores)]
    finite = [r for r in rewards if math.isfinite(r)]
    return {"reward": sum(finite) / max(len(finite), 1), "kl": sum(kls) / max(len(kls), 1), "samples": samples}


def sample_replies(policy, tokenizer, prompts: Sequence[list[dict]], cfg, device, seed: int,
                   max_new_tokens: int) -> list[str]:
    """One sampled reply per prompt, ``max_new_tokens`` long at most, with the same sampling noise at every call of
    a run (the voice check compares weights, not draws)."""
    ids = encode_prompts(tokenizer, list(prompts), cfg.max_prompt_tokens)
    seed_step(seed, 0, 2_000_000)
    replies: list[str] = []
    for i in range(0, len(ids), EVAL_BATCH):
        replies += generate(policy, tokenizer, ids[i:i + EVAL_BATCH], max_new_tokens, cfg.temperature, cfg.top_p,
                            device, with_values=False).replies
    return replies


def _load(config: AppConfig, base_source: str, init_adapter: Optional[str], resume: Optional[Path], dev, base=None):
    """Tokenizer, policy (its value head trains only with GAE), optimizer, KL controller and trainer state
    (restored on resume)."""
    from rlhf.base_models import load_tokenizer

    cfg = config.ppo
    checkpoint = find_checkpoint(resume) if resume else None
    if resume and checkpoint is None:
        raise FileNotFoundError(f"no checkpoint to resume in {resume}")
    tokenizer = load_tokenizer(base_source, config.chat_template)
    torch.manual_seed(cfg.seed)
    # A resumed run rebuilds its adapter from the checkpoint's own config, so the shapes always match.
    model = build_policy(base_source, cfg, dev.type, str(checkpoint / "adapter") if checkpoint else init_adapter,
                         base=base)
    model.value_head.to(dev)
    model.value_head.requires_grad_(cfg.uses_value_head)  # group baselines need no value head (nor DDP its grads)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate,
                                  eps=1e-5)
    kl_ctl = AdaptiveKLController(cfg.kl_init, cfg.kl_target, cfg.kl_horizon) if cfg.kl_target > 0 \
        else FixedKLController(cfg.kl_init)
    state = {"step": 0, "guard_events": 0, "history": [], "reward_before": None, "best_reward": None,
             "phase_seconds": dict.fromkeys(TIMED_PHASES, 0.0), "seconds": 0.0}
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, model, optimizer)
        kl_ctl.load_state_dict(state["kl_ctl"])
        log.info("resumed %s at step %d", checkpoint, state["step"])
    return tokenizer, model, optimizer, kl_ctl, state


@dataclass
class _Run:
    """One run's moving parts, so ``train_ppo`` reads as the loop it is."""

    config: AppConfig
    acc: Any
    model: Any  # as prepared by Accelerate (DDP-wrapped in a multi-process run)
    policy: Any  # the unwrapped PolicyWithValue
    optimizer: Any
    tokenizer: Any
    kl_ctl: Any
    state: dict
    shaper: RewardShaper
    eval_prompts: Sequence[list[dict]]
    run_dir: Path
    started: float = field(default_factory=time.perf_counter)
    metrics_log: Optional[MetricsLog] = None

    @property
    def main(self) -> bool:
        return self.acc.is_main_process

    def elapsed(self) -> float:
        return self.state["seconds"] + time.perf_counter() - self.started

    def timed(self, phase: str, work: Callable[[], Any]) -> Any:
        """``work()``, its seconds added to ``phase`` in the run's phase times."""
        t = time.perf_counter()
        try:
            return work()
        finally:
            self.state["phase_seconds"][phase] += time.perf_counter() - t

    def evaluate(self) -> dict:
        """Evaluate on the held-out prompts (timed as the ``eval`` phase)."""
        cfg = self.config.ppo
        return self.timed("eval", lambda: evaluate_policy(
            self.policy, self.tokenizer, self.shaper, self.eval_prompts, cfg, self.acc.device, cfg.seed)
            if self.eval_prompts else {"reward": math.nan, "kl": math.nan, "samples": []})

    def record(self, step: int, metrics: dict, guard: "Guard", on_step) -> None:
        """Phase times, the periodic evaluation (best/), the metrics log, checkpoints and the caller's hook."""
        cfg, state = self.config.ppo, self.state
        for name in ("generate", "score", "reference", "update"):
            state["phase_seconds"][name] += metrics[f"time/{name}"]
        state["guard_events"] = guard.events
        if self.main and cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
            ev = self.evaluate()
            metrics.update({"eval/reward": ev["reward"], "eval/kl": ev["kl"]})
            if state["best_reward"] is None or ev["reward"] > state["best_reward"]:
                state["best_reward"] = ev["reward"]
                save_policy(self.policy, self.run_dir / "best", {"step": step, **metrics})
        state["history"].append(metrics)
        if self.main:
            self.metrics_log.log(step, metrics)
            self.acc.log(finite_numbers(metrics), step=step)
            if cfg.save_every and step % cfg.save_every == 0:
                save_checkpoint(self.run_dir, step, self.policy, self.optimizer,
                                {**state, "kl_ctl": self.kl_ctl.state_dict(), "seconds": self.elapsed()})
            if on_step is not None:
                on_step(step, metrics)  # may raise to cancel the run: let it propagate


def _start(config: AppConfig, base_source: str, reward_fn, eval_prompts, run_dir: Path, init_adapter, resume,
           device: str, started: float, base=None) -> _Run:
    """Accelerate, the policy and optimizer (restored on resume), trackers and the run dir's config.json."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    cfg = config.ppo
    acc = Accelerator(cpu=device == "cpu", log_with=tracker_for(cfg.report_to),
                      project_config=ProjectConfiguration(str(run_dir), logging_dir=str(run_dir / "tensorboard")))
    if acc.device.type != device:  # Accelerate keeps the first device a process asked for
        raise RuntimeError(f"train_ppo(device={device!r}) but this process's Accelerate state is on {acc.device}")
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, model, optimizer, kl_ctl, state = _load(config, base_source, init_adapter, resume, acc.device, base)
    model, optimizer = acc.prepare(model, optimizer)
    run = _Run(config, acc, model, acc.unwrap_model(model), optimizer, tokenizer, kl_ctl, state,
               RewardShaper(cfg, reward_fn, config.reward.whole_sentences), eval_prompts, run_dir, started,
               metrics_log=MetricsLog(run_dir, state["step"]) if acc.is_main_process else None)
    start_trackers(acc, cfg.report_to, run_dir.name, config.to_dict())
    if run.main:
        (run_dir / "config.json").write_text(config.to_json())
    return run


def train_ppo(config: AppConfig, base_source: str, reward_fn, prompts: PromptBuffer | Sequence[list[dict]],
              eval_prompts: Sequence[list[dict]], run_dir: Path, init_adapter: Optional[str] = None,
              resume: Optional[Path] = None, on_step: Optional[Callable[[int, dict], None]] = None,
              device: str = "cpu", base=None, evaluate_before: bool = True,
              pairs: Sequence[dict] = ()) -> Optional[PPOResult]:
    """Run PPO on a LoRA policy over ``base_source``; ``reward_fn(prompts, replies) -> scores`` (None = rules only).
    ``pairs``: the decided votes (``{prompt: messages, chosen, rejected}``) that ``ppo.vote_weight`` learns from.
    ``base``: that causal LM when this process has it loaded already (the LoRA adapter goes on its weights).
    ``evaluate_before``: also evaluate the starting policy on ``eval_prompts`` (``reward_before``; NaN when off: the
    retrain's own evaluation measures the active version on the same prompts).

    Returns the result on the main process (None on the others of a multi-process run); raises PPOFailed
    when the guards stop the run, which then has no ``final/``.
    """
    started, cfg = time.perf_counter(), config.ppo
    cfg.check()
    buffer = prompts if isinstance(prompts, PromptBuffer) else PromptBuffer(prompts, 0.0, cfg.seed)
    run = _start(config, base_source, reward_fn, eval_prompts, Path(run_dir), init_adapter, resume, device, started,
                 base)
    acc, state = run.acc, run.state
    guard = Guard(cfg.max_guard_events, state["guard_events"])
    votes = None
    if cfg.vote_weight > 0 and pairs:
        t = time.perf_counter()
        votes = VoteTerm(run.tokenizer, pairs, cfg, acc.device)
        votes.prepare(run.policy)  # the reference's log-probs of every pair, read once
        state["phase_seconds"]["reference"] += time.perf_counter() - t
    watch = VoiceWatch(cfg, run.policy, state["step"]) if VoiceWatch.wanted(cfg) else None
    check = _voice_check(run)
    probe = VoiceProbe(cfg.voice_probe_every) if VoiceProbe.wanted(cfg) and run.eval_prompts else None
    try:
        if state["reward_before"] is None and run.main:
            state["reward_before"] = run.evaluate()["reward"] if evaluate_before else math.nan
        if check is not None and state["step"] == 0:  # the starting weights' voice, kept in checkpoints for a resume
            state["voice_start"] = run.timed("eval", check.measure)
            check.keep_start(run.run_dir)
        for step in range(state["step"] + 1, cfg.steps + 1):
            if state.get("voice_stop"):  # resumed after the watch had stopped the run
                break
            metrics = ppo_step(step, run.model, run.policy, run.optimizer, run.tokenizer, buffer, run.shaper,
                               run.kl_ctl, guard, cfg, acc, votes)
            reason = watch.check([*state["history"], metrics]) if watch is not None else None
            if reason is not None:  # the policy is back on the weights kept; the checkpoint saves those
                state["voice_stop"] = {"step": step, "kept": watch.vouched_step, "of": cfg.steps, "reason": reason,
                                       "by": "watch"}
            elif probe is not None and probe.due(step):
                _probe(run, probe, check, step, metrics)
            run.record(step, metrics, guard, on_step)
            acc.wait_for_everyone()
        result = None
        if check is not None and "voice_start" in state:
            settled = run.timed("eval", lambda: check.settle(state["voice_start"], run.run_dir, len(state["history"]),
                                                             probe.seen if probe is not None else None))
            if settled is not None:
                state["voice_stop"] = {**settled, "of": cfg.steps, "by": "check"}
        if run.main:
            result = _finish(run.policy, run.run_dir, state, run.evaluate(), guard.events, run.elapsed(),
                             {"step": len(state["history"]), "base": base_source, "init_adapter": init_adapter,
                              "processes": acc.num_processes, "device": str(acc.device),
                              "voice_stop": state.get("voice_stop"), "voice_probe": state.get("voice_probe")})
        acc.wait_for_everyone()
        return result
    except PPOFailed as exc:
        if run.main:
            (run.run_dir / "failed.json").write_text(json.dumps({"reason": str(exc), "step": len(state["history"])}))
        raise
    finally:
        acc.end_training()


def _probe(run: _Run, probe: VoiceProbe, check: Optional[VoiceCheck], step: int, metrics: dict) -> None:
    """The voice probe after ``step``: the main process measures, every process follows its verdict; a loss
    multiplies the KL coefficient by ``ppo.voice_probe_kl`` (``state["voice_probe"]``: the first loss, how many)."""
    state = run.state
    reason = None
    if run.main and check is not None and "voice_start" in state:
        reason = run.timed("eval", lambda: probe.measure(check, state["voice_start"], step))
    if run.acc.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        reason = broadcast_object_list([reason])[0]
    metrics["voice_probe/passed"] = float(reason is None)
    if reason is None:
        return
    run.kl_ctl.value *= run.config.ppo.voice_probe_kl  # saved with the controller in the step's checkpoint
    first = state.get("voice_probe") or {"step": step, "reason": reason, "losses": 0}
    state["voice_probe"] = {**first, "losses": first["losses"] + 1, "kl_coef": run.kl_ctl.value}
    log.warning("PPO voice probe: %s after step %d; KL coefficient now %.3g", reason, step, run.kl_ctl.value)


def _voice_check(run: _Run) -> Optional[VoiceCheck]:
    """The end-of-run voice check (``ppo.voice_check_tokens``), on the main process, when there are eval prompts:
    sampled replies, and (``ppo.voice_check_gate``) the replies the gate's guard will read of the new version."""
    cfg = run.config.ppo
    if not VoiceCheck.wanted(cfg) or not run.main:
        return None
    if not run.eval_prompts:
        log.info("no eval prompts: no voice check (ppo.voice_check_tokens)")
        return None
    samplers = {"sampled": lambda: sample_replies(run.policy, run.tokenizer, run.eval_prompts, cfg, run.acc.device,
                                                  cfg.seed, cfg.voice_check_tokens)}
    if cfg.voice_check_gate:
        samplers["gate"] = lambda: gate_replies(run.policy, run.tokenizer, run.eval_prompts, run.config)
    return VoiceCheck(run.config, run.policy, samplers)


def gate_replies(policy, tokenizer, prompts: Sequence[list[dict]], config: AppConfig) -> list[str]:
    """The policy's replies as the retrain's evaluation generates the new version's for the gate's guard
    (``rlhf.retrain.assess.evaluate_phase``): same engine, prompts, length, temperature and seed."""
    from rlhf.training.generation import generate_replies

    peft = policy.policy
    (replies,) = generate_replies(peft, tokenizer, list(prompts), [peft.active_adapter], config.eval.max_new_tokens,
                                  config.eval.reply_temperature, config.ppo.seed + config.eval.seed_offset,
                                  max_prompt_tokens=config.eval.max_prompt_tokens)
    return replies.texts


def _finish(policy, run_dir: Path, state: dict, final: dict, guard_events: int, seconds: float,
            info: dict) -> PPOResult:
    """Write ``final/`` (and ``best/`` when final is the best evaluated) and the eval samples."""
    info = {**info, "eval/reward": final["reward"], "eval/kl": final["kl"], "reward_before": state["reward_before"]}
    final_dir = save_policy(policy, run_dir / "final", info)
    if state["best_reward"] is None or not final["reward"] < state["best_reward"]:
        with atomic_dir(run_dir / "best") as tmp:
            shutil.copytree(final_dir, tmp, dirs_exist_ok=True)
    (run_dir / "eval_samples.json").write_text(json.dumps(final["samples"], indent=1))
    return PPOResult(run_dir, info["step"], state["reward_before"], final["reward"], final["kl"], seconds,
                     dict(state["phase_seconds"]), final_dir / "adapter", run_dir / "best" / "adapter",
                     final["samples"], state["history"], guard_events, info.get("voice_stop"), info.get("voice_probe"),
                     policy)
