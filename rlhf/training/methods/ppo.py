"""``retrain.method: ppo``: our PPO on the reward model (``rlhf.training.ppo.trainer.train_ppo``, config section
``ppo``): it samples the policy's own replies and learns from the reward model's scores of them (and, with
``ppo.vote_weight``, from the decided votes themselves: ``rlhf.training.ppo.votes``)."""
from __future__ import annotations

from rlhf.training.methods.base import PolicyMethod


class PPO(PolicyMethod):
    name, title, section = "ppo", "PPO on the reward model", "ppo"
    rate_key, default_rate = "ppo_s_per_sample", 2.5

    def units(self, config, pairs, steps=None):
        p = config.ppo
        return (p.steps if steps is None else steps) * p.batch_size * p.group_size

    def total_steps(self, config, pairs):
        return config.ppo.steps

    def train(self, config, base_source, reward_fn, pairs, prompts, eval_prompts, run_dir, init_adapter=None,
              resume=None, on_step=None, device="cpu", base=None, evaluate_before=True):
        from rlhf.training.ppo.trainer import train_ppo

        return train_ppo(config, base_source, reward_fn, prompts, eval_prompts, run_dir, init_adapter=init_adapter,
                         resume=resume, on_step=on_step, device=device, base=base, evaluate_before=evaluate_before,
                         pairs=pairs)

    def result_metrics(self, trained, pairs):
        stop = trained.voice_stop or {}  # the voice watch's stop or the voice check's (rlhf.training.ppo.voice_watch)
        probe = trained.voice_probe or {}  # the voice probe found the voice lost and raised the KL coefficient
        return {"ppo/reward_after": trained.reward_after,
                **{f"voice_watch/{k}": stop[k] for k in ("step", "kept", "blend", "of", "reason", "by", "passes") if k in stop},
                **{f"voice_probe/{k}": probe[k] for k in ("step", "reason", "losses", "kl_coef") if k in probe}}


METHOD = PPO()
