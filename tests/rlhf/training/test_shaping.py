"""Reward shaping: rule terms by hand, reward functions by import path, totals, clipping, failures."""
from __future__ import annotations

import math

import pytest

from rlhf.config import ConfigError, load_config
from rlhf.training.shaping import (RewardShaper, length_term, load_reward_function, polite_ending, repetition_term)
from rlhf.voice import shared_elsewhere

PROMPT = [{"role": "user", "content": "Hi"}]


def mentions_paris(messages, reply):
    """A tiny 'verifier': 1 when the reply names the right capital."""
    return 1.0 if "Paris" in reply else 0.0


def broken(messages, reply):
    raise RuntimeError("database unavailable")


def ppo(**overrides):
    """The PPO config with only the terms a test names: the default's own terms are off unless named."""
    overrides = {"relevance_weight": 0, "novelty_weight": 0, "repetition_weight": 0, **overrides}
    return load_config(env={}, overrides=[f"ppo.{k}={v}" for k, v in overrides.items()]).ppo


def test_length_term():
    assert length_term(40, 40) == 0.0
    assert length_term(30, 40) == -0.25 and length_term(50, 40) == -0.25
    assert length_term(0, 40) == -1.0 and length_term(200, 40) == -1.0  # floored at -1
    assert length_term(7, 0) == 0.0  # no target: off


def test_repetition_term():
    assert repetition_term("the cat sat on the mat") == 0.0
    # 6 trigrams: "a b c" x2, "b c a" x2, "c a b" x2 -> 3 distinct of 6 -> -0.5
    assert repetition_term("a b c a b c a b") == -0.5
    assert repetition_term("too short") == 0.0
    # the guard's measure: punctuation and case do not make two 3-grams differ
    assert repetition_term("Go on. Go on, go on!") == -0.5


@pytest.mark.parametrize("reply, finished, value", [
    ("Paris is the capital. Hope this helps!", True, 1.0),
    ("Paris is the capital.", True, 0.5),
    ("Paris is the capital. Let me know if you need more", True, 0.5),  # polite, but no full stop
    ("Paris is the capital.", False, 0.0),  # cut off by the token limit: not a complete ending
    ("Use `print(x)`.", True, 0.5), ("", True, 0.0)])
def test_polite_ending(reply, finished, value):
    assert polite_ending(PROMPT, reply, finished) == value


def test_load_reward_function_by_import_path():
    assert load_reward_function("tests.rlhf.training.test_shaping:mentions_paris") is mentions_paris
    assert load_reward_function("rlhf.training.shaping:polite_ending") is polite_ending
    for path, problem in [("no_colon", "import path"), ("no.such.module:f", "cannot import"),
                          ("tests.rlhf.training.test_shaping:nothing_here", "no attribute"),
                          ("tests.rlhf.training.test_shaping:PROMPT", "not callable")]:
        with pytest.raises(ValueError, match=problem):
            load_reward_function(path)


def test_total_is_reward_model_plus_weighted_terms_and_functions():
    cfg = ppo(length_target=4, length_weight=2.0, polite_weight=1.0,
              reward_functions='{"tests.rlhf.training.test_shaping:mentions_paris": 0.5}')
    rm = lambda prompts, replies: [10.0 * i for i in range(len(replies))]  # noqa: E731
    shaper = RewardShaper(cfg, rm)
    replies = ["Paris. Thanks!", "Lyon"]
    totals, parts = shaper([PROMPT, PROMPT], replies, n_tokens=[4, 2], finished=[True, True])
    assert parts["rm"] == [0.0, 10.0]
    assert parts["length"] == [0.0, 2.0 * -0.5]
    assert parts["polite"] == [1.0, 0.0]
    assert parts["tests.rlhf.training.test_shaping:mentions_paris"] == [0.5, 0.0]
    assert totals == [0.0 + 0.0 + 1.0 + 0.5, 10.0 - 1.0 + 0.0 + 0.0]  # within the default clip of 10


def test_total_is_clipped():
    shaper = RewardShaper(ppo(reward_clip=2.0), lambda p, r: [5.0, -7.0, 1.5])
    assert shaper([PROMPT] * 3, ["a", "b", "c"], [1] * 3, [True] * 3)[0] == [2.0, -2.0, 1.5]


def test_a_failing_or_nonfinite_part_gives_nan_for_that_reply_only():
    cfg = ppo(reward_functions='{"tests.rlhf.training.test_shaping:broken": 1.0}')
    totals, parts = RewardShaper(cfg, lambda p, r: [1.0, math.inf])([PROMPT] * 2, ["a", "b"], [1, 1], [True] * 2)
    assert all(math.isnan(t) for t in totals)  # broken() fails on both; inf from the model is also NaN
    totals, _ = RewardShaper(ppo(), lambda p, r: [1.0, math.nan])([PROMPT] * 2, ["a", "b"], [1, 1], [True] * 2)
    assert totals[0] == 1.0 and math.isnan(totals[1])


def test_a_reward_is_required_and_the_count_must_match():
    with pytest.raises(ValueError, match="no reward"):
        RewardShaper(ppo(), None)
    assert RewardShaper(ppo(polite_weight=1.0), None).has_rules()
    with pytest.raises(ValueError, match="returned 1 scores for 2"):
        RewardShaper(ppo(), lambda p, r: [1.0])([PROMPT] * 2, ["a", "b"], [1, 1], [True] * 2)


