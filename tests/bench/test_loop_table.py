"""The table a default is chosen by: each oracle's seed-mean, then mean and worst over oracles per method/votes."""
from __future__ import annotations

import json

import pytest

from bench import loop_table


def row(oracle, method, seed, win, d2=0.90, base_d2=0.93, rep=0.01, base_rep=0.01, votes=32):
    return {"oracle": oracle, "method": method, "seed": seed, "votes_asked": votes, "oracle_win_rate": win,
            "distinct_2": d2, "base_distinct_2": base_d2, "repetition": rep, "base_repetition": base_rep,
            "kl": 2.0, "train_s": 10.0, "pairs": votes, "mean_words": 40.0, "base_mean_words": 50.0}


def test_mean_and_worst_are_over_preferences_after_averaging_seeds():
    rows = [row("a", "dpo", 0, 0.9), row("a", "dpo", 1, 0.7), row("b", "dpo", 0, 0.6), row("b", "dpo", 1, 0.6),
            row("a", "ppo", 0, 0.7), row("b", "ppo", 0, 0.5, d2=0.80)]
    by = {s["method"]: s for s in loop_table.summarise(rows)}
    assert by["dpo"]["mean_win"] == 0.7 and by["dpo"]["worst_win"] == 0.6 and by["dpo"]["worst_oracle"] == "b"
    assert by["dpo"]["voice_kept"] == 4 and by["ppo"]["voice_kept"] == 1  # 0.80 is more than 0.05 below 0.93
    assert abs(by["ppo"]["worst_distinct_drop"] - 0.13) < 1e-9


