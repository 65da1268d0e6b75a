"""One PPO iteration (``ppo_step``): rollout -> score -> KL -> advantages -> clipped updates, with the guards that skip
a bad minibatch and stop a run that keeps producing them. ``rlhf.training.ppo.trainer`` runs the iterations (load,
checkpoints, evaluation, result); the maths lives in ``rlhf.training.ppo.core``."""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from rlhf.training.ppo.core import (compute_gae, entropy_from_logits, group_advantages, logprobs_from_logits,
                                   masked_mean, masked_whiten, ppo_policy_loss, token_rewards, value_loss)
from rlhf.training.ppo.rollout import encode_prompts, generate, reply_relevance, score_tokens
from rlhf.training.ppo.votes import VoteTerm
from rlhf.training.prompts import PromptBuffer
from rlhf.training.shaping import RewardShaper
from rlhf.voice import distinct_n, repetition

log = logging.getLogger(__name__)


class PPOFailed(RuntimeError):
    """The run was stopped by its guards (NaN/inf, runaway ratio or KL); nothing was published."""


@dataclass
class Batch:
    """One rollout's tensors for the update (rows = replies, columns = response tokens)."""

    logprobs: torch.Tensor
    values: Optional[torch.Tensor]  # None with group baselines (no value head)
    advantages: torch.Tensor
    returns: Optional[torch.Tensor]
    mask: torch.Tensor
    kl_per_reply: torch.Tensor

    def kl_of(self, mb: torch.Tensor) -> torch.Tensor:
        """Mean KL per reply over the minibatch's replies that still have tokens."""
        rows = self.mask[mb].sum(1) > 0
        return self.kl_per_reply[mb][rows].mean() if rows.any() else torch.tensor(0.0)


def seed_step(seed: int, step: int, rank: int) -> None:
    # Every step seeds itself from (seed, step, rank): a resumed run samples what the original would have.
    torch.manual_seed((seed * 1_000_003 + step * 1_009 + rank) % (2**63 - 1))


class Guard:
    """Counts skipped minibatches/replies; fails the run at ``limit`` events."""

    def __init__(self, limit: int, events: int = 0):
        self.limit, self.events, self.last = limit, events, ""

    def event(self, reason: str, count: int = 1) -> None:
        self.events += count
        self.last = reason
        log.warning("PPO guard: %s (%d/%d events)", reason, self.events, self.limit)
        if self.events >= self.limit:
            raise PPOFailed(f"PPO stopped after {self.events} guard events (ppo.max_guard_events="
                            f"{self.limit}); last: {reason}")


def _reduce(acc, values: Sequence[float]) -> list[float]:
    """Mean of each value over processes (identity in a single process)."""
    if acc.num_processes == 1:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=acc.device)
    return acc.reduce(t, "mean").tolist()


def ppo_step(step: int, model, policy, optimizer, tokenizer, buffer: PromptBuffer, shaper: RewardShaper, kl_ctl,
             guard: Guard, cfg, acc, votes: Optional[VoteTerm] = None) -> dict:
    """One PPO iteration: rollout, score, KL, advantages (group or GAE), update, then (``votes``, with
    ``ppo.vote_weight``) one step on DPO's loss over a batch of the decided votes; returns the step's metrics."""
    rank, world, dev = acc.process_index, acc.num_processes, acc.device
    t0 = time.perf_counter()

    # Rollout: each prompt sampled group_size times, the copies side by side.
    prompts = [p for p in buffer.batch(step, cfg.batch_size, rank, world) for _ in range(cfg.group_size)]
    prompt_ids = encode_prompts(tokenizer, prompts, cfg.max_prompt_tokens)
    seed_step(cfg.seed, step, rank)
    ro = generate(policy, tokenizer, prompt_ids, cfg.max_new_tokens, cfg.temperature, cfg.top_p, dev,
                  keep_stats=True, with_values=cfg.uses_value_head)
    t1 = time.perf_counter()

    # Reference: per-token log-probs of the replies under the same weights with the adapter disabled (for the
    # KL, and with ppo.relevance_weight for how much more likely each reply is after its own prompt).
    ref_logprobs, _ = score_tokens(policy, ro, cfg.temperature, cfg.mini_batch_size, reference=True)
    rel = reply_relevance(policy, tokenizer, ro, prompt_ids, ref_logprobs, cfg.temperature, cfg.mini_batch_size,
                          cfg.group_size) if cfg.relevance_weight != 0 else None
    t2 = time.perf_counter()

    # Score
    scores_list, parts = shaper(prompts, ro.replies, ro.n_tokens, ro.finished, rel, training=True)
    scores, mask = _finite_scores(scores_list, ro.mask, guard, step, len(prompts), cfg, acc)
    t3 = time.perf_counter()

    # KL: per-token log-ratio against the reference. Values (ppo.advantage=gae): the value head reads the
    # policy's last hidden state. Both come from the logits and hidden states generation already computed (a
    # forward only when they are missing).
    logprobs, values = ro.logprobs, ro.values
    if logprobs is None:
        logprobs, values = score_tokens(policy, ro, cfg.temperature, cfg.mini_batch_size)
    rewards, kl = token_rewards(scores, logprobs, ref_logprobs, mask, kl_ctl.value)
    kl_per_reply = kl.sum(1)

    # Advantages. group: the reply's KL-penalised return against its prompt's other replies, on every token.
    # gae: GAE (Schulman et al. 2016) on the value head, whitened per batch.
    if not cfg.uses_value_head:
        advantages = group_advantages(rewards.sum(1), mask.sum(1) > 0, cfg.group_size).unsqueeze(1) * mask
        returns = None  # no value head, no value loss
    else:
        advantages, returns = compute_gae(rewards, values, mask, cfg.gamma, cfg.lam)
        advantages = masked_whiten(advantages, mask)

    # Update: several epochs over shuffled minibatches.
    batch = Batch(logprobs, values, advantages, returns, mask, kl_per_reply)
    stats = _update(step, model, optimizer, ro, batch, guard, cfg, acc)
    voted = _vote_update(step, model, optimizer, votes, guard, cfg, acc) \
        if votes is not None and votes.active(step, acc.num_processes) else {}
    t4 = time.perf_counter()

    local = {**_local_metrics(scores_list, parts, mask, ro, kl_per_reply, stats, (t0, t1, t2, t3, t4), rel),
             **voted}
    keys = list(local)
    metrics = dict(zip(keys, _reduce(acc, [local[k] for k in keys])))
    metrics["ppo/kl_coef"] = kl_ctl.value
    # KL controller (Ziegler et al. 2019): steer the observed KL per reply toward the target.
    kl_ctl.update(metrics["ppo/kl"], len(prompts) * world)
    metrics["perf/tokens_per_s"] = float(ro.mask.sum()) * world / max(t4 - t0, 1e-9)
    metrics["guard/events"] = float(guard.events)
    metrics["ppo/minibatches"] = float(len(stats["pg_loss"]))
    return metrics


