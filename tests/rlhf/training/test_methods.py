"""The retrain's policy methods behind one registry: each names its config section, its work and its metrics, the
retrain never compares method names, and an unknown name is refused at config time."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from rlhf.config import AppConfig, ConfigError, apply_overrides
from rlhf.retrain.progress import Phases, estimate_minutes, retrain_rates
from rlhf.training.methods import METHODS, get_method, method_title

ROOT = Path(__file__).resolve().parents[3]


def test_every_registered_method_names_its_own_section_and_rate():
    config = AppConfig()
    sections = {f.name for f in dataclasses.fields(AppConfig)}
    keys = set()
    for name in METHODS:
        method = get_method(name)
        assert method.name == name and method.title and method.section in sections
        assert method.settings(config) is getattr(config, method.section)
        assert method.total_steps(config, 16) >= 1 and method.units(config, 16) > 0
        keys.add(method.rate_key)
    assert len(keys) == len(METHODS)  # one method's measured speed never estimates another's


def test_the_retrain_never_compares_method_names():
    pattern = re.compile(r'method *[!=]= *"(ppo|dpo|rpo)"')
    hits = [f"{p}:{i}" for p in (ROOT / "rlhf").rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_an_unknown_method_is_refused_at_config_time_not_trained_as_another():
    with pytest.raises(ConfigError, match="retrain.method"):
        apply_overrides(AppConfig(), {"retrain.method": "grpo"})
    with pytest.raises(ValueError, match="ppo, dpo, rpo"):
        get_method("grpo")
    assert method_title("retired-method") == "retired-method"  # an old version's card still renders


@pytest.mark.parametrize("name", list(METHODS))
def test_estimate_and_measured_rate_follow_the_method(name):
    config = apply_overrides(AppConfig(), {"retrain.method": name})
    method = get_method(name)
    rates = {"reward_s_per_pair": 1.0, "eval_s": 10.0, "overhead_s": 0.0, method.rate_key: 2.0}
    expected = (10 * config.reward.epochs + 2.0 * method.units(config, 10) + 10) / 60
    assert estimate_minutes(rates, 10, config) == pytest.approx(expected, abs=0.1)
    seconds = {"reward": 5.0, "eval": 3.0, name: 40.0}
    measured = retrain_rates(seconds, config, 8, 10, method.total_steps(config, 10))
    assert measured[method.rate_key] == pytest.approx(40.0 / method.units(config, 10, method.total_steps(config, 10)))


def test_rpo_adds_the_chosen_likelihood_to_its_own_section_only():
    config = apply_overrides(AppConfig(), {"retrain.method": "rpo", "rpo.nll_weight": 0.5, "rpo.beta": 0.2})
    rpo = get_method("rpo")
    assert rpo.extra_args(config) == {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]}
    assert get_method("dpo").extra_args(config) == {} and config.dpo.beta == 0.1  # DPO untouched
    assert rpo.result_metrics(None, 12) == {"rpo/pairs": 12}
    with pytest.raises(ConfigError, match="rpo.nll_weight"):
        apply_overrides(AppConfig(), {"rpo.nll_weight": -1})


class _Ctx:
    def __init__(self):
        self.seen = []

    def progress(self, fraction, phase, message):
        self.seen.append((round(fraction, 3), phase))


@pytest.mark.parametrize("name", list(METHODS))
def test_each_method_phase_takes_the_policy_share_of_the_progress_bar(name):
    ctx = _Ctx()
    phases = Phases(ctx)
    phases.enter(name, get_method(name).title)
    phases.report(name, 1.0)
    assert ctx.seen == [(0.25, name), (0.87, name)]
