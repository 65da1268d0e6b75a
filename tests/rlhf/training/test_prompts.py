"""PPO prompts: Store states (dedupe, low-rated), prompt files, the starter set, eval split, replay buffer."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from rlhf.config import load_config
from rlhf.training.prompts import (STARTER_PROMPTS, PromptBuffer, PromptState, build_prompt_sets, is_low_rating,
                          load_prompt_file, prompt_sets, split_eval, state_key, store_states)


def chat(store, turns, rating=None, annotator="ann"):
    """A conversation with alternating user/assistant turns (the last one a reply); optionally rate the reply."""
    conv = store.create_conversation("assistant", annotator=annotator, messages=[{"role": "user", "content": turns[0]}])
    parent = store.leaf(conv.id)
    reply = None
    for i, text in enumerate(turns[1:], 1):
        if i % 2:
            reply = store.record_reply(parent.id, text, policy_id=None)
            parent = reply
        else:
            parent = store.append_messages(conv.id, [{"role": "user", "content": text}])[-1]
    if rating is not None:
        store.record_rating(reply.id, annotator=annotator, **rating)
    return conv, reply


def by_last_user(states):
    return {s.messages[-1]["content"]: s for s in states}


def test_states_end_with_user_turn_and_carry_system_prompt_and_history(store):
    chat(store, ["Hi", "Hello!", "What is 2+2?", "4"])
    system = store.get_agent("assistant").system_prompt
    states = by_last_user(store_states(store.feedback_rows("assistant")))
    assert set(states) == {"Hi", "What is 2+2?"}
    assert [m["role"] for m in states["What is 2+2?"].messages] == ["system", "user", "assistant", "user"]
    assert states["What is 2+2?"].messages[0]["content"] == system
    assert [m["content"] for m in states["What is 2+2?"].messages[1:]] == ["Hi", "Hello!", "What is 2+2?"]


def test_state_key_is_the_context_key_the_store_gives_a_reply(store):
    _, reply = chat(store, ["Hi", "Hello!", "Tell me a joke", "Knock knock"])
    system, history = store.state_for(reply.parent_id)
    assert state_key([{"role": "system", "content": system}, *history]) == reply.context_key


def test_regenerations_and_repeated_conversations_dedupe_to_one_state(store):
    conv, reply = chat(store, ["Same question", "First answer"])
    store.record_reply(reply.parent_id, "A regenerated answer", policy_id=None)
    chat(store, ["Same question", "Another conversation's answer"])
    states = store_states(store.feedback_rows("assistant"))
    assert [s.messages[-1]["content"] for s in states] == ["Same question"]


@pytest.mark.parametrize("rating, low", [
    ({"thumb": -1}, True), ({"score": 2}, True), ({"score": 1}, True), ({"flags": ["Unsafe"]}, True),
    ({"flags": ["Inaccurate"]}, True), ({"thumb": 1}, False), ({"score": 3}, False),
    ({"flags": ["Off-topic"]}, False), ({"note": "meh"}, False)])
def test_low_rated_contexts(store, rating, low):
    chat(store, ["Question?", "Answer."], rating=rating)
    (state,) = store_states(store.feedback_rows("assistant"))
    assert state.low_rated is low


def test_low_rating_is_the_latest_value_and_ignores_excluded_annotators(store):
    _, reply = chat(store, ["Corrected?", "Yes."], rating={"thumb": -1})
    store.record_rating(reply.id, annotator="ann", thumb=1)  # the annotator changed their mind
    _, other = chat(store, ["Spam?", "No."], rating={"thumb": -1}, annotator="troll")
    store.set_annotator_excluded("troll", True)
    states = by_last_user(store_states(store.feedback_rows("assistant")))
    assert not states["Corrected?"].low_rated and not states["Spam?"].low_rated


def test_a_low_rated_regeneration_marks_the_context_and_both_bad_counts(store):
    _, reply = chat(store, ["Q1", "good"], rating={"thumb": 1})
    sibling = store.record_reply(reply.parent_id, "bad", policy_id=None)
    store.record_rating(sibling.id, annotator="ann", score=1)
    _, r2 = chat(store, ["Q2", "meh"])
    r2b = store.record_reply(r2.parent_id, "also meh", policy_id=None)
    store.record_comparison(r2.id, r2b.id, "both_bad", annotator="ann")
    states = by_last_user(store_states(store.feedback_rows("assistant")))
    assert states["Q1"].low_rated and states["Q2"].low_rated


def test_prompt_files_jsonl_and_txt(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join([
        json.dumps({"prompt": "Plain prompt"}),
        json.dumps({"prompt": "Own system", "system": "Be terse."}),
        json.dumps({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                                 {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}),
        "", "# a comment"]))
    states = load_prompt_file(jsonl, system_prompt="Default system.")
    assert [s.messages for s in states] == [
        ({"role": "system", "content": "Default system."}, {"role": "user", "content": "Plain prompt"}),
        ({"role": "system", "content": "Be terse."}, {"role": "user", "content": "Own system"}),
        ({"role": "system", "content": "S"}, {"role": "user", "content": "a"},
         {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"})]
    txt = tmp_path / "p.txt"
    txt.write_text("one\n\ntwo\n")
    assert [s.as_messages() for s in load_prompt_file(txt)] == [[{"role": "user", "content": "one"}],
                                                                [{"role": "user", "content": "two"}]]


@pytest.mark.parametrize("line, problem", [
    ("{not json", "not JSON"), (json.dumps({"nothing": 1}), "expected 'prompt'"),
    (json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
     "last message must be a user turn"),
    (json.dumps({"messages": [{"role": "robot", "content": "a"}]}), "non-empty list")])
def test_bad_prompt_files_name_the_line(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=problem) as err:
        load_prompt_file(path)
    assert "bad.jsonl:2" in str(err.value)


def test_starter_set_is_varied_and_distinct():
    rows = [json.loads(line) for line in STARTER_PROMPTS.read_text().splitlines()]
    assert len(rows) >= 50
    assert len({r["prompt"] for r in rows}) == len(rows)
    kinds = Counter(r["kind"] for r in rows)
    assert set(kinds) >= {"question", "task", "advice", "coding", "math", "chat"} and min(kinds.values()) >= 5


def states_named(names, source="file", low=()):
    return [PromptState(state_key([{"role": "user", "content": n}]), ({"role": "user", "content": n},),
                        n in low, source) for n in names]


def test_eval_split_is_deterministic_disjoint_and_stable_as_the_store_grows():
    files = states_named([f"f{i}" for i in range(20)])
    train, held = split_eval(files, 5, seed=0)
    assert len(held) == 5 and not {s.key for s in train} & {s.key for s in held}
    assert len(train) + len(held) == 20
    # Order does not matter, new Store states do not move the eval set, and the seed does.
    more = states_named([f"s{i}" for i in range(50)], source="store")
    assert {s.key for s in split_eval(list(reversed(files)) + more, 5, seed=0)[1]} == {s.key for s in held}
    assert {s.key for s in split_eval(files, 5, seed=1)[1]} != {s.key for s in held}
    # Never everything: at least one prompt is left for training.
    assert len(split_eval(states_named(["a", "b"]), 8)[0]) == 1


def test_buffer_mixes_adversarial_prompts_at_the_configured_ratio():
    states = states_named([f"n{i}" for i in range(30)] + [f"bad{i}" for i in range(5)],
                          low={f"bad{i}" for i in range(5)})
    buffer = PromptBuffer(states, adversarial_ratio=0.25, seed=0)
    for step in (1, 2, 7):
        batch = [p[-1]["content"] for p in buffer.batch(step, 8)]
        assert sum(b.startswith("bad") for b in batch) == 2 and len(batch) == 8
    assert all(not p[-1]["content"].startswith("bad") for p in PromptBuffer(states, 0.0).batch(1, 8))


def test_buffer_covers_every_prompt_before_repeating_and_is_a_function_of_step_and_rank():
    states = states_named([f"p{i}" for i in range(12)])
    buffer = PromptBuffer(states, seed=3)
    first_epoch = [p[-1]["content"] for step in (1, 2, 3) for p in buffer.batch(step, 4)]
    assert sorted(first_epoch) == sorted(f"p{i}" for i in range(12))
    assert buffer.batch(5, 4) == PromptBuffer(states, seed=3).batch(5, 4)  # a resumed run draws the same
    rank0, rank1 = buffer.batch(1, 4, rank=0, world_size=2), buffer.batch(1, 4, rank=1, world_size=2)
    assert not {p[-1]["content"] for p in rank0} & {p[-1]["content"] for p in rank1}


def test_held_out_prompts_never_enter_training(store, tmp_path):
    chat(store, ["Stored question", "Stored answer"], rating={"thumb": -1})
    config = load_config(env={}, overrides=["ppo.eval_prompts=8", "ppo.adversarial_ratio=0.5"])
    buffer, eval_prompts = prompt_sets(store, config, "assistant")
    assert len(eval_prompts) == 8
    held = {state_key(p) for p in eval_prompts}
    seen = {state_key(p) for step in range(1, 40) for p in buffer.batch(step, 8)}
    assert not held & seen
    assert len(seen) == len(buffer)  # every training prompt was drawn
    system = store.get_agent("assistant").system_prompt
    assert all(p[0] == {"role": "system", "content": system} for p in eval_prompts)
    assert any(p[-1]["content"] == "Stored question" for step in (1, 2) for p in buffer.batch(step, 8))


def test_build_prompt_sets_without_store_uses_the_starter_set():
    train, held = build_prompt_sets(None, "", n_eval=4)
    assert len(held) == 4 and len(train) >= 46 and all(s.source == "file" for s in train)


def test_is_low_rating_on_folded_values():
    assert is_low_rating({"thumb": -1}) and not is_low_rating({"thumb": 1, "flags": []})


def test_a_small_adversarial_pool_does_not_fill_the_batch_with_copies():
    states = states_named([f"n{i}" for i in range(30)] + ["bad"], low={"bad"})
    batch = [p[-1]["content"] for p in PromptBuffer(states, adversarial_ratio=0.5).batch(1, 8)]
    assert batch.count("bad") == 1 and len(set(batch)) == 8
