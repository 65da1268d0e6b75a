"""PPO maths tested two ways: hand-computed small cases and slow per-token reference loops."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf.training.ppo.core import (
    AdaptiveKLController,
    FixedKLController,
    compute_gae,
    entropy_from_logits,
    group_advantages,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    other_prompt,
    ppo_policy_loss,
    relevance,
    token_rewards,
    value_loss,
)


def t(rows, dtype=torch.float32):
    return torch.tensor(rows, dtype=dtype)


# ---------------------------------------------------------------- hand-computed cases


def test_masked_mean_and_whiten_ignore_padding():
    values = t([[1.0, 2.0, 3.0, 1000.0]])
    mask = t([[1, 1, 1, 0]])
    # mean = (1 + 2 + 3) / 3 = 2; the 1000 in padding must not count.
    assert_close(masked_mean(values, mask), torch.tensor(2.0))
    # unbiased var = ((1-2)^2 + 0 + (3-2)^2) / (3 - 1) = 1; biased = 2/3.
    assert_close(masked_var(values, mask), torch.tensor(1.0))
    assert_close(masked_var(values, mask, unbiased=False), torch.tensor(2.0 / 3.0))
    # whiten: (v - 2) / sqrt(1) -> [-1, 0, 1], and 0 at padding.
    assert_close(masked_whiten(values, mask), t([[-1.0, 0.0, 1.0, 0.0]]))
    # shift_mean=False adds the mean back: [1, 2, 3], still 0 at padding.
    assert_close(masked_whiten(values, mask, shift_mean=False), t([[1.0, 2.0, 3.0, 0.0]]))


def test_masked_mean_per_row_with_bool_mask():
    values = t([[1.0, 3.0, 9.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    # row 0: (1 + 3) / 2 = 2; row 1: (4 + 5 + 6) / 3 = 5.
    assert_close(masked_mean(values, mask, dim=1), t([2.0, 5.0]))


def test_logprobs_and_entropy_from_logits():
    logits = t([[[0.0, 0.0, math.log(2.0)]]])  # softmax = [1/4, 1/4, 1/2]
    assert_close(logprobs_from_logits(logits, torch.tensor([[2]])), t([[math.log(0.5)]]))
    assert_close(logprobs_from_logits(logits, torch.tensor([[0]])), t([[math.log(0.25)]]))
    # H = -(2 * 1/4 * ln(1/4) + 1/2 * ln(1/2)) = 0.5 ln 4 + 0.5 ln 2 = 1.5 ln 2.
    assert_close(entropy_from_logits(logits), t([[1.5 * math.log(2.0)]]))
    # A banned (-inf) token contributes 0, not NaN: uniform over 2 tokens -> ln 2.
    banned = t([[[0.0, 0.0, float("-inf")]]])
    assert_close(entropy_from_logits(banned), t([[math.log(2.0)]]))


def test_kl_penalty_kinds():
    logprobs = t([-1.0, -1.5])
    ref_logprobs = t([-1.5, -1.0])  # logratio = logp - ref = [0.5, -0.5]
    assert_close(kl_penalty(logprobs, ref_logprobs, "k1"), t([0.5, -0.5]))
    # k2 = 0.5 * 0.25 = 0.125 for both.
    assert_close(kl_penalty(logprobs, ref_logprobs, "k2"), t([0.125, 0.125]))
    # k3 = (r - 1) - ln r with r = exp(ref - logp):
    #   r = e^-0.5 -> e^-0.5 - 1 + 0.5;  r = e^0.5 -> e^0.5 - 1 - 0.5.
    k3 = t([math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5])
    assert_close(kl_penalty(logprobs, ref_logprobs, "k3"), k3)
    assert_close(kl_penalty(logprobs, ref_logprobs, "abs"), t([0.5, 0.5]))
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(logprobs, ref_logprobs, "k4")


def test_token_rewards_puts_score_on_last_valid_token():
    scores = t([3.0, -1.0])
    logprobs = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -7.0]])
    # k1 = logp - ref = [0.1, 0.2, 0.3] and [0.1, 0.2, padding]
    ref_logprobs = t([[-1.1, -1.2, -1.3], [-1.1, -1.2, 0.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    rewards, kl = token_rewards(scores, logprobs, ref_logprobs, mask, kl_coef=0.5)
    # row 0: -0.5 * [0.1, 0.2, 0.3] = [-0.05, -0.1, -0.15], + 3 at t=2 -> 2.85.
    # row 1: [-0.05, -0.1] with -1 at t=1 -> -1.1; padding t=2 -> 0 (its kl -7 is ignored).
    assert_close(rewards, t([[-0.05, -0.1, 2.85], [-0.05, -1.1, 0.0]]))
    assert_close(kl, t([[0.1, 0.2, 0.3], [0.1, 0.2, 0.0]]))


def test_gae_terminal_step():
    rewards = t([[1.0, 0.0, 2.0]])
    values = t([[0.5, 1.0, 1.5]])
    mask = t([[1, 1, 1]])
    advantages, returns = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # gamma * lam = 0.72; V after the last token is 0 (terminal).
    # t=2: delta = 2 + 0.9*0 - 1.5 = 0.5;                 A2 = 0.5
    # t=1: delta = 0 + 0.9*1.5 - 1.0 = 0.35;              A1 = 0.35 + 0.72*0.5 = 0.71
    # t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4;               A0 = 1.4 + 0.72*0.71 = 1.9112
    assert_close(advantages, t([[1.9112, 0.71, 0.5]]))
    # returns = A + V = [2.4112, 1.71, 2.0]
    assert_close(returns, t([[2.4112, 1.71, 2.0]]))


def test_gae_right_padding_does_not_bootstrap_from_padding():
    rewards = t([[1.0, 2.0, 5.0]])
    values = t([[0.5, 1.0, 100.0]])  # padding value 100 and reward 5 must be ignored
    mask = t([[1, 1, 0]])
    advantages, returns = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # t=1 is terminal: delta = 2 + 0.9*0 - 1.0 = 1.0;      A1 = 1.0
    # t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4;                 A0 = 1.4 + 0.72*1.0 = 2.12
    assert_close(advantages, t([[2.12, 1.0, 0.0]]))
    # returns = [2.12 + 0.5, 1.0 + 1.0, 0] = [2.62, 2.0, 0]
    assert_close(returns, t([[2.62, 2.0, 0.0]]))


def test_ppo_policy_loss_clipped_ratio():
    old_logprobs = t([[0.0, 0.0, 0.0, 0.0]])
    logprobs = t([[math.log(1.5), 0.0, math.log(0.5), math.log(10.0)]])  # ratio = [1.5, 1, 0.5, 10]
    advantages = t([[1.0, 2.0, 1.0, 1.0]])
    mask = t([[1, 1, 1, 0]])  # ratio 10 is padding
    pg_loss, stats = ppo_policy_loss(logprobs, old_logprobs, advantages, mask, clip_range=0.2)
    # token 0: -A*r = -1.5, -A*clip = -1.2 -> max -1.2 (clipped: clip term chosen)
    # token 1: -2.0 and -2.0 -> -2.0 (ratio 1, not clipped)
    # token 2: -0.5 and -0.8 -> -0.5 (ratio below range but A > 0: unclipped term is pessimistic)
    # pg_loss = (-1.2 - 2.0 - 0.5) / 3 = -3.7 / 3
    assert_close(pg_loss, torch.tensor(-3.7 / 3))
    assert_close(stats["clipfrac"], torch.tensor(1.0 / 3.0))
    # approx_kl = mean((r - 1) - ln r) = [(0.5 - ln 1.5) + 0 + (-0.5 - ln 0.5)] / 3
    approx_kl = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 3
    assert_close(stats["approx_kl"], torch.tensor(approx_kl))
    assert_close(stats["ratio_mean"], torch.tensor(1.0))  # (1.5 + 1 + 0.5) / 3
    assert_close(stats["ratio_max"], torch.tensor(1.5))  # the padding ratio 10 is excluded
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())


def test_ppo_policy_loss_gradient_finite_with_garbage_padding():
    logprobs = t([[-1.0, 1000.0]]).requires_grad_()  # exp(1000 - 0) = inf at padding
    pg_loss, _ = ppo_policy_loss(logprobs, t([[-1.0, 0.0]]), t([[1.0, 1.0]]), t([[1, 0]]), 0.2)
    pg_loss.backward()
    # ratio = 1 at the valid token: d(-A*ratio)/dlogp = -A*ratio = -1; padding gets 0.
    assert_close(logprobs.grad, t([[-1.0, 0.0]]))


def test_value_loss_clipping():
    old_values = t([[0.0, 0.0, 0.0, 0.0]])
    values = t([[0.5, 0.1, 0.5, 9.0]])
    returns = t([[1.0, 0.0, 0.0, 0.0]])
    mask = t([[1, 1, 1, 0]])
    v_loss, vf_clipfrac = value_loss(values, old_values, returns, mask, clip_range_value=0.2)
    # token 0: (0.5-1)^2 = 0.25, clipped v 0.2 -> (0.2-1)^2 = 0.64 -> 0.64 (clip active)
    # token 1: (0.1-0)^2 = 0.01, within range -> 0.01
    # token 2: (0.5-0)^2 = 0.25, clipped v 0.2 -> 0.04 -> 0.25 (unclipped chosen)
    # v_loss = 0.5 * (0.64 + 0.01 + 0.25) / 3 = 0.15
    assert_close(v_loss, torch.tensor(0.15))
    assert_close(vf_clipfrac, torch.tensor(1.0 / 3.0))


def test_zero_valid_token_row_gives_no_nan():
    mask = t([[1, 1, 0], [0, 0, 0]])
    x = t([[0.3, -0.2, float("nan")], [float("nan"), 1.0, 2.0]])
    assert_close(masked_mean(x, mask, dim=1), t([0.05, 0.0]))
    assert_close(masked_mean(x, t([[0, 0, 0], [0, 0, 0]])), torch.tensor(0.0))
    assert_close(masked_whiten(x, mask)[1], t([0.0, 0.0, 0.0]))
    rewards, kl = token_rewards(t([1.0, 7.0]), x, torch.zeros(2, 3), mask, kl_coef=0.1)
    # row 1 is empty: its score 7 goes nowhere.
    assert_close(rewards[1], t([0.0, 0.0, 0.0]))
    advantages, returns = compute_gae(rewards, x, mask, gamma=1.0, lam=0.95)
    assert_close(advantages[1], t([0.0, 0.0, 0.0]))
    assert_close(returns[1], t([0.0, 0.0, 0.0]))
    pg_loss, stats = ppo_policy_loss(x, torch.zeros(2, 3), advantages, mask, 0.2)
    v_loss, vf_clipfrac = value_loss(x, torch.zeros(2, 3), returns, mask, 0.2)
    outputs = [rewards, kl, advantages, returns, pg_loss, v_loss, vf_clipfrac, *stats.values()]
    assert all(torch.isfinite(o).all() for o in outputs)
    # A batch with no valid token at all is also finite (and zero).
    empty = torch.zeros(2, 3)
    pg_loss, stats = ppo_policy_loss(x, empty, x, empty, 0.2)
    assert pg_loss.item() == 0.0 and all(v.item() == 0.0 for v in stats.values())


# ---------------------------------------------------------------- slow reference loops


def random_batch(seed, batch=6, length=9):
    """Random float64 tensors with random right padding; row 0 always empty, row 1 always full."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0], lengths[1] = 0, length
    mask = (torch.arange(length) < lengths[:, None]).to(torch.float64)

    def randn():
        # Garbage (large) values in padding so a leak would show.
        noise = torch.randn(batch, length, generator=gen, dtype=torch.float64)
        return torch.where(mask.bool(), noise, 1e3)

    return mask, lengths.tolist(), randn


