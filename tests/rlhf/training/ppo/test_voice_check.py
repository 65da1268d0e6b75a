"""The voice check (``ppo.voice_check_tokens``, ``rlhf.training.ppo.voice_watch.VoiceCheck``): the gate's voice rules
on the final weights' replies, and which checkpoint a run that lost its voice keeps. A real run is in test_ppo.py."""
from __future__ import annotations

import pytest
import torch

from rlhf.config import ConfigError, load_config
from rlhf.training.checkpoint import save_checkpoint
from rlhf.training.ppo.voice_watch import VoiceCheck, VoiceProbe, views_lost, voice_lost, voice_of

VARIED = ["the cat sat on a warm mat today", "a dog ran through the park at noon", "rain fell on the old roof all night"]
LOOPING = ["the cat sat the cat sat the cat sat", "a dog ran a dog ran a dog ran", "rain fell rain fell rain fell"]
SHORT = ["1777", "1.", "Summer"]  # a collapse to a word a reply (seen in the app): distinct-2 and repetition pass


def config(*overrides):
    return load_config(env={}, overrides=list(overrides))


def test_voice_lost_reads_the_gates_distinct_repetition_and_length_rules():
    gate = config().gate
    start = voice_of(VARIED)
    assert start["repetition"] == 0 and start["distinct_2"] == 1
    assert voice_lost(start, start, gate) is None
    assert voice_lost({**start, "distinct_2": 0.96}, start, gate) is None  # a 0.04 drop: under the line
    reason = voice_lost({**start, "distinct_2": 0.95}, start, gate)
    assert reason is not None and "distinct-2 1.000 -> 0.950" in reason and "gate.max_distinct_drop" in reason
    reason = voice_lost({**start, "repetition": 0.03}, start, gate)  # above twice 0 and more than 0.02 up
    assert reason is not None and "repeated 3-grams 0.000 -> 0.030" in reason
    looping = voice_of(LOOPING)
    assert voice_lost(looping, start, gate) is not None
    assert voice_lost(start, looping, gate) is None  # more variety is never a loss
    strict = config("gate.max_distinct_drop=0.5").gate
    assert voice_lost({**start, "distinct_2": 0.9}, start, strict) is None
    short = voice_of(SHORT)
    assert short["distinct_2"] == 1 and short["repetition"] == 0 and start["words"] == 8 and short["words"] == 1
    reason = voice_lost(short, start, gate)  # (1 + 1) / (8 + 1) = 0.22 of the length: under gate.min_length_ratio
    assert reason is not None and "words a reply 8.0 -> 1.0" in reason and "gate.min_length_ratio=0.33" in reason
    assert "words a reply 1.0 -> 8.0" in voice_lost(start, short, gate)  # 4.5 times longer: over gate.max_length_ratio
    assert voice_lost(short, {k: v for k, v in start.items() if k != "words"}, gate) is None  # an older run's start
    assert voice_lost(short, start, config("gate.min_length_ratio=0.2").gate) is None


def test_on_by_default_at_the_verdicts_length_0_turns_it_off_and_bad_values_are_refused():
    assert config().ppo.voice_check_tokens == 64 and VoiceCheck.wanted(config().ppo)
    assert not VoiceCheck.wanted(config("ppo.voice_check_tokens=0").ppo)
    with pytest.raises(ConfigError, match="ppo.voice_check_tokens"):
        config("ppo.voice_check_tokens=-1")


@pytest.fixture
def policy(tiny_model_dir):
    from rlhf.training.ppo.rollout import build_policy

    return build_policy(str(tiny_model_dir), config().ppo, "cpu")


def marker(policy) -> torch.nn.Parameter:
    """One LoRA weight, set to the step whose weights the policy holds."""
    return next(p for p in policy.parameters() if p.requires_grad)


def with_checkpoints(policy, run_dir, steps):
    """Checkpoints after each of ``steps`` (the marker = that step), the policy left on the last one's weights."""
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.1)
    for step in steps:
        with torch.no_grad():
            marker(policy).fill_(float(step))
        save_checkpoint(run_dir, step, policy, optimizer, {"step": step})


def loops_after(step: float):
    """A sampler whose replies loop once the policy holds weights after ``step``."""
    def sample(policy):
        return LOOPING if marker(policy).flatten()[0].item() > step else VARIED
    return sample


def test_a_final_that_lost_its_voice_goes_back_to_the_latest_checkpoint_that_kept_it(policy, tmp_path):
    with_checkpoints(policy, tmp_path, [1, 2, 3, 4])
    sample = loops_after(2)
    check = VoiceCheck(config(), policy, {"sampled": lambda: sample(policy)})
    stop = check.settle({"sampled": voice_of(VARIED)}, tmp_path, final_step=4)
    assert stop is not None and (stop["step"], stop["kept"]) == (4, 2) and "gate.max_distinct_drop" in stop["reason"]
    assert torch.all(marker(policy) == 2.0)  # the weights after step 2, read back from its checkpoint


