"""The engine seam's contract, run against every engine on both sides of the process line: what PolicyServer,
the vote queue and the evaluation rely on, whatever decodes underneath (transformers on the tiny torch model;
llama.cpp on the same model converted to GGUF), in the app's process or in an engine process of its own.
llama.cpp tests skip only when llama-cpp-python is not installed (`make setup` builds it; CI has it)."""
from __future__ import annotations

import threading
import time

import pytest

from rlhf.cpu import CpuBudget, plan_threads
from rlhf.serving.interface import AdapterError
from rlhf.serving.llama_cpp.spec import llama_cpp_installed
from rlhf.serving.policy_server import AdapterRef, Busy, GenParams, PolicyServer
from tests.conftest import make_adapter

LLAMA = pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (`make setup`)")
SLOW = pytest.mark.slow  # starts an engine process or loads llama.cpp: the full suite only (make test-fast < 60 s)
ENGINES = ["transformers", pytest.param("llama_cpp", marks=[LLAMA, SLOW])]
SETUPS = [("transformers", "thread"), pytest.param(("transformers", "process"), marks=SLOW),
          pytest.param(("llama_cpp", "thread"), marks=[LLAMA, SLOW]),
          pytest.param(("llama_cpp", "process"), marks=[LLAMA, SLOW])]
BASE = AdapterRef(1)
HISTORY = [{"role": "user", "content": "Say something."}]


def make_server(kind: str, model_dir, data_dir, isolation: str = "thread", **kw) -> PolicyServer:
    return PolicyServer.load(str(model_dir), "cpu", "tiny", max_context_tokens=256, engine=kind,
                             data_dir=str(data_dir), isolation=isolation, **kw)


@pytest.fixture(scope="module", params=SETUPS, ids=lambda p: "-".join(p))
def server(request, tiny_model_dir, tmp_path_factory):
    kind, isolation = request.param
    s = make_server(kind, tiny_model_dir, tmp_path_factory.mktemp(f"data-{kind}"), isolation)
    yield s
    s.close()


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("contract-adapters")
    return [make_adapter(tiny_model_dir, root / f"a{i}", seed=20 + i) for i in range(2)]


def greedy(n=12):
    return GenParams(max_new_tokens=n, temperature=0)


def wait_until(predicate, what, limit=60.0):
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def test_a_stream_yields_the_deltas_of_its_reply_and_its_token_ids(server):
    stream = server.stream("", HISTORY, BASE, greedy(16))
    parts = list(stream)
    assert "".join(parts) == stream.text() and stream.first_token_at is not None
    assert 1 <= stream.n_tokens <= 16 and len(stream.token_ids) == stream.n_tokens
    assert server.tokenizer.decode(stream.token_ids, skip_special_tokens=True).startswith(stream.text())


def test_greedy_repeats_seeded_sampling_repeats_and_seeds_differ(server):
    assert server.generate("", HISTORY, BASE, greedy()) == server.generate("", HISTORY, BASE, greedy())
    sampled = [server.generate("", HISTORY, BASE, GenParams(max_new_tokens=24, temperature=1.0, top_p=1.0, seed=s))
               for s in (7, 7, 8)]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]


def test_max_new_tokens_is_respected(server):
    s = server.stream("", HISTORY, BASE, greedy(3))
    s.text()
    assert 1 <= s.n_tokens <= 3


def test_adapters_load_without_restart_change_replies_and_leave_the_base_as_it_was(server, adapters):
    before = server.generate("", HISTORY, BASE, greedy(16))
    outs = [server.generate("", HISTORY, AdapterRef(20 + i, p), greedy(16)) for i, p in enumerate(adapters)]
    assert server.generate("", HISTORY, BASE, greedy(16)) == before
    assert outs[0] != before and outs[1] != before and outs[0] != outs[1]
    assert {"p20", "p21"} <= set(server.loaded_adapters)
    server.unload_adapter(AdapterRef(21, adapters[1]))
    assert "p21" not in server.loaded_adapters
    assert server.generate("", HISTORY, AdapterRef(21, adapters[1]), greedy(16)) == outs[1]  # loads again


