"""Open decisions: candidates the gate left to people, their votes against the active version, and settling them.

A version is *open* while it is a candidate whose gate verdict was inconclusive (a judge that cannot be told
from chance, a win rate too close to call, or a tripped reward-hacking guard) and no outcome is recorded yet. Its
opponent is the agent's active version (the arena and the vote queue pair them).

People decide, not votes. Only *blind* votes count: those cast on an arena round or a vote-queue item, where the
voter neither chose the two versions nor saw which was which (a comparison of replies the voter asked of chosen
versions in chat does not). Each person's first ``gate.decision_votes_per_annotator`` blind votes on the decision
count and the rest are kept but not counted, so nobody outvotes the team by voting often; an annotator's latest vote
on a pair of replies counts, and excluded annotators' votes do not. A verdict needs blind votes from at least
``gate.decision_min_annotators`` different people. The sequential test (``rlhf.analysis.confidence_sequence``, run at
``person_alpha`` so that one person's counted votes cannot lift its error rate) turns the counted votes into a
verdict; ``settle`` records it in the version's metrics (``decision/*``) and, with
``gate.decision_rule`` = auto in team mode, promotes or archives it. Local mode is one person: a decided
comparison waits for the admin's click there. The rule counts accounts, not people: in team mode an admin made
every account; under Hugging Face sign-in anyone with an HF account votes, so a decided comparison waits for an
admin there too, unless ``gate.decision_annotators`` names the accounts whose votes count (only theirs then do).

Excluding (or including) an annotator changes what counts: ``revisit`` recomputes every recorded outcome and
reopens the ones that no longer hold, undoing an automatic promotion or archiving (``decision/reopened`` says why).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from rlhf.analysis.confidence_sequence import Decision, decide, person_alpha
from rlhf.config import AppConfig
from storage import Comparison, Conflict, Policy, Store
from storage.util import utcnow

log = logging.getLogger(__name__)


def is_open(policy: Policy) -> bool:
    """True while people's votes are to decide this version (inconclusive gate, no outcome recorded)."""
    m = policy.metrics or {}
    return policy.status == "candidate" and m.get("gate/verdict") == "inconclusive" \
        and m.get("decision/verdict") is None


def opponent(store: Store, policy: Policy) -> Optional[Policy]:
    """The version the candidate is compared with: the one served now (the active version)."""
    active = store.active_policy(policy.agent_id)
    return active if active.id != policy.id else None


@dataclass(frozen=True)
class Tally:
    """The votes a decision counts (the candidate's wins, ties, losses, both-bad) and the people behind them."""

    wins: int = 0
    ties: int = 0
    losses: int = 0
    both_bad: int = 0
    people: int = 0  # different people with a counted rated vote
    blind: int = 0  # blind votes between the two versions (before the per-person cap)
    not_blind: int = 0  # votes between the two that do not count: the voter chose or saw the versions


def tally(comparisons: list[Comparison], candidate_id: int, opponent_id: int,
          excluded_ids: frozenset = frozenset(), per_person: int = 3) -> Tally:
    """Count the blind votes between two versions: each person's first ``per_person`` (the anonymous annotator is
    one person), excluded annotators left out. ``comparisons``: the counted set (``Store.list_comparisons``)."""
    used: dict = {}
    wins = ties = losses = both_bad = blind = not_blind = 0
    people = set()
    for c in sorted(comparisons, key=lambda c: c.id):
        if {c.policy_a_id, c.policy_b_id} != {candidate_id, opponent_id} or c.annotator_id in excluded_ids:
            continue
        if not c.blind:
            not_blind += 1
            continue
        blind += 1
        person = c.annotator_id or 0
        if used.get(person, 0) >= per_person:
            continue
        used[person] = used.get(person, 0) + 1
        if c.winner == "both_bad":
            both_bad += 1
            continue
        people.add(person)
        if c.winner == "tie":
            ties += 1
        elif (c.winner == "a") == (c.policy_a_id == candidate_id):
            wins += 1
        else:
            losses += 1
    return Tally(wins, ties, losses, both_bad, len(people), blind, not_blind)


