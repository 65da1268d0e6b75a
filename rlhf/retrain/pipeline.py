"""The retrain job: feedback snapshot → data → reward model → PPO → evaluation → gate → publish.

Runs inside a job process (rlhf/jobs/worker.py). Each phase reports progress and metrics through the job
context, so the Training tab shows it live; a failure anywhere publishes nothing.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from rlhf.config import AppConfig, ConfigError, apply_overrides
from rlhf.jobs.context import JobContext
from storage import InvalidInput, Policy, Store

# Phase shares of a retrain's wall time (for the progress bar), measured on the default config.
RETRAIN_PHASES = {"data": (0.0, 0.01), "reward": (0.01, 0.25), "ppo": (0.25, 0.87), "dpo": (0.25, 0.87),
                  "eval": (0.87, 0.99), "publish": (0.99, 1.0), "done": (1.0, 1.0)}
# Throughput on a 2-core CPU with SmolLM2-135M, used until this machine has measured its own.
DEFAULT_RATES = {"reward_s_per_pair": 1.5, "ppo_s_per_sample": 2.5, "dpo_s_per_pair": 1.0, "eval_s": 45.0,
                 "overhead_s": 30.0}


def measured_rates(store: Store, agent: str) -> dict:
    """Seconds per pair / per PPO sample from this machine's last successful retrain, else defaults."""
    for job in store.list_jobs(agent, limit=100):
        if job.kind == "retrain" and job.status == "succeeded" and job.result.get("rates"):
            return {**DEFAULT_RATES, **job.result["rates"]}
    return dict(DEFAULT_RATES)


def estimate_minutes(rates: dict, pairs: int, config: AppConfig) -> float:
    """Expected wall minutes of a retrain with these settings."""
    reward_s = rates["reward_s_per_pair"] * max(pairs, 1) * config.reward.epochs
    if config.retrain.method == "dpo":
        policy_s = rates["dpo_s_per_pair"] * max(pairs, 1) * config.dpo.epochs
    else:
        policy_s = rates["ppo_s_per_sample"] * config.ppo.steps * config.ppo.batch_size * config.ppo.group_size
    return round((reward_s + policy_s + rates["eval_s"] + rates["overhead_s"]) / 60.0, 1)


def dry_run(store: Store, config: AppConfig, agent: str, overrides: Optional[dict] = None) -> dict:
    """What a retrain would use and cost now: feedback counts, pairs, minutes, and what is missing.

    Readiness is the retrain's own data preparation (``rlhf.training.reward.prepare_data``) on a snapshot of the
    feedback: the dry run says ready exactly when a retrain's data phase would pass, and otherwise repeats its
    NotEnoughData."""
    from rlhf.training.data import FeedbackSnapshot, NotEnoughData
    from rlhf.training.reward import prepare_data, reward_rows

    try:
        cfg = apply_overrides(config, overrides or {})
    except ConfigError as exc:
        raise InvalidInput(f"config: {exc}") from None
    snapshot = FeedbackSnapshot.take(store, agent)
    missing = None
    try:
        counts = prepare_data(snapshot.rows, cfg.reward, cfg.gate.judge_share, cfg.gate.min_judge_pairs).counts
        n_pairs, n_points = counts["pairs"], counts["points"]
    except NotEnoughData as exc:
        pairs, points = reward_rows(snapshot.rows, cfg.reward)
        n_pairs, n_points, missing = len(pairs), len(points), exc.missing
    out = {"feedback_count": snapshot.feedback_count, "pairs": n_pairs, "pointwise": n_points,
           "estimated_minutes": estimate_minutes(measured_rates(store, agent), n_pairs, cfg), "ready": missing is None}
    if missing is not None:
        out["missing"] = missing
    return out


class Phases:
    """Maps each phase's own 0–1 progress onto the job's overall progress bar and times the phases."""

    def __init__(self, ctx: JobContext):
        self.ctx = ctx
        self.started: dict[str, float] = {}
        self.seconds: dict[str, float] = {}

    def enter(self, name: str, message: str = "") -> None:
        now = time.perf_counter()
        for previous, t0 in self.started.items():
            self.seconds.setdefault(previous, now - t0)
        self.started[name] = now
        self.ctx.progress(RETRAIN_PHASES[name][0], name, message or f"{name} started")

    def report(self, name: str, fraction: float, message: Optional[str] = None) -> None:
        lo, hi = RETRAIN_PHASES[name]
        self.ctx.progress(lo + (hi - lo) * max(0.0, min(1.0, fraction)), name, message)


