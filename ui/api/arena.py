"""REST for the arena, the leaderboard and version archiving (mounted under /api/v1 by ui.webapp)."""
from __future__ import annotations

from typing import Any, Literal, Optional

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from ui.views.arena import leaderboard_json
from ui.flows import access, arena
from ui.permissions import require_admin
from ui.api.chat import ChatMessage, finish, rest_annotator
from ui.api.errors import PREFIX, errors
from ui.api.models import ArenaRound, ArenaVote, PolicyOut, Strict, ok
from ui.services import Services


class ArenaBody(Strict):
    agent: Optional[str] = None
    messages: list[ChatMessage]
    annotator: Optional[str] = None
    continue_pair_id: Optional[str] = None  # a voted pair: the messages follow its preferred reply


class VoteBody(Strict):
    winner: Literal["a", "b", "tie", "both_bad"]
    annotator: Optional[str] = None


def policy_json(policy) -> dict:
    """A version as GET /policies lists it."""
    d = policy.to_dict()
    return {k: d[k] for k in ("id", "agent_id", "version", "parent_id", "status", "created", "metrics", "error")}


def build_arena_router(services: Services) -> APIRouter:
    """POST /arena, POST /arena/{pair_id}/vote, GET /leaderboard, POST /policies/{id}/archive."""
    r = APIRouter(prefix=PREFIX)
    store = services.store

    def opened(body: ArenaBody, request: Request) -> arena.Round:
        if body.continue_pair_id is not None:  # only the round's own player continues it
            access.pair_for(store, access.caller_of(services, request), body.continue_pair_id)
        return arena.open_round(services, body.agent, [m.model_dump() for m in body.messages],
                                rest_annotator(services, request, body.annotator), body.continue_pair_id)

    @r.post("/arena", responses=ok(ArenaRound) | errors(404, 409, write=True))
    async def arena_round(body: ArenaBody, request: Request):
        """Both replies once complete; a client that hangs up first cancels them (nothing is stored)."""
        rnd = await run_in_threadpool(opened, body, request)
        try:
            await finish(request, rnd.a, rnd.b)
            pair = await run_in_threadpool(arena.close_round, store, rnd)
        except BaseException:
            rnd.cancel()
            raise
        # Blind until the vote: message ids and texts only, never the versions behind them.
        return {"pair_id": pair.id, "a": {"message_id": pair.message_a_id, "content": rnd.a.saved.content},
                "b": {"message_id": pair.message_b_id, "content": rnd.b.saved.content}}

    @r.post("/arena/{pair_id}/vote", responses=ok(ArenaVote) | errors(404, 409, write=True))
    def arena_vote(pair_id: str, body: VoteBody, request: Request):
        access.pair_for(store, access.caller_of(services, request), pair_id)  # someone else's round: 404
        vote = arena.cast_vote(store, pair_id, body.winner, rest_annotator(services, request, body.annotator))
        return {"comparison_id": vote.id, "a_policy_id": vote.policy_a_id, "b_policy_id": vote.policy_b_id}

    @r.get("/leaderboard", responses=ok(list[dict[str, Any]]) | errors(404))
    def leaderboard(agent: Optional[str] = None):
        return leaderboard_json(services.leaderboards.table(agent))

    @r.post("/policies/{policy_id}/archive", responses=ok(PolicyOut) | errors(404, 409))
    def archive(policy_id: int, request: Request):
        require_admin(services, request)  # Forbidden -> 403 {"error"} (ui.api.errors handlers)
        return policy_json(store.archive_policy(policy_id))

    return r
