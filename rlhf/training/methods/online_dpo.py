"""``retrain.method: online_dpo``: DPO on the votes plus pairs of the starting version's own replies that the reward
model ranks (``rlhf.training.ranked_pairs``), config section ``online_dpo``. The votes teach the reward model, the
reward model labels many more of the policy's own replies, and TRL's DPOTrainer learns from both
(``rlhf.training.dpo``)."""
from __future__ import annotations

import json
import math
import time

from rlhf.training.methods.dpo import DPO


SAMPLING_STEPS = 4  # progress reports while sampling (each a quarter of the replies), before DPO's own steps


class OnlineDPO(DPO):
    name, section = "online_dpo", "online_dpo"
    title = "DPO on the votes and the reward model's ranking of the policy's replies"
    rate_key, default_rate = "online_dpo_s_per_pair", 1.5

    def units(self, config, pairs, steps=None):
        return (max(pairs, 1) + self.settings(config).prompts) * self.settings(config).epochs

    def total_steps(self, config, pairs):
        s = self.settings(config)
        return SAMPLING_STEPS + max(1, math.ceil(math.ceil((pairs + s.prompts) / s.batch_size) * s.epochs))

    def train(self, config, base_source, reward_fn, pairs, prompts, eval_prompts, run_dir, init_adapter=None,
              resume=None, on_step=None, device="cpu", base=None, evaluate_before=True):
        from rlhf.base_models import load_causal_lm, load_tokenizer
        from rlhf.training.dpo import train_dpo
        from rlhf.training.ranked_pairs import sample_ranked_pairs

        if reward_fn is None:
            raise ValueError("online DPO ranks the policy's replies with the reward model, and none was fitted")
        s, started = self.settings(config), time.perf_counter()
        s.check()
        base = base if base is not None else load_causal_lm(base_source, device)
        tokenizer = load_tokenizer(base_source, config.chat_template)
        ranked = sample_ranked_pairs(s, reward_fn, prompts, _sampler(s, config, base, tokenizer, init_adapter,
                                                                     _sampling_progress(on_step)))
        sampled = time.perf_counter() - started
        # DPO's steps come after the sampling's in the job's progress and metrics
        after = None if on_step is None else (lambda step, metrics: on_step(SAMPLING_STEPS + step, metrics))
        result = train_dpo(config, base_source, [*pairs, *ranked.pairs], run_dir, init_adapter=init_adapter,
                           on_step=after, device=device, base=base, settings=s, method=self.name,
                           trl_args=self.extra_args(config))
        rate = {"sample_tokens_per_s": round(ranked.tokens / max(sampled, 1e-9), 1)}
        (result.run_dir / "ranked_pairs.json").write_text(json.dumps(
            {**ranked.summary(), **rate, "sampled_by": ranked.sampled_by, "pairs": ranked.pairs}))
        result.phase_seconds = {"sample": sampled, **result.phase_seconds}
        result.ranked = {**ranked.summary(), **rate}
        return result

    def result_metrics(self, trained, pairs):
        return {f"{self.section}/pairs": pairs,
                **{f"{self.section}/{k}": v for k, v in getattr(trained, "ranked", {}).items()}}


METHOD = OnlineDPO()


def _sampler(s, config, base, tokenizer, adapter, on_reply):
    """Where the replies come from (``online_dpo.sample_with``): the serving engine, on the job's threads, or the
    job's own torch model."""
    from rlhf.cpu import thread_plan
    from rlhf.training.ranked_pairs import served_sampler, torch_sampler

    if s.sample_with == "serving":
        return served_sampler(s, config, tokenizer, adapter, thread_plan(config).job, on_reply)
    return torch_sampler(s, config.ppo.max_prompt_tokens, base, tokenizer, adapter, on_reply)


def _sampling_progress(on_step):
    """``on_reply(done, total)`` -> ``on_step`` at each quarter of the replies sampled (steps 1..SAMPLING_STEPS, with
    the share sampled as ``online_dpo/sampled``), so the job's progress moves while the policy samples."""
    if on_step is None:
        return None
    reported = 0

    def on_reply(done: int, total: int) -> None:
        nonlocal reported
        while reported < done * SAMPLING_STEPS // total:
            reported += 1
            on_step(reported, {"online_dpo/sampled": reported / SAMPLING_STEPS})
    return on_reply
