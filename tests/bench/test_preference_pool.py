"""The preference benchmark pool: planted scorers, pair making, the split, and the shipped asset."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from bench import preference_pool as pp, preferences as prefs
from rlhf.simulate import preference_pool as shipped

PROMPT = "How do I bake bread at home?"


def score(name: str, reply: str, prompt: str = PROMPT) -> float:
    """One reply's score under a named preference."""
    return prefs.PREFERENCES[name].score(prompt, reply)


def synthetic_pool(n: int = 400, seed: int = 0) -> list[dict]:
    """Prompts with 4 replies: concrete or vague, listed or prose, of random lengths."""
    rng = random.Random(seed)
    vague = "It depends on many things and you should try what feels right for you."
    exact = "Bake it at 220 C for 35 minutes with 500 grams of flour and 2 teaspoons of salt."
    pool = []
    for i in range(n):
        replies = []
        for tag in ("Alpha.", "Beta.", "Gamma.", "Delta."):  # tags keep the four replies distinct
            parts = [rng.choice([vague, exact]) for _ in range(rng.randint(1, 4))] + [tag]
            replies.append(("\n".join("- " + p for p in parts)) if rng.random() < 0.3 else " ".join(parts))
        pool.append({"prompt_id": f"p{i:04d}", "prompt": f"Question {i}?", "replies": replies, "hints": [0] * 4})
    return pool


def test_shorter_prefers_fewer_words():
    assert score("shorter", "Knead, rise, bake.") > score("shorter", "You knead the dough, let it rise for "
                                                                      "an hour, and then bake it in the oven.")


def test_no_lists_prefers_prose():
    prose = "Mix flour, water, yeast and salt, knead it, let it rise, then bake it."
    listed = "Steps:\n- Mix flour and water\n- Knead\n1. Let it rise\n2) Bake"
    assert score("no_lists", prose) == 0
    assert score("no_lists", listed) < -0.5
    assert score("no_lists", prose) > score("no_lists", listed)


def test_concrete_rewards_numbers_and_steps_not_length():
    exact = "Use 500 g of flour, 2 teaspoons of salt and bake at 220 °C for 35 minutes."
    vague = "Use some flour and a little salt, then bake it in a hot oven until it looks done."
    long_vague = " ".join([vague] * 4)
    assert score("concrete", exact) > score("concrete", vague)
    assert score("concrete", exact) > score("concrete", long_vague)
    steps = "First, mix the dough.\nThen let it rise.\nFinally, bake it."
    assert score("concrete", steps) > score("concrete", "Mix the dough, let it rise and bake it.")


def test_direct_penalises_filler_preamble_and_echo():
    answer = "Mix flour, water, yeast and salt, knead, let it rise twice and bake at 220 C."
    assert score("direct", answer) == 0
    for opener in ("Sure! Here is how.", "Great question! Bread is fun.", "As an AI, I love bread.",
                   "I can help with that."):
        assert score("direct", opener + " " + answer) < score("direct", answer), opener
    assert score("direct", "Here are the steps:\n" + answer) < 0
    assert score("direct", "How do I bake bread at home? " + answer) < 0
    assert score("direct", "Baking bread at home is easy. It takes time.") == 0


def test_warm_rewards_kind_wording():
    warm = "Happy to help! Bread is lovely to make, and I hope this helps you."
    flat = "Bread is made from flour, water, yeast and salt, and is baked in an oven."
    assert score("warm", warm) > score("warm", flat)
    assert score("warm", flat + " " + flat) < score("warm", warm)


def test_every_preference_has_a_scorer_and_six_kinds_exist():
    assert {"shorter", "no_lists", "concrete", "direct", "warm", "concrete_noisy"} <= set(prefs.PREFERENCES)
    assert prefs.PREFERENCES["concrete_noisy"].flip == pytest.approx(0.15)
    assert prefs.PREFERENCES["concrete_noisy"].score is prefs.PREFERENCES["concrete"].score


def test_make_pairs_is_deterministic_and_labels_follow_the_score():
    pool = synthetic_pool()
    ids = [r["prompt_id"] for r in pool]
    a = prefs.make_pairs(pool, "concrete", ids, seed=3, n=100)
    assert a == prefs.make_pairs(pool, "concrete", list(reversed(ids)), seed=3, n=100)
    assert a != prefs.make_pairs(pool, "concrete", ids, seed=4, n=100)
    assert len(a) == 100 and set(a[0]) == {"prompt_id", "prompt", "chosen", "rejected"}
    margin = prefs.PREFERENCES["concrete"].margin
    assert all(score("concrete", p["chosen"]) - score("concrete", p["rejected"]) > margin for p in a)


def test_make_pairs_takes_distinct_reply_pairs_when_n_exceeds_prompts():
    pool = synthetic_pool(20)
    pairs = prefs.make_pairs(pool, "shorter", [r["prompt_id"] for r in pool], seed=0, n=60)
    assert len(pairs) == 60
    keys = [(p["prompt_id"], frozenset((p["chosen"], p["rejected"]))) for p in pairs]
    assert len(set(keys)) == len(keys)
    assert len(prefs.make_pairs(pool, "shorter", [r["prompt_id"] for r in pool], seed=0)) <= 20


