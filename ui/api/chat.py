"""REST: chat, regenerate, messages and feedback (POST /chat, /chat/stream, /messages/{id}/regenerate,
GET /messages/{id}, POST /feedback, /comparisons), and what the arena router shares with them: who a write is
stored under (``rest_annotator``) and waiting for replies while the client may hang up (``finish``)."""
from __future__ import annotations

import json
from typing import Any, Iterator, Literal, Optional

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from storage import Conflict, InvalidInput
from ui.api.errors import PREFIX, ClientGone, errors
from ui.api.models import Created, MessageOut, Reply, StreamLine, Strict, ok
from ui.flows import access
from ui.flows import chat as chatflow
from ui.permissions import current_user, sees_all_feedback
from ui.services import Services

# The NDJSON lines of /chat/stream (OpenAPI describes the stream's items by the schema of one line).
STREAM = {200: {"description": "NDJSON: one JSON object per line",
                "content": {"application/x-ndjson": {"schema": StreamLine.model_json_schema()}}}}


class ChatMessage(Strict):
    role: str
    content: str


class ChatBody(Strict):
    agent: Optional[str] = None
    policy_id: Optional[int] = None
    conversation_id: Optional[int] = None
    messages: list[ChatMessage]
    max_new_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    annotator: Optional[str] = None


class RegenerateBody(Strict):
    policy_id: Optional[int] = None
    seed: Optional[int] = None
    temperature: Optional[float] = None
    max_new_tokens: Optional[int] = None
    annotator: Optional[str] = None


class FeedbackBody(Strict):
    message_id: int
    thumb: Optional[int] = None
    score: Optional[Any] = None  # validated by the Store, so NaN / "five" / 6 get one clear message
    flags: Optional[list[str]] = None
    note: Optional[str] = None
    annotator: Optional[str] = None


class ComparisonBody(Strict):
    message_a_id: int
    message_b_id: int
    winner: Literal["a", "b", "tie", "both_bad"]
    annotator: Optional[str] = None


def rest_annotator(services: Services, request: Request, given: Optional[str]) -> Optional[str]:
    """The annotator of a write: the authenticated user when auth is on (a differing ``annotator`` field is
    ignored), else the field as sent."""
    if services.auth is None:
        return given
    return current_user(services, request) or given


ALL = object()  # message_json's default viewer: every annotator's ratings


def message_json(services: Services, message_id: int, viewer: Any = ALL,
                 caller: Optional[access.Caller] = None) -> dict:
    """A stored message with its rating events, as returned by GET /messages/{id}: every annotator's, or only
    ``viewer``'s (a name; None sees none). A blind reply (``ui.flows.access``) hides its version, latency and
    generation settings from ``caller`` (default: everyone, as for an arena round nobody voted on)."""
    store = services.store
    msg = store.get_message(message_id)
    out = access.shown_message(store, caller or access.Caller(None, False), msg)
    ratings = store.ratings_for(message_id) if viewer is ALL else store.ratings_by(message_id, viewer)
    out["ratings"] = [r.to_dict() for r in ratings] if msg.role == "assistant" else []
    return out


def reply_json(msg) -> dict:
    return {"conversation_id": msg.conversation_id, "message_id": msg.id, "policy_id": msg.policy_id,
            "content": msg.content, "latency_ms": msg.latency_ms}


def ndjson_reply(pending: chatflow.PendingReply) -> Iterator[str]:
    """NDJSON lines of a streamed reply: {"delta"} per chunk, then the /chat reply plus {"done", "ttft_ms",
    "n_tokens"}, or {"error"}. A client that hangs up cancels its reply (nothing is stored)."""
    try:
        for delta in pending:
            yield json.dumps({"delta": delta}) + "\n"
        msg = pending.save()
        stream = pending.stream
        ttft = None if stream.first_token_at is None else round((stream.first_token_at - stream.submitted) * 1000, 1)
        yield json.dumps({"done": True, **reply_json(msg), "ttft_ms": ttft, "n_tokens": stream.n_tokens}) + "\n"
    except Exception as exc:  # the status line is already sent: report in-band
        yield json.dumps({"error": str(exc)}) + "\n"
    finally:
        if pending.saved is None:
            pending.stream.cancel()


async def finish(request: Request, *pending: chatflow.PendingReply) -> list:
    """Wait (in a worker thread) for replies to end and store them; a client that hangs up meanwhile, or a request
    cancelled at shutdown, cancels them and nothing is stored (ClientGone)."""
    gone = anyio.Event()

    async def watch() -> None:  # the body is read: the next message is the hang-up, whenever it comes
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()
        for p in pending:
            p.stream.cancel()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await anyio.to_thread.run_sync(lambda: [p.stream.text() for p in pending])
            tg.cancel_scope.cancel()
    except BaseException:
        for p in pending:
            p.stream.cancel()
        raise
    if gone.is_set():
        raise ClientGone()
    return [await run_in_threadpool(p.save) for p in pending]


def build_chat_router(services: Services) -> APIRouter:
    """Chat, regenerate, messages and feedback."""
    r = APIRouter(prefix=PREFIX)
    chat_routes(r, services)
    feedback_routes(r, services)
    return r


