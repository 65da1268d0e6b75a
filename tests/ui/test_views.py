"""View models of the arena and dashboard, on hand-made records (no Gradio, no Store)."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from storage import Comparison, Job, Policy, RewardModel
from rlhf.analysis import arena as pairing
from ui.views import arena as arena_views
from ui.views import dashboard as dashboard_views
from ui.views import text as text_views
from ui.views.text import DASH

T0 = "2024-01-02T03:04:05.000+00:00"


def pol(pid, version, status="candidate", parent=None, metrics=None, rm=None, config=None, snapshot=None):
    return Policy(id=pid, agent_id=1, version=version, parent_id=parent,
                  adapter_path=None if version == 0 else f"/adapters/{pid}", status=status, reward_model_id=rm,
                  job_id=None, data_snapshot=snapshot or {}, config=config or {}, metrics=metrics or {}, error=None,
                  created=T0)


def comp(a, b, winner, cid=1):
    return Comparison(id=cid, message_a_id=10, message_b_id=11, policy_a_id=a, policy_b_id=b, winner=winner,
                      annotator_id=None, pair_id=None, created=T0)


V0, V1, V2 = pol(1, 0, "active"), pol(2, 1, parent=1), pol(3, 2, "archived", parent=2)


def test_only_comparisons_between_two_known_versions_are_votes():
    rows = pairing.rated_votes([comp(1, 2, "a"), comp(2, 2, "b"), comp(None, 2, "a"), comp(2, None, "tie")])
    assert rows == [{"policy_a": 1, "policy_b": 2, "winner": "a"}]


def test_board_hand_worked_elo_and_counts():
    # One vote, v1 beats v0: expected score 0.5 on both sides, so Elo moves K/2 = 16 points each way.
    # The regenerate comparison (v1 vs v1) and the unknown-version one must not count.
    table = pairing.board([comp(2, 1, "a"), comp(2, 2, "a"), comp(None, 1, "b")], [V0, V1, V2], n_boot=50)
    rows = table.set_index("policy_id")
    assert rows.loc[2, "elo"] == pytest.approx(1016.0) and rows.loc[1, "elo"] == pytest.approx(984.0)
    assert rows.loc[3, "elo"] == 1000.0 and rows.loc[3, "votes"] == 0
    assert list(table["policy_id"][:1]) == [2] and rows.loc[2, "bt"] > rows.loc[1, "bt"]
    assert rows.loc[2, "status"] == "candidate" and rows.loc[3, "status"] == "archived"
    assert (rows.loc[1, "votes"], rows.loc[1, "losses"], rows.loc[2, "wins"]) == (1, 1, 1)
    # One vote: every resample is that vote, so the interval collapses onto the estimate.
    assert rows.loc[2, "ci_low"] == pytest.approx(rows.loc[2, "bt"]) == pytest.approx(rows.loc[2, "ci_high"])
    assert math.isnan(rows.loc[3, "ci_low"])


def test_leaderboard_json_is_strict_json_with_nulls():
    rows = arena_views.leaderboard_json(pairing.board([comp(2, 1, "both_bad")], [V0, V1, V2], n_boot=10))
    text = json.dumps(rows, allow_nan=False)  # NaN would raise here
    by_id = {r["policy_id"]: r for r in rows}
    assert by_id[2]["votes"] == 1 and by_id[2]["win_rate"] is None and by_id[3]["ci_low"] is None
    assert {"policy_id", "version", "elo", "bt", "ci_low", "ci_high", "votes", "win_rate", "status"} <= set(rows[0])
    assert isinstance(by_id[2]["votes"], int) and "NaN" not in text


def test_win_rate_view_counts_ties_half():
    comps = [comp(2, 1, "a"), comp(1, 2, "b"), comp(2, 1, "tie"), comp(2, 1, "both_bad")]
    view = arena_views.win_rate_view(comps, [V1, V0, V2]).set_index("row beats →")
    assert list(view.columns) == ["v0", "v1", "v2"]
    assert view.loc["v1", "v0"] == "83%" and view.loc["v0", "v1"] == "17%"  # 2.5 of 3 rated games
    assert view.loc["v0", "v0"] == DASH and view.loc["v1", "v2"] == DASH  # never met


def test_leaderboard_view_rows():
    view = arena_views.leaderboard_view(pairing.board([comp(2, 1, "a"), comp(2, 1, "tie")], [V0, V1], n_boot=20))
    first = view.iloc[0]
    assert first["Version"] == "v1" and first["Rank"] == 1 and first["W / L / T"] == "1 / 0 / 1"
    assert first["Win rate"] == "75%" and " – " in first["95% CI"]


def test_versions_table_metrics_lineage_and_dashes():
    rm = RewardModel(id=7, agent_id=1, path="/rm", mode="pairwise", data_snapshot={}, config={},
                     metrics={"eval_accuracy": 0.75}, job_id=None, created=T0)
    v1 = pol(2, 1, parent=1, rm=7, metrics={"eval/reward": 0.4321, "eval/kl": 1.234, "feedback_used": 40})
    v2 = pol(3, 2, parent=2, metrics={"reward_model/eval_accuracy": 0.9, "eval/reward": None},
             config={"retrain": {"method": "rpo"}}, snapshot={"comparisons": 3})
    table = pairing.board([comp(2, 1, "a")], [V0, v1, v2], n_boot=20)
    out = dashboard_views.versions_table([V0, v1, v2], {7: rm}, table)
    assert list(out.columns) == dashboard_views.VERSION_COLUMNS
    assert list(out["Version"]) == ["v2", "v1", "v0 · base"]
    r2, r1, r0 = (out.iloc[i] for i in range(3))
    assert (r1["Parent"], r1["Feedback used"], r1["RM accuracy"]) == ("v0", "40", "75%")
    assert (r1["Eval reward"], r1["KL to base"], r1["Elo"], r1["Votes"]) == ("0.432", "1.23", "1016", 1)
    bt = table.set_index("policy_id").loc[2, "bt"]
    assert r1["BT [95% CI]"] == f"{bt:.0f} (no interval yet)"  # one vote: every resample is the same
    assert r2["RM accuracy"] == "90%" and r2["Eval reward"] == DASH and r2["Feedback used"] == DASH
    assert r0["Parent"] == DASH and r0["Created"] == "2024-01-02 03:04" and r0["Status"] == "active"
    assert r2["BT [95% CI]"] == "1000 (no votes)"  # no votes: no interval to show
    assert (r2["Method"], r1["Method"], r0["Method"]) == ("rpo", DASH, DASH)  # from the version's own config


def test_rm_accuracy_from_two_held_out_pairs_is_too_few_to_tell():
    def row(accuracy, pairs):
        rm = RewardModel(id=7, agent_id=1, path="/rm", mode="pointwise", data_snapshot={}, config={},
                         metrics={"reward/eval_accuracy": accuracy, "reward/pairs_eval": pairs,
                                  "reward/cv_accuracy": None}, job_id=None, created=T0)
        v1 = pol(2, 1, parent=1, rm=7, metrics={"reward_model/eval_accuracy": accuracy})
        return dashboard_views.versions_table([V0, v1], {7: rm}, pairing.board([], [V0, v1], n_boot=0)).iloc[0]
    assert row(1.0, 2)["RM accuracy"] == "too few to tell (100%, 34%–100%)"  # not "100%"
    assert row(0.9, 60)["RM accuracy"] == "90% [80%–95%]"  # enough pairs: the interval clears chance
    assert dashboard_views.rm_accuracy_text({"cv_accuracy": 0.6, "cv_low": 0.4, "cv_high": 0.8}).startswith(
        "too few to tell")


def test_rating_rows_have_an_interval_only_when_the_votes_vary():
    table = pairing.board([comp(2, 1, "a"), comp(1, 2, "b"), comp(1, 2, "a")], [V0, V1, V2], n_boot=50)
    rows = {r["label"]: r for r in dashboard_views.rating_rows(table)}
    assert list(rows) == ["v0", "v1", "v2"]  # by version: a categorical axis
    bt = table.set_index("policy_id")["bt"]
    assert rows["v1"]["low"] < bt[2] == rows["v1"]["value"] < rows["v1"]["high"] and rows["v1"]["note"] == "3 votes"
    assert rows["v2"]["low"] is None and rows["v2"]["note"] == "no votes"
    one = {r["label"]: r for r in dashboard_views.rating_rows(pairing.board([comp(2, 1, "a")], [V0, V1], n_boot=50))}
    assert one["v1"]["low"] is None and one["v1"]["note"] == "1 vote, no interval"  # a zero-width interval


def test_ties_share_a_rank_and_missing_intervals_say_why():
    even = arena_views.leaderboard_view(pairing.board([], [V0, V1], n_boot=20))
    assert list(even["Rank"]) == [1, 1] and list(even["95% CI"]) == ["no votes yet"] * 2
    one = arena_views.leaderboard_view(pairing.board([comp(2, 1, "a")], [V0, V1], n_boot=20))
    assert list(one["95% CI"]) == ["no interval yet (1 vote)"] * 2 and list(one["Rank"]) == [1, 2]
    many = [comp(2, 1, w) for w in ("a", "b") * 6]  # an even record: overlapping intervals
    assert list(arena_views.leaderboard_view(pairing.board(many, [V0, V1], n_boot=50))["Rank"]) == [1, 1]
    lopsided = [comp(2, 1, "a")] * 12 + [comp(2, 1, "b")] * 2 + [comp(3, 1, "a")] * 12 + [comp(3, 1, "b")] * 2
    ranks = arena_views.leaderboard_view(pairing.board(lopsided, [V0, V1, V2], n_boot=100)).set_index("Version")["Rank"]
    assert ranks["v1"] == ranks["v2"] == 1 and ranks["v0"] == 3
    assert "Elo" in arena_views.BT_VS_ELO and "order" in arena_views.BT_VS_ELO


def test_chart_svgs_by_hand():
    from ui import charts

    assert charts.nice_ticks(0, 1, 6, integer=True) == [0, 1]
    assert charts.nice_ticks(1, 8, 6, integer=True) == [0, 2, 4, 6, 8]
    assert charts.nice_ticks(0.03, 0.97) == [0, 0.25, 0.5, 0.75, 1.0]
    svg = charts.interval_chart([{"label": "v0 <b>", "value": 1000.0, "low": None, "high": None, "note": "no votes"},
                                 {"label": "v1", "value": 1100.0, "low": 1050.0, "high": 1150.0, "note": "9 votes"}])
    assert "v0 &lt;b&gt;" in svg and "<b>" not in svg and svg.count('fill="none"') == 1  # hollow: no interval
    bars = charts.bar_chart(["10:00", "10:05"], {"ratings": [2, 0], "comparisons": [1, 3]}, caption="UTC")
    assert bars.count("<rect") == 3 + 2 and "10:05: 3 comparisons" in bars  # 3 bars + 2 legend keys
    assert "nothing logged" in charts.line_panel("kl", [], "#000")


def test_tied_versions_get_whole_number_ticks_in_one_format():
    import re

    from ui import charts

    tied = charts.interval_chart([{"label": "v0", "value": 999.8, "low": None, "high": None, "note": ""},
                                  {"label": "v1", "value": 1000.3, "low": None, "high": None, "note": ""}])
    ticks = re.findall(r'text-anchor="end" fill="currentColor" >([^<]*)<', tied)
    assert ticks == ["980", "990", "1000", "1010", "1020", "1030"]  # not 999, 1e+03, 1000, 1,000, 1001
    assert [charts.tick_text(t, 0.2) for t in (999.8, 1000.0, 1000.2)] == ["999.8", "1000.0", "1000.2"]
    assert [charts.tick_text(t, 0.25) for t in (0, 0.25)] == ["0.00", "0.25"]


def test_curves_keys_and_frame():
    rows = [{"step": s, "key": k, "value": v} for s, k, v in
            [(0, "reward/mean", 0.1), (1, "reward/mean", 0.3), (0, "ppo/kl", 0.0), (1, "ppo/kl", float("nan")),
             (0, "loss/value", 2.0)]]
    keys = dashboard_views.metric_keys(rows)
    assert keys == ["loss/value", "ppo/kl", "reward/mean"]
    assert dashboard_views.default_curve_keys(keys) == ["reward/mean", "ppo/kl"]
    assert dashboard_views.default_curve_keys(["objective/kl", "loss/policy"]) == ["objective/kl"]
    assert dashboard_views.default_curve_keys(["a", "b", "c"]) == ["a", "b"]
    assert dashboard_views.curve_series(rows, ["reward/mean", "ppo/kl"]) == {"reward/mean": [(0, 0.1), (1, 0.3)],
                                                                    "ppo/kl": [(0, 0.0)]}
    assert dashboard_views.curve_series(rows, ["gone"]) == {}


def test_job_choices_newest_first():
    def job(i, kind):
        return Job(id=i, kind=kind, agent_id=1, status="succeeded", progress=1.0, phase="", message="", config={},
                   result={}, error=None, pid=None, cancel_requested=0, checkpoint=None, created=T0, started=None,
                   finished=None, heartbeat=None)
    assert [c[1] for c in dashboard_views.job_choices([job(1, "retrain"), job(3, "retrain")])] == [3, 1]
    assert dashboard_views.job_choices([job(3, "retrain")])[0][0].startswith("#3 retrain · succeeded")


def test_volume_bins_even_bins_up_to_now():
    from datetime import datetime, timezone

    rows = [{"hour": "2024-01-02T03:01", "kind": "ratings", "n": 4},
            {"hour": "2024-01-02T03:01", "kind": "comparisons", "n": 2},
            {"hour": "2024-01-02T03:07", "kind": "ratings", "n": 1}]
    labels, stacks, caption = dashboard_views.volume_bins(rows, datetime(2024, 1, 2, 3, 10, tzinfo=timezone.utc))
    assert labels == [f"03:{m:02d}" for m in range(1, 11)] and caption == "UTC 2024-01-02 · one bar per minute"
    assert stacks == {"ratings": [4, 0, 0, 0, 0, 0, 1, 0, 0, 0], "comparisons": [2] + [0] * 9}
    labels, stacks, caption = dashboard_views.volume_bins(rows, datetime(2024, 1, 2, 9, 0, tzinfo=timezone.utc))
    assert caption.endswith("one bar per 15 minutes") and labels[0] == "03:00" and stacks["ratings"][0] == 5
    labels, stacks, caption = dashboard_views.volume_bins(rows, datetime(2024, 3, 1, tzinfo=timezone.utc))
    assert caption.endswith("one bar per 2 days") and labels[0] == "2024-01-02"
    assert len(labels) <= dashboard_views.MAX_BINS
    assert dashboard_views.volume_bins([], datetime(2024, 1, 1, tzinfo=timezone.utc)) == ([], {}, "")


def test_side_by_side_aligns_prompts_and_marks_missing():
    a = [{"prompt_index": 0, "prompt": [{"role": "user", "content": "Hi?"}], "reply": "Hello", "reward": 0.5},
         {"prompt_index": 1, "prompt": "Plain prompt", "reply": "A1", "reward": None}]
    b = [{"prompt_index": 1, "prompt": "Plain prompt", "reply": "B1", "reward": -0.25}]
    frame = dashboard_views.side_by_side(a, b, "v1", "v2")
    assert list(frame.columns) == ["Prompt", "v1 reply", "v1 reward", "v2 reply", "v2 reward"]
    assert frame.values.tolist() == [["Hi?", "Hello", "0.500", DASH, DASH],
                                     ["Plain prompt", "A1", DASH, "B1", "-0.250"]]
    same = dashboard_views.side_by_side(a, a, "v1", "v1")
    assert "v1 (A) reply" in same.columns and "v1 (B) reply" in same.columns


def test_prompt_text_shapes():
    turns = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
             {"role": "assistant", "content": "r"}, {"role": "user", "content": "q2"}]
    assert dashboard_views.prompt_text(turns) == "user: q\nassistant: r\nuser: q2"
    assert dashboard_views.prompt_text({"messages": [{"role": "user", "content": "x"}]}) == "x"


def test_rollback_target():
    v0, v3 = pol(1, 0, "candidate"), pol(4, 3, "active", parent=2)
    assert dashboard_views.rollback_target([v0, pol(2, 1, "candidate"), pol(3, 2), v3]).id == 2  # the parent
    broken_parent = [v0, pol(2, 1, "broken"), pol(3, 2, "archived"), v3]
    assert dashboard_views.rollback_target(broken_parent).id == 3  # newest older usable
    assert dashboard_views.rollback_target([pol(1, 0, "active")]) is None


def test_formatting_and_reveal():
    assert text_views.fmt(None) == DASH and text_views.fmt(float("nan")) == DASH and text_views.fmt("x") == DASH
    assert text_views.fmt(0.125, 1, percent=True) == "12.5%" and text_views.fmt(3, 0) == "3"
    text = arena_views.reveal_text("b", V1, V0, 42)
    assert "**A** was **v1 (candidate)**" in text and "v0 · base (active)" in text and "#42" in text
    assert "continue" in text
    assert "Start over" in arena_views.reveal_text("both_bad", V1, V0, 1) and "continue" not in \
        arena_views.reveal_text("both_bad", V1, V0, 1)
    assert dashboard_views.version_choices([V0, V1, V2], servable_only=True) == [("v1 (candidate)", 2),
                                                                       ("v0 · base (active)", 1)]


def test_frames_are_pandas():
    assert isinstance(arena_views.leaderboard_view(pairing.board([], [V0], n_boot=0)), pd.DataFrame)


def test_gate_verdict_is_shown_not_dashed():
    m = {"gate/verdict": "promote", "eval/win_rate": 0.8, "gate/low": 0.7, "gate/high": 0.9}
    assert dashboard_views.gate_text(m) == "promote 0.80 [0.70–0.90]"
    assert dashboard_views.gate_text({**m, "gate/verdict": "inconclusive"}).endswith(" · needs arena votes")
    assert dashboard_views.gate_text({**m, "gate/evidence": "none"}) == "promote: no judge (too few held-out votes)"
    assert dashboard_views.gate_text({}) == DASH
    row = dashboard_views.versions_table([pol(2, 1, metrics=m)], {}, pairing.board([], [pol(2, 1)], n_boot=0)).iloc[0]
    assert row["Gate"] == "promote 0.80 [0.70–0.90]"


def test_a_style_controlled_rating_without_spread_shows_no_interval():
    table = pairing.board([comp(2, 1, "a")], [V0, V1], n_boot=0)

    def shown(style, low, high):
        view = arena_views.leaderboard_view(table.assign(bt_style=style, style_low=low, style_high=high))
        return set(view["Style-controlled"])

    assert shown(1012.0, 1012.0, 1012.0) == {"1012 (no interval yet)"}  # one vote: resampling cannot vary it
    assert shown(1012.0, 980.0, 1040.0) == {"1012 [980 – 1040]"}
    assert shown(float("nan"), None, None) == {DASH}
