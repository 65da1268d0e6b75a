"""DPO beside PPO (``retrain.method: dpo``): TRL's DPOTrainer on the retrain's own preference pairs, LoRA on the
shared base.

DPO (Rafailov et al. 2023, eq. 7) fits the policy to the votes directly:
``L = -log σ(β [log π(y_w|x)/π_ref(y_w|x) − log π(y_l|x)/π_ref(y_l|x)])``, the Bradley–Terry likelihood of the
votes under the reward ``β log π/π_ref`` that the KL-regularised RL problem's optimum implies. It needs no reward
model in the loop and samples nothing, so it is cheap on a CPU; it learns only from the replies that were voted
on (the base's own replies here), never from what the policy would say now.

The rows are the pairs PPO's reward model learns from (the gate's judge keeps its own share out of both). Each
prompt is the one prompt encoder's text (``rlhf.prompting.encode_prompt``, fitted to ``ppo.max_prompt_tokens``),
so DPO trains on the prompt rollouts, the reward model and serving see; TRL appends the end-of-turn token to each
reply, so stopping is learned as well. The reference is the version the run starts from: the adapter disabled
for a fresh adapter, TRL's frozen copy of it when continuing a version; its log-probs are computed once before the
epochs (``precompute_ref_log_probs``).
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from rlhf.config import AppConfig
from rlhf.training.checkpoint import save_policy

# TRL's log keys -> ours (namespaced like PPO's: identical across CLI, Store and plots)
METRICS = {"loss": "loss/policy", "rewards/margins": "dpo/reward_margin", "rewards/accuracies": "dpo/reward_accuracy",
           "rewards/chosen": "dpo/reward_chosen", "rewards/rejected": "dpo/reward_rejected",
           "logps/chosen": "dpo/logp_chosen", "logps/rejected": "dpo/logp_rejected", "entropy": "dpo/entropy",
           "learning_rate": "dpo/learning_rate", "grad_norm": "dpo/grad_norm"}


@dataclass
class DPOResult:
    """What a DPO run produced (the fields the retrain reads of a PPO result; no rollouts, so no rewards)."""

    run_dir: Path
    steps: int
    seconds: float
    phase_seconds: dict
    final_dir: Path  # the PEFT adapter dir (``final/adapter``)
    history: list = field(default_factory=list)
    kl: float = math.nan  # not measured here: the evaluation measures KL to the base on its prompts
    reward_before: float = math.nan
    reward_after: float = math.nan
    policy: Any = field(default=None, repr=False, compare=False)  # the trained PolicyWithValue, in memory

    @property
    def best_dir(self) -> Path:
        return self.final_dir

    def summary(self) -> dict:
        return {"run_dir": str(self.run_dir), "steps": self.steps, "seconds": round(self.seconds, 2),
                "phase_seconds": {k: round(v, 2) for k, v in self.phase_seconds.items()}}


def dpo_rows(tokenizer, pairs: Sequence[dict], max_prompt_tokens: int) -> list[dict]:
    """TRL's ``{prompt, chosen, rejected}`` text rows; the prompt is the one prompt encoder's, as text."""
    from rlhf.prompting import encode_prompt

    rows = []
    for p in pairs:
        prompt = tokenizer.decode(encode_prompt(tokenizer, list(p["prompt"]), max_prompt_tokens),
                                  skip_special_tokens=False)
        rows.append({"prompt": prompt, "chosen": p["chosen"], "rejected": p["rejected"]})
    return rows


def _callback(on_step: Optional[Callable[[int, dict], None]], history: list):
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        """Each logged step's metrics under our names, into ``history`` and the caller's hook (which may raise to
        cancel the run)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "loss" not in logs:  # the end-of-training summary, not a step
                return
            metrics = {ours: float(logs[theirs]) for theirs, ours in METRICS.items() if theirs in logs}
            history.append(metrics)
            if on_step is not None:
                on_step(state.global_step, metrics)

    return Steps()


