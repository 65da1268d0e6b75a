"""`bench gate` and `bench decide` on the tiny model: the contract of their JSON line and their bookkeeping."""
from __future__ import annotations

import argparse
import json

import pytest

from bench import decide, gate
from rlhf.config import apply_overrides

pytestmark = pytest.mark.slow  # features of the whole pool (tiny model: seconds)


def test_quick_gate_bench_reports_the_contract(app_config, tmp_path, capsys):
    config = apply_overrides(app_config, {"gate.min_judge_pairs": 8})  # a judge from 22 pairs: a quick run
    figures = gate.run(config, argparse.Namespace(quick=True, votes=32, trials=4), path=tmp_path / "B.md")
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == figures
    assert {"null_trials", "null_promoted", "real_trials", "real_promoted", "real_rejected", "seconds"} <= set(figures)
    assert figures["null_trials"] == 4 and figures["real_trials"] == 6  # one seed per planted preference
    assert figures["real_promoted"] + figures["real_inconclusive"] + figures["real_rejected"] == 6
    assert 0 <= figures["null_promoted_low"] <= figures["null_promoted_rate"] <= figures["null_promoted_high"] <= 1
    text = (tmp_path / "B.md").read_text()
    assert "## gate" in text and "| null | coin flips | 4 |" in text
    with pytest.raises(ValueError, match="--votes must be at least 22"):
        gate.run(config, argparse.Namespace(quick=True, votes=21, trials=1), path=tmp_path / "B.md")
    with pytest.raises(ValueError, match="--votes must be at least 94"):  # the default: a judge from 94 pairs
        gate.run(app_config, argparse.Namespace(quick=True, votes=64, trials=1), path=tmp_path / "B.md")
    with pytest.raises(ValueError, match="judge_share must be above 0"):
        gate.run(apply_overrides(app_config, {"gate.judge_share": 0}), argparse.Namespace(quick=True, votes=128,
                                                                                            trials=1))


def test_summary_counts_by_hand():
    rows = [{"kind": "null", "gate": g, "rm_low": low, "oracle_win_rate": None}
            for g, low in (("promote", 0.6), ("inconclusive", 0.7), ("inconclusive", 0.4))]
    rows += [{"kind": "real", "gate": g, "rm_low": 0.6, "oracle_win_rate": o}
             for g, o in (("promote", 0.7), ("inconclusive", 0.66), ("reject", 0.5))]
    s = gate.summarise(rows)
    assert (s["null_trials"], s["null_promoted"], s["null_rm_would_promote"]) == (3, 1, 2)
    assert (s["preferred_trials"], s["preferred_promoted"], s["preferred_to_people"], s["preferred_rejected"]) == \
        (2, 1, 1, 0)
    assert s["real_rejected"] == 1


def test_quick_decide_bench(app_config, tmp_path, capsys):
    figures = decide.run(app_config, argparse.Namespace(quick=True, trials=20), path=tmp_path / "B.md")
    assert figures["trials"] == 20 and 0 <= figures["wrong_at_0.5"] <= 1
    assert {"promote_at_0.7", "median_votes_at_0.7", "seconds"} <= set(figures)
