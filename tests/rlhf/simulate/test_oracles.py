"""The oracles `rlhf-studio simulate` plays, and the shipped pool's split they vote and judge on."""
from __future__ import annotations

from rlhf.simulate.annotators import vote_and_eval_prompts
from rlhf.simulate.oracles import ORACLES, concrete_hits, distinct_2


def test_oracles_pick_what_they_prefer():
    assert ORACLES["concise"]("q", "two words", "a much longer reply with many more words") == "a"
    assert ORACLES["concise"]("q", "", "anything") == "b"  # an empty reply always loses
    assert ORACLES["polite"]("q", "Thank you, happy to help!", "No.") == "a"
    assert ORACLES["no-lists"]("q", "- one\n- two", "Prose only.") == "b"
    assert ORACLES["concrete"]("q", "Bake for 30 minutes at 200 degrees.", "Bake it until done.") == "a"
    assert concrete_hits("First, mix 2 cups. Then wait 10 minutes.") >= 4


def test_distinct_2_falls_with_repetition():
    assert distinct_2(["a b c d"]) == 1.0 and distinct_2(["a b a b a b"]) < 0.5 and distinct_2([]) == 0.0


def test_vote_and_eval_prompts_do_not_overlap():
    train, held = vote_and_eval_prompts()
    assert len(held) == 160 and train and not set(train) & set(held)


def test_the_four_newer_kinds_format_register_content_safety():
    assert ORACLES["paragraphed"]("q", "One.\n\nTwo.", "One. Two.") == "a"
    assert ORACLES["casual"]("q", "It is fine. However, it is late.", "It's fine, but it's late.") == "b"
    assert ORACLES["examples"]("q", "Fruit, for example apples.", "Fruit.") == "a"
    assert ORACLES["careful"]("q", "Take it.", "Consult a doctor first; it may interact.") == "b"
    assert all(ORACLES[name]("q", "same", "same") == "tie" for name in ("paragraphed", "casual", "examples", "careful"))