@dataclass(frozen=True)
class Rules:
    """How people's votes decide here: the effective rule (and why it differs from ``gate.decision_rule``), people
    a verdict needs, votes counted per person, the level the test runs at
    (``rlhf.analysis.confidence_sequence.person_alpha``), and the accounts whose votes count (empty: all)."""

    rule: str
    min_people: int
    per_person: int
    alpha: float
    why: str = ""
    voters: frozenset = frozenset()


HF_ASKS = ("HF sign-in: anyone with a Hugging Face account votes and accounts cost nothing, so the rule counts "
           "accounts, not people; an admin confirms (gate.decision_annotators names the accounts to trust)")


def rules(config: AppConfig) -> Rules:
    """Team and HF modes: the ``gate.decision_*`` settings, except that under HF sign-in an automatic decision waits
    for an admin unless ``gate.decision_annotators`` names whose votes count. Local mode is one person: every vote
    counts, one person suffices, and a decided comparison waits for the admin's click."""
    g = config.gate
    if config.server.local_mode:
        return Rules("ask", 1, g.decision_max_votes, g.decision_alpha, "local mode is one person")
    voters = frozenset(n.strip() for n in g.decision_annotators)
    rule, why = g.decision_rule, ""
    if rule == "auto" and config.server.hf_sign_in and not voters:
        rule, why = "ask", HF_ASKS
    return Rules(rule, g.decision_min_annotators, g.decision_votes_per_annotator,
                 person_alpha(g.decision_alpha, g.decision_votes_per_annotator), why, voters)


def verdict_of(config: AppConfig, t: Tally) -> tuple[Decision, int]:
    """The test's decision on a tally, held at ``collecting`` until enough people voted; and people still needed."""
    r = rules(config)
    d = decide(t.wins, t.ties, t.losses, t.both_bad, alpha=r.alpha, max_votes=config.gate.decision_max_votes)
    short = max(0, r.min_people - t.people)
    if short and d.verdict in ("promote", "reject"):
        d = Decision("collecting", d.votes, d.win_rate, d.low, d.high, max(short, 1), d.wins, d.ties, d.losses,
                     d.both_bad)
    return d, short


def _excluded(store: Store, config: AppConfig) -> frozenset:
    """Annotator ids whose votes decide nothing: the excluded ones, and (with ``gate.decision_annotators``) every
    account not on that list, the anonymous one (None) included."""
    voters = rules(config).voters
    out = {a.id for a in store.list_annotators() if a.excluded or (voters and a.name not in voters)}
    return frozenset(out | ({None} if voters else set()))


def decision_for(store: Store, config: AppConfig, policy: Policy,
                 comparisons: Optional[list[Comparison]] = None) -> dict:
    """The people's-vote test for one version: verdict, counted votes, win rate with its always-valid interval,
    votes and people still needed, plus whether it is open, its opponent, and the recorded outcome when settled."""
    r = rules(config)
    other = opponent(store, policy)
    if comparisons is None:
        comparisons = store.list_comparisons(policy.agent_id)
    excluded = _excluded(store, config)
    t = tally(comparisons, policy.id, other.id, excluded, r.per_person) if other is not None else Tally()
    d, short = verdict_of(config, t)
    m = policy.metrics or {}
    out = {**d.to_dict(), "policy_id": policy.id, "version": policy.version, "status": policy.status,
           "open": is_open(policy), "opponent_id": other.id if other else None,
           "opponent_version": other.version if other else None, "rule": r.rule, "rule_reason": r.why,
           "alpha": round(r.alpha, 4),
           "people": t.people, "people_needed": short, "min_people": r.min_people,
           "votes_per_person": r.per_person, "blind_votes": t.blind, "uncounted_votes": t.not_blind,
           "gate": m.get("gate/verdict"), "gate_reason": m.get("gate/reason"),
           "guard_tripped": m.get("gate/guard_tripped") or [], "outcome": m.get("decision/verdict"),
           "awaiting_admin": bool(m.get("decision/awaiting_admin", False)),
           "decided_by": m.get("decision/people"), "reopened": m.get("decision/reopened")}
    if out["outcome"] and not out["open"]:
        out.update(verdict=m.get("decision/verdict"), votes=m.get("decision/votes", d.votes))
    return out


