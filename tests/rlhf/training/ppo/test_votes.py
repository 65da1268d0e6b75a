"""ppo.vote_weight: DPO's loss on the decided votes inside PPO (``rlhf.training.ppo.votes``): the maths, the rows'
log-probs against an unpadded forward, the order the pairs are read in, and a real run that learns the votes."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf.config import ConfigError, load_config
from rlhf.training.ppo.core import preference_loss
from rlhf.training.ppo.votes import VoteTerm, chosen_nll

PROMPTS = [[{"role": "user", "content": q}] for q in ("Name a colour.", "How do I boil an egg?",
                                                      "What is the capital of France?")]
PAIRS = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in zip(
    PROMPTS, ("Blue, like the sky. Thank you for asking!", "Boil it for eight minutes, please.", "Paris."),
    ("Blue.", "Put it in boiling water for eight minutes until it is done, then cool it.", "It is Paris, France."))]


def config(tmp_path, model_dir, *overrides):
    return load_config(env={}, overrides=[
        "ppo.relevance_weight=0", "ppo.novelty_weight=0", "ppo.repetition_weight=0",
        f"data_dir={tmp_path / 'data'}", f"base_model={model_dir}", "device=cpu", "ppo.batch_size=2",
        "ppo.group_size=2", "ppo.mini_batch_size=2", "ppo.max_new_tokens=6", "ppo.eval_prompts=2",
        "ppo.save_every=0", *overrides])


def test_preference_loss_is_dpos():
    zero = torch.zeros(2)
    loss, margins = preference_loss(zero, zero, zero, zero, 0.1)
    assert loss.item() == pytest.approx(math.log(2)) and margins.tolist() == [0.0, 0.0]
    # The policy likes the chosen reply 3 nats more than the reference does, the rejected one 1 nat less.
    loss, margins = preference_loss(torch.tensor([-7.0]), torch.tensor([-11.0]), torch.tensor([-10.0]),
                                    torch.tensor([-10.0]), 0.5)
    assert margins.item() == pytest.approx(0.5 * (3 - (-1)))
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-2.0))))
    assert not margins.requires_grad


def test_smoothing_pulls_a_won_pair_back_toward_a_finite_margin():
    """cDPO (ppo.vote_smoothing ε): the loss is lowest at the margin log((1-ε)/ε), so past it the loss rises with
    the chosen reply's log-prob and a step lowers it; DPO's (ε 0) still pushes the margin wider, however slightly."""
    eps, beta = 0.1, 0.5
    best = math.log((1 - eps) / eps) / beta  # the log-ratio difference (nats) at the optimum
    zero = torch.zeros(1)

    def grad(nats: float, smoothing: float) -> float:
        chosen = torch.tensor([nats], requires_grad=True)
        preference_loss(chosen, zero, zero, zero, beta, smoothing)[0].backward()
        return chosen.grad.item()

    assert grad(best - 1, eps) < 0 < grad(best + 1, eps)  # the loss falls toward the optimum from both sides
    assert grad(best, eps) == pytest.approx(0.0, abs=1e-6)
    assert grad(40.0, 0.0) < 0  # DPO: a pair won by 40 nats is still widened
    assert grad(40.0, eps) == pytest.approx(beta * eps, rel=1e-3)
    loss, _ = preference_loss(zero, zero, zero, zero, beta, eps)  # at margin 0 the two forms agree
    assert loss.item() == pytest.approx(math.log(2))


@pytest.mark.parametrize("value", [-0.1, 0.5, 0.7])
def test_vote_smoothing_out_of_range_is_refused(value):
    with pytest.raises(ConfigError, match="vote_smoothing"):
        load_config(env={}, overrides=[f"ppo.vote_smoothing={value}"])


def test_chosen_nll_is_minus_the_log_prob_per_token():
    # Two chosen replies: -6 nats over 3 tokens and -2 over 4 (the padding after them is not read).
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert chosen_nll(torch.tensor([-6.0, -2.0]), mask).item() == pytest.approx((2.0 + 0.5) / 2)


@pytest.mark.slow
def test_vote_nll_weight_adds_the_chosen_replies_likelihood(tokenizer, tmp_path, tiny_model_dir):
    """With the adapter fresh the policy is the reference: DPO's loss is log 2, and ppo.vote_nll_weight adds that
    weight times the chosen replies' NLL per token, read by an unpadded forward."""
    from rlhf.training.ppo.rollout import build_policy

    cfg = config(tmp_path, tiny_model_dir, "ppo.vote_batch=3", "ppo.vote_nll_weight=0.5").ppo
    policy = build_policy(str(tiny_model_dir), cfg, "cpu")
    term = VoteTerm(tokenizer, PAIRS, cfg, "cpu")
    term.prepare(policy)
    nll = []
    for i, pair in enumerate(PAIRS):
        tokens = tokenizer(pair["chosen"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        nll.append(-term.reference[i, 0].item() / len(tokens))
    with torch.no_grad():
        loss, margins = term.loss(policy, 1)
    assert margins.abs().max().item() < 1e-3
    assert loss.item() == pytest.approx(math.log(2) + 0.5 * sum(nll) / 3, abs=1e-3)


def test_each_pass_reads_every_pair_once(tokenizer, tmp_path, tiny_model_dir):
    cfg = config(tmp_path, tiny_model_dir, "ppo.vote_batch=2", "ppo.vote_passes=0").ppo
    pairs = [{**PAIRS[i % 3], "chosen": f"reply {i}"} for i in range(5)]
    term = VoteTerm(tokenizer, pairs, cfg, "cpu")
    places = [i for step in range(1, 6) for i in term.batch(step)]  # 10 places: two passes over 5 pairs
    assert sorted(places[:5]) == sorted(places[5:]) == list(range(5))
    # Two processes read different pairs at one step, and the same pairs at a rerun of it.
    assert set(term.batch(1, 0, 2)).isdisjoint(term.batch(1, 1, 2))
    assert term.batch(3, 1, 2) == term.batch(3, 1, 2)
    assert all(term.active(step) for step in range(1, 50))  # ppo.vote_passes 0: a vote step after every update
    once = VoteTerm(tokenizer, pairs, config(tmp_path, tiny_model_dir, "ppo.vote_batch=2", "ppo.vote_passes=1").ppo,
                    "cpu")
    assert [once.active(step) for step in range(1, 6)] == [True, True, True, False, False]  # 6 places read >= 5
    assert [once.active(step, world=2) for step in range(1, 4)] == [True, True, False]  # 4 places a step
    with pytest.raises(ValueError, match="at least one decided pair"):
        VoteTerm(tokenizer, [], cfg, "cpu")


def test_a_larger_pool_takes_more_pairs_a_step_up_to_vote_batch_max(tokenizer, tmp_path, tiny_model_dir):
    pairs = [{**PAIRS[i % 3], "chosen": f"reply {i}"} for i in range(9)]

    def term(*overrides):
        return VoteTerm(tokenizer, pairs, config(tmp_path, tiny_model_dir, "ppo.steps=3", "ppo.vote_batch=2",
                                                 "ppo.vote_passes=1", *overrides).ppo, "cpu")

    assert term("ppo.vote_batch_max=1").per_step() == 2  # never below vote_batch
    grown = term("ppo.vote_batch_max=8")
    assert grown.per_step() == 3  # one pass over 9 pairs in 3 steps
    assert [len(grown.batch(s)) for s in (1, 2, 3)] == [3, 3, 3]
    assert sorted(i for s in (1, 2, 3) for i in grown.batch(s)) == list(range(9))
    assert [grown.active(s) for s in (1, 2, 3, 4)] == [True, True, True, False]
    assert term("ppo.vote_batch_max=8").per_step(world=3) == 2  # three processes share the pass
    assert term("ppo.vote_batch_max=2").per_step() == 2  # capped: the pass takes more steps than there are
    assert term("ppo.vote_batch_max=8", "ppo.vote_passes=0").per_step() == 2  # no passes asked: vote_batch
    assert term("ppo.vote_batch_max=20", "ppo.vote_passes=4").per_step() == 9  # never more than the pairs


@pytest.mark.slow
def test_rows_read_each_reply_as_an_unpadded_forward_does(tokenizer, tmp_path, tiny_model_dir):
    from rlhf.training.ppo.rollout import build_policy

    cfg = config(tmp_path, tiny_model_dir).ppo
    policy = build_policy(str(tiny_model_dir), cfg, "cpu")
    term = VoteTerm(tokenizer, PAIRS, cfg, "cpu")
    term.prepare(policy)
    for i, pair in enumerate(PAIRS):
        for j, reply in enumerate((pair["chosen"], pair["rejected"])):
            prompt = term.prompt_ids[i]
            tokens = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            ids = torch.tensor([prompt + tokens])
            with torch.no_grad(), policy.policy.disable_adapter():
                logits = policy.policy(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
            expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None]).sum()
            assert term.reference[i, j].item() == pytest.approx(expected.item(), abs=1e-3)


@pytest.mark.slow
def test_ppo_with_vote_weight_learns_the_votes(tmp_path, tiny_model_dir):
    """A reward that pays nothing: whatever PPO learns comes from the votes, and the policy's margin for the chosen
    replies, read before each step's vote update, grows from about 0 (the fresh adapter is the reference)."""
    from rlhf.training.ppo.trainer import train_ppo

    cfg = config(tmp_path, tiny_model_dir, "ppo.steps=6", "ppo.vote_weight=1", "ppo.vote_beta=0.1",
                 "ppo.vote_batch=3", "ppo.learning_rate=3e-3", "ppo.vote_passes=0")
    result = train_ppo(cfg, str(tiny_model_dir), lambda p, r: [0.0] * len(r), PROMPTS, PROMPTS[:2],
                       tmp_path / "run", pairs=PAIRS)
    margins = [m["votes/margin"] for m in result.history]
    assert abs(margins[0]) < 0.05, margins  # only step 1's PPO update (on rounding noise) came before it
    assert margins[-1] > margins[0] + 0.1 and result.history[-1]["votes/accuracy"] == 1.0, margins
    assert result.history[-1]["votes/loss"] < math.log(2)
    # On by default, for two passes; ppo.vote_weight=0 turns it off, and without pairs the term is not built: no
    # vote metrics.
    default = config(tmp_path, tiny_model_dir).ppo
    assert default.vote_weight > 0 and default.vote_passes == 2
    off = train_ppo(config(tmp_path, tiny_model_dir, "ppo.steps=1", "ppo.vote_weight=0"), str(tiny_model_dir),
                    lambda p, r: [0.0] * len(r), PROMPTS, PROMPTS[:2], tmp_path / "off", pairs=PAIRS)
    none = train_ppo(config(tmp_path, tiny_model_dir, "ppo.steps=1"), str(tiny_model_dir),
                     lambda p, r: [0.0] * len(r), PROMPTS, PROMPTS[:2], tmp_path / "none", pairs=())
    assert not any(k.startswith("votes/") for run in (off, none) for k in run.history[0])
    # ppo.vote_passes 1 with a batch of all three pairs: step 1 reads them, step 2 takes no vote step.
    once = train_ppo(config(tmp_path, tiny_model_dir, "ppo.steps=2", "ppo.vote_batch=3", "ppo.vote_passes=1"),
                     str(tiny_model_dir), lambda p, r: [0.0] * len(r), PROMPTS, PROMPTS[:2], tmp_path / "once",
                     pairs=PAIRS)
    assert [any(k.startswith("votes/") for k in m) for m in once.history] == [True, False]


def test_bad_vote_settings_are_refused(tmp_path, tiny_model_dir):
    for bad in ("ppo.vote_weight=-1", "ppo.vote_beta=0", "ppo.vote_batch=0", "ppo.vote_passes=-1",
                "ppo.vote_nll_weight=-0.5", "ppo.vote_batch_max=0"):
        with pytest.raises(ConfigError, match="ppo.vote_weight must be >= 0"):
            config(tmp_path, tiny_model_dir, bad)
    with pytest.raises(ConfigError, match="ppo.vote_weight must be a finite number"):
        config(tmp_path, tiny_model_dir, "ppo.vote_weight=nan")
