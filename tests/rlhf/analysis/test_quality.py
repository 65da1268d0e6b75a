"""Quality maths by hand and on published numbers; per-annotator stats on hand-made rows and a real Store."""
from __future__ import annotations

import math

import pytest

from rlhf.analysis.quality import (alpha_report, annotator_stats, feedback_frame, filter_feedback, flagged_replies,
                          krippendorff_alpha, median_seconds_per_item, pair_key)

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: four observers, twelve
# units, values 1-5, None = missing. Published: nominal alpha = 0.743, interval alpha = 0.849.
K2011 = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]
K2011_UNITS = [list(col) for col in zip(*K2011)]


def test_alpha_small_case_by_hand():
    # o_aa = 2, o_ab = o_ba = 1, o_bb = 2; n = 6; D_o = 2/6; D_e = 18/30; alpha = 1 - (1/3)/0.6 = 4/9.
    assert krippendorff_alpha([["a", "a"], ["a", "b"], ["b", "b"]]) == pytest.approx(4 / 9)
    # Systematic disagreement: o_ab = o_ba = 2, n = 4, D_o = 1, D_e = 8/12, alpha = -0.5.
    assert krippendorff_alpha([["a", "b"], ["b", "a"]]) == pytest.approx(-0.5)
    assert krippendorff_alpha([[1, 1], [2, 2], [5, 5]], "interval") == pytest.approx(1.0)


def test_alpha_matches_krippendorff_2011():
    assert krippendorff_alpha(K2011_UNITS, "nominal") == pytest.approx(0.743, abs=5e-4)
    assert krippendorff_alpha(K2011_UNITS, "interval") == pytest.approx(0.849, abs=5e-4)


def test_alpha_undefined_cases():
    assert krippendorff_alpha([[1], [2, None]]) is None  # nothing pairable
    assert krippendorff_alpha([[3, 3], [3, 3]]) is None  # no variation: D_e = 0
    with pytest.raises(ValueError):
        krippendorff_alpha([[1, 2]], "ordinal")


T0 = "2025-01-01T12:00:00.000+00:00"


