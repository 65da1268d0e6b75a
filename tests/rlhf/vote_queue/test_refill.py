"""The vote queue's refill worker on the tiny model: it stocks the queue from the prompt pool, pairs the active
version with the newest candidate, never starts while chat is in the engine and gives way when chat arrives,
and scores items with a reward head refit on the Store's pairs."""
from __future__ import annotations

import threading
import time

import pytest

from rlhf.config import apply_overrides
from rlhf.vote_queue.contexts import prompt_pool, queue_versions
from rlhf.vote_queue.refill import QueueRefill
from rlhf.serving.policy_server import AdapterRef, GenParams
from storage import Store
from tests.conftest import make_adapter, vote_on_item

SMALL = {"queue.low_water": 2, "queue.target_ready": 4, "queue.batch_size": 2, "queue.max_new_tokens": 6,
         "queue.temperature": 1.0}


@pytest.fixture
def world(app_config, tiny_server):
    config = apply_overrides(app_config, SMALL)
    store = Store(config.db_path)
    store.ensure_default_agent(config.base_model)
    refill = QueueRefill(store, config, lambda agent: tiny_server, seed=0, idle_s=0.05)
    yield store, config, refill
    refill.stop()
    store.close()


def test_refill_stocks_the_queue_from_the_pool_and_stops_at_the_target(world):
    store, config, refill = world
    agent = store.get_agent("assistant")
    assert refill.tick(agent) == 4
    items = store.open_queue_items(agent.id, 600)
    assert len(items) == 4 and len({i.context_key for i in items}) == 4
    v0 = store.active_policy(agent.id).id
    assert all(i.policy_a_id == i.policy_b_id == v0 and i.source == "starter" for i in items)
    a = store.get_message(items[0].message_a_id)
    assert a.gen_params["temperature"] == 1.0 and a.gen_params["max_new_tokens"] == 6
    assert refill.tick(agent) == 0  # at the target: nothing more
    for item in items[:3]:  # three votes: the unseen items drop below low water, the queue refills
        vote_on_item(store, item.id, "a", "alice")
    assert refill.tick(agent) == 3
    assert store.queue_stats(agent.id, 600)["fresh"] == 4


def test_the_pool_holds_typed_contexts_once_and_never_queue_conversations(world):
    store, config, refill = world
    agent = store.get_agent("assistant")
    for _ in range(2):  # the same context typed twice is one prompt
        store.create_conversation(agent.id, "bob", messages=[{"role": "user", "content": "What is RLHF?"}])
    pool = prompt_pool(store, config, agent)
    typed = [p for p in pool if p.source == "typed"]
    assert [p.history for p in typed] == [({"role": "user", "content": "What is RLHF?"},)]
    assert pool[0].source == "typed" and pool[1].source == "starter"  # interleaved, typed first
    refill.tick(agent)
    assert len(prompt_pool(store, config, agent)) == len(pool)  # queue items add no prompts
    keys = {i.context_key for i in store.open_queue_items(agent.id, 600)}
    assert typed[0].key in keys


def test_items_pair_the_active_version_with_the_newest_candidate(world, tiny_model_dir, tmp_path):
    store, config, refill = world
    agent = store.get_agent("assistant")
    v0 = store.active_policy(agent.id)
    v1 = store.register_policy_version(agent.id, make_adapter(tiny_model_dir, tmp_path / "v1", seed=3), v0.id, False)
    assert [p.id for p in queue_versions(store, agent)] == [v0.id, v1.id]
    refill.tick(agent)
    items = store.open_queue_items(agent.id, 600)
    assert items and all({i.policy_a_id, i.policy_b_id} == {v0.id, v1.id} for i in items)
    assert len({i.policy_a_id for i in items}) == 2 or len(items) < 3  # sides at random


def test_refill_waits_while_chat_is_in_the_engine(world, tiny_server):
    store, config, refill = world
    refill.idle_s = 0.3  # the app's wait is 0.5 s: longer than a loaded machine stalls the engine between steps
    agent = store.get_agent("assistant")
    live = tiny_server.stream("", [{"role": "user", "content": "a long chat"}], AdapterRef(0),
                              GenParams(max_new_tokens=160, temperature=1.0, seed=1))
    done = threading.Event()
    made = []
    worker = threading.Thread(target=lambda: (made.append(refill.tick(agent)), done.set()), daemon=True)
    submitted = tiny_server.engine_load().submitted
    worker.start()
    while live.finished_at is None:  # as long as chat runs, the refill submits nothing
        assert tiny_server.engine_load().submitted == submitted and store.count("queue_items") == 0
        time.sleep(0.01)
    assert live.text() and done.wait(120) and made == [4]
    worker.join()


def test_chat_arriving_cancels_a_running_refill_batch(world, tiny_server):
    store, config, refill = world
    config.queue.max_new_tokens = 1500  # a long batch, so chat certainly arrives while it runs
    agent = store.get_agent("assistant")
    result = []
    worker = threading.Thread(target=lambda: result.append(
        refill.generate(agent, queue_versions(store, agent), prompt_pool(store, config, agent)[:2])), daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while tiny_server.engine_load().running == 0:
        assert time.monotonic() < deadline, "the refill batch never started"
        time.sleep(0.005)
    live = tiny_server.stream("", [{"role": "user", "content": "hi"}], AdapterRef(0),  # long enough to be seen
                              GenParams(max_new_tokens=200, temperature=1.0, seed=2))
    assert live.text() is not None
    worker.join(120)
    assert result == [None] and refill.counts["preempted"] == 1
    assert store.count("queue_items") == 0 and store.count("messages") == 0  # nothing half-stored


def test_items_are_scored_by_a_head_refit_on_the_stores_pairs(world):
    store, config, refill = world
    config.reward.min_pairs = 3
    config.queue.refit_every = 2
    agent = store.get_agent("assistant")
    refill.tick(agent)
    assert refill.score(agent) == 0  # no pairs yet: nothing scored, items are handed out at random
    items = store.open_queue_items(agent.id, 600)
    for item, winner in zip(items[:3], "aba"):
        vote_on_item(store, item.id, winner, "alice")
    assert refill.tick(agent) == 3  # refilled, and every open item scored by a head on the 3 pairs
    open_items = store.open_queue_items(agent.id, 600)
    assert open_items and all(i.scored_pairs == 3 and 0 <= i.uncertainty <= 1 for i in open_items)
    assert refill.counts["refits"] == 1
    vote_on_item(store, open_items[0].id, "b", "alice")
    refill.tick(agent)  # one new pair: fewer than refit_every, the same head
    assert refill.counts["refits"] == 1
    vote_on_item(store, open_items[1].id, "a", "alice")
    refill.tick(agent)
    assert refill.counts["refits"] == 2
    assert {i.scored_pairs for i in store.open_queue_items(agent.id, 600)} == {5}