def _finite_scores(scores_list: list[float], reply_mask: torch.Tensor, guard: Guard, step: int, n: int, cfg,
                   acc) -> tuple[torch.Tensor, torch.Tensor]:
    """The scores as a tensor and the token mask without the replies whose score is NaN/inf (a guard event each;
    same shapes on every process keep DDP in step), whitened when ``ppo.whiten_rewards``."""
    scores = torch.tensor(scores_list, dtype=torch.float32, device=acc.device)
    ok = torch.isfinite(scores)
    n_bad = int(round(_reduce(acc, [float((~ok).sum())])[0] * acc.num_processes))
    if n_bad:
        guard.event(f"non-finite reward for {n_bad} of {n * acc.num_processes} replies at step {step}", n_bad)
    mask = reply_mask * ok.unsqueeze(1)
    scores = torch.where(ok, scores, torch.zeros_like(scores))
    if cfg.whiten_rewards and ok.sum() > 1:
        scores = torch.where(ok, (scores - scores[ok].mean()) / (scores[ok].std() + 1e-8), scores)
    return scores, mask


def _local_metrics(scores_list: list[float], parts: dict, mask: torch.Tensor, ro, kl_per_reply: torch.Tensor,
                   stats: dict, times: tuple, rel: Optional[list[float]] = None) -> dict:
    """This process's metrics of one step (before the mean over processes)."""
    t0, t1, t2, t3, t4 = times
    rows = mask.sum(1) > 0
    finite = [s for s in scores_list if math.isfinite(s)]
    mean = lambda xs: sum(xs) / len(xs) if xs else math.nan  # noqa: E731
    return {
        "reward/mean": mean(finite),
        "reward/std": float(torch.tensor(finite).std()) if len(finite) > 1 else 0.0,
        "ppo/kl": float(kl_per_reply[rows].mean()) if rows.any() else 0.0,
        "ppo/approx_kl": mean(stats["approx_kl"]), "ppo/clipfrac": mean(stats["clipfrac"]),
        "loss/policy": mean(stats["pg_loss"]), "loss/value": mean(stats["v_loss"]),
        "ppo/entropy": mean(stats["entropy"]), "ppo/response_length": float(ro.mask.sum(1).mean()),
        "voice/distinct2": distinct_n(ro.replies), "voice/repetition": mean([repetition(r) for r in ro.replies]),
        "time/generate": t1 - t0, "time/reference": t2 - t1, "time/score": t3 - t2, "time/update": t4 - t3,
        **{f"reward/{name}": mean([v for v in vals if math.isfinite(v)]) for name, vals in parts.items()},
        **({"voice/relevance": mean(rel)} if rel is not None else {}),
    }


