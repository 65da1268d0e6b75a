"""Pure PPO maths for LLM RLHF: masked statistics, KL penalties, GAE, losses, KL controllers.

All tensors are (B, T) over response tokens unless noted. `mask` is float or bool with
1 = real response token and 0 = padding. Padding positions never influence a result, and a row
with no valid token yields zeros, never NaN.
"""

from __future__ import annotations

import torch


def _as_bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is set (0 where nothing is set)."""
    valid = _as_bool(mask)
    # torch.where rather than multiply, so NaN/inf in padding cannot leak into the sum.
    total = torch.where(valid, values, torch.zeros_like(values))
    count = valid.to(values.dtype)
    if dim is None:
        return total.sum() / count.sum().clamp_min(1)
    return total.sum(dim) / count.sum(dim).clamp_min(1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `values` over all masked positions (Bessel-corrected when `unbiased`)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = _as_bool(mask).sum()
        # Bessel's correction n / (n - 1); skipped when n <= 1 where it is undefined.
        var = torch.where(count > 1, var * count / (count - 1).clamp_min(1), var)
    return var


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise masked `values` to zero mean / unit variance; 0 at padding."""
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(_as_bool(mask), whitened, torch.zeros_like(whitened))


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label under softmax(logits): (..., V), (...) -> (...)."""
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy H = -sum_v p_v log p_v of softmax(logits): (..., V) -> (...)."""
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    # 0 * log 0 = 0: keeps -inf (banned) logits from turning into NaN.
    plogp = torch.where(probs > 0, probs * logp, torch.zeros_like(logp))
    return -plogp.sum(-1)


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(policy || ref) from sampled-token log-probs."""
    # Estimators from Schulman, "Approximating KL Divergence" (2020), with x ~ policy and
    # r = p_ref(x) / p_policy(x): k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r.
    logratio = logprobs - ref_logprobs
    if kind == "k1":
        return logratio
    if kind == "k2":
        return 0.5 * logratio**2
    if kind == "k3":
        # (r - 1) - log r with log r = -logratio; expm1 keeps precision near r = 1.
        return torch.expm1(-logratio) + logratio
    if kind == "abs":
        return logratio.abs()
    raise ValueError(f"unknown KL penalty kind {kind!r}; expected k1, k2, k3 or abs")


def token_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: -kl_coef * KL on each token, plus the score on the last valid token."""
    # Ziegler et al. 2019, eq. 2: R(x, y) = r(x, y) - beta * log(pi(y|x) / rho(y|x)),
    # spread per token with the sequence score r(x, y) credited at the final token.
    valid = _as_bool(mask)
    kl = kl_penalty(logprobs, ref_logprobs, kind)
    kl = torch.where(valid, kl, torch.zeros_like(kl))
    rewards = -kl_coef * kl
    # Last valid index per row (works for any padding side); -1 when the row is empty.
    positions = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, torch.full_like(positions, -1)).max(dim=1).values
    has_token = last >= 0
    scores = scores.to(rewards.dtype)
    bonus = torch.where(has_token, scores, torch.zeros_like(scores))
    rewards = rewards.scatter_add(1, last.clamp_min(0).unsqueeze(1), bonus.unsqueeze(1))
    return rewards, kl