def retrain(ctx: JobContext) -> dict:
    """Train a reward model and a PPO policy on the agent's feedback, evaluate, gate and publish."""
    from rlhf.models import pick_device, resolve_model
    from rlhf.retrain.publish import publish_version
    from rlhf.training.data import FeedbackSnapshot

    store, cfg = ctx.store, ctx.config
    agent = store.get_agent(ctx.job.agent_id)
    parent = store.active_policy(agent.id)  # what the candidate must beat
    start = start_policy(store, agent.id, ctx.job.config.get("from_policy_id")) or parent  # where PPO starts
    phases = Phases(ctx)
    device = pick_device(cfg.device)
    base_source = resolve_model(cfg.base_model, cfg.data_path)

    # Data: one read of the feedback; everything below trains and counts on these rows, nothing newer
    phases.enter("data", f"snapshot of {agent.name}'s feedback")
    snapshot = FeedbackSnapshot.take(store, agent.id)

    # Reward model on that snapshot, on the one copy of the base this job loads (None: the kinds load their own)
    phases.enter("reward", "training the reward model")
    base, features = shared_base(cfg, base_source, device)
    rm, scorer = train_reward_phase(ctx, phases, agent.name, device, snapshot, features)

    # The policy from the active version (retrain.method): PPO toward the new reward model on the snapshot's
    # prompts, or DPO on the pairs that model learned from; its LoRA adapter on the same base weights (the reward
    # features switch adapters off while they read them)
    method = cfg.retrain.method
    phases.enter(method, "PPO on the reward model" if method == "ppo" else "DPO on the preference pairs")
    trained, eval_prompts = train_policy_phase(ctx, phases, agent.name, base_source, scorer, start.adapter_path,
                                               device, snapshot, base, rm.pairs)

    # Evaluation against the active version (on the trained policy and its base, already loaded), then the gate
    phases.enter("eval", "evaluating candidate vs active version")
    report, guard = evaluate_phase(ctx, base_source, device, trained, parent.adapter_path, scorer, eval_prompts)
    judged = gate_phase(ctx, rm, scorer, report, guard, eval_prompts, device, features)
    verdict = judged.verdict
    passed, reasons = verdict.verdict == "promote", ([] if verdict.verdict == "promote" else [verdict.reason])
    ctx.log(f"gate: {verdict.verdict} — {verdict.reason}")
    if judged.guarded:
        ctx.log(f"guard tripped: {', '.join(guard['tripped'])}", level="warning")
    ctx.metrics(trained.steps + 1, {**report.metrics(), "gate/win_rate": verdict.win_rate, "gate/low": verdict.low,
                                    "gate/high": verdict.high})

    # Publish (directory, then one transaction); promote when the gate passes and auto-promote is on
    phases.enter("publish", "publishing the new version")
    metrics = {**report.metrics(), "reward_model/eval_accuracy": rm.eval_accuracy,
               **{f"reward_model/{k}": rm.metrics.get(f"reward/{k}") for k in ("cv_accuracy", "cv_low", "cv_high")},
               **{f"reward_model/{k}": rm.metrics.get(f"reward/{k}") for k in ("judge_accuracy", "judge_low",
                                                                               "judge_high", "judge_pairs")},
               "feedback_used": snapshot.feedback_count, "gate/passed": passed,
               "gate/reasons": reasons, **judged.metrics(), "retrain/method": method,
               **({"ppo/reward_after": trained.reward_after} if method == "ppo" else {"dpo/pairs": len(rm.pairs)})}
    promote = passed and cfg.retrain.auto_promote
    policy = publish_version(store, cfg, agent.name, trained.final_dir, parent_id=start.id, promote=promote,
                             job_id=ctx.job_id, reward_model_id=rm.reward_model_id, data_snapshot=snapshot.watermark,
                             run_config=cfg.to_dict(), metrics=metrics)
    store.record_eval_samples(policy.id, report.samples)
    store.record_eval_samples(parent.id, report.active_samples)  # same prompts, same reward model: comparable
    ctx.log(f"published version {policy.version} ({'active' if promote else 'candidate'})"
            + ("" if passed else ": " + "; ".join(reasons)))
    phases.enter("done", "finished")
    rates = {"reward_s_per_pair": phases.seconds["reward"] / max(1.0, rm.pairs_train * cfg.reward.epochs),
             "eval_s": phases.seconds["eval"]}
    if method == "ppo":
        rates["ppo_s_per_sample"] = phases.seconds["ppo"] / max(1, trained.steps * cfg.ppo.batch_size
                                                                     * cfg.ppo.group_size)
    else:
        rates["dpo_s_per_pair"] = phases.seconds["dpo"] / max(1.0, len(rm.pairs) * cfg.dpo.epochs)
    return {"policy_id": policy.id, "version": policy.version, "promoted": promote, "gate_passed": passed,
            "gate_reasons": reasons, "gate": judged.to_dict(), "reward_model_id": rm.reward_model_id, "metrics": metrics,
            "run_dir": str(trained.run_dir), "rates": rates, **phase_split(phases.seconds, trained.phase_seconds)}


