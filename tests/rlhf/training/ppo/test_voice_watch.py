"""The voice watch (``rlhf.training.ppo.voice_watch``): when the rollouts' voice counts as drifted, and which
weights a stopped run keeps. A real run that stops is in test_ppo.py."""
from __future__ import annotations

import pytest
import torch

from rlhf.config import ConfigError, load_config
from rlhf.training.ppo.voice_watch import VoiceWatch


def cfg(*overrides):
    return load_config(env={}, overrides=list(overrides)).ppo


def step(rep: float, d2: float) -> dict:
    return {"voice/repetition": rep, "voice/distinct2": d2}


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lora = torch.nn.Linear(2, 2)
        self.frozen = torch.nn.Linear(2, 2).requires_grad_(False)


def test_drift_compares_the_recent_window_with_the_first_step():
    watch = VoiceWatch(cfg("ppo.stop_repetition_rise=0.03", "ppo.stop_distinct_drop=0.05", "ppo.stop_window=2"),
                       Tiny())
    first = step(0.02, 0.80)
    assert watch.drift([first]) is None
    assert watch.drift([first, step(0.06, 0.80)]) is None  # one step's rise, averaged with the first: 0.02
    reason = watch.drift([first, step(0.06, 0.80), step(0.07, 0.80)])  # mean 0.065: up 0.045
    assert reason is not None and "repeated 3-grams up 0.045" in reason and "ppo.stop_repetition_rise" in reason
    reason = watch.drift([first, step(0.02, 0.74), step(0.02, 0.72)])  # mean 0.73: down 0.07
    assert reason is not None and "distinct-2 down 0.070" in reason
    assert watch.drift([first, step(0.0, 0.90), step(0.0, 0.95)]) is None  # more variety is not a drift


def test_off_by_default():
    defaults = cfg()
    assert defaults.stop_repetition_rise == 0 and defaults.stop_distinct_drop == 0 and defaults.stop_window == 2
    assert not VoiceWatch.wanted(defaults)


def test_a_zero_threshold_is_off():
    watch = VoiceWatch(cfg("ppo.stop_repetition_rise=0", "ppo.stop_distinct_drop=0.05"), Tiny())
    assert watch.drift([step(0.0, 0.8), step(0.5, 0.8), step(0.5, 0.8)]) is None
    assert not VoiceWatch.wanted(cfg("ppo.stop_repetition_rise=0", "ppo.stop_distinct_drop=0"))
    assert VoiceWatch.wanted(cfg("ppo.stop_repetition_rise=0", "ppo.stop_distinct_drop=0.05"))


def test_a_stop_puts_back_the_last_weights_whose_rollouts_kept_the_voice():
    model = Tiny()
    watch = VoiceWatch(cfg("ppo.stop_repetition_rise=0.03", "ppo.stop_distinct_drop=0", "ppo.stop_window=1"), model)
    frozen = model.frozen.weight.clone()
    weights = [model.lora.weight.detach().clone()]  # weights[k]: after step k (0: the start)
    history = []
    for rep in (0.02, 0.03, 0.04, 0.20):  # step k's rollouts come from weights[k - 1]; step 4's have drifted
        with torch.no_grad():
            model.lora.weight.add_(1.0)  # the step's update
            model.frozen.weight.add_(1.0)  # not trainable: not the watch's to keep
        weights.append(model.lora.weight.detach().clone())
        history.append(step(rep, 0.8))
        reason = watch.check(history)
        if len(history) < 4:
            assert reason is None and watch.vouched_step == len(history) - 1
    assert reason is not None
    # Step 4's rollouts came from the weights after step 3, so the last vouched for are those after step 2.
    assert watch.vouched_step == 2
    assert torch.equal(model.lora.weight, weights[2])
    torch.testing.assert_close(model.frozen.weight.detach(), frozen + 4)


def test_a_drift_at_the_second_step_goes_back_to_the_starting_weights():
    model = Tiny()
    start = model.lora.weight.detach().clone()
    watch = VoiceWatch(cfg("ppo.stop_repetition_rise=0.03", "ppo.stop_window=1"), model, step=5)
    history = [step(0.0, 0.8)] * 5  # a resumed run: the first step of its history is still the reference
    with torch.no_grad():
        model.lora.weight.add_(1.0)
    assert watch.check([*history, step(0.5, 0.8)]) is not None
    assert watch.vouched_step == 5 and torch.equal(model.lora.weight, start)


@pytest.mark.parametrize("bad", ["ppo.stop_repetition_rise=-0.1", "ppo.stop_distinct_drop=-1", "ppo.stop_window=0",
                                 "ppo.stop_repetition_rise=nan"])
def test_bad_settings_are_refused_at_load(bad):
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        load_config(env={}, overrides=[bad])