def relevance(own_logprobs: torch.Tensor, away_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per reply (B,): mean over its tokens of log p_ref(token | its prompt) − log p_ref(token | another prompt).

    The pointwise mutual information of reply and prompt per token, which the reward-hacking guard reads as
    "off-prompt" below ``gate.min_relevance``: a reply that would fit any question scores about 0. 0 for an empty
    reply."""
    valid = _as_bool(mask)
    gain = torch.where(valid, own_logprobs - away_logprobs, torch.zeros_like(own_logprobs))
    return gain.sum(1) / valid.sum(1).clamp_min(1)


def other_prompt(n: int, group_size: int) -> list[int]:
    """For each of ``n`` rollout rows (each prompt repeated ``group_size`` times side by side), the row of the next
    prompt: a different prompt whenever the batch has more than one."""
    return [(i + group_size) % n for i in range(n)]


def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns over valid tokens (terminal after the last)."""
    # Schulman et al. 2016, eqs. 11-16: delta_t = r_t + gamma * V(s_{t+1}) - V(s_t),
    # A_t = delta_t + gamma * lam * A_{t+1}, with V = 0 and A = 0 past the episode end.
    valid = _as_bool(mask)
    zeros = torch.zeros_like(values)
    rewards = torch.where(valid, rewards.to(values.dtype), zeros)
    values = torch.where(valid, values, zeros)
    next_value = values.new_zeros(values.shape[0])
    next_advantage = values.new_zeros(values.shape[0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        valid_t = valid[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage_t = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(valid_t, advantage_t, torch.zeros_like(advantage_t))
        # Padding is skipped, not bootstrapped from: carry the next valid token's state over it.
        next_value = torch.where(valid_t, values[:, t], next_value)
        next_advantage = torch.where(valid_t, advantage_t, next_advantage)
    returns = torch.where(valid, advantages + values, zeros)
    return advantages, returns


def group_advantages(returns: torch.Tensor, valid: torch.Tensor, group_size: int) -> torch.Tensor:
    """Leave-one-out advantages (B,) for replies sampled ``group_size`` at a time from the same prompt.

    Rows are grouped consecutively: rows [k * g, (k + 1) * g) answer the same prompt. Each reply's advantage is
    its return minus the mean return of the *other* valid replies to that prompt (RLOO: Kool et al. 2019,
    Ahmadian et al. 2024), then scaled by the batch's spread (not shifted: the baseline already centres it).
    A reply alone in its group, or invalid, gets 0: with nothing to compare it to, it teaches nothing.
    """
    if returns.numel() % group_size:
        raise ValueError(f"{returns.numel()} replies do not split into groups of {group_size}")
    ok = _as_bool(valid).to(returns.dtype).view(-1, group_size)
    r = torch.where(ok > 0, returns.view(-1, group_size), torch.zeros_like(ok))
    others = (ok.sum(1, keepdim=True) - ok).clamp_min(1)
    baseline = (r.sum(1, keepdim=True) - r) / others
    has_peer = (ok > 0) & (ok.sum(1, keepdim=True) > 1)
    adv = torch.where(has_peer, r - baseline, torch.zeros_like(r)).reshape(-1)
    used = has_peer.reshape(-1)
    if used.sum() > 1:
        adv = adv / (adv[used].std() + 1e-8)
    return adv


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate policy loss (to minimise) and detached stats over valid tokens."""
    # Schulman et al. 2017, eq. 7: L^CLIP = E[min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)];
    # we minimise its negative, i.e. max(-A * ratio, -A * clipped_ratio).
    valid = _as_bool(mask)
    # Zero padding before exp so garbage log-probs there cannot give inf/NaN gradients.
    logratio = torch.where(valid, logprobs - old_logprobs, torch.zeros_like(logprobs))
    advantages = torch.where(valid, advantages, torch.zeros_like(advantages))
    ratio = torch.exp(logratio)
    pg_losses = -advantages * ratio
    pg_losses_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    pg_loss = masked_mean(torch.max(pg_losses, pg_losses_clipped), mask)
    with torch.no_grad():
        # k3 estimator of KL(old || new) (Schulman, "Approximating KL Divergence").
        approx_kl = masked_mean((ratio - 1) - logratio, mask)
        # Clipping is "active" where the clipped term was chosen and differs (zero gradient).
        clipfrac = masked_mean((pg_losses_clipped > pg_losses).to(ratio.dtype), mask)
        ratio_mean = masked_mean(ratio, mask)
        # ratio > 0, so filling padding with 0 leaves the max intact and gives 0 for no tokens.
        ratio_max = torch.where(valid, ratio, torch.zeros_like(ratio)).max()
    stats = {
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
        "ratio_mean": ratio_mean,
        "ratio_max": ratio_max,
    }
    return pg_loss, stats


def preference_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
                    ref_rejected: torch.Tensor, beta: float,
                    smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """DPO's loss on whole replies' summed log-probs (Rafailov et al. 2023, eq. 7), one entry per pair:
    ``-log σ(β [(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))])``. With ``smoothing`` ε > 0, the
    conservative form (cDPO: each vote read as right with probability 1 − ε): ``−(1−ε) log σ(m) − ε log σ(−m)``,
    whose optimum is the finite margin ``log((1−ε)/ε)``, so a pair already won is pulled back instead of widened.
    Returns (mean loss, the margins β[...] detached): a margin above 0 means the policy prefers the chosen reply
    more than the reference."""
    margins = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    loss = -(1 - smoothing) * torch.nn.functional.logsigmoid(margins)
    if smoothing > 0:
        loss = loss - smoothing * torch.nn.functional.logsigmoid(-margins)
    return loss.mean(), margins.detach()


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range_value: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss 0.5 * E[max((v - R)^2, (v_clipped - R)^2)] and the clipped fraction."""
    # Value clipping as in the PPO reference implementation (baselines ppo2; Schulman et al. 2017):
    # v_clipped = old + clip(v - old, -eps, eps), pessimistic max of the two squared errors.
    valid = _as_bool(mask)
    zeros = torch.zeros_like(values)
    values = torch.where(valid, values, zeros)
    old_values = torch.where(valid, old_values, zeros)
    returns = torch.where(valid, returns, zeros)
    delta = torch.clamp(values - old_values, -clip_range_value, clip_range_value)
    values_clipped = old_values + delta
    vf_losses = (values - returns) ** 2
    vf_losses_clipped = (values_clipped - returns) ** 2
    v_loss = 0.5 * masked_mean(torch.max(vf_losses, vf_losses_clipped), mask)
    with torch.no_grad():
        vf_clipfrac = masked_mean((vf_losses_clipped > vf_losses).to(values.dtype), mask)
    return v_loss, vf_clipfrac


class AdaptiveKLController:
    """Adaptive KL coefficient driving the observed KL towards a target (Ziegler et al. 2019)."""

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Scale the coefficient by 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon."""
        # Ziegler et al. 2019, section 2.2: e_t = clip((KL_t - KL_target) / KL_target, -0.2, 0.2),
        # beta_{t+1} = beta_t * (1 + K_beta * e_t), with K_beta = n_steps / horizon.
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        """Plain-float state for exact resumption."""
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore state written by `state_dict`."""
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = float(state["horizon"])


class FixedKLController:
    """Constant KL coefficient with the same interface as AdaptiveKLController."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        """Plain-float state for exact resumption."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore state written by `state_dict`."""
        self.value = float(state["value"])
