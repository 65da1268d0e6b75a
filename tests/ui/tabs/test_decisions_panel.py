"""The dashboard's promotion panel and the Training tab's guard box: view functions and handlers on a real Store."""
from __future__ import annotations

from tests.rlhf.retrain.test_decisions import INCONCLUSIVE, version, vote
from tests.rlhf.retrain.test_lineage import feedback, trained
from ui.views.dashboard import gate_text
from ui.tabs import decisions as panel

GATE = {"verdict": "inconclusive", "reason": "guarded",
        "guard": {"tripped": ["off_prompt", "distinct"],
                  "examples": [{"check": "off_prompt", "prompt": "What is 12 squared?", "candidate": "<b>Sorry</b>",
                                "active": "144"}] * 3}}


def test_guard_html_names_the_checks_and_shows_the_examples_escaped():
    text = panel.guard_html(GATE)
    assert "off_prompt, distinct" in text and text.count("<li>") == 3 and "&lt;b&gt;Sorry" in text
    assert panel.guard_html({"guard": {"tripped": [], "examples": []}}) == "" and panel.guard_html(None) == ""


def test_a_decision_line_adds_up():
    d = {"version": 2, "opponent_version": 1, "votes": 3, "wins": 0, "ties": 1, "losses": 2, "both_bad": 1,
         "win_rate": 1 / 6, "low": 0.0, "high": 0.9, "votes_needed": 12, "guard_tripped": [], "people": 2}
    line = panel.decision_line(d)
    assert "4 votes from 2 accounts — 0 won, 1 tied, 2 lost, 1 both bad" in line
    assert "(3 count: both-bad votes" in line
    assert "count:" not in panel.decision_line({**d, "both_bad": 0})


def test_panel_lists_open_decisions_and_marked_versions(services, tmp_path):
    store = services.store
    cand = version(store, tmp_path, 1, {**INCONCLUSIVE, "gate/guard_tripped": ["off_prompt"]})
    vote(store, cand, store.active_policy("assistant"), "a", "ann", 0)
    text, marked, pick = panel.refresh_panel(services, "assistant")
    assert "**v1** vs active v0: 1 vote from 1 account — 1 won" in text
    assert "off_prompt" in text and "more votes" in text
    assert marked == "" and pick["choices"] == []
    for i in range(10):
        feedback(store, "mallory", i)
    for i in range(20):
        feedback(store, "alice", i)  # enough to retrain without mallory
    v2 = trained(store, tmp_path, 2, 1)
    store.set_annotator_excluded("mallory", True)
    _, marked, pick = panel.refresh_panel(services, "assistant")
    assert "v2 (candidate) learned from mallory" in marked and pick["value"] == v2.id
    assert "without mallory" in panel.retrain_without(services, v2.id, None)
    out = panel.retrain_without(services, v2.id, None)  # a second click returns the queued job
    assert out.startswith("Queued job #") and "without mallory" in out
    assert panel.retrain_without(services, None, None) == "Pick a marked version first."


def test_the_versions_table_shows_the_guard_and_the_peoples_verdict():
    text = gate_text({"gate/verdict": "inconclusive", "gate/win_rate": 0.8, "gate/low": 0.6, "gate/high": 0.95,
                      "gate/guard_tripped": ["length"], "decision/verdict": "promote", "decision/votes": 41})
    assert text == "inconclusive 0.80 [0.60–0.95] · guard: length · people's votes: promote (41 votes)"


def test_retrain_without_them_asks_first_and_keeps_its_subject(services, tmp_path):
    store = services.store
    for i in range(10):
        feedback(store, "mallory", i)
    for i in range(20):
        feedback(store, "alice", i)
    v1 = trained(store, tmp_path, 1, 1)
    store.set_annotator_excluded("mallory", True)
    box, question, status = panel.ask_retrain_without(services, "assistant", v1.id)
    assert box.visible and "Retrain without mallory?" in question and status == ""
    assert store.count("jobs") == 0  # asking starts nothing
    assert panel.ask_retrain_without(services, "assistant", None)[2] == "Pick a marked version first."
    assert panel.refresh_panel(services, "assistant", v1.id)[2]["value"] == v1.id
    assert "Queued job #" in panel.retrain_without(services, v1.id, None)
    assert store.list_jobs()[0].config["estimated_minutes"] > 0  # the Training tab can say how long it takes
