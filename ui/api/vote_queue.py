"""REST for the vote queue (mounted under /api/v1 by ui.webapp): next item, vote, stats."""
from __future__ import annotations

from typing import Literal, Optional

from fastapi import APIRouter, Request, Response

from ui.api.chat import rest_annotator
from ui.api.errors import PREFIX, errors
from ui.api.models import QueueItemOut, QueueStats, QueueVote, Strict, ok
from ui.flows import vote_queue as queueflow
from ui.flows.access import caller_of
from ui.services import Services


class QueueVoteBody(Strict):
    winner: Literal["a", "b", "tie", "both_bad"]
    annotator: Optional[str] = None


def build_queue_router(services: Services) -> APIRouter:
    """GET /queue/next, POST /queue/{item_id}/vote, GET /queue/stats."""
    r = APIRouter(prefix=PREFIX)

    @r.get("/queue/next", responses=ok(QueueItemOut) | errors(204, 404))
    def queue_next(request: Request, agent: Optional[str] = None, annotator: Optional[str] = None):
        """The item to vote on next (the caller's unvoted one first); 204 when nothing is left for them.
        ``annotator`` names who asks when sign-in is off (with sign-in, it is the signed-in user)."""
        item = queueflow.next_item(services, agent, rest_annotator(services, request, annotator))
        return Response(status_code=204) if item is None else item

    @r.post("/queue/{item_id}/vote", responses=ok(QueueVote) | errors(404, 409, write=True))
    def queue_vote(item_id: int, body: QueueVoteBody, request: Request):
        comparison = queueflow.cast_vote(services, item_id, body.winner,
                                         rest_annotator(services, request, body.annotator))
        return {"comparison_id": comparison.id}

    @r.get("/queue/stats", responses=ok(QueueStats) | errors(404))
    def queue_stats(request: Request, agent: Optional[str] = None):
        """The queue's figures; votes per annotator: every annotator's for admins, the caller's own for others."""
        caller = caller_of(services, request)
        return queueflow.stats(services, agent, caller.name, caller.admin)

    return r
