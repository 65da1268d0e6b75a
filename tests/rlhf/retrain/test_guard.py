"""The reward-hacking guard: its measures by hand, its verdicts, and relevance judged by a real base model."""
from __future__ import annotations

import math

import pytest

from rlhf.config import GateConfig
from rlhf.retrain.guard import SHOWN_FIRST, distinct_n, guard_report, relevance, repetition, run_guard

CFG = GateConfig()
PROMPTS = [[{"role": "user", "content": f"question {i}"}] for i in range(6)]
ANSWERS = [f"The answer to question {i} is {i * 7}, because of reason number {i}." for i in range(6)]
SORRY = "I'm sorry for any misunderstanding, can you please assist me with a question?"


def test_measures_by_hand():
    assert distinct_n(["a b c", "a b d"]) == pytest.approx(3 / 4)  # bigrams ab, bc, ab, bd
    assert distinct_n([""]) == 1.0
    assert repetition("go go go go") == pytest.approx(1 - 1 / 2)  # 3-grams: (go go go) twice
    assert repetition("one two three four") == 0.0


def test_a_healthy_candidate_passes():
    report = guard_report(PROMPTS, ANSWERS[::-1], ANSWERS, 5.0, CFG, [0.8] * 6, [0.8] * 6)
    assert report["tripped"] == [] and report["examples"] == []
    assert set(report["checks"]) == {"length", "distinct", "repetition", "off_prompt", "kl"}


def test_deflections_trip_off_prompt_and_distinct_with_three_examples():
    candidate = [SORRY] * 5 + [ANSWERS[5]]
    rel = [0.05] * 5 + [0.9]
    report = guard_report(PROMPTS, candidate, ANSWERS, 5.0, CFG, rel, [0.8] * 6)
    assert "off_prompt" in report["tripped"] and "distinct" in report["tripped"]
    # three examples per tripped check, the plainest check (off-prompt) first
    assert [e["check"] for e in report["examples"]] == ["off_prompt"] * 3 + ["distinct"] * 3
    assert all(e["candidate"] == SORRY and e["check"] == "off_prompt" and e["relevance"] == 0.05
               for e in report["examples"][:3])
    assert report["examples"][0]["prompt"].startswith("question") and report["examples"][0]["active"] in ANSWERS


def test_length_repetition_and_kl_trip():
    longer = [a + " " + a + " " + a for a in ANSWERS]
    assert "length" in guard_report(PROMPTS, longer, ANSWERS, 1.0, CFG)["tripped"]
    loops = [a + " and again and again and again and again" for a in ANSWERS]
    assert "repetition" in guard_report(PROMPTS, loops, ANSWERS, 1.0, CFG)["tripped"]
    assert guard_report(PROMPTS, ANSWERS, ANSWERS, CFG.guard_max_kl + 1, CFG)["tripped"] == ["kl"]
    assert "off_prompt" not in guard_report(PROMPTS, ANSWERS, ANSWERS, 1.0, CFG)["checks"]  # no relevance given


@pytest.mark.slow  # seconds of real work: the full suite only (make test-fast < 60 s)
def test_relevance_runs_on_a_real_tiny_model(tiny_model_dir):
    from rlhf.base_models import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm(str(tiny_model_dir), "cpu"), load_tokenizer(str(tiny_model_dir))
    rel = relevance(model, tok, PROMPTS[:3], ANSWERS[:3])
    assert len(rel) == 3 and all(math.isfinite(r) for r in rel)
    off = run_guard(model, tok, PROMPTS[:3], ANSWERS[:3], ANSWERS[:3], 1.0, GateConfig(guard=False))
    assert off["tripped"] == [] and off["off"]


