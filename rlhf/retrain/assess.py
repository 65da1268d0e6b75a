"""The retrain's evaluation step: the candidate and the active version answer the held-out prompts on one base,
the reward model compares them, the reward-hacking guard reads the replies, and the gate's held-out judge takes
the verdict (the measurements live in ``evaluation``, ``guard`` and ``gate``; this is the job's phase)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from rlhf.config import AppConfig
from rlhf.jobs.context import JobContext


def evaluate_phase(ctx: JobContext, base_source: str, device: str, ppo, active_dir: Optional[str], scorer,
                   eval_prompts: list, progress: Optional[Callable[[float, str], None]] = None):
    """Generate with candidate and active adapters on one base (one batch) and compare them with the reward
    model; the KL to the base is PPO's final estimate on the same prompts (measured here when missing). Then the
    reward-hacking guard on the same replies, with the same base as the judge of relevance: (report, guard).
    ``progress(fraction, message)``: how far the phase is (the replies are most of it, then the guard).

    The base is PPO's own (its trained adapter is the candidate; the active one is loaded beside it), so the job
    holds one copy of the base weights; without PPO's model in memory, the base is loaded with both adapters."""
    from rlhf.retrain.evaluation import evaluate_versions
    from rlhf.retrain.guard import run_guard

    cfg = ctx.config
    model, tokenizer, candidate = candidate_on_base(base_source, device, ppo, active_dir, cfg.chat_template)
    say = progress or (lambda fraction, message: None)
    report = evaluate_versions(model, tokenizer, eval_prompts, scorer, candidate, "active" if active_dir else None,
                               cfg.eval.max_new_tokens, cfg.eval.temperature, seed=cfg.ppo.seed + cfg.eval.seed_offset,
                               kl_to_base=ppo.kl, max_prompt_tokens=cfg.eval.max_prompt_tokens,
                               on_reply=lambda done, total: say(0.7 * done / total, f"eval replies {done}/{total}"),
                               whole_sentences=cfg.reward.whole_sentences,
                               reply_temperature=cfg.eval.reply_temperature)
    say(0.75, "reward-hacking checks on the replies")
    guard = run_guard(model, tokenizer, eval_prompts, [s["reply"] for s in report.samples],
                      [s["reply"] for s in report.active_samples], report.kl_to_base, cfg.gate,
                      max_prompt_tokens=cfg.eval.max_prompt_tokens)
    return report, guard


def candidate_on_base(base_source: str, device: str, ppo, active_dir: Optional[str], template: str = ""):
    """(peft model, tokenizer, candidate adapter name) with the active adapter (if any) loaded as ``active``;
    ``template``: the chat template the tokenizer encodes prompts with ("" = the base's)."""
    from rlhf.base_models import load_tokenizer

    policy = getattr(ppo.policy, "policy", None)  # PolicyWithValue -> the PeftModel PPO (or DPO) trained
    if policy is None or not hasattr(policy, "load_adapter"):
        model, tokenizer = adapters_on_base(base_source, device, {"cand": str(ppo.final_dir), "active": active_dir},
                                            template)
        return model, tokenizer, "cand"
    import gc

    gc.collect()  # PPO's optimizer and Accelerate wrappers are garbage now: free them before loading more
    policy.requires_grad_(False)  # trained: from here on it only generates and scores
    if active_dir is not None:
        policy.load_adapter(active_dir, adapter_name="active")
    policy.eval()
    return policy, load_tokenizer(base_source, template), policy.active_adapter


def gate_phase(ctx: JobContext, rm, scorer, report, guard: dict, eval_prompts: list, device: str, features=None):
    """The gate's verdict (``rlhf.retrain.gate.decide``): the held-out judge scores the same replies (on ``features``,
    the job's shared reward features, when the scorer has none of its own)."""
    from rlhf.retrain.gate import Evidence, decide, judge_scores

    cfg = ctx.config
    judge = load_gate_judge(rm.path, scorer, device, cfg, features)
    cand, act = judge_scores(judge, eval_prompts, [s["read"] for s in report.samples],
                             [s["read"] for s in report.active_samples])
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


def adapters_on_base(base_source: str, device: str, adapters: dict, template: str = ""):
    """One base model with named LoRA adapters (None entries are skipped) and its tokenizer (``template``: the chat
    template it encodes prompts with, "" = the base's)."""
    from peft import PeftModel

    from rlhf.base_models import load_causal_lm, load_tokenizer

    model = load_causal_lm(base_source, device)
    for name, path in adapters.items():
        if path is None:
            continue
        if isinstance(model, PeftModel):
            model.load_adapter(path, adapter_name=name)
        else:
            model = PeftModel.from_pretrained(model, path, adapter_name=name)
    model.eval()
    return model, load_tokenizer(base_source, template)