def test_when_no_checkpoint_kept_the_voice_the_final_weights_stay(policy, tmp_path):
    with_checkpoints(policy, tmp_path, [1, 2, 3])
    sample = loops_after(0)
    stop = VoiceCheck(config(), policy, {"sampled": lambda: sample(policy)}).settle({"sampled": voice_of(VARIED)},
                                                                                   tmp_path, final_step=3)
    assert stop is not None and stop["kept"] == stop["step"] == 3
    assert torch.all(marker(policy) == 3.0)


def test_a_final_that_kept_its_voice_is_left_alone(policy, tmp_path):
    with_checkpoints(policy, tmp_path, [1, 2])
    calls = []

    def sample():
        calls.append(1)
        return VARIED
    assert VoiceCheck(config(), policy, {"sampled": sample}).settle({"sampled": voice_of(VARIED)}, tmp_path,
                                                                    final_step=2) is None
    assert len(calls) == 1 and torch.all(marker(policy) == 2.0)


def second(policy) -> torch.nn.Parameter:
    """Another LoRA weight (the blends move every trainable weight, not only the marker)."""
    return [p for p in policy.parameters() if p.requires_grad][1]


def started(policy, run_dir, blends: int, order: str = "progress") -> VoiceCheck:
    """A check with ``blends`` tried in ``order`` whose run started from weights with the marker and ``second`` at 0
    (saved in ``run_dir/start``)."""
    with torch.no_grad():
        marker(policy).fill_(0.0)
        second(policy).fill_(0.0)
    check = VoiceCheck(config(f"ppo.voice_check_blends={blends}", f"ppo.voice_check_blend_order={order}"), policy, {})
    check.keep_start(run_dir)
    return check


def test_a_blend_of_the_final_weights_with_the_start_is_tried_before_the_checkpoint_as_far_along(policy, tmp_path):
    check = started(policy, tmp_path, blends=4)
    with_checkpoints(policy, tmp_path, [2, 4])  # the final weights: the marker at 4
    with torch.no_grad():
        second(policy).fill_(8.0)
    tried = []

    def sample():
        tried.append(marker(policy).flatten()[0].item())
        return loops_after(2.5)(policy)
    check.samplers = {"sampled": sample}
    stop = check.settle({"sampled": voice_of(VARIED)}, tmp_path, final_step=4)
    # final 4 loops, blend 3/4 (marker 3) loops, blend 1/2 (marker 2) passes: it is kept, before checkpoint 2
    assert tried == [4.0, 3.0, 2.0]
    assert stop == {"step": 4, "kept": 4, "blend": 0.5, "reason": stop["reason"], "passes": "every view"}
    assert torch.allclose(marker(policy), torch.full_like(marker(policy), 2.0))
    assert torch.allclose(second(policy), torch.full_like(second(policy), 4.0))  # half way from 0 to 8


def trying(policy, sample_after: float) -> tuple[list, callable]:
    """The markers the check tries, in order, and a sampler whose replies loop above ``sample_after``."""
    tried = []

    def sample():
        tried.append(round(marker(policy).flatten()[0].item(), 4))
        return loops_after(sample_after)(policy)
    return tried, sample


def test_by_default_blends_are_tried_only_after_every_checkpoint_lost_the_voice(policy, tmp_path):
    assert config().ppo.voice_check_blend_order == "last"
    check = started(policy, tmp_path, blends=4, order="last")
    with_checkpoints(policy, tmp_path, [2, 4])
    tried, check.samplers["sampled"] = trying(policy, 2.5)
    stop = check.settle({"sampled": voice_of(VARIED)}, tmp_path, final_step=4)
    # final 4 loops; checkpoint 2 passes before any blend is read: what the check keeps without blends
    assert tried == [4.0, 2.0] and (stop["kept"], "blend" in stop) == (2, False)


def test_a_blend_is_kept_last_when_no_checkpoint_keeps_the_voice(policy, tmp_path):
    check = started(policy, tmp_path, blends=4, order="last")
    with_checkpoints(policy, tmp_path, [3, 4])
    with torch.no_grad():
        marker(policy).fill_(8.0)  # the final weights moved further than the checkpoint
    tried, check.samplers["sampled"] = trying(policy, 2.5)
    stop = check.settle({"sampled": voice_of(VARIED)}, tmp_path, final_step=4)
    # the only checkpoint (3) loops; then blends 3/4 (6), 1/2 (4) and 1/4 (2): the last passes
    assert tried == [8.0, 3.0, 6.0, 4.0, 2.0]
    assert stop == {"step": 4, "kept": 4, "blend": 0.25, "reason": stop["reason"], "passes": "every view"}
    assert torch.allclose(marker(policy), torch.full_like(marker(policy), 2.0))