@pytest.mark.slow
def test_the_base_model_tells_answers_from_deflections(smol_dir):
    """SmolLM2's own likelihoods: its pool answers are far likelier after their prompt than after another one; a
    polite deflection is about as likely after any prompt."""
    from rlhf.simulate.preference_pool import load_pool
    from rlhf.base_models import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm(str(smol_dir), "cpu"), load_tokenizer(str(smol_dir))
    pool = sorted(load_pool(), key=lambda r: r["prompt_id"])[:8]
    prompts = [[{"role": "user", "content": r["prompt"]}] for r in pool]
    answers = [r["replies"][0][:300] for r in pool]
    deflections = [SORRY, "I'm glad you asked! Thank you so much for your question. Let me know if you need "
                          "anything else."] * 4
    rel_a, rel_d = relevance(model, tok, prompts, answers), relevance(model, tok, prompts, deflections)
    assert sum(r >= CFG.min_relevance for r in rel_a) >= 7 and sum(r < CFG.min_relevance for r in rel_d) >= 6
    report = guard_report(prompts, deflections, answers, 5.0, CFG, rel_d, rel_a)
    assert "off_prompt" in report["tripped"]


def test_default_limits_trip_on_the_drop_issue_35_measured():
    """The retrain of #35: distinct-2 0.82 → 0.77 and repeated 3-grams 0.037 → 0.110 (3×) went through a guard that
    tripped only on a 0.1 drop or a 0.1 rise. The defaults trip on a 0.05 drop and on twice the active repetition."""
    from rlhf.retrain.guard import distinct_dropped, repeats_more

    assert CFG.max_distinct_drop == 0.05 and CFG.max_repetition_ratio == 2.0
    assert distinct_dropped(0.77, 0.82, CFG.max_distinct_drop) and not distinct_dropped(0.78, 0.82, CFG.max_distinct_drop)
    assert not distinct_dropped(0.90, 0.82, CFG.max_distinct_drop)  # more diverse is never a trip
    rise = (CFG.max_repetition_ratio, CFG.max_repetition_rise)
    assert repeats_more(0.110, 0.037, *rise) and not repeats_more(0.070, 0.037, *rise)  # 3× trips, 1.9× does not
    assert not repeats_more(0.015, 0.0, *rise) and repeats_more(0.03, 0.0, *rise)  # the floor over a base at 0


def planted_loops(replies: list[str]) -> list[str]:
    """A candidate that learned to repeat itself: each reply's opening dozen words, said three times."""
    return [" ".join([" ".join(r.split()[:12]).rstrip(".,:") + "."] * 3) for r in replies]


@pytest.mark.slow
def test_a_planted_repetitive_candidate_trips_the_guard_and_is_never_promoted(smol_dir):
    """Real replies of the base (the shipped pool) as the active version, a planted candidate that loops them,
    relevance by the real base model: the guard trips on repetition and distinct-2 with the loops as its examples,
    and the gate does not promote it however much its judge likes it."""
    import numpy as np

    from rlhf.retrain.gate import Evidence, decide
    from rlhf.base_models import load_causal_lm, load_tokenizer
    from rlhf.simulate.preference_pool import load_pool

    pool = sorted(load_pool(), key=lambda r: r["prompt_id"])[:12]
    prompts = [[{"role": "user", "content": r["prompt"]}] for r in pool]
    active = [r["replies"][0] for r in pool]
    candidate = planted_loops(active)
    model, tok = load_causal_lm(str(smol_dir), "cpu"), load_tokenizer(str(smol_dir))
    guard = run_guard(model, tok, prompts, candidate, active, 5.0, CFG)
    assert {"repetition", "distinct"} <= set(guard["tripped"])
    rep = guard["checks"]["repetition"]
    assert rep["candidate"] > CFG.max_repetition_ratio * rep["active"] and rep["tripped"]
    shown = [e for e in guard["examples"] if e["check"] == "repetition"]
    assert len(shown) == 3 and all(e["repeated"] and e["repeated"] in e["candidate"].lower() for e in shown)
    order = [e["check"] for e in guard["examples"]]
    assert order == sorted(order, key=SHOWN_FIRST.index)  # the plainest check's examples first
    judge_likes_it = np.full((12, 4), 1.0), np.zeros((12, 4))  # the judge scores every looped reply higher
    good = Evidence(0.85, 0.7, 0.93, 30, 60, 0.8, 0.66, 0.9)
    verdict = decide(*judge_likes_it, good, 5.0, 0.5, 20.0, guard).verdict
    assert verdict.verdict == "inconclusive" and "guard tripped" in verdict.reason
    assert "repetition" in verdict.reason and verdict.verdict != "promote"
