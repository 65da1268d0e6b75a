"""Promotion decisions and lineage as plain functions, shared by the REST router and the dashboard panel."""
from __future__ import annotations

from typing import Optional

from rlhf.retrain import decisions, lineage
from rlhf.retrain.data import dry_run
from storage import Conflict, InvalidInput
from ui.services import Services

DECISION_KEYS = ("verdict", "votes", "win_rate", "low", "high", "votes_needed")


# How the votes split: read before and after someone votes, it tells how they voted. For admins only.
LIVE_KEYS = ("wins", "ties", "losses", "both_bad", "win_rate", "low", "high")


def for_viewer(d: dict, admin: bool) -> dict:
    """A decision as the caller may see it: admins see the live tally; others see how many votes and accounts it
    has and its verdict, not how the votes split (``tally_hidden``)."""
    counted = sum(d.get(k) or 0 for k in ("wins", "ties", "losses", "both_bad"))
    if admin:
        return {**d, "counted_votes": counted, "tally_hidden": False}
    return {**d, **dict.fromkeys(LIVE_KEYS), "counted_votes": counted, "tally_hidden": True}


def decision_json(services: Services, policy_id: int, admin: bool = False) -> dict:
    """GET /policies/{id}/decision: the people's-vote test of this version against the active one (the live tally
    for admins only)."""
    store = services.store
    return for_viewer(decisions.decision_for(store, services.config, store.get_policy(policy_id)), admin)


def open_decisions(services: Services, agent: Optional[str], admin: bool = False) -> list[dict]:
    """Every open decision of an agent (and decided ones awaiting an admin), newest first (live tallies for admins
    only)."""
    rows = decisions.open_decisions(services.store, services.config, services.store.get_agent(agent).id)
    return [for_viewer(d, admin) for d in rows]


def set_excluded(services: Services, name: str, excluded: bool) -> dict:
    """Exclude an annotator from training and from people's decisions (their feedback stays stored), or include them
    again; every recorded decision that rested on their votes is recomputed, and reopened when it no longer holds.
    ``{"name", "excluded", "reopened": [{"policy_id", "version", "previous", "now", ...}]}``."""
    a = services.store.set_annotator_excluded(name, excluded)
    reopened = decisions.revisit(services.store, services.config, a.name)
    return {"name": a.name, "excluded": bool(a.excluded), "reopened": reopened}


def reopened_text(reopened: list[dict]) -> str:
    """What reopening decisions changed, in words ('' when nothing was reopened)."""
    lines = []
    for r in reopened:
        undone = (f"; policy {r['restored_active_id']} is active again" if r.get("restored_active_id") else "") + \
            (f" ({r['note']})" if r.get("note") else "")
        lines.append(f"v{r['version']}: people's decision '{r['previous']}' reopened ({r['because']}; without those "
                     f"votes: {r['now']}){undone}")
    return "\n".join(lines)


def lineage_json(services: Services, policy_id: int) -> dict:
    """GET /policies/{id}/lineage."""
    return lineage.lineage(services.store, policy_id, services.config.reward.exclude_annotators)


def tainted(services: Services, agent: Optional[str]) -> list[dict]:
    """Servable versions that learned from an annotator excluded since."""
    store = services.store
    return lineage.tainted_versions(store, store.get_agent(agent).id, services.config.reward.exclude_annotators)


def retrain_without(services: Services, policy_id: int, annotators: Optional[list[str]] = None) -> dict:
    """Queue a retrain of a version's agent that leaves ``annotators`` out (default: the excluded annotators it
    learned from), with PPO starting from the newest ancestor that never learned from them."""
    store, config = services.store, services.config
    policy = store.get_policy(policy_id)
    if annotators is not None and (not isinstance(annotators, list) or not all(isinstance(a, str) and a.strip()
                                                                               for a in annotators)):
        raise InvalidInput("annotators must be a list of annotator names")
    names = sorted(set(annotators)) if annotators else None
    lin = lineage.lineage(store, policy.id, sorted(set(config.reward.exclude_annotators) | set(names or [])))
    leave_out = names or lin["tainted_by"]
    if not leave_out:
        raise InvalidInput(f"version {policy.version} learned from no excluded annotator; name the annotators to "
                           "leave out")
    if not set(leave_out) & set(lin["tainted_by"]):
        raise InvalidInput(f"version {policy.version} did not learn from {', '.join(leave_out)}")
    if services.scheduler is None:
        raise Conflict("the scheduler is not running here: start the app with scheduler.enabled to retrain")
    agent = store.get_agent(policy.agent_id)
    overrides = {"reward.exclude_annotators": sorted(set(config.reward.exclude_annotators) | set(leave_out))}
    estimate = dry_run(store, config, agent.name, overrides)
    if not estimate["ready"]:
        raise Conflict("not enough feedback without them to retrain: " + estimate["missing"])
    start = lin["retrain_from"]
    job = services.scheduler.enqueue("retrain", agent.name, overrides, reason="retrain-without",
                                     from_policy_id=start, estimated_minutes=estimate["estimated_minutes"])
    return {"status": "queued", "job_id": job.id, "without": leave_out, "from_policy_id": start}
