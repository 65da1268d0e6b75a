"""The reward-hacking guard: its measures by hand, its verdicts, and relevance judged by a real base model."""
from __future__ import annotations

import math

import pytest

from rlhf.config import GateConfig
from rlhf.jobs.guard import distinct_n, guard_report, relevance, repetition, run_guard

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
    assert len(report["examples"]) == 3
    assert all(e["candidate"] == SORRY and e["check"] == "off_prompt" and e["relevance"] == 0.05
               for e in report["examples"])
    assert report["examples"][0]["prompt"].startswith("question") and report["examples"][0]["active"] in ANSWERS


def test_length_repetition_and_kl_trip():
    longer = [a + " " + a + " " + a for a in ANSWERS]
    assert "length" in guard_report(PROMPTS, longer, ANSWERS, 1.0, CFG)["tripped"]
    loops = [a + " and again and again and again and again" for a in ANSWERS]
    assert "repetition" in guard_report(PROMPTS, loops, ANSWERS, 1.0, CFG)["tripped"]
    assert guard_report(PROMPTS, ANSWERS, ANSWERS, CFG.guard_max_kl + 1, CFG)["tripped"] == ["kl"]
    assert "off_prompt" not in guard_report(PROMPTS, ANSWERS, ANSWERS, 1.0, CFG)["checks"]  # no relevance given


def test_relevance_runs_on_a_real_tiny_model(tiny_model_dir):
    from rlhf.models import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm(str(tiny_model_dir), "cpu"), load_tokenizer(str(tiny_model_dir))
    rel = relevance(model, tok, PROMPTS[:3], ANSWERS[:3])
    assert len(rel) == 3 and all(math.isfinite(r) for r in rel)
    off = run_guard(model, tok, PROMPTS[:3], ANSWERS[:3], ANSWERS[:3], 1.0, GateConfig(guard=False))
    assert off["tripped"] == [] and off["off"]


@pytest.mark.slow
def test_the_base_model_tells_answers_from_deflections(smol_dir):
    """SmolLM2's own likelihoods: its pool answers are far likelier after their prompt than after another one; a
    polite deflection is about as likely after any prompt."""
    from rlhf.simulate.pool import load_pool
    from rlhf.models import load_causal_lm, load_tokenizer

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