def start_policy(store: Store, agent_id: int, policy_id) -> Optional[Policy]:
    """The version PPO starts from when the job names one (a retrain without excluded annotators starts from the
    newest clean ancestor); None = the active version."""
    if policy_id is None:
        return None
    policy = store.get_policy(int(policy_id))
    if policy.agent_id != agent_id or policy.status == "broken":
        raise InvalidInput(f"version {policy_id} cannot start this retrain (other agent, or broken)")
    return policy


def phase_split(seconds: dict, ppo_seconds: dict) -> dict:
    """Seconds per retrain phase, PPO's own split, and the share of the wall time spent in the eval phase (and
    with PPO's own before/after evaluations added, which the ppo phase contains)."""
    total = sum(seconds.values())
    evaluating = seconds.get("eval", 0.0) + ppo_seconds.get("eval", 0.0)
    share = lambda x: round(x / total, 4) if total else 0.0  # noqa: E731
    return {"phase_seconds": {k: round(v, 3) for k, v in seconds.items()},
            "ppo_phase_seconds": {k: round(v, 3) for k, v in ppo_seconds.items()},
            "seconds": round(total, 3), "eval_share": share(seconds.get("eval", 0.0)),
            "eval_share_with_ppo": share(evaluating)}


def shared_base(cfg: AppConfig, base_source: str, device: str):
    """(causal LM, reward features on its decoder) for a job that shares one base between the reward model, PPO's
    policy and reference, and the evaluation; (None, None) when the two would load it differently (4-bit)."""
    from rlhf.models import load_causal_lm, load_tokenizer
    from rlhf.training.features import reward_features

    if cfg.reward.load_in_4bit or cfg.ppo.load_in_4bit:  # k-bit training prepares (casts) the base it gets
        return None, None
    base = load_causal_lm(base_source, device)
    return base, reward_features(cfg, device, base_source, model=base.base_model, tokenizer=load_tokenizer(base_source))


def train_reward_phase(ctx: JobContext, phases: Phases, agent: str, device: str, snapshot, features=None):
    """Train and register the reward model on the snapshot's rows; returns (result, scorer). The scorer is the
    fitted one, in memory (same weights and features as its saved directory): the base is not loaded again."""
    from rlhf.training.reward import load_reward_model, train_reward_model

    def progress(fraction: float, phase: str = "reward", metrics: Optional[dict] = None) -> None:
        phases.report("reward", fraction, phase)
        if metrics:
            ctx.metrics(int(metrics.get("step", 0)), {k: v for k, v in metrics.items() if k != "step"})

    rm = train_reward_model(ctx.store, ctx.config, agent, job_id=ctx.job_id, progress=progress,
                            rows=snapshot.rows, snapshot=snapshot.watermark, features=features)
    s = rm.summary()
    ctx.log(f"reward model {rm.reward_model_id} ({rm.method}, {rm.mode}): {rm.pairs_train + rm.pairs_eval} pairs, "
            f"cross-validated accuracy {s['verdict']}")
    scorer = rm.scorer or load_reward_model(rm.path, device=device, load_in_4bit=ctx.config.reward.load_in_4bit,
                                            data_dir=ctx.config.paths)
    return rm, scorer