def ref_token_rewards(scores, logprobs, ref_logprobs, lengths, kl_coef):
    rewards = torch.zeros_like(logprobs)
    for b, n in enumerate(lengths):
        for i in range(n):
            rewards[b, i] = -kl_coef * (logprobs[b, i].item() - ref_logprobs[b, i].item())
        if n > 0:
            rewards[b, n - 1] += scores[b].item()
    return rewards


def ref_gae(rewards, values, lengths, gamma, lam):
    advantages = torch.zeros_like(values)
    for b, n in enumerate(lengths):
        last_advantage = 0.0
        for i in reversed(range(n)):
            next_value = values[b, i + 1].item() if i + 1 < n else 0.0
            delta = rewards[b, i].item() + gamma * next_value - values[b, i].item()
            last_advantage = delta + gamma * lam * last_advantage
            advantages[b, i] = last_advantage
    returns = torch.zeros_like(values)
    for b, n in enumerate(lengths):
        for i in range(n):
            returns[b, i] = advantages[b, i] + values[b, i]
    return advantages, returns


def ref_policy_loss(logprobs, old_logprobs, advantages, lengths, clip_range):
    losses, clipped, kls = [], [], []
    for b, n in enumerate(lengths):
        for i in range(n):
            logratio = logprobs[b, i].item() - old_logprobs[b, i].item()
            ratio = math.exp(logratio)
            a = advantages[b, i].item()
            unclipped = -a * ratio
            clipped_loss = -a * min(max(ratio, 1 - clip_range), 1 + clip_range)
            losses.append(max(unclipped, clipped_loss))
            clipped.append(1.0 if clipped_loss > unclipped else 0.0)
            kls.append((ratio - 1) - logratio)
    return [torch.tensor(sum(x) / len(x), dtype=torch.float64) for x in (losses, clipped, kls)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_mean_and_whiten_match_reference(seed):
    mask, lengths, randn = random_batch(seed)
    values = randn()
    valid = [values[b, i].item() for b, n in enumerate(lengths) for i in range(n)]
    mean = sum(valid) / len(valid)
    var = sum((v - mean) ** 2 for v in valid) / (len(valid) - 1)
    assert_close(masked_mean(values, mask), torch.tensor(mean, dtype=torch.float64))
    assert_close(masked_var(values, mask), torch.tensor(var, dtype=torch.float64))
    row_means = [sum(values[b, :n].tolist()) / n if n else 0.0 for b, n in enumerate(lengths)]
    assert_close(masked_mean(values, mask, dim=1), torch.tensor(row_means, dtype=torch.float64))
    expected = torch.zeros_like(values)
    for b, n in enumerate(lengths):
        for i in range(n):
            expected[b, i] = (values[b, i].item() - mean) / math.sqrt(var + 1e-8)
    assert_close(masked_whiten(values, mask), expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_rewards_match_reference(seed):
    mask, lengths, randn = random_batch(seed)
    logprobs, ref_logprobs = randn(), randn()
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(len(lengths), generator=gen, dtype=torch.float64)
    rewards, _ = token_rewards(scores, logprobs, ref_logprobs, mask, kl_coef=0.07)
    assert_close(rewards, ref_token_rewards(scores, logprobs, ref_logprobs, lengths, 0.07))


@pytest.mark.parametrize("seed,gamma,lam", [(0, 1.0, 0.95), (1, 0.99, 0.9), (2, 0.9, 1.0)])
def test_gae_matches_reference(seed, gamma, lam):
    mask, lengths, randn = random_batch(seed)
    rewards, values = randn(), randn()
    advantages, returns = compute_gae(rewards, values, mask, gamma, lam)
    expected_advantages, expected_returns = ref_gae(rewards, values, lengths, gamma, lam)
    assert_close(advantages, expected_advantages)
    assert_close(returns, expected_returns)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ppo_policy_loss_matches_reference(seed):
    mask, lengths, randn = random_batch(seed)
    old_logprobs = randn()
    # Ratios spread around 1 so that some tokens clip and some do not.
    logprobs = torch.where(mask.bool(), old_logprobs + 0.3 * randn(), 1e3)
    advantages = randn()
    pg_loss, stats = ppo_policy_loss(logprobs, old_logprobs, advantages, mask, clip_range=0.2)
    expected_loss, expected_clipfrac, expected_kl = ref_policy_loss(
        logprobs, old_logprobs, advantages, lengths, 0.2
    )
    assert 0.0 < expected_clipfrac < 1.0
    assert_close(pg_loss, expected_loss)
    assert_close(stats["clipfrac"], expected_clipfrac)
    assert_close(stats["approx_kl"], expected_kl)


# ---------------------------------------------------------------- KL controllers


def test_adaptive_kl_rises_above_target_and_falls_below():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10000)
    # KL 6.6: error = 6.6/6 - 1 = 0.1 (inside the clip)
    #   -> coef * (1 + 0.1 * 256 / 10000) = 0.1 * 1.00256
    ctl.update(6.6, n_steps=256)
    assert ctl.value == pytest.approx(0.100256)
    ctl = AdaptiveKLController(0.1, 6.0, 10000)
    # KL 5.7: error = -0.05 -> 0.1 * (1 - 0.05 * 0.0256) = 0.1 * 0.99872
    ctl.update(5.7, n_steps=256)
    assert ctl.value == pytest.approx(0.099872)


def test_adaptive_kl_error_is_clipped():
    high, higher, low = (AdaptiveKLController(0.1, 6.0, 10000) for _ in range(3))
    high.update(12.0, 256)  # error 1.0 -> clipped to 0.2: 0.1 * (1 + 0.2 * 0.0256) = 0.100512
    higher.update(600.0, 256)  # error 99 -> also 0.2
    low.update(0.0, 256)  # error -1 -> clipped to -0.2: 0.1 * (1 - 0.00512) = 0.099488
    assert high.value == pytest.approx(0.100512)
    assert higher.value == pytest.approx(0.100512)
    assert low.value == pytest.approx(0.099488)
    # A tensor KL is accepted too.
    tensor_ctl = AdaptiveKLController(0.1, 6.0, 10000)
    tensor_ctl.update(torch.tensor(12.0), 256)
    assert tensor_ctl.value == pytest.approx(0.100512)


def test_kl_controllers_resume_exactly_from_state_dict():
    ctl = AdaptiveKLController(0.2, 6.0, 10000)
    for kl in (9.0, 1.0, 7.3):
        ctl.update(kl, 512)
    state = ctl.state_dict()
    assert all(type(v) is float for v in state.values())
    resumed = AdaptiveKLController(1.0, 1.0, 1.0)
    resumed.load_state_dict(state)
    ctl.update(4.2, 512)
    resumed.update(4.2, 512)
    assert resumed.value == ctl.value and resumed.state_dict() == ctl.state_dict()

    fixed = FixedKLController(0.05)
    fixed.update(100.0, 512)
    assert fixed.value == 0.05
    other = FixedKLController(1.0)
    other.load_state_dict(fixed.state_dict())
    assert other.value == 0.05 and other.state_dict() == {"value": 0.05}


def test_group_advantages_compare_each_reply_with_the_others_to_its_prompt():
    returns = t([1.0, 2.0, 3.0, 4.0, 0.0, 99.0, 5.0, 1.0])
    valid = torch.tensor([True, True, True, True, True, False, True, True])
    adv = group_advantages(returns, valid, 4)
    # Prompt 1: 1 - (2+3+4)/3 = -2, 2 - 8/3, 3 - 7/3, 4 - 2 = 2. Prompt 2 (the 99 is invalid): 0 - 3, 5 - 0.5,
    # 1 - 2.5. Then one scale for the whole batch (the std of the six), no shift.
    raw = t([-2.0, -2.0 / 3, 2.0 / 3, 2.0, -3.0, 0.0, 4.5, -1.5])
    used = valid
    assert_close(adv, raw / raw[used].std())
    assert adv[5] == 0.0


def test_group_advantages_give_nothing_to_a_reply_without_peers_and_check_the_shape():
    adv = group_advantages(t([3.0, 7.0, 1.0, 1.0]), torch.tensor([True, False, True, True]), 2)
    assert adv[0] == 0.0 and adv[1] == 0.0  # its only peer is invalid: nothing to compare with
    assert adv[2] == 0.0 and adv[3] == 0.0  # equal returns: no preference, no signal (and no NaN)
    assert torch.isfinite(adv).all()
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(t([1.0, 2.0, 3.0, 4.0]), torch.ones(4, dtype=torch.bool), 3)


def test_relevance_is_the_mean_log_prob_gain_per_reply_token_over_another_prompt():
    own = t([[-1.0, -2.0, -9.0], [-3.0, -3.0, -3.0], [0.0, 0.0, 0.0]])
    away = t([[-2.0, -4.0, 0.0], [-3.0, -2.0, -1.0], [-5.0, -5.0, -5.0]])
    mask = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    # Row 1: (1 + 2) / 2 (the padded third token is not read); row 2: (0 - 1 - 2) / 3; row 3 has no token.
    assert_close(relevance(own, away, mask), t([1.5, -1.0, 0.0]))


def test_other_prompt_is_always_another_prompt_of_the_batch():
    assert other_prompt(8, 4) == [4, 5, 6, 7, 0, 1, 2, 3]
    assert other_prompt(3, 1) == [1, 2, 0]
    groups = 4
    assert all(j // groups != i // groups for i, j in enumerate(other_prompt(12, groups)))
