"""Response bodies of the REST API, as the OpenAPI document describes them (``responses={200: {"model": ...}}``), and
``Strict``, the base of every request body.

Documentation only: the handlers still return plain dicts, so no field is dropped or renamed on the way out. A
model lists the fields a client may rely on; a body may carry more (no model forbids extra fields). The fuzz
test (tests/ui/api/test_fuzz.py) checks every live response against these.
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A request body: unknown fields and loose types are refused (422)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Health(BaseModel):
    status: str
    model: str
    schema_version: int
    engine: str  # the serving engine: llama_cpp | transformers
    engine_status: str  # which engine serves and why (a fault seen on this CPU, a fallback)
    engine_build: str = ""  # what the engine's native code runs on (llama.cpp: its CPU variant, or a native build)


class AgentOut(BaseModel):
    id: int
    name: str
    system_prompt: str
    base_model: str
    generation: dict[str, Any]
    guidelines: str
    chat_template: Optional[str] = None  # the agent's own chat template (Jinja); null: the base model's
    created: str
    updated: str
    active_policy_id: int
    # Whether its base model can chat: ready | preparing (a prepare_base job converts it) | failed | unprepared
    status: str = "ready"
    prepare_job_id: Optional[int] = None


class PolicyOut(BaseModel):
    id: int
    agent_id: int
    version: int
    parent_id: Optional[int]
    status: str
    created: str
    metrics: dict[str, Any]
    error: Optional[str]


class Reply(BaseModel):
    conversation_id: int
    message_id: int
    policy_id: Optional[int]
    content: str
    latency_ms: Optional[float]


class StreamLine(BaseModel):
    """One NDJSON line of /chat/stream: ``{"delta"}`` per chunk, then the /chat reply with ``done``,
    ``ttft_ms`` and ``n_tokens``, or ``{"error"}``."""
    delta: Optional[str] = None
    done: Optional[bool] = None
    error: Optional[str] = None


class RatingOut(BaseModel):
    id: int
    message_id: int
    annotator_id: Optional[int]
    thumb: Optional[int]
    score: Optional[int]
    flags: Optional[list[str]]
    note: Optional[str]
    created: str


class MessageOut(BaseModel):
    """A message; a blind reply has its version, latency and generation settings hidden (null) and its question's
    `created`."""
    id: int
    conversation_id: int
    parent_id: Optional[int]
    role: str
    content: str
    policy_id: Optional[int]
    latency_ms: Optional[float]
    created: str
    ratings: list[RatingOut]


class Created(BaseModel):
    id: int


class ArenaSide(BaseModel):
    message_id: int
    content: str


class ArenaRound(BaseModel):
    pair_id: str
    a: ArenaSide
    b: ArenaSide


class ArenaVote(BaseModel):
    comparison_id: int
    a_policy_id: Optional[int]
    b_policy_id: Optional[int]


class TrainOut(BaseModel):
    """``queued`` with a ``job_id``; or ``dry_run`` with what a retrain would use and cost."""
    status: str
    job_id: Optional[int] = None
    ready: Optional[bool] = None


class JobOut(BaseModel):
    id: int
    kind: str
    agent: Optional[str]
    status: str
    progress: float
    phase: str
    message: str
    error: Optional[str]
    created: str
    policy_id: Optional[int]
    promoted: Optional[bool]


class JobDetail(JobOut):
    metrics: dict[str, Any]
    log: list[str]


class Promoted(BaseModel):
    id: int
    version: int
    status: str


class Me(BaseModel):
    user: Optional[str]
    admin: bool
    mode: str


class Quality(BaseModel):
    annotators: list[dict[str, Any]]
    alpha: dict[str, Any]


class Excluded(BaseModel):
    name: str
    excluded: bool
    reopened: list[dict[str, Any]]  # decisions that rested on their votes and no longer hold


class TokenOut(BaseModel):
    """An API token without its secret."""
    id: int
    user: str
    label: str
    created: str
    expires: Optional[str]
    expired: bool
    revoked: bool


class NewToken(BaseModel):
    """The new token's secret: shown once, never again."""
    name: str
    token: str
    expires: Optional[str]


class QueueItemOut(BaseModel):
    item_id: int
    messages: list[dict[str, Any]]
    a: ArenaSide
    b: ArenaSide
    reason: str


class QueueVote(BaseModel):
    comparison_id: int


class QueueStats(BaseModel):
    agent: str
    pool_size: int


def ok(model: Any, description: str = "OK") -> dict:
    """The 200 entry of ``responses=``."""
    return {200: {"model": model, "description": description}}