def test_a_later_checkpoint_that_keeps_the_voice_comes_before_an_earlier_blend(policy, tmp_path):
    check = started(policy, tmp_path, blends=2)
    with_checkpoints(policy, tmp_path, [1, 2, 3, 4])
    check.samplers = {"sampled": lambda: loops_after(3.5)(policy)}
    stop = check.settle({"sampled": voice_of(VARIED)}, tmp_path, final_step=4)
    assert (stop["kept"], "blend" in stop) == (3, False) and torch.all(marker(policy) == 3.0)


def test_when_no_weights_keep_the_voice_in_every_view_the_furthest_heard_blend_is_kept(policy, tmp_path):
    check = started(policy, tmp_path, blends=4)
    with_checkpoints(policy, tmp_path, [2, 4])
    check.samplers = {"sampled": lambda: loops_after(3.5)(policy), "gate": lambda: LOOPING}
    stop = check.settle({"sampled": voice_of(VARIED), "gate": voice_of(VARIED)}, tmp_path, final_step=4)
    assert (stop["kept"], stop["blend"], stop["passes"]) == (4, 0.75, "sampled replies")
    assert torch.allclose(marker(policy), torch.full_like(marker(policy), 3.0))


def test_blends_without_a_saved_start_fall_back_to_the_checkpoints(policy, tmp_path):
    with_checkpoints(policy, tmp_path, [1, 2, 3, 4])
    check = VoiceCheck(config("ppo.voice_check_blends=4"), policy, {"sampled": lambda: loops_after(1.5)(policy)})
    stop = check.settle({"sampled": voice_of(VARIED)}, tmp_path, final_step=4)  # a run resumed from before blends
    assert (stop["kept"], "blend" in stop) == (1, False)


def test_blends_are_off_by_default_and_bad_counts_are_refused(policy, tmp_path):
    assert config().ppo.voice_check_blends == 0
    VoiceCheck(config(), policy, {}).keep_start(tmp_path)
    assert not (tmp_path / "start").exists()  # nothing saved without blends
    for bad in ("ppo.voice_check_blends=-1", "ppo.voice_check_blends=17", "ppo.voice_check_blends=0.5"):
        with pytest.raises(ConfigError, match="ppo.voice_check_blends"):
            config(bad)
    with pytest.raises(ConfigError, match="ppo.voice_check_blend_order"):
        config("ppo.voice_check_blend_order=first")


def test_each_view_is_checked_and_the_reason_names_the_one_that_lost_the_voice():
    gate = config().gate
    start = {"sampled": voice_of(VARIED), "gate": voice_of(VARIED)}
    assert views_lost(start, start, gate) is None
    reason = views_lost({"sampled": voice_of(VARIED), "gate": voice_of(LOOPING)}, start, gate)
    assert reason.startswith("the gate's replies: ") and "gate.max_distinct_drop" in reason
    reason = views_lost({"sampled": voice_of(SHORT), "gate": voice_of(VARIED)}, start, gate)
    assert reason.startswith("sampled replies: ") and "gate.min_length_ratio" in reason
    older = voice_of(VARIED)  # an older run's start: one flat voice, of its sampled replies
    assert views_lost({"sampled": voice_of(VARIED), "gate": voice_of(LOOPING)}, older, gate) is None
    assert views_lost({"sampled": voice_of(LOOPING), "gate": voice_of(VARIED)}, older, gate) is not None


def test_a_final_whose_sampled_replies_pass_but_the_gates_loop_goes_back(policy, tmp_path):
    """What a retrain driven through the app did: sampled at temperature 1 its replies kept the voice, greedy (what
    the gate's guard reads) they looped, and the guard refused the version. Both views must pass."""
    with_checkpoints(policy, tmp_path, [1, 2, 3, 4])
    greedy = loops_after(1)
    check = VoiceCheck(config(), policy, {"sampled": lambda: VARIED, "gate": lambda: greedy(policy)})
    stop = check.settle({"sampled": voice_of(VARIED), "gate": voice_of(VARIED)}, tmp_path, final_step=4)
    assert (stop["step"], stop["kept"]) == (4, 1) and stop["reason"].startswith("the gate's replies: ")
    assert torch.all(marker(policy) == 1.0)
    assert not config("ppo.voice_check_gate=false").ppo.voice_check_gate and config().ppo.voice_check_gate


