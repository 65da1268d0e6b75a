"""Training prompts for PPO: conversation states from the Store, a prompt file, a held-out eval split,
and a replay buffer that mixes low-rated ("adversarial") contexts with the rest.

A prompt is a chat state: ``[{"role": "system", ...}?, ...history..., {"role": "user", ...}]`` — exactly
what a policy answers. States are deduplicated by their context key (the key a reply to that state
carries in the Store), so a context that was regenerated five times is trained on once.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from rlhf.assets import asset_path
from storage.conversations import context_key
from storage.ratings import fold_ratings

STARTER_PROMPTS = asset_path("prompts.jsonl")
LOW_FLAGS = frozenset({"Unsafe", "Inaccurate"})


@dataclass(frozen=True)
class PromptState:
    """One deduplicated conversation state ending with a user turn."""

    key: str
    messages: tuple  # of {"role", "content"} dicts, system message first when there is one
    low_rated: bool = False
    source: str = "store"  # store | file

    def as_messages(self) -> list[dict]:
        """A fresh list of message dicts (safe to mutate)."""
        return [dict(m) for m in self.messages]


def state_key(messages: Sequence[dict]) -> str:
    """The Store's context key of a reply to ``messages`` (system prompt first, if any)."""
    msgs = list(messages)
    system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else ""
    if msgs and msgs[0]["role"] == "system":
        msgs = msgs[1:]
    key = context_key(None, None, None, system)
    for m in msgs:
        key = context_key(key, m["role"], m["content"], system)
    return key


def _with_system(system_prompt: str, history: Iterable[dict]) -> tuple:
    head = ({"role": "system", "content": system_prompt},) if system_prompt else ()
    return head + tuple({"role": m["role"], "content": m["content"]} for m in history)


def is_low_rating(rating: dict) -> bool:
    """A folded rating counts as low: thumbs down, score <= 2, or an Unsafe/Inaccurate flag."""
    if rating.get("thumb") == -1:
        return True
    score = rating.get("score")
    if score is not None and score <= 2:
        return True
    return bool(LOW_FLAGS.intersection(rating.get("flags") or ()))


def _low_rated_messages(rows: dict) -> set[int]:
    """Ids of replies rated low by some (non-excluded) annotator, or judged both bad in a comparison."""
    excluded = set(rows.get("excluded_annotators") or ())
    events: dict[tuple, list[dict]] = {}
    for r in rows["ratings"]:  # ordered by id: fold_ratings takes the latest value of each field (withdrawals too)
        if r.get("annotator") not in excluded:
            events.setdefault((r["message_id"], r.get("annotator")), []).append(r)
    low = {message_id for (message_id, _), rs in events.items() if is_low_rating(fold_ratings(rs))}
    for c in rows.get("comparisons") or ():
        if c["winner"] == "both_bad" and c.get("annotator") not in excluded:
            low.update((c["message_a_id"], c["message_b_id"]))
    return low


def store_states(rows: dict) -> list[PromptState]:
    """One state per distinct context that ends with a user turn, from ``Store.feedback_rows(agent)``."""
    conversations = {c["id"]: c for c in rows["conversations"]}
    messages = {m["id"]: m for m in rows["messages"]}
    low_messages = _low_rated_messages(rows)
    low_keys = {messages[i]["context_key"] for i in low_messages if i in messages}
    states: dict[str, PromptState] = {}
    for m in rows["messages"]:
        if m["role"] != "user":
            continue
        branch, node = [], m
        while node is not None:  # walk up to the conversation's first message
            branch.append(node)
            node = messages.get(node["parent_id"]) if node["parent_id"] is not None else None
        system = conversations[m["conversation_id"]]["system_prompt"] or ""
        msgs = _with_system(system, reversed(branch))
        key = state_key(msgs)
        if key not in states:
            states[key] = PromptState(key, msgs, low_rated=key in low_keys, source="store")
        elif key in low_keys and not states[key].low_rated:
            states[key] = PromptState(key, msgs, low_rated=True, source="store")
    return list(states.values())


