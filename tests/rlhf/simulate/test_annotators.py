"""`rlhf.simulate.annotators` returns its figures and prints nothing: progress and the votes line go to callbacks
(the command line draws them: tests/cli/test_simulate.py)."""
from __future__ import annotations

from rlhf.simulate import annotators


def offline_team(monkeypatch, winner="a"):
    """Annotators that never reach a server: every vote goes to ``winner``, every pair is two fixed replies."""
    monkeypatch.setattr(annotators.Annotators, "__init__", lambda self, *a, **k: setattr(self, "judge",
                                                                                          lambda p, a, b: winner))
    monkeypatch.setattr(annotators.Annotators, "vote", lambda self, prompt, seed: "a" if seed % 4 == 0 else "b")
    monkeypatch.setattr(annotators.Annotators, "pair", lambda self, prompt, seed, policy_a=None, policy_b=None: (
        {"content": "old reply"}, {"content": "a new reply"}))


def test_simulate_reports_progress_and_the_votes_and_prints_nothing(monkeypatch, capsys):
    offline_team(monkeypatch)
    seen, logs = [], []
    out = annotators.simulate("http://unused", "concise", 3, log=logs.append,
                              progress=lambda *event: seen.append(event))
    assert out["votes"] == 3 and out["active"] is False and out["job_id"] is None
    assert seen == [("concise votes", done, 3, "") for done in range(4)]
    assert logs == ["votes: {'a': 2, 'b': 1}"]
    assert capsys.readouterr() == ("", "")


def test_the_oracle_verdict_reports_each_prompt(monkeypatch, capsys):
    offline_team(monkeypatch, winner="a")  # the oracle prefers the new version's reply (passed first)
    team = annotators.Annotators("http://unused", "concise")
    seen = []
    verdict = team.oracle_win_rate(["p1", "p2"], old=1, new=2, samples=2, progress=lambda *e: seen.append(e))
    assert verdict["oracle_win_rate"] == 1.0 and verdict["judged"] == 4 and verdict["mean_words"] == 3.0
    assert seen == [("oracle verdict", done, 2, "") for done in range(3)]
    assert capsys.readouterr() == ("", "")