def test_a_broken_adapter_is_refused_with_the_reason(server, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{not json")
    (bad / "adapter_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(AdapterError, match="policy 66"):
        server.stream("", HISTORY, AdapterRef(66, str(bad)), greedy())
    assert "p66" not in server.loaded_adapters


def test_concurrent_requests_decode_together_and_each_gets_its_reply(server):
    alone = [server.generate("", [{"role": "user", "content": f"Count to {i}."}], BASE, greedy(20)) for i in range(4)]
    streams = [server.stream("", [{"role": "user", "content": f"Count to {i}."}], BASE, greedy(20)) for i in range(4)]
    together = [s.text() for s in streams]
    assert all(together) and server.engine.profile()["max_rows"] >= 2
    assert sum(a == b for a, b in zip(alone, together)) >= 3  # a kernel's rounding may flip a near-tie once


def test_cancel_stops_one_reply_and_the_engine_goes_idle(server):
    long = server.stream("", HISTORY, BASE, GenParams(max_new_tokens=400, temperature=1.0, seed=3))
    other = server.stream("", HISTORY, BASE, greedy(8))
    wait_until(lambda: long.n_tokens > 0, "the long reply started")
    long.cancel()
    long.text()
    assert long.n_tokens < 400 and other.text() is not None
    wait_until(lambda: server.engine_load().idle, "the engine is idle again")


def test_engine_load_counts_running_and_submitted(server):
    before = server.engine_load()
    s = server.stream("", HISTORY, BASE, GenParams(max_new_tokens=200, temperature=1.0, seed=1))
    wait_until(lambda: server.engine_load().running == 1, "the reply is running")
    assert server.engine_load().submitted == before.submitted + 1 and not server.engine_load().idle
    s.cancel()
    s.text()


def test_the_server_says_when_it_is_idle_and_which_requests_are_not_ours(server):
    """What the vote queue's refill asks (never the engine): idle, and replies that are not its own."""
    wait_until(server.idle, "idle before")
    mark = server.requests_seen()
    mine = server.stream("", HISTORY, BASE, GenParams(max_new_tokens=200, temperature=1.0, seed=1))
    wait_until(lambda: not server.idle(), "busy with our reply")
    assert server.others(mark, [mine]) == (0, 0)
    chat = server.stream("", HISTORY, BASE, GenParams(max_new_tokens=200, temperature=1.0, seed=2))
    arrived, _ = server.others(mark, [mine])
    assert arrived == 1 and server.requests_seen() == mark + 2
    for s in (mine, chat):
        s.cancel()
        s.text()
    wait_until(server.idle, "idle after")


def _request(server, adapter):
    from rlhf.serving.interface import Request
    from rlhf.serving.policy_server import ReplyStream

    stream = ReplyStream()
    return Request(server.build_prompt("", HISTORY), adapter, greedy(), stream)


def test_unknown_adapter_request_gets_an_error(server):
    req = _request(server, "never-loaded")
    server.engine.submit(req)
    with pytest.raises(KeyError):
        req.stream.text()
    assert server.generate("", HISTORY, BASE, greedy(4)) is not None  # the engine serves on


def test_a_shared_system_prompt_is_computed_once(server):
    before = server.engine.profile().get("prefix_hits", 0)
    for q in ("Hi.", "Hello."):
        server.generate("You are a terse assistant.", [{"role": "user", "content": q}], BASE, greedy(4))
    assert server.engine.profile()["prefix_hits"] >= before + 1


def test_threads_follow_the_cpu_budget(server):
    budget = CpuBudget(plan_threads(4, job_threads=1))
    server.use_budget(budget)
    try:
        server.generate("", HISTORY, BASE, greedy(2))
        wait_until(lambda: server.engine.threads == 4, "4 threads while no job runs")
        budget.job_started()
        server.generate("", HISTORY, BASE, greedy(2))
        wait_until(lambda: server.engine.threads == 3, "3 threads beside a job")
        budget.job_ended()
        server.generate("", HISTORY, BASE, greedy(2))
        wait_until(lambda: server.engine.threads == 4, "4 threads again")
    finally:
        server.use_budget(CpuBudget(plan_threads(1)))


def test_a_reply_wakes_the_budget_so_a_job_holding_every_core_gives_chat_its_share(server):
    """While nobody chats a job may hold every core; the first reply tells the budget (whose listener tells the
    job), and the engine takes chat's share for it."""
    budget = CpuBudget(plan_threads(4, job_threads=1, idle_after_s=60.0))
    woke = []
    budget.listen(lambda: woke.append(budget.job_share()))
    budget.job_started()
    assert budget.job_share() == 4 and budget.serving_threads() == 1
    server.use_budget(budget)
    try:
        server.generate("", HISTORY, BASE, greedy(2))
        assert woke == [1]  # once, with the job's share already back to 1
        wait_until(lambda: server.engine.threads == 3, "chat's 3 threads beside the job's 1")
    finally:
        server.use_budget(CpuBudget(plan_threads(1)))


@pytest.mark.parametrize("kind", ENGINES)
def test_a_full_queue_answers_busy_with_a_retry_hint(kind, tiny_model_dir, tmp_path):
    from rlhf.base_models import load_tokenizer
    from rlhf.serving.interface import build_core
    from rlhf.serving.llama_cpp.base import llama_base
    from rlhf.serving.loop import EngineLoop

    tok = load_tokenizer(str(tiny_model_dir))
    if kind == "transformers":
        core = build_core(kind, model_source=str(tiny_model_dir))
    else:
        core = build_core(kind, gguf=str(llama_base(str(tiny_model_dir), tmp_path)[0]),
                          tokenizer_source=str(tiny_model_dir), cache_dir=str(tmp_path))
    engine = EngineLoop(core, queue_size=2, start=False)
    s = PolicyServer(engine, tok, "tiny", 128)
    streams = [s.stream("", HISTORY, BASE, greedy()) for _ in range(2)]
    with pytest.raises(Busy) as info:
        s.stream("", HISTORY, BASE, greedy())
    assert info.value.retry_after >= 1
    engine.start()  # the two queued replies are still served
    assert all(st.text() is not None for st in streams)
    s.close()


@SLOW
@pytest.mark.parametrize("kind", ENGINES)
def test_the_process_line_keeps_its_queue_bound_and_serves_what_waited(kind, tiny_model_dir, tmp_path):
    """Requests that arrive before the engine process is ready wait (up to the queue size) and are then served."""
    from rlhf.base_models import load_tokenizer
    from rlhf.serving.llama_cpp.base import llama_base
    from rlhf.serving.process import EngineProcess, EngineSpec

    tok = load_tokenizer(str(tiny_model_dir))
    if kind == "transformers":
        spec = EngineSpec(kind, {"model_source": str(tiny_model_dir)}, kind)
    else:
        spec = EngineSpec(kind, {"gguf": str(llama_base(str(tiny_model_dir), tmp_path)[0]),
                                 "tokenizer_source": str(tiny_model_dir), "cache_dir": str(tmp_path)}, kind)
    engine = EngineProcess([spec], queue_size=2)
    s = PolicyServer(engine, tok, "tiny", 128)
    streams = [s.stream("", HISTORY, BASE, greedy()) for _ in range(2)]
    with pytest.raises(Busy):
        s.stream("", HISTORY, BASE, greedy())
    engine.start()
    try:
        assert all(st.text() for st in streams) and engine.status.startswith(kind)
    finally:
        s.close()


def test_loading_an_adapter_while_replies_stream_is_safe(server, adapters):
    live = server.stream("", HISTORY, BASE, GenParams(max_new_tokens=60, temperature=1.0, seed=4))
    loader = threading.Thread(target=server.ensure_adapter, args=(AdapterRef(30, adapters[0]),))
    loader.start()
    loader.join(60)
    assert live.text() is not None and "p30" in server.loaded_adapters