def test_when_no_checkpoint_passes_both_views_the_latest_whose_sampled_replies_pass_stays(policy, tmp_path):
    """Measured in the loop table: the greedy replies looped at every checkpoint, and keeping the final weights then
    published sampled replies that had lost the voice where the sampled view alone had kept step 12's."""
    with_checkpoints(policy, tmp_path, [1, 2, 3, 4])
    sampled = loops_after(2)
    check = VoiceCheck(config(), policy, {"sampled": lambda: sampled(policy), "gate": lambda: LOOPING})
    stop = check.settle({"sampled": voice_of(VARIED), "gate": voice_of(VARIED)}, tmp_path, final_step=4)
    assert (stop["step"], stop["kept"]) == (4, 2) and stop["reason"].startswith("sampled replies: ")
    assert torch.all(marker(policy) == 2.0)


def test_when_no_checkpoint_passes_both_views_final_weights_whose_sampled_replies_pass_stay(policy, tmp_path):
    with_checkpoints(policy, tmp_path, [1, 2, 3])
    check = VoiceCheck(config(), policy, {"sampled": lambda: VARIED, "gate": lambda: LOOPING})
    stop = check.settle({"sampled": voice_of(VARIED), "gate": voice_of(VARIED)}, tmp_path, final_step=3)
    assert stop["kept"] == stop["step"] == 3 and stop["reason"].startswith("the gate's replies: ")
    assert torch.all(marker(policy) == 3.0)


def test_the_gate_view_reads_the_replies_the_guard_reads(policy, tiny_model_dir):
    """Fresh LoRA weights answer as the base: the check's gate view of them is the evaluation's reply of the base at
    ``eval.reply_temperature`` (``generate_replies`` with no adapter, as the guard reads the active version's), prompt
    for prompt."""
    from rlhf.base_models import load_tokenizer
    from rlhf.training.generation import generate_replies
    from rlhf.training.ppo.trainer import gate_replies

    cfg = config("eval.max_new_tokens=12")
    tokenizer = load_tokenizer(str(tiny_model_dir), cfg.chat_template)
    prompts = [[{"role": "user", "content": q}] for q in ("Why is the sky blue?", "Name a prime number.")]
    mine = gate_replies(policy, tokenizer, prompts, cfg)
    (base,) = generate_replies(policy.policy, tokenizer, prompts, [None], 12, cfg.eval.reply_temperature,
                               cfg.ppo.seed + cfg.eval.seed_offset, max_prompt_tokens=cfg.eval.max_prompt_tokens)
    assert mine == base.texts and all(mine)


def test_the_check_reads_what_the_probe_measured_instead_of_sampling_again(policy, tmp_path):
    """``known`` (the probe's measures by step) stands for the final weights and for each checkpoint it names: the
    final and step 3 are read from it, step 2 is sampled, and the policy ends on step 2's checkpoint."""
    with_checkpoints(policy, tmp_path, [1, 2, 3, 4])
    sample, calls = loops_after(2), []

    def counted():
        calls.append(marker(policy).flatten()[0].item())
        return sample(policy)
    check = VoiceCheck(config(), policy, {"sampled": counted})
    looped = {"sampled": voice_of(LOOPING)}
    stop = check.settle({"sampled": voice_of(VARIED)}, tmp_path, final_step=4, known={4: looped, 3: looped})
    assert (stop["step"], stop["kept"]) == (4, 2) and calls == [2.0]
    assert torch.all(marker(policy) == 2.0)


def test_the_probe_measures_the_checks_views_and_keeps_what_it_saw(policy):
    """Step 1's weights keep the voice, step 2's loop; the probe says why and keeps both measures for the end
    check, without touching the weights."""
    start = {"sampled": voice_of(VARIED)}
    sample = loops_after(1)
    check = VoiceCheck(config(), policy, {"sampled": lambda: sample(policy)})
    probe = VoiceProbe(1)
    reasons = []
    for step in (1, 2):
        with torch.no_grad():
            marker(policy).fill_(float(step))
        reasons.append(probe.measure(check, start, step))
    assert reasons[0] is None and "gate.max_distinct_drop" in reasons[1]
    assert probe.seen == {1: start, 2: {"sampled": voice_of(LOOPING)}} and torch.all(marker(policy) == 2.0)
    assert probe.due(4) and not VoiceProbe(4).due(3)


def test_the_probe_is_off_by_default_needs_the_check_and_refuses_bad_values():
    assert config().ppo.voice_probe_every == 0 and not VoiceProbe.wanted(config().ppo)
    assert VoiceProbe.wanted(config("ppo.voice_probe_every=4").ppo)
    assert not VoiceProbe.wanted(config("ppo.voice_probe_every=4", "ppo.voice_check_tokens=0").ppo)
    assert config().ppo.voice_probe_kl == 4.0
    for bad in ("ppo.voice_probe_every=-1", "ppo.voice_probe_kl=0.5", "ppo.voice_probe_kl=nan"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            config(bad)