def at(seconds: float) -> str:
    from datetime import datetime, timedelta

    return (datetime.fromisoformat(T0) + timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


def rows_by_hand() -> dict:
    """Replies 10, 11, 12 (10 and 12 answer the same prompt 1); three annotators; see the test for the sums."""
    messages = [{"id": 1, "conversation_id": 1, "parent_id": None, "role": "user", "content": "hello?",
                 "context_key": "k1", "policy_id": None, "created": T0},
                {"id": 10, "conversation_id": 1, "parent_id": 1, "role": "assistant", "content": "hi",
                 "context_key": "k2", "policy_id": 1, "created": T0},
                {"id": 12, "conversation_id": 1, "parent_id": 1, "role": "assistant", "content": "hey",
                 "context_key": "k2", "policy_id": 2, "created": T0},
                {"id": 2, "conversation_id": 1, "parent_id": 10, "role": "user", "content": "more", "context_key": "k3",
                 "policy_id": None, "created": T0},
                {"id": 11, "conversation_id": 1, "parent_id": 2, "role": "assistant", "content": "sure",
                 "context_key": "k4", "policy_id": 1, "created": T0}]
    ratings, rid = [], iter(range(1, 100))

    def rate(who, mid, t, thumb=None, score=None, flags=None):
        ratings.append({"id": next(rid), "message_id": mid, "annotator": who, "thumb": thumb, "score": score,
                        "flags": flags, "note": None, "created": at(t)})

    rate("alice", 10, 0, thumb=1)
    rate("alice", 11, 20, thumb=1)
    rate("alice", 10, 100, score=5)  # a later event on an item she started at t=0
    rate("bob", 10, 5, thumb=1, score=4)
    rate("bob", 11, 1000, thumb=1)
    rate("carol", 10, 7, thumb=-1, score=1, flags=["Inaccurate"])
    rate("carol", 11, 30, thumb=1)
    rate("dave", 12, 40, thumb=1, flags=["Unsafe", "Inaccurate"])
    rate(None, 11, 50, thumb=-1)
    comparisons = [
        {"id": 1, "message_a_id": 10, "message_b_id": 12, "policy_a_id": 1, "policy_b_id": 2, "winner": "a",
         "annotator": "alice", "pair_id": None, "created": at(50)},
        {"id": 2, "message_a_id": 12, "message_b_id": 10, "policy_a_id": 2, "policy_b_id": 1, "winner": "b",
         "annotator": "bob", "pair_id": None, "created": at(1010)},
    ]
    return {"conversations": [{"id": 1, "system_prompt": "", "source": "chat", "created": T0, "annotator": None}],
            "messages": messages, "ratings": ratings, "comparisons": comparisons, "excluded_annotators": ["carol"]}


def test_pair_key_orients_votes():
    assert pair_key(10, 12, "a") == ((10, 12), "low") == pair_key(12, 10, "b")
    assert pair_key(12, 10, "a") == ((10, 12), "high")
    assert pair_key(3, 1, "tie") == ((1, 3), "tie")


def test_annotator_stats_by_hand():
    stats = annotator_stats(rows_by_hand()).set_index("annotator")
    # Leave-one-out majority on overlapping items:
    #   thumbs r10 (alice +1, bob +1, carol -1): alice and bob see a tie (skipped), carol disagrees;
    #   thumbs r11 (all +1): all agree; scores r10 (5, 4, 1): alice |5 - 2.5| > 1 no, bob |4 - 3| <= 1 yes,
    #   carol |1 - 4.5| > 1 no; vote on (10, 12): alice and bob both say 10 wins: both agree.
    assert stats.loc["alice", "agreement"] == pytest.approx(2 / 3)
    assert stats.loc["bob", "agreement"] == pytest.approx(1.0)
    assert stats.loc["carol", "agreement"] == pytest.approx(1 / 3)
    assert stats.loc["alice", "overlap_items"] == 4 and stats.loc["carol", "overlap_items"] == 3
    assert stats.loc["dave", "overlap_items"] == 0 and math.isnan(stats.loc["dave", "agreement"])
    assert stats.loc["alice", "ratings"] == 3 and stats.loc["alice", "votes"] == 1 and stats.loc["alice", "items"] == 3
    assert stats.loc["(anonymous)", "ratings"] == 1 and stats.loc["(anonymous)", "overlap_items"] == 0
    assert bool(stats.loc["carol", "excluded"]) and not bool(stats.loc["alice", "excluded"])
    # Item starts: alice 0, 20, 50 -> gaps 20, 30 -> 25; bob 5, 1000, 1010 -> gaps 995 (capped 300), 10 -> 155.
    assert stats.loc["alice", "median_seconds"] == pytest.approx(25.0)
    assert stats.loc["bob", "median_seconds"] == pytest.approx(155.0)
    assert median_seconds_per_item(rows_by_hand(), cap=1000.0)["bob"] == pytest.approx(502.5)


def test_alpha_report_by_hand():
    report = alpha_report(rows_by_hand())
    # thumbs r10 (1, 1, -1), r11 (1, 1, 1): o_11 = 1 + 3, o_1,-1 = o_-1,1 = 1; n_1 = 5, n_-1 = 1, n = 6;
    # D_o = 2/6, D_e = 10/30: alpha = 0.
    assert report["thumbs"]["units"] == 2 and report["thumbs"]["alpha"] == pytest.approx(0.0)
    assert report["votes"]["units"] == 1 and report["votes"]["alpha"] is None  # perfect, no variation
    assert report["scores"]["units"] == 1 and report["scores"]["alpha"] is not None


def test_feedback_frame_filters_and_flagged_replies():
    rows = rows_by_hand()
    frame = feedback_frame(rows)
    assert len(frame) == len(rows["ratings"]) + len(rows["comparisons"])
    assert list(frame["created"]) == sorted(frame["created"], reverse=True)
    assert set(filter_feedback(frame, annotator="carol")["annotator"]) == {"carol"}
    assert set(filter_feedback(frame, kind="vote")["kind"]) == {"vote"}
    assert list(filter_feedback(frame, flag="Unsafe")["message_id"]) == [12]
    assert len(filter_feedback(frame, text="SURE")) == 4  # reply 11's three ratings + the anonymous one
    assert filter_feedback(frame, annotator="carol")["excluded"].all()
    flagged = flagged_replies(rows)
    assert list(flagged["message_id"]) == [12, 10]  # two flags before one
    assert flagged.loc[0, "flags"] == "Inaccurate ×1, Unsafe ×1" and flagged.loc[0, "prompt"] == "hello?"


def test_stats_on_a_real_store(store):
    conv = store.create_conversation("assistant", "alice", messages=[{"role": "user", "content": "q"}])
    user = store.leaf(conv.id)
    a = store.record_reply(user.id, "one", store.active_policy("assistant").id)
    b = store.record_reply(user.id, "two", store.active_policy("assistant").id)
    for who, thumb in (("alice", 1), ("bob", 1), ("carol", -1)):
        store.record_rating(a.id, who, thumb=thumb)
    store.record_comparison(a.id, b.id, "a", "alice")
    store.record_comparison(b.id, a.id, "b", "bob")
    store.set_annotator_excluded("carol", True)
    rows = store.feedback_rows("assistant")
    stats = annotator_stats(rows).set_index("annotator")
    assert stats.loc["alice", "votes"] == 1 and stats.loc["carol", "ratings"] == 1
    assert bool(stats.loc["carol", "excluded"])
    assert stats.loc["carol", "agreement"] == 0.0 and stats.loc["alice", "agreement"] == 1.0
    assert alpha_report(rows)["thumbs"]["units"] == 1
