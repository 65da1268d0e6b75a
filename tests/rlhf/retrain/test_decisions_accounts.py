"""An account is not a person. Under Hugging Face sign-in anyone with an HF account votes, so an automatic people's
decision waits for an admin there, unless ``gate.decision_annotators`` names the accounts whose votes count; in team
mode an admin made every account, and the automatic rule stays."""
from __future__ import annotations

from rlhf.config import AppConfig, apply_overrides
from rlhf.retrain import decisions
from tests.rlhf.retrain.test_decisions import INCONCLUSIVE, TEAM, version, vote
from ui.tabs.decisions import decision_line

HF = {"server.space_id": "me/studio"}  # HF sign-in: a Space, no configured users


def sock_puppets(store, tmp_path, n=4):
    """A candidate and ``n`` fresh accounts each giving it 3 blind wins (enough to decide it)."""
    cand = version(store, tmp_path, 1, INCONCLUSIVE)
    active = store.active_policy("assistant")
    for i in range(3):
        for person in range(n):
            vote(store, cand, active, "a", f"puppet{person}", f"{person}-{i}")
    return cand, active


def test_hf_sign_in_records_the_accounts_decision_and_waits_for_an_admin(store, tmp_path):
    cand, active = sock_puppets(store, tmp_path)
    cfg = apply_overrides(AppConfig(), {**HF, "gate.decision_rule": "auto"})
    settled = decisions.settle(store, cfg)
    assert [(s["verdict"], s["applied"], s["people"]) for s in settled] == [("promote", False, 4)]
    after = store.get_policy(cand.id)
    assert after.status == "candidate" and after.metrics["decision/awaiting_admin"]
    assert store.active_policy("assistant").id == active.id  # four free accounts promoted nothing
    d = decisions.open_decisions(store, cfg, "assistant")[0]
    assert d["rule"] == "ask" and "HF sign-in" in d["rule_reason"] and d["decided_by"] == 4
    line = decision_line(d)
    assert "decided by 4 accounts: promote" in line and "waiting for an admin" in line and "HF sign-in" in line


def test_an_allow_list_lifts_the_wait_and_counts_only_the_accounts_on_it(store, tmp_path):
    cand, active = sock_puppets(store, tmp_path)
    cfg = apply_overrides(AppConfig(), {**HF, "gate.decision_annotators": ["ann", "bob", "carol", "dave"]})
    d = decisions.decision_for(store, cfg, store.get_policy(cand.id))
    assert d["rule"] == "auto" and d["votes"] == 0 and d["people"] == 0  # the puppets are not on the list
    assert decisions.settle(store, cfg) == []
    for i in range(3):
        for person in ("ann", "bob", "carol", "dave"):
            vote(store, cand, active, "a", person, f"{person}{i}")
    vote(store, cand, active, "b", None, "anonymous")  # an anonymous vote is nobody on the list either
    settled = decisions.settle(store, cfg)
    assert [(s["verdict"], s["applied"], s["people"], s["votes"]) for s in settled] == [("promote", True, 4, 12)]
    assert store.active_policy("assistant").id == cand.id


def test_team_mode_accounts_are_admin_made_and_the_automatic_rule_stays(store, tmp_path):
    cand, _ = sock_puppets(store, tmp_path)
    cfg = apply_overrides(AppConfig(), {**TEAM, "gate.decision_rule": "auto"})
    assert decisions.rules(cfg).rule == "auto" and decisions.rules(cfg).why == ""
    assert [(s["verdict"], s["applied"]) for s in decisions.settle(store, cfg)] == [("promote", True)]
    assert store.active_policy("assistant").id == cand.id


def test_an_allow_list_must_name_annotators():
    import pytest

    from rlhf.config import ConfigError

    with pytest.raises(ConfigError, match="gate.decision_annotators"):
        apply_overrides(AppConfig(), {"gate.decision_annotators": ["ann", ""]})
