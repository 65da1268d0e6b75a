"""Serving: streamed generation, per-request params, LoRA adapters on one shared base, backpressure."""
from __future__ import annotations

import threading

import pytest

from rlhf.serving.policy_server import AdapterError, AdapterRef, Busy, GenParams, PolicyServer
from tests.conftest import make_adapter

BASE = AdapterRef(1)
HISTORY = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return [make_adapter(tiny_model_dir, root / f"a{i}", seed=10 + i) for i in range(2)]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    s = PolicyServer.load(str(tiny_model_dir), "cpu", "tiny", max_context_tokens=256)
    yield s
    s.close()


def greedy(n=12):
    return GenParams(max_new_tokens=n, temperature=0)


def test_stream_yields_deltas_that_make_the_reply(server):
    stream = server.stream("", HISTORY, BASE, greedy())
    parts = list(stream)
    assert len(parts) >= 2 and "".join(parts) == stream.text()
    assert 1 <= stream.n_tokens <= 12 and stream.first_token_at is not None


def test_greedy_is_deterministic_and_seeded_sampling_repeats(server):
    assert server.generate("", HISTORY, BASE, greedy()) == server.generate("", HISTORY, BASE, greedy())
    sampled = GenParams(max_new_tokens=12, temperature=1.0, top_p=1.0, seed=7)
    assert server.generate("", HISTORY, BASE, sampled) == server.generate("", HISTORY, BASE, sampled)


def test_max_new_tokens_is_respected(server):
    s = server.stream("", HISTORY, BASE, greedy(3))
    s.text()
    assert s.n_tokens <= 3


def test_adapters_change_outputs_and_base_stays_base(server, adapters, tiny_model_dir):
    base_before = server.generate("", HISTORY, BASE, greedy(16))
    outs = [server.generate("", HISTORY, AdapterRef(10 + i, path), greedy(16)) for i, path in enumerate(adapters)]
    base_after = server.generate("", HISTORY, BASE, greedy(16))
    assert base_before == base_after  # disable_adapter gives exactly the base
    assert outs[0] != base_before and outs[1] != base_before and outs[0] != outs[1]
    fresh = PolicyServer.load(str(tiny_model_dir), "cpu", "tiny", max_context_tokens=256)
    assert fresh.generate("", HISTORY, BASE, greedy(16)) == base_before
    fresh.close()
    assert {"p10", "p11"} <= set(server.loaded_adapters)


def test_concurrent_requests_on_different_adapters_do_not_mix(server, adapters):
    expected = {i: server.generate("", HISTORY, AdapterRef(10 + i, p), greedy(10)) for i, p in enumerate(adapters)}
    results, errors = {}, []

    def ask(k):
        i = k % 2
        try:
            results[k] = (i, server.generate("", HISTORY, AdapterRef(10 + i, adapters[i]), greedy(10)))
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    assert all(text == expected[i] for i, text in results.values())


def test_missing_or_corrupt_adapter_raises_adapter_error(server, tmp_path):
    with pytest.raises(AdapterError, match="missing"):
        server.generate("", HISTORY, AdapterRef(99, str(tmp_path / "nope")), greedy())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="cannot be loaded"):
        server.generate("", HISTORY, AdapterRef(98, str(bad)), greedy())
    assert server.generate("", HISTORY, BASE, greedy(4))  # still serving


def test_long_history_is_cut_to_the_context_limit(server):
    history = []
    for i in range(40):
        history += [{"role": "user", "content": f"question {i} " * 5}, {"role": "assistant", "content": "answer"}]
    history.append({"role": "user", "content": "last question"})
    ids = server.build_prompt("system", history)
    assert len(ids) <= 256
    assert "last question" in server.tokenizer.decode(ids)


def test_bad_params_are_refused():
    for bad in (GenParams(max_new_tokens=0), GenParams(temperature=-1), GenParams(top_p=1.5),
                GenParams(temperature=float("nan")), GenParams(seed=-1)):
        with pytest.raises(ValueError):
            bad.validated()
