"""Votes a team can trust (issue #24), over REST in process: no test door, forwarded headers only from listed
proxies, blind replies stay blind, one counted vote per annotator and pair, conversations are their owner's,
message caps, safe agent names and export paths, API tokens that can be listed, revoked and expire, and chat
boxes that render no math. The real-process versions of findings 1-3 are in tests/e2e/test_side_doors.py."""
from __future__ import annotations

import json
import time
from pathlib import Path

import gradio as gr
import httpx
import pytest
from fastapi.testclient import TestClient

from rlhf.config import ConfigError, load_config
from rlhf.interop.export import ExportError, default_name
from rlhf.training.data import build_pairs
from tests.conftest import LiveServer, make_adapter
from ui.tabs import data as data_tab

USERS = "alice:a-pass:admin,bob:b-pass,carol:c-pass"
ALICE, BOB, CAROL = ("alice", "a-pass"), ("bob", "b-pass"), ("carol", "c-pass")
LOCAL = "http://127.0.0.1"  # what an in-process client must send as its Host, like any browser on this machine


def build(tmp_path, tiny_model_dir, tiny_server, *extra):
    from ui.webapp import build_services

    config = load_config(env={}, overrides=[f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}",
                                            "device=cpu", "serving.warmup=false", "serving.max_new_tokens=6",
                                            "scheduler.enabled=false", *extra])
    return build_services(config, server=tiny_server)


@pytest.fixture
def team(tmp_path, tiny_model_dir, tiny_server):
    """A team app (alice admin, bob and carol annotators) and an in-process client that sends Host 127.0.0.1."""
    from ui.webapp import create_app

    services = build(tmp_path, tiny_model_dir, tiny_server, f"server.users={USERS}")
    with TestClient(create_app(services, ui=False), base_url=LOCAL) as client:
        yield services, client
    services.store.close()


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory):
    return make_adapter(tiny_model_dir, tmp_path_factory.mktemp("trust") / "v1", seed=41)


def two_versions(services, adapter_dir):
    store = services.store
    v0 = store.active_policy("assistant")
    return v0, store.register_policy_version("assistant", adapter_dir, v0.id, promote=False)


