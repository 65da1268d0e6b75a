"""`rlhf-studio simulate`: the command draws the core's progress on stderr and prints the figures as one JSON line."""
from __future__ import annotations

import json

from cli import main
from cli.simulate import Bars


def test_bars_draw_one_bar_per_phase_on_stderr(capsys):
    bars = Bars()
    for done in range(3):
        bars("concise votes", done, 2)
    bars.log("votes: {'a': 2}")
    bars("retrain", 40, 100, "reward model")
    bars("retrain", 100, 100, "policy")
    bars.close()
    out, err = capsys.readouterr()
    assert out == ""
    assert "concise votes" in err and "2/2" in err and "votes: {'a': 2}" in err
    assert err.index("2/2") < err.index("votes: {'a': 2}") < err.index("retrain")
    assert "policy" in err and bars.bar is None


def test_simulate_prints_the_figures_as_json(monkeypatch, capsys, tmp_path):
    import rlhf.simulate.annotators as annotators

    def simulate(url, oracle, votes, *args, log, progress, **kwargs):
        progress(f"{oracle} votes", votes, votes, "")
        log("votes: {'a': 1}")
        return {"votes": votes, "url": url}

    monkeypatch.setattr(annotators, "simulate", simulate)
    assert main(["simulate", "--oracle", "concise", "--votes", "1", "--url", "http://x:1",
                 "--set", f"data_dir={tmp_path}"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"votes": 1, "url": "http://x:1"} and "votes: {'a': 1}" in err


def test_simulate_refuses_no_votes(capsys):
    assert main(["simulate", "--oracle", "concise", "--votes", "0"]) == 2
    assert "--votes must be at least 1" in capsys.readouterr().err