def train_policy_phase(ctx: JobContext, phases: Phases, agent: str, base_source: str, scorer,
                       init_adapter: Optional[str], device: str, snapshot, base=None, pairs=()):
    """The policy (``retrain.method``: PPO on the snapshot's prompts, or DPO on ``pairs``) from the active version's
    adapter (or the base); returns (result, held-out eval prompts)."""
    from rlhf.training.checkpoint import checkpoints_dir
    from rlhf.training.policy import train_policy
    from rlhf.training.prompts import prompt_sets

    cfg = ctx.config
    method = cfg.retrain.method
    prompts, eval_prompts = prompt_sets(ctx.store, cfg, agent, rows=snapshot.rows)
    run_dir = cfg.paths.job_run(ctx.job_id)
    total = cfg.ppo.steps if method == "ppo" else dpo_steps(len(pairs), cfg)

    def on_step(step: int, metrics: dict) -> None:
        ctx.metrics(step, metrics)
        phases.report(method, step / max(1, total), f"{method.upper()} step {step}/{total}")

    resume = run_dir if checkpoints_dir(run_dir).is_dir() else None  # a re-queued interrupted PPO job
    # The eval phase measures the active version on the same prompts: PPO need not evaluate its start (#35: ~7% of
    # a retrain's wall time)
    result = train_policy(cfg, base_source, scorer, pairs, prompts, eval_prompts, run_dir, init_adapter=init_adapter,
                          resume=resume, on_step=on_step, device=device, base=base, evaluate_before=False)
    return result, eval_prompts


def dpo_steps(n_pairs: int, cfg: AppConfig) -> int:
    """Optimizer steps of a DPO run on ``n_pairs`` pairs (for the progress bar)."""
    import math

    return max(1, math.ceil(math.ceil(n_pairs / cfg.dpo.batch_size) * cfg.dpo.epochs))


def evaluate_phase(ctx: JobContext, base_source: str, device: str, ppo, active_dir: Optional[str], scorer,
                   eval_prompts: list):
    """Generate with candidate and active adapters on one base (one batch) and compare them with the reward
    model; the KL to the base is PPO's final estimate on the same prompts (measured here when missing). Then the
    reward-hacking guard on the same replies, with the same base as the judge of relevance: (report, guard).

    The base is PPO's own (its trained adapter is the candidate; the active one is loaded beside it), so the job
    holds one copy of the base weights; without PPO's model in memory, the base is loaded with both adapters."""
    from rlhf.retrain.evaluation import evaluate_versions
    from rlhf.retrain.guard import run_guard

    cfg = ctx.config
    model, tokenizer, candidate = candidate_on_base(base_source, device, ppo, active_dir)
    report = evaluate_versions(model, tokenizer, eval_prompts, scorer, candidate, "active" if active_dir else None,
                               cfg.eval.max_new_tokens, cfg.eval.temperature, seed=cfg.ppo.seed + cfg.eval.seed_offset,
                               kl_to_base=ppo.kl, max_prompt_tokens=cfg.eval.max_prompt_tokens)
    guard = run_guard(model, tokenizer, eval_prompts, [s["reply"] for s in report.samples],
                      [s["reply"] for s in report.active_samples], report.kl_to_base, cfg.gate,
                      max_prompt_tokens=cfg.eval.max_prompt_tokens)
    return report, guard


def candidate_on_base(base_source: str, device: str, ppo, active_dir: Optional[str]):
    """(peft model, tokenizer, candidate adapter name) with the active adapter (if any) loaded as ``active``."""
    from rlhf.models import load_tokenizer

    policy = getattr(ppo.policy, "policy", None)  # PolicyWithValue -> the PeftModel PPO (or DPO) trained
    if policy is None or not hasattr(policy, "load_adapter"):
        model, tokenizer = adapters_on_base(base_source, device, {"cand": str(ppo.final_dir), "active": active_dir})
        return model, tokenizer, "cand"
    import gc

    gc.collect()  # PPO's optimizer and Accelerate wrappers are garbage now: free them before loading more
    policy.requires_grad_(False)  # trained: from here on it only generates and scores
    if active_dir is not None:
        policy.load_adapter(active_dir, adapter_name="active")
    policy.eval()
    return policy, load_tokenizer(base_source), policy.active_adapter


