"""Blind stays blind: an arena round's pace on screen says nothing about which version answers on which side.

The engine here decodes like llama.cpp's lanes (tests/support/lane_core.py): the adapter version's lane always runs
before the base's. Rounds are played through the Arena tab's own handler (the function Gradio calls), and the first
paint of each round is recorded.
"""
from __future__ import annotations

import pytest
from scipy.stats import binomtest

from rlhf.serving.loop import EngineLoop
from rlhf.serving.policy_server import PolicyServer
from tests.conftest import make_adapter
from tests.support.lane_core import LaneOrderCore
from ui.flows.arena import lockstep
from ui.tabs import arena

ROUNDS = 30


@pytest.fixture
def lane_services(app_config, tokenizer, tiny_model_dir, tmp_path):
    from ui.webapp import build_services

    server = PolicyServer(EngineLoop(LaneOrderCore(tokenizer)), tokenizer, "lanes", max_context_tokens=512)
    services = build_services(app_config, server=server)
    store = services.store
    v0 = store.active_policy("assistant")
    store.register_policy_version("assistant", make_adapter(tiny_model_dir, tmp_path / "v1", seed=3), v0.id,
                                  promote=False)
    yield services
    services.store.close()
    server.close()


def reply_text(chat) -> str:
    value = chat.constructor_args.get("value", []) if hasattr(chat, "constructor_args") else chat
    return value[-1]["content"] if value and value[-1]["role"] == "assistant" else ""


def first_painted(services) -> tuple[str, dict]:
    """Play one round through the tab's handler: which side the first paint with text showed ("a", "b", "both"),
    and the version id behind each side."""
    first = None
    for chat_a, chat_b, state, *_ in arena.play_round(services, "Hello", arena.empty_state(), "assistant", "alice"):
        shown = [side for side, chat in (("a", chat_a), ("b", chat_b)) if reply_text(chat)]
        if first is None and shown:
            first = "both" if len(shown) == 2 else shown[0]
    pair = services.store.get_arena_pair(state["pair_id"])
    store = services.store
    return first, {"a": store.get_message(pair.message_a_id).policy_id,
                   "b": store.get_message(pair.message_b_id).policy_id}


def test_the_first_painted_side_says_nothing_about_the_version(lane_services):
    base = lane_services.store.active_policy("assistant").id
    firsts = [first_painted(lane_services) for _ in range(ROUNDS)]
    assert len({sides["a"] for _, sides in firsts}) == 2  # both versions played on side A
    alone = [sides[first] for first, sides in firsts if first != "both"]  # the version painted before the other
    base_first = sum(policy == base for policy in alone)
    assert not alone or binomtest(base_first, len(alone)).pvalue > 0.01, (base_first, len(alone))
    assert [first for first, _ in firsts] == ["both"] * ROUNDS  # and in fact neither side ever goes first


# ---- the lock-step rule, without Gradio or threads ---------------------------------------------------
def test_lockstep_waits_for_both_sides_then_keeps_them_level():
    events = [(0, "a1"), (0, "a2"), (1, "b1"), (0, "a3"), (1, "b2"), (1, "b3"), (1, "b4"), (0, None), (1, "b5"),
              (1, None)]
    assert list(lockstep(events)) == [("a1", "b1"), ("a1a2", "b1b2"), ("a1a2a3", "b1b2b3"),
                                      ("a1a2a3", "b1b2b3b4"), ("a1a2a3", "b1b2b3b4b5")]


def test_lockstep_a_side_that_ends_empty_lets_the_other_run():
    assert list(lockstep([(1, "b1"), (0, None), (1, "b2"), (1, None)])) == [("", "b1"), ("", "b1b2")]
    assert list(lockstep([(0, None), (1, None)])) == [("", "")]
