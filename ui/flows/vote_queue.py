"""The vote queue as plain functions (no Gradio, no FastAPI), shared by the Vote tab and the REST router.

Handing out an item and storing a vote are Store queries: items were generated and scored in the background
(``rlhf.vote_queue.refill``), so nothing here generates or runs a model. Both wake the refill worker, which tops the
queue up and refits the reward head on the new pair.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from rlhf.vote_queue.choice import choose_item
from rlhf.vote_queue.contexts import prompt_pool
from storage import Comparison, QueueItem, Store
from ui.services import Services


def _lease(services: Services) -> float:
    return services.config.queue.lease_minutes * 60


def _excluded(services: Services) -> list[str]:
    return list(services.config.reward.exclude_annotators or [])


def _poke(services: Services) -> None:
    if services.refill is not None:
        services.refill.poke()


def item_json(store: Store, item: QueueItem, reason: str) -> dict:
    """An item as GET /queue/next returns it: the context, both replies (no version ids), and why it was picked."""
    _, history = store.queue_item_context(item)
    a, b = store.get_message(item.message_a_id), store.get_message(item.message_b_id)
    return {"item_id": item.id, "messages": history, "a": {"message_id": a.id, "content": a.content},
            "b": {"message_id": b.id, "content": b.content}, "reason": reason}


def next_item(services: Services, agent_name: Optional[str], annotator: Optional[str],
              rng: Optional[np.random.Generator] = None) -> Optional[dict]:
    """The next item for ``annotator`` (their unvoted one first), or None when nothing is left for them."""
    store = services.store
    agent = store.get_agent(agent_name)  # None = the default (first) agent
    share, rng = services.config.queue.random_share, rng or np.random.default_rng()  # fresh entropy per call
    picked = store.next_queue_item(agent.id, annotator, lambda c: choose_item(c, share, rng),
                                   _lease(services), _excluded(services))
    _poke(services)
    if picked is None:
        return None
    item, assignment = picked
    return item_json(store, item, assignment.reason)


def cast_vote(services: Services, item_id: int, winner: str, annotator: Optional[str],
              retry: bool = True) -> Comparison:
    """Store the vote as a comparison of the item's replies. Only the item on the annotator's screen takes it
    (``Store.vote_queue_item``): ``retry`` lets the same vote sent again return the first."""
    comparison = services.store.vote_queue_item(item_id, winner, annotator, _lease(services), _excluded(services),
                                                retry)
    _poke(services)
    return comparison


def skip_item(services: Services, item_id: int, annotator: Optional[str]) -> None:
    """The annotator passes on an item shown to them: it goes to others, never back to them."""
    services.store.skip_queue_item(item_id, annotator)
    _poke(services)


def left_for(services: Services, agent_name: Optional[str], annotator: Optional[str]) -> int:
    """How many items ``annotator`` can still vote on right now (their current one included)."""
    store = services.store
    return store.queue_left(store.get_agent(agent_name).id, annotator, _lease(services), _excluded(services))


def stats(services: Services, agent_name: Optional[str], viewer: Optional[str] = None, admin: bool = True) -> dict:
    """Pool size (prompts the queue can ask about), items made, ready (open for a vote), fresh (never shown),
    scored, expired, and votes per annotator: every annotator's for admins, only ``viewer``'s own for others (a
    named annotator's count, read before and after a vote, would pick out their vote)."""
    store = services.store
    agent = store.get_agent(agent_name)
    figures = store.queue_stats(agent.id, _lease(services), _excluded(services))
    if not admin:
        figures["votes"] = {name: n for name, n in figures["votes"].items() if viewer is not None and name == viewer}
    return {"agent": agent.name, "pool_size": len(prompt_pool(store, services.config, agent)), **figures}
