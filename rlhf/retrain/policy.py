"""The retrain's policy step: the method ``retrain.method`` names (PPO toward the new reward model on the snapshot's
prompts, DPO on the pairs it learned from, ...; ``rlhf.training.methods``), from the version the job starts from."""
from __future__ import annotations

from typing import Optional

from rlhf.jobs.context import JobContext
from rlhf.retrain.progress import Phases
from storage import InvalidInput, Policy, Store


def start_policy(store: Store, agent_id: int, policy_id) -> Optional[Policy]:
    """The version PPO starts from when the job names one (a retrain without excluded annotators starts from the
    newest clean ancestor); None = the active version."""
    if policy_id is None:
        return None
    policy = store.get_policy(int(policy_id))
    if policy.agent_id != agent_id or policy.status == "broken":
        raise InvalidInput(f"version {policy_id} cannot start this retrain (other agent, or broken)")
    return policy


def train_policy_phase(ctx: JobContext, phases: Phases, agent: str, base_source: str, scorer,
                       init_adapter: Optional[str], device: str, snapshot, base=None, pairs=()):
    """The policy (``retrain.method``, on the snapshot's prompts or on ``pairs``) from the active version's adapter
    (or the base); returns (result, held-out eval prompts)."""
    from rlhf.training.checkpoint import checkpoints_dir
    from rlhf.training.methods import get_method
    from rlhf.training.policy import train_policy
    from rlhf.training.prompts import prompt_sets

    cfg = ctx.config
    method = get_method(cfg.retrain.method)
    prompts, eval_prompts = prompt_sets(ctx.store, cfg, agent, rows=snapshot.rows)
    run_dir = cfg.paths.job_run(ctx.job_id)
    total = method.total_steps(cfg, len(pairs))

    def on_step(step: int, metrics: dict) -> None:
        ctx.metrics(step, metrics)
        phases.report(method.name, step / max(1, total), f"{method.name.upper()} step {step}/{total}")

    resume = run_dir if checkpoints_dir(run_dir).is_dir() else None  # a re-queued interrupted job (PPO checkpoints)
    # The eval phase measures the active version on the same prompts: PPO need not evaluate its start (#35: ~7% of
    # a retrain's wall time)
    result = train_policy(cfg, base_source, scorer, pairs, prompts, eval_prompts, run_dir, init_adapter=init_adapter,
                          resume=resume, on_step=on_step, device=device, base=base, evaluate_before=False)
    stop = method.result_metrics(result, len(pairs))
    if "voice_probe/step" in stop:
        ctx.log(f"voice probe: {stop['voice_probe/reason']} after step {stop['voice_probe/step']}; the KL "
                f"coefficient raised {stop['voice_probe/losses']} time(s), to {stop['voice_probe/kl_coef']:.3g}",
                level="warning")
    if "voice_watch/step" in stop:
        kept = stop["voice_watch/kept"]
        ctx.log(f"voice {stop.get('voice_watch/by', 'watch')}: {stop['voice_watch/reason']} at step "
                f"{stop['voice_watch/step']} of {stop['voice_watch/of']}; "
                + (f"keeping {stop['voice_watch/blend']:.0%} of the change the run made (a blend with the start)"
                   if "voice_watch/blend" in stop else f"keeping the weights after step {kept}"
                   if kept < stop["voice_watch/step"] else "no earlier weights kept the voice")
                + (f" (in every view the check reads, none did; these pass: {stop['voice_watch/passes']})"
                   if stop.get("voice_watch/passes") not in (None, "every view", "none") else ""), level="warning")
    return result, eval_prompts

