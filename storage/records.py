"""Small frozen records that cross the Store boundary (rows in, records out)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

_JSON_FIELDS = {"generation", "gen_params", "config", "result", "metrics", "data_snapshot", "flags", "prompt",
                "withdrawn"}


def _from_row(cls, row: Mapping[str, Any]):
    names = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key in names:
        value = row.get(key)
        if key in _JSON_FIELDS and isinstance(value, str):
            value = json.loads(value)
        values[key] = value
    return cls(**values)


class Record:
    """Mixin: build from a row and turn into a plain dict."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]):
        return _from_row(cls, row)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Annotator(Record):
    id: int
    name: str
    role: str
    excluded: int
    created: str


@dataclass(frozen=True)
class Agent(Record):
    id: int
    name: str
    system_prompt: str
    base_model: str
    generation: dict
    created: str
    updated: str
    guidelines: str = ""
    chat_template: Optional[str] = None  # the agent's own Jinja chat template; None: the base model's


@dataclass(frozen=True)
class Policy(Record):
    id: int
    agent_id: int
    version: int
    parent_id: Optional[int]
    adapter_path: Optional[str]
    status: str
    reward_model_id: Optional[int]
    job_id: Optional[int]
    data_snapshot: dict
    config: dict
    metrics: dict
    error: Optional[str]
    created: str

    @property
    def is_base(self) -> bool:
        return self.adapter_path is None


@dataclass(frozen=True)
class Conversation(Record):
    id: int
    agent_id: int
    annotator_id: Optional[int]
    system_prompt: str
    source: str
    created: str


@dataclass(frozen=True)
class Message(Record):
    id: int
    conversation_id: int
    parent_id: Optional[int]
    role: str
    content: str
    context_key: str
    policy_id: Optional[int]
    gen_params: dict
    latency_ms: Optional[float]
    created: str
    n_tokens: Optional[int] = None


@dataclass(frozen=True)
class Rating(Record):
    id: int
    message_id: int
    annotator_id: Optional[int]
    thumb: Optional[int]
    score: Optional[int]
    flags: Optional[list]
    note: Optional[str]
    created: str
    withdrawn: Optional[list] = None  # fields of this event taken back since (``Store.withdraw_rating``)


@dataclass(frozen=True)
class Withdrawal(Record):
    """An annotator taking back one field (thumb or score) of a rating event: append-only, like every label."""

    id: int
    rating_id: int
    field: str
    created: str


@dataclass(frozen=True)
class Comparison(Record):
    id: int
    message_a_id: int
    message_b_id: int
    policy_a_id: Optional[int]
    policy_b_id: Optional[int]
    winner: str
    annotator_id: Optional[int]
    pair_id: Optional[str]
    created: str
    text_a: Optional[str] = None  # the two replies' text, only from list_comparisons(..., with_text=True)
    text_b: Optional[str] = None
    blind: Optional[int] = None  # 1: voted on an arena round or a vote-queue item (list_comparisons' counted set)


@dataclass(frozen=True)
class ArenaPair(Record):
    id: str
    agent_id: int
    message_a_id: int
    message_b_id: int
    created: str


@dataclass(frozen=True)
class RewardModel(Record):
    id: int
    agent_id: int
    path: str
    mode: str
    data_snapshot: dict
    config: dict
    metrics: dict
    job_id: Optional[int]
    created: str


@dataclass(frozen=True)
class Job(Record):
    id: int
    kind: str
    agent_id: Optional[int]
    status: str
    progress: float
    phase: str
    message: str
    config: dict
    result: dict
    error: Optional[str]
    pid: Optional[int]
    cancel_requested: int
    checkpoint: Optional[str]
    created: str
    started: Optional[str]
    finished: Optional[str]
    heartbeat: Optional[str]
    progressed: Optional[str] = None  # when the progress last moved (None: not since the job started)

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class QueueItem(Record):
    id: int
    agent_id: int
    context_key: str
    message_a_id: int
    message_b_id: int
    policy_a_id: Optional[int]
    policy_b_id: Optional[int]
    source: str
    votes_wanted: int
    p_a: Optional[float]
    uncertainty: Optional[float]
    scored_pairs: Optional[int]
    created: str
    expires: str


@dataclass(frozen=True)
class QueueAssignment(Record):
    id: int
    item_id: int
    annotator_id: Optional[int]
    reason: str
    comparison_id: Optional[int]
    created: str
    voted: Optional[str]
    skipped: Optional[str] = None
