"""The retrain job: feedback snapshot → data → reward model → PPO → evaluation → gate → publish.

Runs inside a job process (rlhf/jobs/worker.py). Each phase reports progress and metrics through the job
context, so the Training tab shows it live; a failure anywhere publishes nothing. The steps live beside this
module: ``data``, ``reward``, ``policy``, ``assess`` (evaluation and gate) and ``publish``; ``progress`` times them.
"""
from __future__ import annotations

from rlhf.jobs.context import JobContext
from rlhf.retrain.assess import adapters_on_base, evaluate_phase, gate_phase
from rlhf.retrain.data import take_snapshot
from rlhf.retrain.policy import start_policy, train_policy_phase
from rlhf.retrain.progress import Phases, phase_split, retrain_rates
from rlhf.retrain.reward import shared_base, train_reward_phase


def retrain(ctx: JobContext) -> dict:
    """Train a reward model and a policy (``retrain.method``) on the agent's feedback, evaluate, gate and publish."""
    from rlhf.base_models import pick_device, resolve_model
    from rlhf.retrain.publish import publish_version
    from rlhf.training.methods import get_method

    store, cfg = ctx.store, ctx.config
    agent = store.get_agent(ctx.job.agent_id)
    parent = store.active_policy(agent.id)  # what the candidate must beat
    start = start_policy(store, agent.id, ctx.job.config.get("from_policy_id")) or parent  # where PPO starts
    phases = Phases(ctx)
    device = pick_device(cfg.device)
    base_source = resolve_model(cfg.base_model, cfg.data_path)

    # Data: one read of the feedback; everything below trains and counts on these rows, nothing newer
    phases.enter("data", f"snapshot of {agent.name}'s feedback")
    snapshot = take_snapshot(store, agent.id)

    # Reward model on that snapshot, on the one copy of the base this job loads (None: the kinds load their own)
    phases.enter("reward", "training the reward model")
    base, features = shared_base(cfg, base_source, device)
    rm, scorer = train_reward_phase(ctx, phases, agent.name, device, snapshot, features)

    # The policy from the active version (retrain.method): PPO toward the new reward model on the snapshot's
    # prompts, DPO on the pairs that model learned from, ...; its LoRA adapter on the same base weights (the reward
    # features switch adapters off while they read them)
    method = get_method(cfg.retrain.method)
    phases.enter(method.name, method.title)
    trained, eval_prompts = train_policy_phase(ctx, phases, agent.name, base_source, scorer, start.adapter_path,
                                               device, snapshot, base, rm.pairs)

    # Evaluation against the active version (on the trained policy and its base, already loaded), then the gate
    phases.enter("eval", "evaluating candidate vs active version")
    report, guard = evaluate_phase(ctx, base_source, device, trained, parent.adapter_path, scorer, eval_prompts,
                                   progress=lambda fraction, message: phases.report("eval", fraction, message))
    phases.report("eval", 0.9, "the gate's held-out judge")
    judged = gate_phase(ctx, rm, scorer, report, guard, eval_prompts, device, features)
    passed, reasons = record_verdict(ctx, judged, guard, report, trained.steps + 1)

    # Publish (directory, then one transaction); promote when the gate passes and auto-promote is on
    phases.enter("publish", "publishing the new version")
    metrics = {**version_metrics(report, rm, judged, method, trained), "feedback_used": snapshot.feedback_count,
               "gate/passed": passed, "gate/reasons": reasons}
    promote = passed and cfg.retrain.auto_promote
    policy = publish_version(store, cfg, agent.name, trained.final_dir, parent_id=start.id, promote=promote,
                             job_id=ctx.job_id, reward_model_id=rm.reward_model_id, data_snapshot=snapshot.watermark,
                             run_config=cfg.to_dict(), metrics=metrics)
    store.record_eval_samples(policy.id, report.samples)
    store.record_eval_samples(parent.id, report.active_samples)  # same prompts, same reward model: comparable
    ctx.log(f"published version {policy.version} ({'active' if promote else 'candidate'})"
            + ("" if passed else ": " + "; ".join(reasons)))
    phases.enter("done", "finished")
    rates = retrain_rates(phases.seconds, cfg, rm.pairs_train, len(rm.pairs), trained.steps)
    return {"policy_id": policy.id, "version": policy.version, "promoted": promote, "gate_passed": passed,
            "gate_reasons": reasons, "gate": judged.to_dict(), "reward_model_id": rm.reward_model_id, "metrics": metrics,
            "run_dir": str(trained.run_dir), "rates": rates, **phase_split(phases.seconds, trained.phase_seconds)}


def record_verdict(ctx: JobContext, judged, guard: dict, report, step: int) -> tuple[bool, list]:
    """Log the gate's verdict (and a tripped guard) and its figures at ``step``; (passed, reasons)."""
    verdict = judged.verdict
    passed, reasons = verdict.verdict == "promote", ([] if verdict.verdict == "promote" else [verdict.reason])
    ctx.log(f"gate: {verdict.verdict} — {verdict.reason}")
    if judged.guarded:
        ctx.log(f"guard tripped: {', '.join(guard['tripped'])}", level="warning")
    ctx.metrics(step, {**report.metrics(), "gate/win_rate": verdict.win_rate, "gate/low": verdict.low,
                       "gate/high": verdict.high})
    return passed, reasons


RM_FIGURES = ("cv_accuracy", "cv_low", "cv_high", "cv_p_value", "cv_chance", "judge_accuracy", "judge_low",
              "judge_high", "judge_pairs")


def version_metrics(report, rm, judged, method, trained) -> dict:
    """What a published version records of how it was made: the evaluation, the reward model's figures, the gate
    and the method's own."""
    return {**report.metrics(), "reward_model/eval_accuracy": rm.eval_accuracy,
            **{f"reward_model/{k}": rm.metrics.get(f"reward/{k}") for k in RM_FIGURES},
            **judged.metrics(), "retrain/method": method.name, **method.result_metrics(trained, len(rm.pairs))}


def eval_samples(ctx: JobContext) -> dict:
    """Regenerate one version's replies to the held-out eval prompts, scored by its reward model."""
    from rlhf.retrain.evaluation import generate_replies
    from rlhf.base_models import pick_device, resolve_model
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
                                        {"version": policy.adapter_path}, cfg.chat_template)
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
