"""Online DPO (``retrain.method: online_dpo``): the votes plus pairs of the policy's own replies ranked by the reward
model; added through the registry alone (its own module, config section and pair builder)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rlhf.config import ConfigError, load_config
from rlhf.training.ranked_pairs import confidence, draw_prompts, rank_pairs
from rlhf.voice import whole_sentences
from tests.rlhf.training.test_dpo import PAIRS, one_thread  # noqa: F401 (an autouse fixture)

CHAT = [{"role": "user", "content": "hi"}]


def scores(*rows):
    return np.asarray(rows, dtype=float)


def test_a_pair_is_the_best_and_worst_whole_reply_where_the_ensemble_agrees():
    texts = [["short", "a longer reply", "the longest reply of all", "mid one"]]
    s = [scores([3, 3, 3], [1, 1, 1], [-2, -1, -3], [0, 2, 0])]
    ranked = rank_pairs([CHAT], texts, s, [[False] * 4], min_confidence=0.8)
    assert ranked.pairs == [{"prompt": CHAT, "chosen": "short", "rejected": "the longest reply of all",
                             "source": "reward_model"}]
    assert ranked.summary()["ranked_pairs"] == 1 and ranked.replies == 4


def test_cut_empty_alike_and_unsure_replies_make_no_pair():
    s4 = scores([3, 3], [1, 1], [0, 0], [-1, -1])
    cut = rank_pairs([CHAT], [["cut best", "b", "c", "d"]], [s4], [[True, False, False, False]], 0.8)
    assert cut.pairs[0]["chosen"] == "b" and cut.cut == 1  # the cut reply is never a side
    alike = rank_pairs([CHAT, CHAT], [["same", "same ", "", "x"], ["same"] * 4], [s4, s4], [[False] * 4] * 2, 0.8)
    assert alike.pairs[0]["rejected"] == "x" and alike.alike == 1  # identical texts: no pair
    unsure = rank_pairs([CHAT], [["a", "b", "c", "d"]], [scores([1, -1], [0, 0], [0, 0], [-1, 1])], [[False] * 4],
                        0.8)
    assert unsure.pairs == [] and unsure.unsure == 1  # the members disagree: half of them is not 0.8


def test_a_cut_reply_keeps_its_whole_sentences_only():
    assert whole_sentences("Tea is a drink. It comes from a pla") == "Tea is a drink."
    assert whole_sentences('He said "yes." Then he wa') == 'He said "yes."'
    assert whole_sentences("Steps:\n- boil water\n- ad") == "Steps:\n- boil water"
    assert whole_sentences("Version 1.2 is out and") == ""  # no sentence ends inside: the reply joins no pair


def test_confidence_of_one_scorer_is_its_bradley_terry_probability():
    assert confidence(np.array([2.0]), np.array([0.0])) == pytest.approx(1 / (1 + np.exp(-2)))
    assert confidence(np.array([1.0, 1.0, -1.0, 2.0]), np.zeros(4)) == 0.75


def test_prompts_are_drawn_once_each_and_seeded():
    chats = [[{"role": "user", "content": str(i)}] for i in range(10)] + [[{"role": "user", "content": "0"}]]
    a, b = draw_prompts(chats, 5, seed=1), draw_prompts(chats, 5, seed=1)
    assert a == b and len({json.dumps(c) for c in a}) == 5
    assert len(draw_prompts(chats, 50, seed=1)) == 10


def test_the_section_is_checked_at_load(tmp_path):
    with pytest.raises(ConfigError, match="online_dpo"):
        load_config(env={}, overrides=[f"data_dir={tmp_path}", "online_dpo.samples=1"])
    with pytest.raises(ConfigError, match="online_dpo"):
        load_config(env={}, overrides=[f"data_dir={tmp_path}", "online_dpo.min_confidence=0.2"])


class ShortIsBetter:
    """A reward model with a three-member ensemble that prefers fewer characters (members differ in scale)."""

    def __call__(self, prompts, replies):
        return self.member_scores(prompts, replies).mean(axis=1).tolist()

    def member_scores(self, prompts, replies):
        lengths = np.array([len(r) for r in replies], dtype=float)
        return np.stack([-lengths * w for w in (1.0, 0.5, 2.0)], axis=1)


@pytest.mark.slow  # samples and trains
def test_online_dpo_trains_on_the_votes_and_its_ranked_replies(tmp_path, tiny_model_dir):
    from peft.tuners.lora import LoraLayer

    from rlhf.base_models import load_causal_lm
    from rlhf.training.methods import get_method
    from rlhf.training.policy import train_policy

    config = load_config(env={}, overrides=[
        f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}", "device=cpu", "retrain.method=online_dpo",
        "online_dpo.batch_size=4", "online_dpo.epochs=1", "online_dpo.prompts=6", "online_dpo.samples=3",
        "online_dpo.max_new_tokens=12", "online_dpo.min_confidence=0.5", "online_dpo.sample_with=serving"])
    prompts = [[{"role": "user", "content": f"Say something about {w}."}] for w in "abcdefgh"]
    base = load_causal_lm(str(tiny_model_dir), "cpu")
    steps = []
    result = train_policy(config, str(tiny_model_dir), ShortIsBetter(), PAIRS, prompts, [], tmp_path / "run",
                          device="cpu", base=base, on_step=lambda step, metrics: steps.append((step, metrics)))
    # progress while sampling (a quarter of the replies per step), then DPO's steps after them
    assert [(n, m["online_dpo/sampled"]) for n, m in steps[:4]] == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
    assert [n for n, _ in steps[4:]] == list(range(5, 5 + result.steps)) and "loss/policy" in steps[4][1]
    saved = json.loads((result.run_dir / "ranked_pairs.json").read_text())
    assert saved["sampled_prompts"] == 6 and saved["sampled_replies"] == 18
    assert saved["sampled_by"] == "llama_cpp" and saved["sample_tokens_per_s"] > 0  # the serving engine sampled
    assert saved["ranked_pairs"] + saved["unsure_prompts"] + saved["alike_prompts"] == 6
    assert saved["trimmed_replies"] + saved["cut_replies"] <= 18
    for pair in saved["pairs"]:  # the ranking followed the reward model
        assert len(pair["chosen"]) < len(pair["rejected"])
    assert (result.final_dir / "adapter_model.safetensors").is_file() and "sample" in result.phase_seconds
    metrics = get_method("online_dpo").result_metrics(result, len(PAIRS))
    assert metrics["online_dpo/pairs"] == 4 and metrics["online_dpo/ranked_pairs"] == saved["ranked_pairs"]
    # The base carries the trained adapter only: the sampling adapter of a continued version would be gone too.
    names = {n for m in base.modules() if isinstance(m, LoraLayer) for n in m.lora_A}
    assert names == {"default"}


@pytest.mark.slow
def test_online_dpo_sampling_in_torch_continues_a_version_and_leaves_the_base_as_it_found_it(tmp_path, tiny_model_dir):
    from peft.tuners.lora import LoraLayer

    from rlhf.base_models import load_causal_lm
    from rlhf.training.policy import train_policy

    config = load_config(env={}, overrides=[
        f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}", "device=cpu", "retrain.method=dpo",
        "dpo.batch_size=4", "dpo.epochs=1"])
    first = train_policy(config, str(tiny_model_dir), None, PAIRS, [], [], tmp_path / "first", device="cpu")
    config = load_config(env={}, overrides=[
        f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}", "device=cpu", "retrain.method=online_dpo",
        "online_dpo.batch_size=4", "online_dpo.epochs=1", "online_dpo.prompts=4", "online_dpo.samples=2",
        "online_dpo.max_new_tokens=8", "online_dpo.min_confidence=0.5"])  # sampled by torch, the default
    base = load_causal_lm(str(tiny_model_dir), "cpu")
    prompts = [[{"role": "user", "content": f"About {w}?"}] for w in "abcd"]
    result = train_policy(config, str(tiny_model_dir), ShortIsBetter(), PAIRS, prompts, [], tmp_path / "run",
                          init_adapter=str(first.final_dir), device="cpu", base=base)
    assert (result.final_dir / "adapter_model.safetensors").is_file()
    assert json.loads((result.run_dir / "ranked_pairs.json").read_text())["sampled_by"] == "torch"
    names = {n for m in base.modules() if isinstance(m, LoraLayer) for n in m.lora_A}
    assert "start" not in names


def test_without_a_reward_model_it_says_so(tmp_path):
    from rlhf.training.methods import get_method

    config = load_config(env={}, overrides=[f"data_dir={tmp_path}", "retrain.method=online_dpo"])
    with pytest.raises(ValueError, match="reward model"):
        get_method("online_dpo").train(config, "x", None, PAIRS, [], [], tmp_path / "run")