def _trl_config(cfg, output_dir: str, device: str, trl_args: Optional[dict]):
    """TRL's DPOConfig for one run: our settings, then ``trl_args`` (a variant's extra keys) on top."""
    from trl import DPOConfig as TrlDPOConfig

    return TrlDPOConfig(**{**dict(
        output_dir=output_dir, beta=cfg.beta, learning_rate=cfg.learning_rate, num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.micro_batch_size, max_length=cfg.max_length, loss_type=[cfg.loss_type],
        gradient_accumulation_steps=cfg.batch_size // cfg.micro_batch_size,
        precompute_ref_log_probs=True, precompute_ref_batch_size=cfg.micro_batch_size, seed=cfg.seed, data_seed=cfg.seed, logging_steps=1,
        save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True, use_cpu=device == "cpu",
        bf16=False, activation_checkpointing=False, dataloader_num_workers=0, lr_scheduler_type="constant"),
        **(trl_args or {})})


def train_dpo(config: AppConfig, base_source: str, pairs: Sequence[dict], run_dir: Path, init_adapter: Optional[str] = None,
              on_step: Optional[Callable[[int, dict], None]] = None, device: str = "cpu", base=None,
              settings=None, method: str = "dpo", trl_args: Optional[dict] = None) -> DPOResult:
    """DPO on ``pairs`` (``{prompt: messages, chosen, rejected}``) from ``init_adapter`` (None = a fresh LoRA on the
    base); writes ``run_dir/final/adapter``. ``base``: the causal LM already loaded in this process (shared).
    ``settings``: the config section to train with (default ``config.dpo``; a DPO variant passes its own, with
    ``trl_args``: extra TRL DPOConfig keys such as its loss) and ``method`` its name, for the version's record."""
    from datasets import Dataset, disable_progress_bars
    from transformers import set_seed
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import DPOTrainer

    from rlhf.base_models import load_tokenizer
    from rlhf.training.ppo.rollout import build_policy

    cfg, started = settings or config.dpo, time.perf_counter()
    cfg.check()
    if not pairs:
        raise ValueError("DPO learns from preference pairs and this feedback has none (only ratings): vote on "
                         "pairs of replies, or set retrain.method=ppo")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(base_source, config.chat_template)
    set_seed(cfg.seed)  # the adapter's init and the pair order
    model = build_policy(base_source, cfg, device, init_adapter, base=base)
    policy = model.policy  # the PeftModel DPO trains; the value head stays unused
    rows = dpo_rows(tokenizer, pairs, config.ppo.max_prompt_tokens)
    disable_progress_bars()  # datasets' bars for a few dozen rows would only clutter the job log
    history: list[dict] = []
    work = tempfile.mkdtemp(prefix="rlhf-dpo-")
    try:
        trainer = DPOTrainer(model=policy, args=_trl_config(cfg, work, device, trl_args),
                             train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                             callbacks=[_callback(on_step, history)])
        for cb in (PrinterCallback, ProgressCallback):  # they print to stdout; the CLI keeps stdout for JSON
            trainer.remove_callback(cb)
        t_prepared = time.perf_counter()  # the reference log-probs were computed in the constructor
        trainer.train()
        t_end = time.perf_counter()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if "ref" in policy.peft_config:  # TRL's frozen copy of a continued version: not part of the new version
        policy.delete_adapter("ref")
    policy.set_adapter("default")
    model.eval()
    model.requires_grad_(False)
    info = {"method": method, "pairs": len(rows), "base": base_source, "init_adapter": init_adapter,
            "steps": trainer.state.global_step, "device": device}
    final = save_policy(model, run_dir / "final", info)
    (run_dir / "history.json").write_text(json.dumps(history))
    # prepare: the adapter, the rows and the reference log-probs; update: the DPO epochs
    phases = {"prepare": t_prepared - started, "update": t_end - t_prepared}
    return DPOResult(run_dir, trainer.state.global_step, time.perf_counter() - started, phases, final / "adapter",
                     history, policy=model)