def chat_routes(r: APIRouter, services: Services) -> None:
    """POST /chat, POST /chat/stream, POST /messages/{id}/regenerate."""
    store = services.store

    def user_turn(body: ChatBody, request: Request):
        """The steps /chat and /chat/stream share: agent, version, settings, the user turn(s) checked for the
        caller's conversation (a new one without ``conversation_id``; someone else's is 404), the caller's reply
        slot taken; the turn is stored only with its reply."""
        agent = store.get_agent(body.agent)  # None = the default (first) agent
        policy = chatflow.resolve_policy(store, agent, body.policy_id, access.caller_of(services, request))
        params = chatflow.gen_params(services.config, agent, body.max_new_tokens, body.temperature, body.top_p,
                                     body.seed)
        messages = chatflow.check_turns(services.config, [m.model_dump() for m in body.messages])
        if body.conversation_id is not None:
            access.conversation_for(store, access.caller_of(services, request), body.conversation_id)
        server = services.server_for(agent)
        turn = chatflow.plan_turn(store, agent, messages, body.conversation_id,
                                  rest_annotator(services, request, body.annotator), source="api")
        return chatflow.begin_turn(store, server, turn, policy, params, services.replies)

    @r.post("/chat", responses=ok(Reply) | errors(404, 409, write=True))
    async def chat(body: ChatBody, request: Request):
        """The reply, once complete; a client that hangs up first cancels it (nothing is stored)."""
        (msg,) = await finish(request, await run_in_threadpool(user_turn, body, request))
        return reply_json(msg)

    @r.post("/chat/stream", response_class=StreamingResponse, responses=STREAM | errors(404, 409, write=True))
    def chat_stream(body: ChatBody, request: Request):
        """/chat streamed as NDJSON; errors before the first byte (bad input, busy) are ordinary JSON errors."""
        return StreamingResponse(ndjson_reply(user_turn(body, request)), media_type="application/x-ndjson")

    @r.post("/messages/{message_id}/regenerate", responses=ok(Reply) | errors(404, 409, write=True))
    async def regenerate(message_id: int, body: RegenerateBody, request: Request):
        (msg,) = await finish(request, await run_in_threadpool(regenerated, message_id, body, request))
        return reply_json(msg)

    def regenerated(message_id: int, body: RegenerateBody, request: Request) -> chatflow.PendingReply:
        caller = access.caller_of(services, request)
        original = access.message_for(store, caller, message_id)
        if store.is_blind(message_id):
            raise Conflict("this reply is part of an arena round that has not been voted on yet; vote first")
        if store.queue_item_of(message_id) is not None:
            raise Conflict("this reply belongs to a vote-queue item; items are voted on, not regenerated")
        parent = chatflow.sibling_parent(store, message_id)
        agent = chatflow.agent_of(store, parent)
        # Admins regenerate with the reply's own version unless they name another; annotators get the active one.
        wanted = body.policy_id if body.policy_id is not None else (original.policy_id if caller.admin else None)
        policy = chatflow.resolve_policy(store, agent, wanted, caller)
        params = chatflow.gen_params(services.config, agent, body.max_new_tokens, body.temperature, None, body.seed)
        return chatflow.begin_reply(store, services.server_for(agent), parent.id, policy, params, services.replies)


def feedback_routes(r: APIRouter, services: Services) -> None:
    """GET /messages/{id}, POST /feedback, POST /comparisons."""
    store = services.store

    @r.get("/messages/{message_id}", responses=ok(MessageOut) | errors(404))
    def get_message(message_id: int, request: Request):
        """A message of the caller's conversation (or of a vote-queue item shown to them) with the caller's own
        ratings (every annotator's for admins or with open_feedback); blind replies hide their version."""
        caller = access.caller_of(services, request)
        access.message_for(store, caller, message_id, reading=True)
        if sees_all_feedback(services, request):
            return message_json(services, message_id, caller=caller)
        return message_json(services, message_id, current_user(services, request), caller)

    @r.post("/feedback", responses=ok(Created) | errors(404, 409, write=True))
    def feedback(body: FeedbackBody, request: Request):
        if body.thumb is None and body.score is None and body.flags is None and body.note is None:
            raise InvalidInput("feedback needs at least one of thumb, score, flags, note")
        access.message_for(store, access.caller_of(services, request), body.message_id)
        rating = store.record_rating(body.message_id, rest_annotator(services, request, body.annotator),
                                     thumb=body.thumb, score=body.score, flags=body.flags, note=body.note)
        return {"id": rating.id}

    @r.post("/comparisons", responses=ok(Created) | errors(404, 409, write=True))
    def comparisons(body: ComparisonBody, request: Request):
        caller = access.caller_of(services, request)
        for message_id in (body.message_a_id, body.message_b_id):
            access.message_for(store, caller, message_id)
        comp = store.record_comparison(body.message_a_id, body.message_b_id, body.winner,
                                       rest_annotator(services, request, body.annotator))
        return {"id": comp.id}