def test_the_reward_model_reads_a_cut_reply_up_to_its_last_whole_sentence():
    seen = []
    rm = lambda prompts, replies: seen.extend(replies) or [0.0] * len(replies)  # noqa: E731
    replies = ["Tea is a drink. It comes from a pla", "Tea is a drink. It comes from a pla", "No sentence ends her"]
    RewardShaper(ppo(), rm)([PROMPT] * 3, replies, [9, 9, 4], finished=[False, True, False])
    # cut: its whole sentences; finished: as written; cut without a whole sentence: as written (nothing to keep)
    assert seen == ["Tea is a drink.", "Tea is a drink. It comes from a pla", "No sentence ends her"]
    seen.clear()
    RewardShaper(ppo(), rm, whole_sentences=False)([PROMPT], replies[:1], [9], finished=[False])
    assert seen == ["Tea is a drink. It comes from a pla"]


def test_rule_terms_and_functions_read_the_reply_as_written():
    cfg = ppo(reward_functions='{"tests.rlhf.training.test_shaping:mentions_paris": 1.0}')
    _, parts = RewardShaper(cfg, lambda p, r: [0.0])([PROMPT], ["It is Lyon. Or Paris"], [6], finished=[False])
    assert parts["tests.rlhf.training.test_shaping:mentions_paris"] == [1.0]


def test_relevance_is_a_weighted_part_that_must_come_for_every_reply():
    shaper = RewardShaper(ppo(relevance_weight=2.0, relevance_floor=0.5), lambda p, r: [1.0] * len(r))
    totals, parts = shaper([PROMPT] * 4, ["Paris.", "It is Paris.", "Happy to help!", "?"], [2, 4, 4, 1],
                           [True] * 4, relevance=[2.0, 0.5, 0.0, math.nan])
    # Above the floor nothing is paid (a shorter, denser reply gains nothing); below it, 2 per nat short.
    assert parts["relevance"][:3] == [-0.0, -0.0, -1.0] and totals[:3] == [1.0, 1.0, 0.0]
    assert math.isnan(parts["relevance"][3]) and math.isnan(totals[3])
    for missing in (None, [0.5]):
        with pytest.raises(ValueError, match="relevance score"):
            shaper([PROMPT] * 2, ["a", "b"], [1, 1], [True] * 2, relevance=missing)
    assert "relevance" not in RewardShaper(ppo(), lambda p, r: [1.0])([PROMPT], ["a"], [1], [True], [0.5])[1]
    assert RewardShaper(ppo(relevance_weight=1.0), None).has_rules()  # alone it is a reward too


def test_novelty_costs_the_share_of_a_reply_s_word_pairs_that_replies_to_other_prompts_use():
    other = [{"role": "user", "content": "Name a colour."}]
    replies = ["Happy to help! Paris.", "Paris is the capital.", "Happy to help! Blue."]
    assert shared_elsewhere(replies, [PROMPT, PROMPT, other]) == [
        pytest.approx(2 / 3),  # "happy to", "to help" are in the other prompt's reply; "help paris" is not
        0.0,  # "paris is" etc.: only the same prompt's reply shares words with it, and that one is not compared
        pytest.approx(2 / 3)]
    assert shared_elsewhere(["Yes", "Yes"], [PROMPT, other]) == [0.0, 0.0]  # no word pairs, nothing to share
    _, parts = RewardShaper(ppo(novelty_weight=3.0), lambda p, r: [0.0] * len(r))(
        [PROMPT, PROMPT, other], replies, [5, 5, 5], [True] * 3)
    assert parts["novelty"] == [pytest.approx(-2.0), 0.0, pytest.approx(-2.0)]
    assert "novelty" not in RewardShaper(ppo(), lambda p, r: [0.0] * len(r))([PROMPT], ["a b"], [2], [True])[1]


def test_novelty_memory_also_compares_a_step_with_the_steps_before_it():
    """ppo.novelty_memory: a training step's replies are compared with the last N steps' replies to other prompts
    too, then remembered; an evaluation's replies (training=False) are neither."""
    other = [{"role": "user", "content": "Name a colour."}]
    shaper = RewardShaper(ppo(novelty_weight=1.0, novelty_memory=1), lambda p, r: [0.0] * len(r))
    step = lambda prompts, replies, training=True: shaper(prompts, replies, [5] * len(replies), [True] * len(replies),
                                                          training=training)[1]["novelty"]
    assert step([PROMPT], ["Happy to help! Paris."]) == [0.0]  # nothing earlier
    # The next step's reply to another prompt reuses "happy to", "to help": 2 of its 3 word pairs.
    assert step([other], ["Happy to help! Blue."], training=False) == [0.0]  # an evaluation reads no memory
    assert step([other], ["Happy to help! Blue."]) == [pytest.approx(-2 / 3)]
    assert step([PROMPT], ["Happy to help! Paris."]) == [pytest.approx(-2 / 3)]  # memory 1: the last step only
    assert step([PROMPT], ["Happy to help! Paris."]) == [0.0]  # the step before was to the same prompt
    assert shared_elsewhere(["a b"], [PROMPT], others=[("a b", other), ("a b", PROMPT)]) == [1.0]
    with pytest.raises(ConfigError, match="novelty_memory"):
        ppo(novelty_memory=-1)