def open_decisions(store: Store, config: AppConfig, agent: int | str) -> list[dict]:
    """Every open decision of an agent (newest version first), and versions decided but awaiting an admin."""
    policies = store.list_policies(agent)
    comparisons = store.list_comparisons(agent)
    waiting = [p for p in policies if is_open(p) or ((p.metrics or {}).get("decision/awaiting_admin")
                                                     and (p.metrics or {}).get("decision/verdict")
                                                     and p.status == "candidate")]
    return [decision_for(store, config, p, comparisons) for p in sorted(waiting, key=lambda p: -p.version)]


def settle(store: Store, config: AppConfig) -> list[dict]:
    """Record every open decision the votes have decided; under the auto rule (team and HF modes) also act on it
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
    auto = rules(config).rule == "auto"
    record = {"decision/verdict": d["verdict"], "decision/votes": d["votes"], "decision/win_rate": d["win_rate"],
              "decision/low": d["low"], "decision/high": d["high"], "decision/opponent_id": d["opponent_id"],
              "decision/people": d["people"], "decision/awaiting_admin": not auto, "decision/applied": False}
    store.merge_policy_metrics(d["policy_id"], record)
    if auto:
        try:
            if d["verdict"] == "promote":
                store.promote_policy(d["policy_id"])
            else:
                store.archive_policy(d["policy_id"])
            store.merge_policy_metrics(d["policy_id"], {"decision/applied": True})
        except Conflict as exc:  # it became active or broken meanwhile: the outcome stays recorded
            log.warning("decision on policy %s not applied: %s", d["policy_id"], exc)
    log.info("people's votes decided policy %s: %s after %s votes from %s people", d["policy_id"], d["verdict"],
             d["votes"], d["people"])
    return {**d, "applied": auto}


def revisit(store: Store, config: AppConfig, annotator: str) -> list[dict]:
    """After ``annotator`` was excluded (or included again): recompute every recorded outcome they voted on with the
    votes that count now, and reopen those that no longer hold: an automatic promotion is undone (its opponent is
    active again), an automatic archiving too (a candidate again), and ``decision/reopened`` records why. Returns
    what was reopened."""
    person = next((a for a in store.list_annotators() if a.name == annotator), None)
    if person is None:
        return []
    because = f"{annotator} was {'excluded' if person.excluded else 'included again'}"
    excluded, per_person = _excluded(store, config), rules(config).per_person
    reopened = []
    for agent in store.list_agents():
        comparisons = None
        for p in store.list_policies(agent.id):
            m = p.metrics or {}
            was, opp_id = m.get("decision/verdict"), m.get("decision/opponent_id")
            if not was or opp_id is None:
                continue
            if comparisons is None:
                comparisons = store.list_comparisons(agent.id)
            theirs = [c for c in comparisons if c.annotator_id == person.id and c.blind
                      and {c.policy_a_id, c.policy_b_id} == {p.id, opp_id}]
            if not theirs:
                continue  # the outcome never rested on their votes
            now, _ = verdict_of(config, tally(comparisons, p.id, opp_id, excluded, per_person))
            if now.verdict == was:
                continue
            reopened.append(_reopen(store, p, was, now, opp_id, because))
    return reopened


def _reopen(store: Store, p: Policy, was: str, now: Decision, opp_id: int, because: str) -> dict:
    """Undo what an outcome that no longer holds did, and say so in the version's metrics."""
    m = p.metrics or {}
    restored, note = None, ""
    if m.get("decision/applied"):
        try:
            if was == "promote" and p.status == "active":
                restored = store.promote_policy(opp_id).id  # the version it replaced serves again
            elif was != "promote" and p.status == "archived":
                store.unarchive_policy(p.id)
            else:
                note = f"left {p.status}: it changed since the decision"
        except Conflict as exc:
            note = f"not undone: {exc}"
    info = {"previous": was, "now": now.verdict, "votes_before": m.get("decision/votes"), "votes_now": now.votes,
            "because": because, "at": utcnow(), "restored_active_id": restored, "note": note}
    store.merge_policy_metrics(p.id, {"decision/verdict": None, "decision/awaiting_admin": False,
                                      "decision/applied": False, "decision/reopened": info})
    log.warning("decision on policy %s reopened (%s → %s) because %s%s", p.id, was, now.verdict, because,
                f"; policy {restored} is active again" if restored else "")
    return {"policy_id": p.id, "version": p.version, **info}
