"""Arena rounds as plain functions (no Gradio, no FastAPI), shared by the Arena tab and the REST router.

Pick a pair, generate two sibling replies, remember the pair, vote, continue. The browser only ever holds
the pair id: which version wrote which side is looked up in the Store after the vote.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import numpy as np

from rlhf.analysis.arena import choose_pair, pair_candidates
from rlhf.retrain.decisions import is_open
from storage import Agent, ArenaPair, Comparison, Conflict, Message, Policy, Store
from ui.state.leaderboard import Leaderboards
from ui.flows import chat as chatflow
from ui.services import Services

@dataclass
class Round:
    """An arena round being generated: both replies answer the same user message."""

    agent: Agent
    user: Message
    a: chatflow.PendingReply
    b: chatflow.PendingReply

    def cancel(self) -> None:
        self.a.stream.cancel()
        self.b.stream.cancel()


def need_two_message(agent: Agent, servable: int) -> str:
    return (f"The arena compares two versions of an agent, and {agent.name!r} has {servable} servable version"
            f"{'' if servable == 1 else 's'}. Retrain it on the collected feedback (ratings and comparisons) "
            "to publish a new version, or promote an archived one, then come back.")


def draw_pair(store: Store, boards: Leaderboards, agent: Agent,
              rng: Optional[np.random.Generator] = None) -> tuple[Policy, Policy]:
    """The two versions of the next round (A, B), by the arena's pairing rules (``rlhf.analysis.arena``) on votes,
    BT ratings and open decisions."""
    policies = store.list_policies(agent.id)
    table = boards.table(agent.id, n_boot=0, with_text=False)  # may be a vote or two behind: ratings, not rules
    status = {p.id: p.status for p in policies}  # but the statuses are today's (an archived version is never shown)
    table = table[table["policy_id"].isin(status)].assign(status=lambda t: t["policy_id"].map(status))
    candidates = pair_candidates(table, frozenset(p.id for p in policies if is_open(p)))
    if len(candidates) < 2:
        raise Conflict(need_two_message(agent, len(candidates)))
    a_id, b_id = choose_pair(candidates, rng if rng is not None else np.random.default_rng())
    return store.get_policy(a_id), store.get_policy(b_id)


def continuation_parent(store: Store, pair_id: str) -> Message:
    """The reply a follow-up continues under: the vote's winner (A on a tie)."""
    vote = store.arena_vote(pair_id)
    if vote is None:
        raise Conflict("vote on this round before continuing it")
    if vote.winner == "both_bad":
        raise Conflict("both replies of this round were bad; start a new round instead of continuing")
    return store.get_message(vote.message_b_id if vote.winner == "b" else vote.message_a_id)


def open_round(services: Services, agent_name: Optional[str], messages: list[dict], annotator: Optional[str] = None,
               continue_pair_id: Optional[str] = None, rng: Optional[np.random.Generator] = None) -> Round:
    """Record the user turn(s) and start both replies (queued on the one PolicyServer)."""
    store = services.store
    chatflow.check_turns(services.config, messages)
    if continue_pair_id is not None:
        parent = continuation_parent(store, continue_pair_id)
        agent = chatflow.agent_of(store, parent)
        if agent_name is not None and store.get_agent(agent_name).id != agent.id:
            raise Conflict(f"arena pair {continue_pair_id} belongs to agent {agent.name!r}")
    else:
        agent = store.get_agent(agent_name)  # None = the default (first) agent
    policy_a, policy_b = draw_pair(store, services.leaderboards, agent, rng)
    params = chatflow.gen_params(services.config, agent)
    if continue_pair_id is not None:
        user = store.append_messages(parent.conversation_id, messages, parent_id=parent.id)[-1]
    else:
        user = chatflow.add_user_turn(store, agent, messages, None, annotator, source="arena")
    server = services.server_for(agent)
    a = chatflow.begin_reply(store, server, user.id, policy_a, params, services.replies)
    try:
        b = chatflow.begin_reply(store, server, user.id, policy_b, params, services.replies)
    except BaseException:
        a.stream.cancel()
        raise
    return Round(agent, user, a, b)


def lockstep(events: Iterable[tuple[int, Optional[str]]]) -> Iterator[tuple[str, str]]:
    """Both sides' text as the screen may show it, from ``(side, delta)`` events (``delta`` None: that side ended).

    Blind means the pace tells nothing: each version decodes in its own lane, one after the other, so the side whose
    lane runs first would start first every time. Nothing is shown until both sides have their first delta (or
    ended); then both advance together, each side showing as many deltas as the slower one has; a side that ended
    shows all of itself and the other runs on alone."""
    parts: tuple[list, list] = ([], [])
    done = [False, False]
    last = None
    for side, delta in events:
        if delta is None:
            done[side] = True
        else:
            parts[side].append(delta)
        if not all(parts[s] or done[s] for s in (0, 1)):
            continue
        both = min(len(parts[0]), len(parts[1]))
        shown = tuple("".join(parts[s] if done[s] or done[1 - s] else parts[s][:both]) for s in (0, 1))
        if shown != last:
            last = shown
            yield shown


def stream_round(rnd: Round) -> Iterator[tuple[str, str]]:
    """Both replies' text so far, in lock-step (``lockstep``): one reader thread per side feeds a queue."""
    events: "queue.Queue[tuple[int, Optional[str], Optional[BaseException]]]" = queue.Queue()

    def pump(side: int, pending: chatflow.PendingReply) -> None:
        try:
            for delta in pending:
                events.put((side, delta, None))
            events.put((side, None, None))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            events.put((side, None, exc))

    running = 2

    def received() -> Iterator[tuple[int, Optional[str]]]:
        nonlocal running
        while running:
            side, delta, exc = events.get()
            if exc is not None:
                raise exc
            running -= delta is None
            yield side, delta

    for side, pending in enumerate((rnd.a, rnd.b)):
        threading.Thread(target=pump, args=(side, pending), name=f"arena-{'ab'[side]}", daemon=True).start()
    try:
        yield from lockstep(received())
    finally:
        if running:  # the consumer went away or a side failed: stop generating the other one
            rnd.cancel()


def close_round(store: Store, rnd: Round) -> ArenaPair:
    """Store both replies and the pair they form (call after both streams ended)."""
    a, b = rnd.a.save(), rnd.b.save()
    return store.create_arena_pair(rnd.agent.id, a.id, b.id)


def cast_vote(store: Store, pair_id: str, winner: str, annotator: Optional[str] = None) -> Comparison:
    """Record the vote of a round (a second vote returns the first)."""
    return store.vote_arena_pair(pair_id, winner, annotator)
