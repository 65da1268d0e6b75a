"""Lineage: which annotators' comparisons and ratings a version learned from, and which versions an exclusion hits.

A retrained version's reward model was fitted on the agent's feedback up to its data snapshot (the highest
rating and comparison ids), minus the annotators excluded at that time (recorded in the reward model's
``meta.json``); PPO started from its parent's adapter, so it also carries everything its ancestors learned.
When an annotator is excluded later, every version whose own or inherited lineage holds their feedback is
*tainted*; a retrain without them starts PPO from the newest clean ancestor (the base at worst).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from storage import Policy, Store

ANONYMOUS = "(anonymous)"


def _excluded_then(store: Store, policy: Policy) -> set[str]:
    """Annotators left out when the version was trained: its reward model's record, else its config's list."""
    names = set(((policy.config or {}).get("reward") or {}).get("exclude_annotators") or [])
    if policy.reward_model_id is not None:
        try:
            meta = json.loads((Path(store.get_reward_model(policy.reward_model_id).path) / "meta.json").read_text())
            names |= set(meta.get("excluded_annotators") or [])
        except (OSError, ValueError):
            pass
    return names


def _span(ids: list[int]) -> dict:
    return {"count": len(ids), "first_id": min(ids) if ids else None, "last_id": max(ids) if ids else None}


def own_sources(store: Store, policy: Policy, rows: Optional[dict] = None) -> list[dict]:
    """Per annotator: counts and id ranges of the comparisons and ratings this version's training read."""
    snap = policy.data_snapshot or {}
    if not snap:
        return []
    rows = rows if rows is not None else store.feedback_rows(policy.agent_id)
    skip = _excluded_then(store, policy)
    by: dict[str, dict[str, list[int]]] = {}
    for kind, key in (("comparisons", "comparison_id"), ("ratings", "rating_id")):
        for row in rows[kind]:
            name = row.get("annotator") or ANONYMOUS
            if row["id"] <= int(snap.get(key, 0)) and name not in skip:
                by.setdefault(name, {"comparisons": [], "ratings": []})[kind].append(int(row["id"]))
    return [{"annotator": name, "comparisons": _span(v["comparisons"]), "ratings": _span(v["ratings"])}
            for name, v in sorted(by.items())]


def ancestors(store: Store, policy: Policy) -> list[Policy]:
    """Parent, grandparent, ... (nearest first)."""
    out, seen, current = [], {policy.id}, policy
    while current.parent_id is not None and current.parent_id not in seen:
        current = store.get_policy(current.parent_id)
        seen.add(current.id)
        out.append(current)
    return out


def excluded_now(store: Store, config_excluded: Optional[list] = None) -> set[str]:
    """Annotators excluded today (the Store's marks and ``reward.exclude_annotators``)."""
    return {a.name for a in store.list_annotators() if a.excluded} | set(config_excluded or [])


def lineage(store: Store, policy_id: int, config_excluded: Optional[list] = None) -> dict:
    """GET /policies/{id}/lineage: own sources per annotator, inherited annotators, and the exclusions it carries."""
    policy = store.get_policy(policy_id)
    rows = store.feedback_rows(policy.agent_id)
    own = own_sources(store, policy, rows)
    now = excluded_now(store, config_excluded)
    inherited, clean = [], None
    for anc in ancestors(store, policy):
        names = sorted({s["annotator"] for s in own_sources(store, anc, rows)})
        inherited.append({"policy_id": anc.id, "version": anc.version, "annotators": names})
    learned = {s["annotator"] for s in own} | {n for a in inherited for n in a["annotators"]}
    for i, anc in enumerate(ancestors(store, policy)):  # the newest ancestor untouched by today's exclusions
        if anc.status != "broken" and not ({n for a in inherited[i:] for n in a["annotators"]} & now):
            clean = anc
            break
    tainted = sorted(learned & now)
    excluded = {a.name for a in store.list_annotators() if a.excluded}
    return {"policy_id": policy.id, "version": policy.version, "data_snapshot": policy.data_snapshot,
            "annotators": [{**s, "excluded": s["annotator"] in excluded} for s in own],
            "inherited": inherited, "tainted_by": tainted,
            "retrain_from": (clean.id if clean else None) if tainted else None}


def tainted_versions(store: Store, agent: int | str, config_excluded: Optional[list] = None) -> list[dict]:
    """Servable versions of an agent that learned from an annotator excluded since (newest first)."""
    out = []
    for p in sorted(store.list_policies(agent), key=lambda p: -p.version):
        if p.status in ("active", "candidate") and p.data_snapshot:
            lin = lineage(store, p.id, config_excluded)
            if lin["tainted_by"]:
                out.append({"policy_id": p.id, "version": p.version, "status": p.status,
                            "tainted_by": lin["tainted_by"], "retrain_from": lin["retrain_from"]})
    return out