def _skip_reason(step: int, loss, pg_stats: dict, mb_kl, cfg, acc) -> tuple[Optional[str], float]:
    """Why this minibatch must not be applied (or None), and its approx KL; identical on every process."""
    # One reduction per minibatch keeps every process's skip / stop decisions identical.
    bad_loss, ratio_mean, mb_kl, approx_kl = _reduce(acc, [
        float(not torch.isfinite(loss)), float(pg_stats["ratio_mean"]), float(mb_kl), float(pg_stats["approx_kl"])])
    if bad_loss > 0:
        return f"non-finite loss at step {step}", approx_kl
    if not 1 / cfg.ratio_limit <= ratio_mean <= cfg.ratio_limit:  # a loss spike in the making
        return f"mean policy ratio {ratio_mean:.3g} outside ppo.ratio_limit at step {step}", approx_kl
    if mb_kl > cfg.kl_limit:
        return f"KL {mb_kl:.3g} nats per reply above ppo.kl_limit={cfg.kl_limit} at step {step}", approx_kl
    return None, approx_kl


def _apply(step: int, model, optimizer, loss, cfg, acc) -> Optional[str]:
    """Backward, clip, step; a non-finite gradient is not applied (returns why)."""
    optimizer.zero_grad(set_to_none=True)
    acc.backward(loss)
    grad_norm = acc.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    reason = None
    if torch.isfinite(torch.as_tensor(grad_norm)):
        optimizer.step()
    else:
        reason = f"non-finite gradient at step {step}"
    optimizer.zero_grad(set_to_none=True)
    return reason


def _vote_update(step: int, model, optimizer, votes: VoteTerm, guard: Guard, cfg, acc) -> dict[str, float]:
    """One optimizer step on ``ppo.vote_weight`` x DPO's loss over this step's votes (skipped, as a guard event,
    when the loss or its gradient is not finite); the loss and margins as they were before the step."""
    loss, margins = votes.loss(model, step, acc.process_index, acc.num_processes)
    finite = _reduce(acc, [float(torch.isfinite(loss))])[0] == 1.0
    reason = _apply(step, model, optimizer, cfg.vote_weight * loss, cfg, acc) if finite else \
        f"non-finite vote loss at step {step}"
    if reason is not None:
        guard.event(reason)
    return {"votes/loss": loss.item(), "votes/margin": margins.mean().item(),
            "votes/accuracy": (margins > 0).float().mean().item()}


def _update(step: int, model, optimizer, ro, b: Batch, guard: Guard, cfg, acc) -> dict[str, list[float]]:
    """PPO epochs over shuffled minibatches with guards and early stop; per-minibatch stats of those applied."""
    stats: dict[str, list[float]] = {k: [] for k in ("pg_loss", "v_loss", "approx_kl", "clipfrac", "entropy")}
    generator = torch.Generator().manual_seed(cfg.seed * 7919 + step)
    with_values = cfg.uses_value_head  # group baselines replace the value head
    if _reduce(acc, [float(b.mask.sum() == 0)])[0] == 1.0:  # every reply was dropped: nothing to learn from
        return stats
    for _ in range(cfg.ppo_epochs):
        b_inds = torch.randperm(b.mask.shape[0], generator=generator).to(b.mask.device)
        for start in range(0, b.mask.shape[0], cfg.mini_batch_size):
            mb = b_inds[start:start + cfg.mini_batch_size]
            mb_mask = b.mask[mb]
            logits, mb_values = model(ro.input_ids[mb], ro.attention_mask[mb], ro.response_len, cfg.temperature,
                                      with_values=with_values)
            mb_logprobs = logprobs_from_logits(logits, ro.response[mb])
            # Policy loss (clipped surrogate, Schulman et al. 2017 eq. 7)
            pg_loss, pg_stats = ppo_policy_loss(mb_logprobs, b.logprobs[mb], b.advantages[mb], mb_mask, cfg.clip_range)
            # Value loss (clipped, as in the PPO reference implementation); none with group baselines
            v_loss = value_loss(mb_values, b.values[mb], b.returns[mb], mb_mask, cfg.clip_range_value)[0] \
                if with_values else torch.zeros((), device=mb_mask.device)
            # Entropy bonus (no graph when its coefficient is 0)
            with torch.set_grad_enabled(cfg.ent_coef != 0 and torch.is_grad_enabled()):
                entropy = masked_mean(entropy_from_logits(logits), mb_mask)
            loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
            # Guards, then the step
            reason, approx_kl = _skip_reason(step, loss, pg_stats, b.kl_of(mb), cfg, acc)
            reason = reason or _apply(step, model, optimizer, loss, cfg, acc)
            if reason is not None:
                guard.event(reason)
                continue
            for key, value in (("pg_loss", pg_loss.item()), ("v_loss", v_loss.item()), ("approx_kl", approx_kl),
                               ("clipfrac", float(pg_stats["clipfrac"])), ("entropy", entropy.item())):
                stats[key].append(value)
            if approx_kl > cfg.approx_kl_stop:  # early stop: the policy moved far enough for this batch
                return stats
    return stats
