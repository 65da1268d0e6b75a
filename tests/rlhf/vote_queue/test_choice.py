"""Choosing the next vote: uncertainty by hand, the most uncertain item on a hand-made pool, the random share,
overlap items first, random before any reward model, and the Store handing items out with this chooser."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlhf.vote_queue.choice import binary_entropy, choose_batch, choose_item, pair_uncertainty
from rlhf.training.reward_head import LinearHead


def test_uncertainty_by_hand():
    p_mean, u = pair_uncertainty(np.array([[0.5, 0.5], [0.9, 0.1], [0.9, 0.9], [1.0, 1.0]]))
    np.testing.assert_allclose(p_mean, [0.5, 0.5, 0.9, 1.0])
    h09 = -(0.9 * math.log2(0.9) + 0.1 * math.log2(0.1))  # 0.469
    np.testing.assert_allclose(u, [1.0, 1.0, h09, 0.0], atol=1e-9)
    assert binary_entropy(np.array([0.2]))[0] == pytest.approx(binary_entropy(np.array([0.8]))[0])


def test_the_most_uncertain_item_of_a_hand_made_pool_is_picked():
    # A 2-member head on 2 features: both members like feature 0; they disagree on feature 1.
    head = LinearHead(mean=np.zeros(2), scale=np.ones(2), weights=np.array([[2.0, 3.0], [2.0, -3.0]]),
                      bias=np.zeros(2))
    x_a = np.array([[2.0, 0.0],   # item 0: A clearly better by both members
                    [0.1, 0.0],   # item 1: A slightly better: p̄ = σ(0.2) = 0.55
                    [0.0, 1.0],   # item 2: the members disagree completely (σ(3) vs σ(-3)): p̄ = 0.5
                    [-1.0, 0.0]])  # item 3: B better
    x_b = np.zeros((4, 2))
    p_mean, u = pair_uncertainty(head.preference(x_a, x_b))
    assert p_mean[2] == pytest.approx(0.5) and u.argmax() == 2
    candidates = [{"id": 10 + i, "uncertainty": float(u[i]), "votes": 0, "votes_wanted": 1} for i in range(4)]
    assert choose_item(candidates, 0.0, np.random.default_rng(0)) == (12, "uncertain")
    # without item 2, the pair nearest 0.5 is next
    assert choose_item([c for c in candidates if c["id"] != 12], 0.0, np.random.default_rng(0)) == (11, "uncertain")


def test_random_before_any_reward_model_and_nothing_from_nothing():
    rng = np.random.default_rng(1)
    candidates = [{"id": i, "uncertainty": None, "votes": 0, "votes_wanted": 1} for i in range(5)]
    picks = {choose_item(candidates, 0.0, rng) for _ in range(200)}
    assert {reason for _, reason in picks} == {"cold_start"} and {i for i, _ in picks} == set(range(5))
    assert choose_item([], 0.2, rng) is None


def test_a_share_of_picks_is_random():
    rng = np.random.default_rng(2)
    candidates = [{"id": i, "uncertainty": i / 10, "votes": 0, "votes_wanted": 1} for i in range(10)]
    reasons = [choose_item(candidates, 0.25, rng)[1] for _ in range(2000)]
    assert 0.21 < reasons.count("random") / len(reasons) < 0.29
    assert all(choose_item(candidates, 1.0, rng)[1] == "random" for _ in range(20))
    assert choose_item(candidates, 0.0, rng) == (9, "uncertain")


def test_an_item_waiting_for_its_second_vote_comes_first():
    candidates = [{"id": 1, "uncertainty": 1.0, "votes": 0, "votes_wanted": 1},
                  {"id": 2, "uncertainty": 0.0, "votes": 1, "votes_wanted": 2},
                  {"id": 3, "uncertainty": 0.1, "votes": 1, "votes_wanted": 2}]
    assert choose_item(candidates, 0.0, np.random.default_rng(0)) == (2, "overlap")


def test_a_batch_takes_distinct_items_most_uncertain_first():
    u = np.array([0.1, 0.9, 0.5, 0.95, 0.2])
    picks = choose_batch(u, 3, 0.0, np.random.default_rng(0))
    assert picks == [(3, "uncertain"), (1, "uncertain"), (2, "uncertain")]
    cold = choose_batch(None, 5, 0.0, np.random.default_rng(0), n=5)
    assert sorted(i for i, _ in cold) == list(range(5)) and {r for _, r in cold} == {"cold_start"}
    assert len(choose_batch(u, 10, 0.5, np.random.default_rng(0))) == 5


def test_the_store_hands_out_the_most_uncertain_item(store):
    policy = store.active_policy("assistant").id
    items = [store.create_queue_item("assistant", [{"role": "user", "content": f"q{i}"}],
                                     [{"content": "x", "policy_id": policy}, {"content": "y", "policy_id": policy}])
             for i in range(4)]
    store.set_queue_scores([(it.id, 0.5, u) for it, u in zip(items, (0.3, 0.99, 0.6, 0.1))], scored_pairs=20)
    rng = np.random.default_rng(0)
    order = []
    for _ in range(4):
        item, assignment = store.next_queue_item("assistant", "alice", lambda c: choose_item(c, 0.0, rng), 600)
        store.vote_queue_item(item.id, "a", "alice", 600)
        order.append((item.id, assignment.reason))
    assert order == [(items[1].id, "uncertain"), (items[2].id, "uncertain"), (items[0].id, "uncertain"),
                     (items[3].id, "uncertain")]