def chat(client, who, text="Which is better?", **extra) -> dict:
    r = client.post("/api/v1/chat", auth=who, json={"messages": [{"role": "user", "content": text}],
                                                    "max_new_tokens": 4, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def counts(services) -> dict:
    return {t: services.store.count(t) for t in ("messages", "ratings", "comparisons", "conversations")}


# ---- 1. no test door: an in-process client is just another client ---------------------------------------
def test_the_in_process_client_gets_no_host_exemption(tmp_path, tiny_model_dir, tiny_server):
    from ui.webapp import create_app

    services = build(tmp_path, tiny_model_dir, tiny_server)  # local mode, no server.allowed_hosts
    try:
        app = create_app(services, ui=False)
        with TestClient(app) as testserver:  # Host: testserver, peer "testclient"
            refused = testserver.get("/api/v1/agents")
            assert refused.status_code == 400 and "allowed_hosts" in refused.json()["error"]
            rebind = {"Host": "rebind.evil.example", "X-Forwarded-For": "testclient"}
            assert testserver.post("/api/v1/tokens", json={"name": "mallory"}, headers=rebind).status_code == 400
        with TestClient(app, base_url=LOCAL) as local:
            assert local.get("/api/v1/agents").status_code == 200
        services.config.server.allowed_hosts = ["testserver"]  # or list the name, like any other host
        with TestClient(app) as listed:
            assert listed.get("/api/v1/agents").status_code == 200
        assert services.store.list_api_tokens() == []
    finally:
        services.store.close()


# ---- 2. forwarded headers only from listed proxies ---------------------------------------------------------
def test_trusted_proxies_parse_and_pick_the_client():
    from ui.forwarded import TrustedProxies

    none = TrustedProxies([])
    assert not none and not none.trusts("127.0.0.1") and not none.trusts("testclient")
    lan = TrustedProxies(["10.0.0.0/8", "::1"])
    assert lan.trusts("10.1.2.3") and lan.trusts("::1") and not lan.trusts("127.0.0.1") and not lan.trusts("x")
    assert lan.client("10.0.0.1", "1.2.3.4, 10.0.0.7") == "1.2.3.4"  # listed hops are skipped
    assert lan.client("10.0.0.1", "6.6.6.6, 1.2.3.4") == "1.2.3.4"  # what a client wrote itself is ignored
    assert lan.client("10.0.0.1", " ") == "10.0.0.1"
    assert TrustedProxies(["*"]).client("10.0.0.1", "6.6.6.6, 1.2.3.4") == "1.2.3.4"
    with pytest.raises(ConfigError, match="trusted_proxies"):
        TrustedProxies(["proxy.example"])
    assert load_config(env={"RLHF_SERVER_TRUSTED_PROXIES": "*"}).server.trusted_proxies == ["*"]
    on_space = {"SPACE_ID": "team/studio", "SYSTEM": "spaces"}
    assert load_config(env=on_space).server.trusted_proxies == ["*"]  # HF's proxy only
    assert load_config(env={}).server.trusted_proxies == []


def spray(url: str, names: int, forwarded: bool) -> list[int]:
    """Wrong passwords for ``names`` different users, each claiming another client address when ``forwarded``."""
    codes = []
    with httpx.Client(timeout=60) as c:
        for i in range(names):
            headers = {"X-Forwarded-For": f"203.0.113.{i + 1}"} if forwarded else {}
            codes.append(c.get(url, auth=(f"user{i}", "guess"), headers=headers).status_code)
    return codes


def test_x_forwarded_for_counts_only_from_a_listed_proxy(tmp_path, tiny_model_dir, tiny_server):
    from ui.webapp import create_app

    base = (f"server.users={USERS}", "server.login_max_failures=3")
    untrusted = build(tmp_path / "a", tiny_model_dir, tiny_server, *base)
    try:
        with LiveServer(create_app(untrusted, ui=False)) as live:
            # one loopback peer, a new "address" per request: still one address, locked after 3 failures
            assert spray(live.url + "/api/v1/agents", 6, forwarded=True) == [401] * 3 + [429] * 3
            # and a forwarded host does not make a foreign page same-origin
            evil = {"Origin": "http://evil.example", "X-Forwarded-Host": "evil.example"}
            r = httpx.post(live.url + "/api/v1/tokens", auth=ALICE, json={"name": "bob"}, headers=evil)
            assert r.status_code == 403 and untrusted.store.list_api_tokens() == []
    finally:
        untrusted.store.close()
    proxied = build(tmp_path / "b", tiny_model_dir, tiny_server, *base, "server.trusted_proxies=127.0.0.1")
    try:
        with LiveServer(create_app(proxied, ui=False)) as live:
            # behind a listed proxy, each forwarded client is counted on its own
            assert spray(live.url + "/api/v1/agents", 6, forwarded=True) == [401] * 6
            assert spray(live.url + "/api/v1/agents", 4, forwarded=False) == [401] * 3 + [429]  # the proxy itself
    finally:
        proxied.store.close()


# ---- 3-4. blind replies stay blind --------------------------------------------------------------------------
def test_a_blind_arena_reply_cannot_be_compared_or_read_before_the_vote(team, adapter_dir):
    services, client = team
    store = services.store
    two_versions(services, adapter_dir)
    board = client.get("/api/v1/leaderboard", auth=BOB).json()
    rnd = client.post("/api/v1/arena", auth=BOB, json={"messages": [{"role": "user", "content": "Which is better?"}]})
    assert rnd.status_code == 200, rnd.text
    pair, blind = rnd.json()["pair_id"], rnd.json()["a"]["message_id"]
    shown = client.get(f"/api/v1/messages/{blind}", auth=BOB).json()
    assert (shown["policy_id"], shown["latency_ms"], shown["gen_params"]) == (None, None, {})
    for version in store.list_policies("assistant"):  # the attack: same prompt, a chosen version, then compare
        mine = chat(client, ALICE, policy_id=version.id)["message_id"]  # choosing a version is an admin's (#33)
        assert store.get_message(mine).context_key == store.get_message(blind).context_key
        for a, b in ((mine, blind), (blind, mine)):
            r = client.post("/api/v1/comparisons", auth=ALICE, json={"message_a_id": a, "message_b_id": b,
                                                                     "winner": "a"})
            assert r.status_code == 409 and "arena pair" in r.json()["error"]
    assert store.count("comparisons") == 0 and client.get("/api/v1/leaderboard", auth=BOB).json() == board
    assert client.post(f"/api/v1/arena/{pair}/vote", auth=CAROL, json={"winner": "a"}).status_code == 404
    assert client.post(f"/api/v1/arena/{pair}/vote", auth=BOB, json={"winner": "a"}).status_code == 200
    revealed = client.get(f"/api/v1/messages/{blind}", auth=BOB).json()
    assert revealed["policy_id"] is not None and revealed["latency_ms"] is not None


def test_vote_queue_replies_are_blind_and_voted_only_by_those_shown(team):
    services, client = team
    store = services.store
    policy = store.active_policy("assistant").id
    items = [store.create_queue_item("assistant", [{"role": "user", "content": f"q{i}?"}],
                                     [{"content": f"one {i}", "policy_id": policy, "latency_ms": 900.0},
                                      {"content": f"two {i}", "policy_id": policy, "latency_ms": 300.0}])
             for i in range(2)]
    reply = items[0].message_a_id
    assert client.get(f"/api/v1/messages/{reply}", auth=BOB).status_code == 404  # never shown to bob
    first = client.get("/api/v1/queue/next", auth=BOB).json()
    other = next(i for i in items if i.id != first["item_id"])
    mine = next(i for i in items if i.id == first["item_id"])
    shown = client.get(f"/api/v1/messages/{mine.message_a_id}", auth=BOB).json()
    assert (shown["policy_id"], shown["latency_ms"], shown["gen_params"]) == (None, None, {})
    admin = client.get(f"/api/v1/messages/{mine.message_a_id}", auth=ALICE).json()
    assert admin["policy_id"] == policy and admin["latency_ms"] == 900.0  # admins see through
    before = counts(services)
    sneaky = client.post(f"/api/v1/queue/{other.id}/vote", auth=BOB, json={"winner": "a"})
    assert sneaky.status_code == 409 and "not shown to you" in sneaky.json()["error"] and counts(services) == before
    by_hand = client.post("/api/v1/comparisons", auth=ALICE, json={"message_a_id": mine.message_a_id,
                                                                   "message_b_id": mine.message_b_id, "winner": "b"})
    assert by_hand.status_code == 409 and "vote-queue item" in by_hand.json()["error"]
    assert client.post(f"/api/v1/messages/{mine.message_a_id}/regenerate", auth=ALICE, json={}).status_code == 409
    assert client.post(f"/api/v1/queue/{mine.id}/vote", auth=BOB, json={"winner": "b"}).status_code == 200
    assert client.get(f"/api/v1/messages/{mine.message_a_id}", auth=BOB).json()["policy_id"] == policy


# ---- 5. one annotator, one counted vote per pair --------------------------------------------------------------
def test_one_annotator_one_counted_vote_per_pair(team, adapter_dir):
    services, client = team
    store = services.store
    v0, v1 = two_versions(services, adapter_dir)
    first = chat(client, BOB)  # annotators get the active version (v0) ...
    store.promote_policy(v1.id)  # ... and, once v1 goes live, regenerate with it
    second = client.post(f"/api/v1/messages/{first['message_id']}/regenerate", auth=BOB, json={}).json()
    assert (first["policy_id"], second["policy_id"]) == (v0.id, v1.id)
    a, b = first["message_id"], second["message_id"]
    for i in range(20):  # alternating winners, and the pair written both ways round
        body = {"message_a_id": a, "message_b_id": b, "winner": "a" if i % 2 else "b"} if i % 3 else \
            {"message_a_id": b, "message_b_id": a, "winner": "b" if i % 2 else "a"}
        assert client.post("/api/v1/comparisons", auth=BOB, json=body).status_code == 200
    history = store.list_comparisons("assistant", history=True)
    assert len(history) == 20  # append-only: every change of mind is kept
    (counted,) = store.list_comparisons("assistant")
    assert counted.id == history[-1].id  # the latest counts: v0's reply (a) won the 20th vote
    rows = {r["policy_id"]: r for r in client.get("/api/v1/leaderboard", auth=BOB).json()}
    assert rows[v0.id]["votes"] == rows[v1.id]["votes"] == 1 and rows[v0.id]["wins"] == 1
    again = client.post("/api/v1/comparisons", auth=BOB, json={"message_a_id": b, "message_b_id": a, "winner": "b"})
    assert again.json()["id"] == counted.id and store.count("comparisons") == 20  # the same verdict: nothing new
    pairs = build_pairs(store.feedback_rows("assistant"))
    assert [(p["chosen_id"], p["rejected_id"]) for p in pairs] == [(a, b)]  # the reward model's one pair
    export = client.get("/api/v1/export", auth=ALICE, params={"format": "jsonl"})
    votes = [json.loads(line) for line in export.text.splitlines() if json.loads(line)["event"] == "comparison"]
    assert [v["id"] for v in votes] == [counted.id]  # and the export's
    carol = chat(client, CAROL)  # another annotator's vote on her own pair counts too
    alt = client.post(f"/api/v1/messages/{carol['message_id']}/regenerate", auth=CAROL, json={}).json()
    client.post("/api/v1/comparisons", auth=CAROL, json={"message_a_id": carol["message_id"],
                                                         "message_b_id": alt["message_id"], "winner": "a"})
    assert len(store.list_comparisons("assistant")) == 2


# ---- 6. a conversation is its owner's -------------------------------------------------------------------------
def test_other_peoples_conversations_are_404(team):
    services, client = team
    ann = chat(client, BOB, "my private prompt")
    alt = client.post(f"/api/v1/messages/{ann['message_id']}/regenerate", auth=BOB, json={}).json()
    before = counts(services)
    attempts = [
        client.get(f"/api/v1/messages/{ann['message_id']}", auth=CAROL),
        client.get(f"/api/v1/messages/{ann['message_id'] - 1}", auth=CAROL),  # her prompt
        client.post("/api/v1/chat", auth=CAROL, json={"conversation_id": ann["conversation_id"],
                                                      "messages": [{"role": "user", "content": "go on"}]}),
        client.post("/api/v1/chat/stream", auth=CAROL, json={"conversation_id": ann["conversation_id"],
                                                             "messages": [{"role": "user", "content": "go on"}]}),
        client.post(f"/api/v1/messages/{ann['message_id']}/regenerate", auth=CAROL, json={}),
        client.post("/api/v1/feedback", auth=CAROL, json={"message_id": ann["message_id"], "thumb": -1}),
        client.post("/api/v1/comparisons", auth=CAROL, json={"message_a_id": ann["message_id"],
                                                             "message_b_id": alt["message_id"], "winner": "a"}),
    ]
    for r in attempts:
        assert r.status_code == 404, (r.request.url, r.text)
        assert "my private prompt" not in r.text and "unknown" in r.json()["error"]
    assert counts(services) == before
    unknown = client.get("/api/v1/messages/99999", auth=CAROL)
    assert unknown.status_code == 404 and unknown.json()["error"].startswith("unknown message")  # the same answer
    assert client.get(f"/api/v1/messages/{ann['message_id']}", auth=ALICE).status_code == 200  # admins see all
    own = client.post("/api/v1/chat", auth=BOB, json={"conversation_id": ann["conversation_id"], "max_new_tokens": 4,
                                                      "messages": [{"role": "user", "content": "go on"}]})
    assert own.status_code == 200


# ---- 8. no CPU burn by message count ------------------------------------------------------------------------------
def test_chat_caps_the_message_count(team):
    services, client = team
    before = counts(services)
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(9_999)]
    for path in ("/api/v1/chat", "/api/v1/chat/stream", "/api/v1/arena"):
        r = client.post(path, auth=BOB, json={"messages": many})
        assert r.status_code == 422 and "serving.max_messages" in r.json()["error"], path
    assert counts(services) == before


# ---- 11. agent names and export paths -------------------------------------------------------------------------------
def test_agent_names_are_safe_slugs_and_exports_never_use_them(team):
    from ui.tabs import agents as agents_ui

    services, client = team
    store = services.store
    for bad in ("../../../../outside/pwn", "a/b", ".hidden", "with space", "x" * 65, "", "semi;colon", "naïve"):
        r = client.post("/api/v1/agents", auth=ALICE, json={"name": bad, "system_prompt": "s"})
        assert r.status_code == 422 and "agent name" in r.json()["error"], bad
    _, status = agents_ui.save_agent(services, agents_ui.NEW, "../pwn", "s", "", None, None, None,
                                     gr.Request(username="alice"))
    assert status.startswith("⚠️") and "agent name" in status
    assert [a.name for a in store.list_agents()] == ["assistant"]
    assert client.post("/api/v1/agents", auth=ALICE, json={"name": "support-bot.v2", "system_prompt": "s"}) \
        .status_code == 200
    # An agent a database from before this check may hold: its name reaches no path.
    store.db.execute("UPDATE agents SET name = '../../../../outside/pwn' WHERE name = 'support-bot.v2'")
    store.db.conn.commit()
    bad_id = store.get_agent("../../../../outside/pwn").id
    name = default_name("jsonl", bad_id)
    assert name.startswith(f"rlhf-studio-agent{bad_id}-jsonl-") and "/" not in name
    r = client.get("/api/v1/export", auth=ALICE, params={"format": "verl", "agent": "../../../../outside/pwn"})
    assert r.status_code == 200 and f"agent{bad_id}" in r.headers["content-disposition"]
    assert ".." not in r.headers["content-disposition"]
    button, _ = data_tab.run_export(services, "../../../../outside/pwn", "jsonl", gr.Request(username="alice"))
    path = Path(button.value["path"])
    assert path.name.startswith(f"rlhf-studio-agent{bad_id}-") and path.parent.name.startswith("rlhf-export-")
    services.downloads.remove(path.parent)
    with pytest.raises(ExportError, match="unknown format"):
        default_name("../x", None)


# ---- 12. API tokens: listed, revoked, expiring --------------------------------------------------------------------
def test_tokens_are_listed_revoked_and_expire(team):
    services, client = team
    made = client.post("/api/v1/tokens", auth=ALICE, json={"name": "bob", "label": "ci", "expires_in_days": 30})
    assert made.status_code == 200 and made.json()["expires"]
    token = {"Authorization": f"Bearer {made.json()['token']}"}
    assert client.get("/api/v1/me", headers=token).json()["user"] == "bob"
    short = client.post("/api/v1/tokens", auth=ALICE, json={"name": "bob", "expires_in_days": 0.000002}).json()
    carols = client.post("/api/v1/tokens", auth=ALICE, json={"name": "carol"}).json()
    time.sleep(0.3)
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {short['token']}"}).status_code == 401
    listed = client.get("/api/v1/tokens", auth=ALICE).json()
    assert [(t["user"], t["expired"], t["revoked"]) for t in listed] == [("bob", False, False), ("bob", True, False),
                                                                          ("carol", False, False)]
    assert all("token" not in t and "token_hash" not in t for t in listed)
    mine = client.get("/api/v1/tokens", auth=BOB).json()
    assert [t["user"] for t in mine] == ["bob", "bob"]  # a user sees only their own
    carol_id = listed[2]["id"]
    assert client.delete(f"/api/v1/tokens/{carol_id}", auth=BOB).status_code == 404  # not his
    assert client.delete(f"/api/v1/tokens/{listed[0]['id']}", auth=BOB).json()["revoked"] is True  # his own
    assert client.get("/api/v1/me", headers=token).status_code == 401
    assert client.delete(f"/api/v1/tokens/{carol_id}", auth=ALICE).status_code == 200  # admins: anyone's
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {carols['token']}"}).status_code == 401
    for bad in (0, -1, "7", 10**6, True):
        r = client.post("/api/v1/tokens", auth=ALICE, json={"name": "bob", "expires_in_days": bad})
        assert r.status_code == 422, bad
    assert client.delete("/api/v1/tokens/999", auth=ALICE).status_code == 404
    assert len(client.get("/api/v1/tokens", auth=ALICE).json()) == 3


def test_the_data_tab_lists_and_revokes_tokens(team):
    services, _ = team
    alice, bob = gr.Request(username="alice"), gr.Request(username="bob")
    made, box = data_tab.make_token(services, "bob", "laptop", 7, alice)
    assert "expires in 7 day" in made and box.value.startswith("rlhf_")
    table = data_tab.token_table(services, alice)
    assert list(table["user"]) == ["bob"] and list(table["state"]) == ["active"] and table["expires"][0]
    assert data_tab.token_table(services, bob).empty  # annotators see no tokens here
    assert "admin" in data_tab.revoke_token(services, int(table["id"][0]), bob)
    box, question, _ = data_tab.ask_revoke(services, int(table["id"][0]), alice)  # asked first in the tab
    assert box.visible and "Revoke token" in question and "of bob?" in question
    assert "revoked" in data_tab.revoke_token(services, int(table["id"][0]), alice)
    assert list(data_tab.token_table(services, alice)["state"]) == ["revoked"]


# ---- 10. text is text: no math in chat boxes ----------------------------------------------------------------------------
def test_no_chat_box_renders_latex(services):
    from ui.app import build_ui

    demo = build_ui(services)
    boxes = [b for b in demo.blocks.values() if isinstance(b, gr.Chatbot)]
    assert len(boxes) >= 6  # chat, arena A/B, vote context/A/B
    assert all(b.latex_delimiters == [] for b in boxes), [(b.label, b.latex_delimiters) for b in boxes]


def test_the_cli_makes_expiring_tokens_and_lists_them(tmp_path, capsys):
    from cli import main

    where = ["--set", f"data_dir={tmp_path / 'data'}", "--set", "base_model=tiny"]
    assert main(["token", "bob", "--expires-in-days", "2", *where]) == 0
    token = capsys.readouterr().out.split()[0]
    assert main(["token", "--list", *where]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert token.startswith("rlhf_") and listed["user"] == "bob" and listed["expires"] and not listed["expired"]
    assert main(["token", "bob", "--expires-in-days", "-1", *where]) == 1  # refused, nothing stored
    assert "expires_in_days" in capsys.readouterr().err
    assert main(["token", "--revoke", str(listed["id"]), *where]) == 0