def load_prompt_file(path: str | Path, system_prompt: str = "") -> list[PromptState]:
    """Prompts from a JSONL file (``{"prompt"}`` or ``{"messages"}`` per line) or a TXT file (one per line).

    ``system_prompt`` is put first unless a JSONL row brings its own system message or ``"system"`` key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    states = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if path.suffix == ".jsonl":
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON: {exc}") from None
            msgs = _row_messages(row, system_prompt, f"{path}:{n}")
        else:
            msgs = _with_system(system_prompt, [{"role": "user", "content": line}])
        states.append(PromptState(state_key(msgs), msgs, source="file"))
    return states


def _row_messages(row: dict, system_prompt: str, where: str) -> tuple:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object with 'prompt' or 'messages'")
    system = row.get("system", system_prompt) or ""
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs or any(
                not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant")
                or not isinstance(m.get("content"), str) for m in msgs):
            raise ValueError(f"{where}: 'messages' must be a non-empty list of {{role, content}}")
        if msgs[0]["role"] == "system":
            system, msgs = msgs[0]["content"], msgs[1:]
    elif isinstance(row.get("prompt"), str) and row["prompt"].strip():
        msgs = [{"role": "user", "content": row["prompt"]}]
    else:
        raise ValueError(f"{where}: expected 'prompt' (text) or 'messages'")
    if not msgs or msgs[-1]["role"] != "user":
        raise ValueError(f"{where}: the last message must be a user turn")
    return _with_system(system, msgs)


def dedupe(states: Iterable[PromptState]) -> list[PromptState]:
    """First occurrence of each key wins, except that a low rating anywhere marks the key low."""
    out: dict[str, PromptState] = {}
    for s in states:
        if s.key not in out:
            out[s.key] = s
        elif s.low_rated and not out[s.key].low_rated:
            out[s.key] = PromptState(s.key, out[s.key].messages, True, out[s.key].source)
    return list(out.values())


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def split_eval(states: Sequence[PromptState], n_eval: int, seed: int = 0
               ) -> tuple[list[PromptState], list[PromptState]]:
    """(train, eval): a deterministic, disjoint split; eval prefers file prompts so it stays fixed across runs.

    Eval is the ``n_eval`` states with the smallest hash of (seed, key), file prompts first: new chats in
    the Store do not move the eval set, so rewards of successive versions are measured on the same prompts.
    At least one state is always left for training.
    """
    ordered = sorted(states, key=lambda s: (s.source != "file", _rank(seed, s.key)))
    n = max(0, min(n_eval, len(ordered) - 1)) if len(ordered) > 1 else 0
    held = {s.key for s in ordered[:n]}
    return [s for s in states if s.key not in held], ordered[:n]


class PromptBuffer:
    """Rollout prompts per step: a share from low-rated contexts, the rest from all others.

    The share is ``adversarial_ratio`` of the batch, at most the number of low-rated contexts.

    Each pool is walked through in a seeded shuffled order, epoch after epoch, so every prompt is seen
    before any repeats. The batch of a step is a pure function of (seed, step, rank): a resumed run draws
    exactly the prompts the uninterrupted run would have.
    """

    def __init__(self, states: Sequence[PromptState] | Sequence[list[dict]], adversarial_ratio: float = 0.0,
                 seed: int = 0):
        states = [s if isinstance(s, PromptState) else PromptState(state_key(s), tuple(s)) for s in states]
        if not states:
            raise ValueError("no training prompts: add conversations or a prompt file")
        if not 0.0 <= adversarial_ratio <= 1.0:
            raise ValueError(f"adversarial_ratio must be in [0, 1], got {adversarial_ratio}")
        self.adversarial = [s for s in states if s.low_rated]
        self.normal = [s for s in states if not s.low_rated]
        self.ratio = adversarial_ratio if self.adversarial else 0.0
        if not self.normal:  # only low-rated contexts: all of them come from the adversarial pool
            self.ratio = 1.0
        self.seed = seed

    def __len__(self) -> int:
        return len(self.adversarial) + len(self.normal)

    def _draw(self, pool: list[PromptState], tag: int, start: int, count: int) -> list[PromptState]:
        out, perms = [], {}
        for i in range(start, start + count):
            epoch, pos = divmod(i, len(pool))
            if epoch not in perms:
                order = list(range(len(pool)))
                random.Random(f"{self.seed}:{tag}:{epoch}").shuffle(order)
                perms[epoch] = order
            out.append(pool[perms[epoch][pos]])
        return out

    def batch(self, step: int, batch_size: int, rank: int = 0, world_size: int = 1) -> list[list[dict]]:
        """The prompts of rollout ``step`` (1-based) for process ``rank``."""
        # No more low-rated prompts per batch than there are: a tiny pool must not fill the batch with copies.
        n_adv = min(round(self.ratio * batch_size), len(self.adversarial)) if self.normal else batch_size
        n_norm = batch_size - n_adv
        slot = (step - 1) * world_size + rank
        picked = self._draw(self.adversarial, 1, slot * n_adv, n_adv) if n_adv else []
        picked += self._draw(self.normal, 0, slot * n_norm, n_norm) if n_norm else []
        return [s.as_messages() for s in picked]


def build_prompt_sets(rows: Optional[dict], system_prompt: str, prompt_file: str = "", n_eval: int = 8,
                      seed: int = 0) -> tuple[list[PromptState], list[PromptState]]:
    """(train, eval) states from the Store rows plus the prompt file (the starter set when empty)."""
    file_states = load_prompt_file(prompt_file or STARTER_PROMPTS, system_prompt)
    states = dedupe(file_states + (store_states(rows) if rows else []))
    return split_eval(states, n_eval, seed)


def prompt_sets(store, config, agent: int | str | None = None, rows: Optional[dict] = None
                ) -> tuple[PromptBuffer, list[list[dict]]]:
    """(training buffer, held-out eval prompts) for an agent: its Store states + the prompt file.

    ``rows``: the feedback snapshot a retrain took (``FeedbackSnapshot``), so nothing written after it becomes a
    training prompt; None reads the Store as it is now.
    """
    record = store.get_agent(agent)
    cfg = config.ppo
    rows = store.feedback_rows(record.id) if rows is None else rows
    train, held_out = build_prompt_sets(rows, record.system_prompt, cfg.prompt_file, cfg.eval_prompts, cfg.seed)
    return PromptBuffer(train, cfg.adversarial_ratio, cfg.seed), [s.as_messages() for s in held_out]
