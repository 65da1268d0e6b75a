"""Batched evaluation: every version's eval replies in one continuous batch are the replies each prompt gets
one at a time (greedy), seeded samples do not depend on the batch, and the batched log-probs match one by one."""
from __future__ import annotations

import contextlib

import pytest
import torch

from rlhf.prompting import encode_prompt
from rlhf.retrain.evaluation import evaluate_versions, generate_replies, sequence_logprobs
from tests.conftest import make_adapter
from tests.rlhf.serving.transformers.test_engine import make_lively_model

PROMPTS = [[{"role": "user", "content": t}] for t in (
    "Hi", "Tell me a long story about a dragon and a knight who became friends", "What is 2+2?",
    "Bonjour, ça va?", "Name three colours.")]


@pytest.fixture(scope="module")
def peft_model(tmp_path_factory, tokenizer):
    from peft import PeftModel

    from rlhf.base_models import load_causal_lm

    base_dir = make_lively_model(tmp_path_factory.mktemp("eval-lively"), tokenizer)
    root = tmp_path_factory.mktemp("eval-adapters")
    model = PeftModel.from_pretrained(load_causal_lm(str(base_dir), "cpu"),
                                      make_adapter(base_dir, root / "cand", seed=31, alpha=32), adapter_name="cand")
    model.load_adapter(make_adapter(base_dir, root / "active", seed=32, alpha=32), adapter_name="active")
    return model.eval()


def one_at_a_time(model, tokenizer, messages, adapter, n):
    """The reference: plain HF greedy generate, one prompt, no padding, the adapter set alone."""
    ids = encode_prompt(tokenizer, messages)
    if adapter is not None:
        model.set_adapter(adapter)
    with model.disable_adapter() if adapter is None else contextlib.nullcontext(), torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    reply = out[0, len(ids):].tolist()
    cut = next((k for k, t in enumerate(reply) if t == tokenizer.eos_token_id), len(reply))
    return tokenizer.decode(reply[:cut], skip_special_tokens=True), reply[:cut]


def test_batched_greedy_eval_replies_equal_one_at_a_time(peft_model, tokenizer):
    cand, active, base = generate_replies(peft_model, tokenizer, PROMPTS, ["cand", "active", None], 20, 0.0, seed=0)
    for replies, adapter in ((cand, "cand"), (active, "active"), (base, None)):
        solo = [one_at_a_time(peft_model, tokenizer, p, adapter, 20) for p in PROMPTS]
        assert replies.texts == [text for text, _ in solo]
        assert replies.token_ids == [ids for _, ids in solo]
        assert replies.prompt_ids == [encode_prompt(tokenizer, p) for p in PROMPTS]
    assert len(set(cand.texts)) == len(PROMPTS) and cand.texts != active.texts != base.texts  # a real comparison


def test_seeded_samples_do_not_depend_on_the_batch(peft_model, tokenizer):
    (together,) = generate_replies(peft_model, tokenizer, PROMPTS, ["cand"], 12, 1.0, seed=7)
    for i, prompt in enumerate(PROMPTS):
        (alone,) = generate_replies(peft_model, tokenizer, [prompt], ["cand"], 12, 1.0, seed=7 + i)
        assert alone.texts == [together.texts[i]] and alone.token_ids == [together.token_ids[i]]
    (other,) = generate_replies(peft_model, tokenizer, PROMPTS, ["cand"], 12, 1.0, seed=8)
    assert other.texts != together.texts


def test_batched_logprobs_match_single_forwards(peft_model, tokenizer):
    (s,) = generate_replies(peft_model, tokenizer, PROMPTS, ["cand"], 10, 1.0, seed=3)
    batched = sequence_logprobs(peft_model, s.prompt_ids, s.token_ids, "cand", batch_size=4)
    single = sequence_logprobs(peft_model, s.prompt_ids, s.token_ids, "cand", batch_size=1)
    torch.testing.assert_close(torch.tensor(batched), torch.tensor(single), rtol=1e-4, atol=1e-3)
    assert all(lp < 0 for lp in batched)


def test_evaluate_versions_takes_a_measured_kl_or_measures_it(peft_model, tokenizer):
    scorer = lambda prompts, replies: [float(len(r)) for r in replies]  # noqa: E731
    given = evaluate_versions(peft_model, tokenizer, PROMPTS, scorer, "cand", "active", 12, 1.0, kl_to_base=0.25)
    measured = evaluate_versions(peft_model, tokenizer, PROMPTS, scorer, "cand", "active", 12, 1.0)
    assert given.kl_to_base == 0.25 and measured.kl_to_base != 0.25
    assert given.win_rate == measured.win_rate and len(given.samples) == len(PROMPTS)
    assert [s["reward"] for s in given.samples] == [float(len(s["reply"])) for s in given.samples]


def test_the_compared_replies_report_their_progress(peft_model, tokenizer):
    """The eval phase's progress bar moves while its replies are generated (it stood at 87 % for minutes)."""
    heard = []
    scorer = lambda prompts, replies: [0.0] * len(replies)  # noqa: E731
    evaluate_versions(peft_model, tokenizer, PROMPTS, scorer, "cand", "active", 6, 1.0, kl_to_base=0.1,
                      on_reply=lambda done, total: heard.append((done, total)))
    n = 2 * len(PROMPTS)  # candidate and active
    assert heard == [(k, n) for k in range(1, n + 1)]


@pytest.mark.parametrize("whole_sentences", [True, False])
def test_a_cut_eval_reply_is_scored_on_its_whole_sentences(monkeypatch, whole_sentences):
    import rlhf.retrain.evaluation as evaluation
    from rlhf.training.generation import Replies

    text = "Tea is hot. It is bre"
    # The candidate's reply filled max_new_tokens (4 ids: cut); the active one stopped at 3 (finished).
    monkeypatch.setattr(evaluation, "generate_replies", lambda *a, **k: [
        Replies([text], [[1, 2, 3, 4]], [[0]]), Replies([text], [[1, 2, 3]], [[0]])])
    scorer = lambda prompts, replies: [float(len(r)) for r in replies]  # noqa: E731
    report = evaluate_versions(None, None, PROMPTS[:1], scorer, "cand", "active", 4, kl_to_base=0.0,
                               whole_sentences=whole_sentences)
    cand, act = report.samples[0], report.active_samples[0]
    assert cand["reply"] == act["reply"] == act["read"] == text  # shown as written; a finished reply read whole
    assert cand["read"] == ("Tea is hot." if whole_sentences else text)
    assert (cand["reward"], act["reward"]) == (float(len(cand["read"])), float(len(text)))


def test_the_compared_replies_are_greedy_or_sampled_at_the_reply_temperature(peft_model, tokenizer):
    """``eval.reply_temperature``: the gate can read the replies as people are served them (sampled), or greedy."""
    scorer = lambda prompts, replies: [0.0] * len(replies)  # noqa: E731
    judged = lambda t: evaluate_versions(peft_model, tokenizer, PROMPTS, scorer, "cand", "active", 12, 1.0,  # noqa
                                         seed=5, kl_to_base=0.0, reply_temperature=t)
    greedy, served = judged(0.0), judged(0.7)
    cand, active = generate_replies(peft_model, tokenizer, PROMPTS, ["cand", "active"], 12, 0.7, seed=5)
    assert [s["reply"] for s in served.samples] == cand.texts
    assert [s["reply"] for s in served.active_samples] == active.texts
    solo = [one_at_a_time(peft_model, tokenizer, p, "cand", 12)[0] for p in PROMPTS]
    assert [s["reply"] for s in greedy.samples] == solo != cand.texts