@pytest.mark.slow  # seconds of real work: the full suite only (make test-fast < 60 s)
def test_noisy_preference_flips_about_fifteen_percent():
    pool = synthetic_pool(3000)
    ids = [r["prompt_id"] for r in pool]
    clean = prefs.make_pairs(pool, "concrete", ids, seed=7)
    noisy = prefs.make_pairs(pool, "concrete_noisy", ids, seed=7)
    assert len(clean) == len(noisy) > 2000
    flipped = sum(c["chosen"] != n["chosen"] for c, n in zip(clean, noisy)) / len(clean)
    assert 0.12 < flipped < 0.18
    assert noisy == prefs.make_pairs(pool, "concrete_noisy", ids, seed=7)


def test_length_balancing_makes_length_uninformative():
    pool = synthetic_pool(600)
    ids = [r["prompt_id"] for r in pool]
    balanced = prefs.make_pairs(pool, "no_lists", ids, seed=0, n=300)
    raw = prefs.make_pairs(pool, "no_lists", ids, seed=0, n=300, balance=False)
    assert abs(prefs.chosen_shorter(balanced) - 0.5) < 0.05
    assert abs(prefs.chosen_shorter(raw) - 0.5) > abs(prefs.chosen_shorter(balanced) - 0.5)


def test_length_model_learns_a_pure_length_preference():
    pool = synthetic_pool(600)
    train, held = shipped.split_prompts(pool, n_heldout=200)
    w = prefs.fit_length_model(prefs.make_pairs(pool, "shorter", train, seed=0, n=256))
    assert w < 0
    assert prefs.length_accuracy(w, prefs.make_pairs(pool, "shorter", held, seed=1, n=200, max_per_prompt=2)) == 1.0


def test_split_is_disjoint_and_complete():
    pool = synthetic_pool(320)
    train, held = shipped.split_prompts(pool, n_heldout=128)
    assert len(held) == 128 and not set(train) & set(held)
    assert set(train) | set(held) == {r["prompt_id"] for r in pool}
    assert (train, held) == shipped.split_prompts(pool, n_heldout=128)


def test_tidy_trims_cut_replies_and_dangling_list_items():
    cut = "Mix flour, water and salt into a dough, then let it rise. Bake it at 2"
    assert pp.tidy(cut, finished=False) == "Mix flour, water and salt into a dough, then let it rise."
    assert pp.tidy("Mix. Then let the dough rise for an hour in a warm place and bake it at 2", False).endswith("2")
    assert pp.tidy("Steps:\n1. Mix.\n2. Bake.\n\n3.", finished=True) == "Steps:\n1. Mix.\n2. Bake."
    assert pp.tidy("Bake at 220 C.", finished=True) == "Bake at 220 C."
    assert pp.tidy("4.", finished=True) == "4."


def test_degenerate_catches_symbols_runs_and_fragments():
    assert pp.degenerate("🔍🔍🔍🔍🔍🔍🔍🔍") and pp.degenerate("* 1. 100001011111111111111")
    assert pp.degenerate("Yes.") and pp.degenerate("1. **A**\n2. **B**\n3. **C**\n4. **D**")
    assert not pp.degenerate("The capital of Canada is Ottawa.")
    assert not pp.degenerate("Bake at 220 °C for 35 minutes! 😊")


def test_hints_are_bitmasks_appended_to_the_user_turn():
    masks = pp.assign_hints(50, 4, seed=0)
    assert masks == pp.assign_hints(50, 4, seed=0) and all(len(m) == 4 for m in masks)
    assert all(0 <= m < 2 ** len(pp.HINTS) for row in masks for m in row)
    chat = pp._messages("How do I bake bread?", 0b100 | 0b1000)
    assert chat == [{"role": "user", "content": "How do I bake bread? Use a bulleted list. Be warm and friendly."}]
    assert pp._messages("Hi?", 0) == [{"role": "user", "content": "Hi?"}]


def test_build_prompts_distinct_and_deterministic():
    prompts = pp.build_prompts(320, seed=0)
    assert len(set(prompts)) == 320 and prompts == pp.build_prompts(320, seed=0)


def test_shipped_pool_has_enough_prompts_replies_and_pairs():
    pool = shipped.load_pool()
    assert len(pool) >= 300
    assert len({r["prompt"] for r in pool}) == len(pool)
    for r in pool:
        assert len(r["replies"]) >= 4 and all(rep.strip() for rep in r["replies"])
        assert len(r["hints"]) == len(r["replies"])
    assert shipped.read_meta()["model"] == "smollm2-135m-instruct"
    assert not any(pp.degenerate(rep) for r in pool for rep in r["replies"])
    train, held = shipped.split_prompts(pool)
    for name in prefs.PREFERENCES:
        test = prefs.heldout_pairs(pool, name)
        assert len(test) >= 200, name
        assert {p["prompt_id"] for p in test} <= set(held)
        assert max(Counter(p["prompt_id"] for p in test).values()) <= 2
        assert len(prefs.make_pairs(pool, name, train, seed=0, n=256)) == 256, name
