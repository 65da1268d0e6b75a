"""Continuous batching: a batched reply is the reply each request gets alone (greedy and seeded sampling),
per-row settings and adapters hold inside one batch, cancelling or failing one row leaves the others alone,
and a full queue answers busy.

The model is a tiny random Llama with untied embeddings and a wide init: unlike a near-zero init (which just
repeats its input token) it writes different text for different prompts, so equal outputs mean something.
"""
from __future__ import annotations

import threading
import time

import pytest
import torch

from rlhf.serving.interface import Request
from rlhf.serving.loop import EngineLoop
from rlhf.serving.policy_server import AdapterRef, Busy, GenParams, PolicyServer, ReplyStream
from rlhf.serving.transformers.batch import DecodeBatch, keep_rows, merge
from rlhf.serving.transformers.engine import TransformersCore
from tests.conftest import make_adapter

TEXTS = ["Hi", "Tell me a long story about a dragon and a knight who became friends", "What is 2+2?",
         "Bonjour, ça va? 🙂 Dis-moi tout."]


def make_lively_model(target, tokenizer, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False, initializer_range=0.2, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def lively_dir(tmp_path_factory, tokenizer):
    return make_lively_model(tmp_path_factory.mktemp("lively"), tokenizer)


@pytest.fixture(scope="module")
def model(lively_dir):
    from rlhf.base_models import load_causal_lm

    return load_causal_lm(str(lively_dir), "cpu")


@pytest.fixture(scope="module")
def adapter_dirs(lively_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lively-adapters")
    return [make_adapter(lively_dir, root / f"a{i}", seed=20 + i, alpha=32) for i in range(2)]


@pytest.fixture(scope="module")
def peft_model(lively_dir, adapter_dirs):
    from peft import PeftModel

    from rlhf.base_models import load_causal_lm

    m = PeftModel.from_pretrained(load_causal_lm(str(lively_dir), "cpu"), adapter_dirs[0], adapter_name="a0")
    m.load_adapter(adapter_dirs[1], adapter_name="a1")
    return m.eval()


def prompt(tokenizer, text):
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"])


def greedy(n=24):
    return GenParams(max_new_tokens=n, temperature=0)


def make_engine(model, tokenizer, start=True, max_batch_size=32, queue_size=64, **core_kw) -> EngineLoop:
    """The transformers core behind the engine loop, in this process."""
    core = TransformersCore(model, tokenizer, "cpu", max_batch_size=max_batch_size, **core_kw)
    return EngineLoop(core, queue_size=queue_size, max_batch_size=max_batch_size, start=start)


def stall(engine: EngineLoop) -> threading.Event:
    """Hold the loop between two steps (a call that waits) until the returned event is set."""
    gate, inside = threading.Event(), threading.Event()
    threading.Thread(target=engine.call, args=(lambda: inside.set() or gate.wait(60),), daemon=True).start()
    assert inside.wait(30), "the loop never ran the stalling call"
    return gate


class Stats:
    """An engine's profile read as attributes (``stats.prefill_calls``)."""

    def __init__(self, profile: dict):
        self.__dict__.update(profile)


def together(model, tokenizer, specs, **engine_kw):
    """Submit every (ids, adapter, params) before the engine starts, so they share the first batch."""
    engine = make_engine(model, tokenizer, start=False, **engine_kw)
    streams = [ReplyStream() for _ in specs]
    for (ids, adapter, params), stream in zip(specs, streams):
        engine.submit(Request(ids, adapter, params, stream))
    engine.start()
    texts = [s.text() for s in streams]
    engine.close()
    return texts, streams, Stats(engine.profile())


def alone(model, tokenizer, spec):
    return together(model, tokenizer, [spec])[0][0]


def hf_generate(model, tokenizer, ids, n):
    """The reference: plain HF greedy generate, one request, no padding."""
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode([t for t in out[0, len(ids):].tolist() if t != tokenizer.eos_token_id],
                            skip_special_tokens=True)


def wait_until(predicate, what, limit=30.0):
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


# ---- pieces ------------------------------------------------------------------------------------
def test_merge_and_keep_rows_leave_each_row_as_it_was_alone(model, tokenizer):
    """Left padding + masks + per-row positions: a merged batch's next-token logits equal the solo ones."""
    ids = [prompt(tokenizer, t) for t in TEXTS[:3]]

    def solo_batch(row_ids):
        x = torch.tensor([row_ids])
        mask = torch.ones_like(x)
        with torch.inference_mode():
            out = model(input_ids=x, attention_mask=mask, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        return DecodeBatch([None], out.past_key_values, mask, torch.tensor([len(row_ids)]), nxt)

    def step(b):
        mask = torch.cat([b.mask, b.mask.new_ones((len(b), 1))], dim=1)
        with torch.inference_mode():
            return model(input_ids=b.last, attention_mask=mask, position_ids=b.positions[:, None],
                         past_key_values=b.cache, use_cache=True).logits[:, -1]

    singles = [solo_batch(i) for i in ids]
    expected = [step(solo_batch(i))[0] for i in ids]
    merged = merge(merge(singles[0], singles[1]), singles[2])
    assert merged.mask.shape == (3, max(map(len, ids))) and int(merged.mask.sum()) == sum(map(len, ids))
    got = step(merged)
    for row, exp in zip(got, expected):
        torch.testing.assert_close(row, exp, atol=1e-4, rtol=1e-4)
    merged = merge(merge(*[solo_batch(i) for i in ids[:2]]), solo_batch(ids[2]))
    kept = keep_rows(merged, [0, 2])  # the longest prompt (row 1) leaves: padding is cut
    assert kept.mask.shape[1] == max(len(ids[0]), len(ids[2]))
    got = step(kept)
    torch.testing.assert_close(got[0], expected[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1], expected[2], atol=1e-4, rtol=1e-4)


# ---- the engine ---------------------------------------------------------------------------------
def test_batched_greedy_replies_equal_unbatched_generate(model, tokenizer):
    ids = [prompt(tokenizer, t) for t in TEXTS]
    texts, streams, stats = together(model, tokenizer, [(i, None, greedy()) for i in ids])
    assert stats.prefill_calls == 1 and stats.max_rows == len(TEXTS)  # really one batch
    assert len(set(texts)) == len(TEXTS) and all(len(t) > 10 for t in texts)  # a meaningful comparison
    assert texts == [hf_generate(model, tokenizer, i, 24) for i in ids]
    assert all(s.first_token_at is not None and 1 <= s.n_tokens <= 24 for s in streams)


def test_a_long_reply_outgrows_the_cache_room_and_stays_exact(model, tokenizer):
    ids = prompt(tokenizer, TEXTS[0])
    texts, streams, _ = together(model, tokenizer, [(ids, None, greedy(100))])
    assert streams[0].n_tokens > 70  # past the 64 spare columns, so the buffer really grew
    assert texts[0] == hf_generate(model, tokenizer, ids, 100)


def test_prefill_budget_spreads_a_burst_over_steps(model, tokenizer):
    ids = [prompt(tokenizer, t) for t in TEXTS[:3]]
    texts, _, stats = together(model, tokenizer, [(i, None, greedy(30)) for i in ids],
                               max_prefill_tokens=max(map(len, ids)))  # room for one prompt per prefill
    assert stats.prefill_calls == 3 and stats.max_rows == 3  # later prompts joined the running batch
    assert texts == [hf_generate(model, tokenizer, i, 30) for i in ids]


def test_requests_joining_a_running_batch_get_their_solo_reply(model, tokenizer):
    ids = [prompt(tokenizer, t) for t in TEXTS]
    engine = make_engine(model, tokenizer)
    first = ReplyStream()
    engine.submit(Request(ids[0], None, greedy(40), first))
    it = iter(first)
    head = next(it)  # the first reply is decoding now: the next ones must join it between steps
    later = [ReplyStream() for _ in ids[1:]]
    for i, s in zip(ids[1:], later):
        engine.submit(Request(i, None, greedy(), s))
    texts = [head + "".join(it)] + [s.text() for s in later]
    engine.close()
    stats = Stats(engine.profile())
    assert stats.prefill_calls >= 2 and stats.max_rows >= 2
    assert texts == [hf_generate(model, tokenizer, ids[0], 40)] + [hf_generate(model, tokenizer, i, 24)
                                                                    for i in ids[1:]]


def test_per_request_settings_hold_inside_one_batch(model, tokenizer):
    a, b = prompt(tokenizer, TEXTS[1]), prompt(tokenizer, TEXTS[2])
    specs = [(a, None, greedy(5)), (a, None, greedy(30)),
             (b, None, GenParams(max_new_tokens=20, temperature=1.0, top_p=0.9, seed=3)),
             (b, None, GenParams(max_new_tokens=20, temperature=1.0, top_p=0.9, seed=4)),
             (b, None, GenParams(max_new_tokens=20, temperature=0.3, top_p=0.5, seed=3))]
    texts, streams, stats = together(model, tokenizer, specs)
    assert stats.max_rows == len(specs)
    assert streams[0].n_tokens <= 5 < streams[1].n_tokens
    assert texts[1].startswith(texts[0]) and len(texts[0]) < len(texts[1])
    assert len({texts[2], texts[3], texts[4]}) == 3  # seeds and temperatures differ, so replies do
    for spec, text in zip(specs, texts):
        assert text == alone(model, tokenizer, spec)  # seeded sampling too: each row has its own generator


def test_mixed_adapters_in_one_batch_equal_each_adapter_alone(peft_model, tokenizer):
    ids = prompt(tokenizer, TEXTS[1])
    specs = [(ids, None, greedy()), (ids, "a0", greedy()), (ids, "a1", greedy()), (ids, "a0", greedy(12))]
    texts, _, stats = together(peft_model, tokenizer, specs)
    assert stats.max_rows == 4
    assert len({texts[0], texts[1], texts[2]}) == 3  # the adapters really change the reply
    assert texts[1].startswith(texts[3])
    for spec, text in zip(specs, texts):
        assert text == alone(peft_model, tokenizer, spec)  # alone = set_adapter / disable_adapter path


def test_cancelling_one_client_does_not_disturb_the_others(model, tokenizer):
    ids = [prompt(tokenizer, t) for t in TEXTS[:3]]
    engine = make_engine(model, tokenizer, start=False)
    streams = [ReplyStream() for _ in ids]
    for i, s in zip(ids, streams):
        engine.submit(Request(i, None, greedy(40), s))
    engine.start()
    it = iter(streams[1])
    next(it)
    streams[1].cancel()
    rest = list(it)  # the cancelled stream ends (promptly, well before its 40 tokens)
    others = [streams[0].text(), streams[2].text()]
    engine.close()
    assert streams[1].n_tokens < 40 and streams[1].finished_at is not None and isinstance(rest, list)
    assert others == [hf_generate(model, tokenizer, ids[0], 40), hf_generate(model, tokenizer, ids[2], 40)]


def test_a_failing_request_fails_alone_and_the_engine_keeps_serving(model, tokenizer):
    engine = make_engine(model, tokenizer)
    bad = ReplyStream()
    engine.submit(Request(prompt(tokenizer, "hi"), "not-loaded", greedy(), bad))
    with pytest.raises(KeyError, match="not-loaded"):
        bad.text()
    good = ReplyStream()
    ids = prompt(tokenizer, TEXTS[2])
    engine.submit(Request(ids, None, greedy(), good))
    assert good.text() == hf_generate(model, tokenizer, ids, 24)
    engine.close()


SYSTEM = "You are a terse assistant who answers in one line."


def with_system(tokenizer, text):
    """Prompt ids with SYSTEM first, and how many leading ids are the system part alone."""
    ids = list(tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                                             add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    head = list(tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}], tokenize=True,
                                              return_dict=True)["input_ids"])
    assert ids[:len(head)] == head
    return ids, len(head)


def test_shared_prefix_kv_is_computed_once_and_reused_exactly(model, tokenizer):
    engine = make_engine(model, tokenizer, start=False)
    prompts = [with_system(tokenizer, t) for t in TEXTS]
    plain = prompt(tokenizer, TEXTS[2])  # no system prompt: no prefix, shares the batch all the same

    def serve(specs):
        streams = [ReplyStream() for _ in specs]
        for (ids, n, params), stream in zip(specs, streams):
            engine.submit(Request(ids, None, params, stream, prefix_len=n))
        return streams

    first = serve([(ids, n, greedy()) for ids, n in prompts[:2]])  # a miss: the prefix is computed and kept
    engine.start()
    texts = [s.text() for s in first]
    assert engine.profile()["prefix_hits"] == 0
    # Hits, with suffixes of different lengths and a row without prefix, in one prefill: [pad, prefix, pad, suffix].
    second = serve([(ids, n, greedy()) for ids, n in prompts] + [(plain, 0, greedy())])
    texts2 = [s.text() for s in second]
    engine.close()
    stats = Stats(engine.profile())
    assert stats.prefix_hits == len(TEXTS) and stats.prefix_tokens_saved == len(TEXTS) * prompts[0][1]
    expected = [hf_generate(model, tokenizer, ids, 24) for ids, _ in prompts]
    assert texts == expected[:2] and texts2 == expected + [hf_generate(model, tokenizer, plain, 24)]
    assert len(set(texts2)) == len(texts2)


def test_closing_ends_waiting_and_running_replies_with_an_error(model, tokenizer):
    engine = make_engine(model, tokenizer, max_batch_size=1)
    ids = prompt(tokenizer, TEXTS[1])
    streams = [ReplyStream() for _ in range(3)]
    engine.submit(Request(ids, None, greedy(200), streams[0]))
    wait_until(lambda: engine.load().running == 1, "the first reply runs")
    gate = stall(engine)  # the loop holds between two steps; the others wait in the queue
    for s in streams[1:]:
        engine.submit(Request(ids, None, greedy(200), s))
    engine.close(timeout=0)
    gate.set()
    engine.thread.join(timeout=30)
    assert not engine.thread.is_alive()
    for s in streams:
        with pytest.raises(RuntimeError, match="shutting down"):
            s.text()


# ---- through PolicyServer ------------------------------------------------------------------------
HISTORY = [{"role": "user", "content": TEXTS[1]}]


def test_backpressure_answers_busy_while_the_batch_is_full(model, tokenizer):
    server = PolicyServer.from_model(model, tokenizer, "cpu", "lively", queue_size=1, max_batch_size=1)
    try:
        first = server.stream("", HISTORY, AdapterRef(1), greedy(60))
        wait_until(lambda: server.engine_load().running == 1, "the first reply runs")
        gate = stall(server.engine)  # the loop holds between two steps, as behind a slow adapter load
        second = server.stream("", HISTORY, AdapterRef(1), greedy(60))  # the one queue slot
        with pytest.raises(Busy) as info:
            server.stream("", HISTORY, AdapterRef(1), greedy(60))
        assert info.value.retry_after >= 1 and "retry in" in str(info.value)
        gate.set()
        assert first.text() == second.text() != ""  # both served once the engine moves again
    finally:
        server.close()


def test_server_reuses_the_system_prompt_prefix(model, tokenizer):
    server = PolicyServer.from_model(model, tokenizer, "cpu", "lively")
    try:
        history = [{"role": "user", "content": TEXTS[3]}]
        ids = server.build_prompt(SYSTEM, history)
        assert server.shared_prefix_len(SYSTEM, ids) == with_system(tokenizer, TEXTS[3])[1]
        assert server.shared_prefix_len("", ids) == 0 and server.shared_prefix_len("Other.", ids) == 0
        replies = [server.generate(SYSTEM, history, AdapterRef(1), greedy()) for _ in range(2)]
        assert server.engine.profile()["prefix_hits"] == 1  # the second reply read the first one's prefix KV
        assert replies[0] == replies[1] == hf_generate(model, tokenizer, ids, 24)
    finally:
        server.close()


def test_loading_an_adapter_while_a_batch_runs_is_safe(lively_dir, tokenizer, adapter_dirs):
    from rlhf.base_models import load_causal_lm

    server = PolicyServer.from_model(load_causal_lm(str(lively_dir), "cpu"), tokenizer, "cpu", "lively")
    try:
        expected = server.generate("", HISTORY, AdapterRef(1), greedy(60))
        running = server.stream("", HISTORY, AdapterRef(1), greedy(60))
        it = iter(running)
        head = next(it)
        loader = threading.Thread(target=server.ensure_adapter, args=(AdapterRef(7, adapter_dirs[0]),))
        loader.start()  # wraps the base into a PeftModel between two decode steps
        text = head + "".join(it)
        loader.join()
        assert "p7" in server.loaded_adapters and hasattr(server.model, "peft_config")
        assert text == expected
        adapted = server.generate("", HISTORY, AdapterRef(7, adapter_dirs[0]), greedy(60))
        assert adapted != expected and server.generate("", HISTORY, AdapterRef(1), greedy(60)) == expected
    finally:
        server.close()
