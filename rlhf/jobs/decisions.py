"""Open decisions: candidates the gate left to people, their votes against the active version, and settling them.

A version is *open* while it is a candidate whose gate verdict was inconclusive (a judge that cannot be told
from chance, a win rate too close to call, or a tripped reward-hacking guard) and no outcome is recorded yet. Its
opponent is the agent's active version (the arena and the vote queue pair them). The votes are the comparisons between exactly these two versions (arena and vote queue alike); an
annotator's latest vote on a pair of replies counts, and excluded annotators' votes do not. The sequential test
(``rlhf.analysis.decision``) turns them into a verdict; ``settle`` records it in the version's metrics
(``decision/*``) and, with ``gate.decision_rule`` = auto, promotes or archives it.
"""
from __future__ import annotations

import logging
from typing import Optional

from rlhf.analysis.decision import Decision, decide
from rlhf.config import AppConfig
from storage import Comparison, Conflict, Policy, Store

log = logging.getLogger(__name__)

def is_open(policy: Policy) -> bool:
    """True while people's votes are to decide this version (inconclusive gate, no outcome recorded)."""
    m = policy.metrics or {}
    return policy.status == "candidate" and m.get("gate/verdict") == "inconclusive" and "decision/verdict" not in m


def opponent(store: Store, policy: Policy) -> Optional[Policy]:
    """The version the candidate is compared with: the one served now (the active version)."""
    active = store.active_policy(policy.agent_id)
    return active if active.id != policy.id else None


def vote_counts(comparisons: list[Comparison], candidate_id: int, opponent_id: int,
                excluded_ids: frozenset = frozenset()) -> tuple[int, int, int, int]:
    """(wins, ties, losses, both_bad) of the candidate in votes between the two versions; an annotator's latest
    vote on a pair of replies counts (anonymous votes each count)."""
    latest: dict = {}
    for c in comparisons:
        if {c.policy_a_id, c.policy_b_id} != {candidate_id, opponent_id} or c.annotator_id in excluded_ids:
            continue
        key = (c.annotator_id, min(c.message_a_id, c.message_b_id), max(c.message_a_id, c.message_b_id)) \
            if c.annotator_id is not None else ("anon", c.id)
        latest[key] = c
    wins = ties = losses = both_bad = 0
    for c in latest.values():
        if c.winner == "tie":
            ties += 1
        elif c.winner == "both_bad":
            both_bad += 1
        elif (c.winner == "a") == (c.policy_a_id == candidate_id):
            wins += 1
        else:
            losses += 1
    return wins, ties, losses, both_bad


def decision_for(store: Store, config: AppConfig, policy: Policy,
                 comparisons: Optional[list[Comparison]] = None) -> dict:
    """The people's-vote test for one version: verdict, votes, win rate with its always-valid interval, votes still
    needed, plus whether it is open, its opponent, and the recorded outcome when settled."""
    g = config.gate
    other = opponent(store, policy)
    if comparisons is None:
        comparisons = store.list_comparisons(policy.agent_id)
    excluded = frozenset(a.id for a in store.list_annotators() if a.excluded)
    counts = vote_counts(comparisons, policy.id, other.id, excluded) if other is not None else (0, 0, 0, 0)
    d: Decision = decide(*counts, alpha=g.decision_alpha, max_votes=g.decision_max_votes)
    m = policy.metrics or {}
    out = {**d.to_dict(), "policy_id": policy.id, "version": policy.version, "status": policy.status,
           "open": is_open(policy), "opponent_id": other.id if other else None,
           "opponent_version": other.version if other else None, "rule": g.decision_rule,
           "gate": m.get("gate/verdict"), "gate_reason": m.get("gate/reason"),
           "guard_tripped": m.get("gate/guard_tripped") or [], "outcome": m.get("decision/verdict"),
           "awaiting_admin": m.get("decision/awaiting_admin", False)}
    if out["outcome"] and not out["open"]:
        out.update(verdict=m.get("decision/verdict"), votes=m.get("decision/votes", d.votes))
    return out


def open_decisions(store: Store, config: AppConfig, agent: int | str) -> list[dict]:
    """Every open decision of an agent (newest version first), and versions decided but awaiting an admin."""
    policies = store.list_policies(agent)
    comparisons = store.list_comparisons(agent)
    waiting = [p for p in policies if is_open(p) or ((p.metrics or {}).get("decision/awaiting_admin")
                                                     and p.status == "candidate")]
    return [decision_for(store, config, p, comparisons) for p in sorted(waiting, key=lambda p: -p.version)]


def settle(store: Store, config: AppConfig) -> list[dict]:
    """Record every open decision the votes have decided; with ``gate.decision_rule`` auto also act on it
    (promote, or archive on reject / no difference). Returns what was settled."""
    settled = []
    for agent in store.list_agents():
        for d in open_decisions(store, config, agent.id):
            if d["verdict"] == "collecting" or not d["open"]:
                continue
            settled.append(settle_one(store, config, d))
    return settled


def settle_one(store: Store, config: AppConfig, d: dict) -> dict:
    """Record one decided comparison (and act on it under the auto rule)."""
    auto = config.gate.decision_rule == "auto"
    record = {"decision/verdict": d["verdict"], "decision/votes": d["votes"], "decision/win_rate": d["win_rate"],
              "decision/low": d["low"], "decision/high": d["high"], "decision/opponent_id": d["opponent_id"],
              "decision/awaiting_admin": not auto}
    store.merge_policy_metrics(d["policy_id"], record)
    if auto:
        try:
            if d["verdict"] == "promote":
                store.promote_policy(d["policy_id"])
            else:
                store.archive_policy(d["policy_id"])
        except Conflict as exc:  # it became active or broken meanwhile: the outcome stays recorded
            log.warning("decision on policy %s not applied: %s", d["policy_id"], exc)
    log.info("people's votes decided policy %s: %s after %s votes", d["policy_id"], d["verdict"], d["votes"])
    return {**d, "applied": auto}

