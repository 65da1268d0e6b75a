"""The vote queue's prompts and versions: which contexts it asks about, which two versions answer, and how."""
from __future__ import annotations

from dataclasses import dataclass

from rlhf.config import AppConfig
from rlhf.retrain.decisions import is_open
from rlhf.serving.policy_server import GenParams
from rlhf.training.prompts import STARTER_PROMPTS, PromptState, load_prompt_file, state_key, store_states
from storage import Agent, Policy, Store


@dataclass(frozen=True)
class PoolPrompt:
    """A context the queue may ask about: its history (ending with a user turn) and where it came from."""

    key: str  # the context key its replies get in the Store (under the agent's current system prompt)
    history: tuple  # {"role", "content"} dicts, no system message
    source: str  # starter | file | typed


def prompt_pool(store: Store, config: AppConfig, agent: Agent) -> list[PoolPrompt]:
    """The agent's prompt pool: contexts users typed (newest first) interleaved with the starter prompts (or
    ``queue.prompt_file``), deduplicated by context key under the agent's current system prompt."""
    system = agent.system_prompt or ""
    path = config.queue.prompt_file or STARTER_PROMPTS
    starter = [_rekey(s, system, "file" if config.queue.prompt_file else "starter") for s in load_prompt_file(path)]
    rows = store.feedback_rows(agent.id)
    queue_convs = {c["id"] for c in rows["conversations"] if c["source"] == "queue"}
    typed_rows = {"conversations": [c for c in rows["conversations"] if c["id"] not in queue_convs],
                  "messages": [m for m in rows["messages"] if m["conversation_id"] not in queue_convs],
                  "ratings": [], "comparisons": []}
    typed = [_rekey(s, system, "typed") for s in reversed(store_states(typed_rows))]
    out, seen = [], set()
    for i in range(max(len(typed), len(starter))):
        for group in (typed, starter):
            if i < len(group) and group[i].key not in seen:
                seen.add(group[i].key)
                out.append(group[i])
    return out


def _rekey(state: PromptState, system: str, source: str) -> PoolPrompt:
    history = tuple(m for m in state.as_messages() if m["role"] != "system")
    head = [{"role": "system", "content": system}] if system else []
    return PoolPrompt(state_key(head + list(history)), history, source)


def queue_versions(store: Store, agent: Agent) -> tuple[Policy, Policy]:
    """The two versions that answer queue items: the active one and the newest open decision, else the newest
    candidate (or the active one twice)."""
    active = store.active_policy(agent.id)
    candidates = [p for p in store.list_policies(agent.id) if p.status == "candidate"]
    waiting = [p for p in candidates if is_open(p)]  # people's votes decide these: they go first
    return active, (max(waiting or candidates, key=lambda p: p.version) if candidates else active)


def queue_params(config: AppConfig, agent: Agent, seed: int) -> GenParams:
    """Sampling settings of a queue reply: the agent's defaults, ``queue.temperature``, ``queue.max_new_tokens``."""
    gen = agent.generation or {}
    max_new = config.queue.max_new_tokens or gen.get("max_new_tokens") or config.serving.max_new_tokens
    return GenParams(max_new_tokens=int(max_new), temperature=config.queue.temperature,
                     top_p=gen.get("top_p", config.serving.top_p), seed=seed).validated()
