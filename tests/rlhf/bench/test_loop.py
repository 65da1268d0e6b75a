"""`bench loop` on the tiny model: oracle-labelled pool votes, the head reward model, PPO, the oracle's verdict."""
from __future__ import annotations

import argparse
import json

import pytest

from rlhf.bench import loop
from rlhf.bench.preference_pool import load_pool, split_prompts
from rlhf.bench.simulate import ORACLES
from rlhf.config import apply_overrides

pytestmark = pytest.mark.slow  # trains PPO


def test_oracle_pairs_follow_the_oracle_and_stay_on_train_prompts():
    pool = load_pool()
    train_ids, held_ids = split_prompts(pool)
    pairs = loop.oracle_pairs(pool, "no-lists", train_ids, 40, seed=3)
    assert len(pairs) == 40 and not {p["prompt_id"] for p in pairs} & set(held_ids)
    assert len({p["prompt_id"] for p in pairs}) == 40  # one pair per prompt
    assert all(ORACLES["no-lists"](p["prompt"], p["chosen"], p["rejected"]) == "a" for p in pairs)
    assert pairs == loop.oracle_pairs(pool, "no-lists", train_ids, 40, seed=3)  # deterministic


def test_quick_loop_reports_the_verdict(app_config, tmp_path, capsys):
    config = apply_overrides(app_config, {"ppo.steps": 1, "ppo.batch_size": 2, "ppo.mini_batch_size": 2,
                                          "ppo.max_new_tokens": 8, "ppo.save_every": 0, "reward.cv_folds": 2})
    args = argparse.Namespace(quick=True, oracle="concrete", votes=12)
    figures = loop.run(config, args, path=tmp_path / "BENCHMARKS.md")
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == figures
    assert figures["votes"] == 12 and set(figures["oracle_win_rate"]) == {"concrete"}
    assert 0.0 <= figures["min_win_rate"] <= 1.0 and 0.0 <= figures["distinct_2"]["concrete"] <= 1.0
    assert "## loop" in (tmp_path / "BENCHMARKS.md").read_text()


@pytest.mark.parametrize("oracle, votes, message", [("kind", 16, "--oracle must be one of"),
                                                     ("concrete", 0, "--votes must be at least 4"),
                                                     ("concrete", -3, "--votes must be at least 4")])
def test_bad_arguments_are_refused_before_any_work(app_config, oracle, votes, message):
    from rlhf.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        loop.run(app_config, argparse.Namespace(quick=True, oracle=oracle, votes=votes))