def test_the_markdown_table_reads_json_lines(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [row("a", "rpo", 0, 0.8), row("b", "rpo", 0, 0.6)]))
    assert loop_table.main(["table", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| rpo | 32 | 0.70 (not 0.75) | 0.60 (b) |" in out and "2/2" in out and "| 0.80 (a) |" in out


def test_a_methods_variants_stay_apart_in_the_table():
    rows = [row("a", "ppo", 0, 0.6), {**row("a", "ppo", 0, 0.9), "variant": "ppo.steps=16", "mean_words": 5.0}]
    by = {s["method"]: s for s in loop_table.summarise(rows)}
    assert by["ppo"]["mean_win"] == 0.6 and by["ppo (ppo.steps=16)"]["mean_win"] == 0.9
    assert by["ppo (ppo.steps=16)"]["shortest"] == 0.1  # a collapse to short replies shows, though distinct-2 rises


def test_the_table_says_whether_the_goal_is_met_and_shows_each_preference():
    rows = [row("a", "ppo", 0, 0.7, votes=16), row("b", "ppo", 0, 0.6, votes=16, d2=0.83),
            row("a", "ppo", 0, 0.8, votes=64), row("c", "ppo", 0, 0.8, votes=64)]
    out = loop_table.markdown(rows)
    assert "| ppo | 16 | 0.65 (met 0.65) |" in out and "| ppo | 64 | 0.80 (not 0.85) |" in out
    assert "| method | votes | a | b | c |" in out
    assert "| ppo | 16 | 0.70 (-0.03) | 0.60 (-0.10) | - |" in out  # c never ran at 16 votes


def test_the_table_can_plot_each_preference_across_vote_counts(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    rows = [row("a", "ppo", 0, 0.6, votes=16), row("a", "ppo", 0, 0.8, votes=32, d2=0.85)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert loop_table.main(["table", str(path), "--plot", str(tmp_path / "votes.svg")]) == 0
    svg = (tmp_path / "votes.svg").read_text()
    assert svg.count("<circle") == 2 and "a · ppo" in svg and ">16<" in svg and ">32<" in svg


def test_a_label_shows_one_retrain_spelled_two_ways_as_one_method(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    rows = [{**row("a", "ppo", 0, 0.8), "variant": "ppo.vote_passes=2"},
            {**row("b", "ppo", 0, 0.6), "variant": "ppo.vote_passes=2,gate.judge_share=0"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert loop_table.main(["table", str(path), "--label", "ppo (default)"]) == 0
    assert "| ppo (default) | 32 | 0.70 (not 0.75) | 0.60 (b) |" in capsys.readouterr().out


def test_a_label_refuses_two_rows_of_one_cell(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    rows = [row("a", "ppo", 0, 0.8), {**row("a", "ppo", 0, 0.6), "variant": "ppo.steps=8"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit) as refused:
        loop_table.main(["table", str(path), "--label", "ppo"])
    assert refused.value.code == 2
    assert "('a', 0, 32)" in capsys.readouterr().err


def traced(oracle, seed, trace, **kw):
    """A row whose rollouts' voice per step (distinct-2, repeated 3-grams) was kept."""
    return {**row(oracle, "ppo", seed, 0.8, **kw), "voice_trace": trace}


def test_the_watch_replay_stops_where_the_rollouts_drift_and_keeps_the_weights_two_steps_back():
    calm = [[0.90, 0.00]] * 6
    looping = [[0.90, 0.00]] * 3 + [[0.90, 0.02], [0.90, 0.04], [0.90, 0.05]]  # last two: 0.03 at step 5
    rows = [traced("a", 0, looping, rep=0.09), traced("b", 0, calm), traced("c", 0, looping),
            traced("d", 0, calm, rep=0.05), row("e", "ppo", 0, 0.7)]  # e: no trace, left out
    replay = {x["oracle"]: x for x in loop_table.watch_replay(rows, rise=0.015, drop=0.0, window=2)}
    assert set(replay) == {"a", "b", "c", "d"}
    assert (replay["a"]["stop"], replay["a"]["kept_step"], replay["a"]["voice_kept"]) == (5, 3, False)
    assert replay["b"]["stop"] is None and replay["b"]["kept_step"] is None
    assert replay["c"]["stop"] == 5 and replay["c"]["voice_kept"]  # a stop the run's end did not need
    assert replay["d"]["stop"] is None and not replay["d"]["voice_kept"]  # a loss the rollouts never showed
    text = loop_table.watch_markdown(list(replay.values()))
    assert "| ppo | 32 | a | 0 | 0.80 | lost | stops at step 5 of 6, keeps step 3 |" in text
    assert "Of 4 runs with a trace the watch stops 2: 1 that lost the voice, 1 that kept it; it lets 1 that " \
           "lost it run on." in text
    # A fall in variety is the distinct-2 check's, off unless asked for.
    narrowing = [[0.90, 0.0]] * 2 + [[0.80, 0.0]] * 2
    assert loop_table.watch_replay([traced("f", 0, narrowing)], 0.015, 0.0, 2)[0]["stop"] is None
    assert loop_table.watch_replay([traced("f", 0, narrowing)], 0.0, 0.05, 2)[0]["stop"] == 4


def test_the_watch_command_refuses_thresholds_that_watch_nothing(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(traced("a", 0, [[0.9, 0.0]] * 3)) + "\n")
    for bad in (["--rise", "0"], ["--rise", "-0.1"], ["--window", "0"]):
        with pytest.raises(SystemExit) as refused:
            loop_table.main(["watch", str(path), *bad])
        assert refused.value.code == 2
        assert "--rise and --drop" in capsys.readouterr().err
    assert loop_table.main(["watch", str(path), "--label", "ppo (default)"]) == 0
    assert "| ppo (default) | 32 | a | 0 | 0.80 | kept | runs on |" in capsys.readouterr().out


def test_the_table_counts_what_the_guards_voice_rules_would_publish():
    """A refused run leaves the team on the base (0.5); rows that do not say show -."""
    rows = [{**row("a", "ppo", 0, 0.9), "guard_voice": True}, {**row("a", "ppo", 1, 0.9), "guard_voice": False},
            {**row("b", "ppo", 0, 0.6), "guard_voice": True}, {**row("b", "ppo", 1, 0.8), "guard_voice": True},
            row("a", "dpo", 0, 0.9)]
    by = {s["method"]: s for s in loop_table.summarise(rows)}
    assert by["ppo"]["published"] == 3 and abs(by["ppo"]["published_win"] - (0.7 + 0.7) / 2) < 1e-9
    assert by["dpo"]["published"] is None
    out = loop_table.markdown(rows)
    assert "| 4/4 | 3/4 (0.70) |" in out and "| 1/1 | - |" in out  # voice kept, then what is published


def test_a_ppo_runs_guard_voice_is_read_from_its_voice_check():
    from bench.verdict import guard_voice

    ppo = {"ppo/reward_after": 0.3}
    assert guard_voice(ppo, gate_view=True) is True  # the check passed the final weights
    went_back = {**ppo, "voice_watch/by": "check", "voice_watch/kept": 8, "voice_watch/step": 16}
    assert guard_voice({**went_back, "voice_watch/passes": "every view"}, gate_view=True) is True
    assert guard_voice({**went_back, "voice_watch/passes": "sampled replies"}, gate_view=True) is False
    assert guard_voice({**ppo, "voice_watch/by": "watch"}, gate_view=True) is True
    assert guard_voice(ppo, gate_view=False) is None and guard_voice({"dpo/loss": 0.1}, gate_view=True) is None