def gate_phase(ctx: JobContext, rm, scorer, report, guard: dict, eval_prompts: list, device: str, features=None):
    """The gate's verdict (``rlhf.retrain.gate.decide``): the held-out judge scores the same replies (on ``features``,
    the job's shared reward features, when the scorer has none of its own)."""
    from rlhf.retrain.gate import Evidence, decide, judge_scores

    cfg = ctx.config
    judge = load_gate_judge(rm.path, scorer, device, cfg, features)
    cand, act = judge_scores(judge, eval_prompts, [s["reply"] for s in report.samples],
                             [s["reply"] for s in report.active_samples])
    return decide(cand, act, Evidence.from_metrics(rm.metrics), report.kl_to_base, cfg.retrain.min_win_rate,
                  cfg.retrain.max_kl, guard, report.candidate_members, report.active_members, seed=cfg.ppo.seed)


def load_gate_judge(rm_path: str, scorer, device: str, cfg: AppConfig, features=None):
    """The judge saved with a reward model, on the scorer's own features when it has them (else ``features``, else
    a fresh load of the base); None without one."""
    from rlhf.training.judge import JUDGE_FILE
    from rlhf.training.reward import load_judge

    if not (Path(rm_path) / JUDGE_FILE).is_file():
        return None
    features = getattr(scorer, "features", None) or features
    if features is None:  # the features the judge was fitted on (``train_reward_model``): the config's
        from rlhf.training.features import reward_features

        features = reward_features(cfg, device)
    return load_judge(rm_path, features)


def adapters_on_base(base_source: str, device: str, adapters: dict):
    """One base model with named LoRA adapters (None entries are skipped) and its tokenizer."""
    from peft import PeftModel

    from rlhf.models import load_causal_lm, load_tokenizer

    model = load_causal_lm(base_source, device)
    for name, path in adapters.items():
        if path is None:
            continue
        if isinstance(model, PeftModel):
            model.load_adapter(path, adapter_name=name)
        else:
            model = PeftModel.from_pretrained(model, path, adapter_name=name)
    model.eval()
    return model, load_tokenizer(base_source)


def eval_samples(ctx: JobContext) -> dict:
    """Regenerate one version's replies to the held-out eval prompts, scored by its reward model."""
    from rlhf.retrain.evaluation import generate_replies
    from rlhf.models import pick_device, resolve_model
    from rlhf.training.prompts import prompt_sets
    from rlhf.training.reward import load_reward_model

    store, cfg = ctx.store, ctx.config
    policy = store.get_policy(int(ctx.job.config["policy_id"]))
    device = pick_device(cfg.device)
    models = store.list_reward_models(policy.agent_id)
    rm_path = store.get_reward_model(policy.reward_model_id).path if policy.reward_model_id else \
        (models[0].path if models else None)
    ctx.progress(0.1, "generate", f"replies of version {policy.version}")
    _, prompts = prompt_sets(store, cfg, policy.agent_id)
    model, tokenizer = adapters_on_base(resolve_model(cfg.base_model, cfg.data_path), device,
                                        {"version": policy.adapter_path})
    (replies,) = generate_replies(model, tokenizer, prompts, ["version" if policy.adapter_path else None],
                                  cfg.eval.max_new_tokens, cfg.eval.temperature, cfg.ppo.seed + cfg.eval.seed_offset,
                                  max_prompt_tokens=cfg.eval.max_prompt_tokens)
    texts = replies.texts
    ctx.progress(0.7, "score", "reward-model scores" if rm_path else "no reward model yet: unscored")
    rewards = load_reward_model(rm_path, device=device, data_dir=cfg.paths)(prompts, texts) if rm_path else \
        [None] * len(texts)
    store.record_eval_samples(policy.id, [{"prompt_index": i, "prompt": p, "reply": t, "reward": r}
                                          for i, (p, t, r) in enumerate(zip(prompts, texts, rewards))])
    return {"policy_id": policy.id, "samples": len(texts), "reward_model": rm_path}
