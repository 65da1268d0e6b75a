"""Arena rounds on the tiny model: pair choice, sibling replies, blind until the vote, one vote, REST contracts."""
from __future__ import annotations

import json

import gradio as gr
import numpy as np
import pytest
from fastapi.testclient import TestClient

from storage import Conflict
from tests.conftest import make_adapter
from ui.tabs import arena
from ui.flows import arena as flow
from ui.auth import Auth
from ui.users import sync_users
from ui.webapp import create_app
from rlhf.analysis import arena as pairing
from ui.views import arena as arena_views
from ui.views import text as text_views


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("arena-adapters")
    return [make_adapter(tiny_model_dir, root / f"v{i}", seed=20 + i) for i in (1, 2)]


@pytest.fixture
def versions(services, adapter_dirs):
    """v0 (base, active) plus two candidate LoRA versions of the default agent (short replies: fast tests)."""
    store = services.store
    store.update_agent("assistant", generation={"max_new_tokens": 6})
    v0 = store.active_policy("assistant")
    v1 = store.register_policy_version("assistant", adapter_dirs[0], v0.id, promote=False)
    v2 = store.register_policy_version("assistant", adapter_dirs[1], v1.id, promote=False)
    return v0, v1, v2


@pytest.fixture
def client(services):
    with TestClient(create_app(services, ui=False)) as c:
        yield c


def play(services, messages=None, continue_pair_id=None, seed=0):
    rnd = flow.open_round(services, "assistant", messages or [{"role": "user", "content": "Hello arena"}],
                           "alice", continue_pair_id, rng=np.random.default_rng(seed))
    updates = list(flow.stream_round(rnd))
    return rnd, updates, flow.close_round(services.store, rnd)


def drain(gen):
    return list(gen)


def shown(chat) -> list:
    """Messages a chat update sends: a component update's value, or the plain list."""
    return chat.constructor_args.get("value", []) if hasattr(chat, "constructor_args") else chat


def label(chat, default: str) -> str:
    return chat.constructor_args.get("label", default) if hasattr(chat, "constructor_args") else default


# ---- round logic -----------------------------------------------------------------------------------
def test_the_arena_needs_two_versions_and_stores_nothing_without(services):
    with pytest.raises(Conflict, match="two versions.*Retrain"):
        flow.open_round(services, "assistant", [{"role": "user", "content": "hi"}])
    assert services.store.count("messages") == 0 and services.store.count("conversations") == 0


def test_pairs_are_two_different_servable_versions(services, versions):
    v0, v1, v2 = versions
    services.store.archive_policy(v2.id)
    rng = np.random.default_rng(1)
    agent = services.store.get_agent("assistant")
    seen = {tuple(sorted(p.id for p in flow.draw_pair(services.store, services.leaderboards, agent, rng)))
            for _ in range(40)}
    assert seen == {(v0.id, v1.id)}  # never v2 (archived), never one version twice


def test_a_version_archived_after_the_last_fit_is_never_paired(services, versions):
    """The pairing reads the last leaderboard table (it never waits for a refit), but today's statuses."""
    v0, v1, v2 = versions
    agent = services.store.get_agent("assistant")
    flow.draw_pair(services.store, services.leaderboards, agent, np.random.default_rng(0))  # fits the table
    services.store.archive_policy(v2.id)
    rng = np.random.default_rng(1)
    seen = {tuple(sorted(p.id for p in flow.draw_pair(services.store, services.leaderboards, agent, rng)))
            for _ in range(40)}
    assert seen == {(v0.id, v1.id)}


def test_a_round_streams_both_sides_and_stores_sibling_replies(services, versions):
    store = services.store
    rnd, updates, pair = play(services)
    assert len(updates) >= 2
    text_a, text_b = updates[-1]
    a, b = store.get_message(pair.message_a_id), store.get_message(pair.message_b_id)
    assert (a.content, b.content) == (text_a, text_b)
    assert a.parent_id == b.parent_id == rnd.user.id and a.context_key == b.context_key
    assert a.policy_id != b.policy_id and {a.policy_id, b.policy_id} <= {p.id for p in versions}
    assert store.get_conversation(a.conversation_id).source == "arena"
    # both texts only ever grow (each update extends one side)
    for (pa, pb), (na, nb) in zip(updates, updates[1:]):
        assert na.startswith(pa) and nb.startswith(pb)


def test_vote_is_stored_once_and_feeds_comparisons_and_ratings(services, versions):
    store = services.store
    _, _, pair = play(services)
    first = flow.cast_vote(store, pair.id, "a", "alice")
    again = flow.cast_vote(store, pair.id, "b", "alice")
    assert again.id == first.id and again.winner == "a" and store.count("comparisons") == 1
    a = store.get_message(pair.message_a_id)
    assert first.policy_a_id == a.policy_id and first.pair_id == pair.id
    # a comparison between two versions is a rated vote for the leaderboard (and a preference pair)
    rows = {r["policy_id"]: r for r in arena_views.leaderboard_json(
        pairing.board(store.list_comparisons("assistant"), store.list_policies("assistant"), n_boot=10))}
    assert rows[first.policy_a_id]["wins"] == 1 and rows[first.policy_b_id]["losses"] == 1
    assert rows[first.policy_a_id]["elo"] > 1000 > rows[first.policy_b_id]["elo"]


@pytest.mark.parametrize("winner,side", [("b", "b"), ("tie", "a")])
def test_continue_goes_under_the_preferred_reply(services, versions, winner, side):
    store = services.store
    _, _, pair = play(services)
    with pytest.raises(Conflict, match="vote"):
        flow.open_round(services, "assistant", [{"role": "user", "content": "more"}], continue_pair_id=pair.id)
    flow.cast_vote(store, pair.id, winner)
    rnd, _, nxt = play(services, [{"role": "user", "content": "And then?"}], continue_pair_id=pair.id, seed=3)
    preferred = pair.message_a_id if side == "a" else pair.message_b_id
    assert rnd.user.parent_id == preferred
    a, b = store.get_message(nxt.message_a_id), store.get_message(nxt.message_b_id)
    _, history = store.state_for(a.id)
    assert [m["content"] for m in history[:3]] == ["Hello arena", store.get_message(preferred).content, "And then?"]
    assert a.context_key == b.context_key


def test_after_both_bad_only_start_over(services, versions):
    _, _, pair = play(services)
    flow.cast_vote(services.store, pair.id, "both_bad")
    before = services.store.count("messages")
    with pytest.raises(Conflict, match="both replies"):
        flow.open_round(services, "assistant", [{"role": "user", "content": "x"}], continue_pair_id=pair.id)
    assert services.store.count("messages") == before


# ---- UI handlers -----------------------------------------------------------------------------------
def test_tab_is_blind_until_the_vote_then_reveals(services, versions):
    store = services.store
    updates = drain(arena.play_round(services, "Which is better?", arena.empty_state(), "assistant", "alice"))
    labels = {p.id: text_views.status_label(p) for p in store.list_policies("assistant")}
    for chat_a, chat_b, state, _, status, *buttons in updates:
        # the browser gets texts and fixed labels only; the state holds nothing but the pair id
        assert label(chat_a, "Model A") == "Model A" and label(chat_b, "Model B") == "Model B"
        assert set(state) <= {"pair_id", "player"} and not any(name in status for name in labels.values())
        for msg in shown(chat_a) + shown(chat_b):
            assert set(msg) == {"role", "content"}
    chat_a, chat_b, state, box, status, *buttons = updates[-1]
    assert box == "" and all(b.interactive for b in buttons) and "vote" in status.lower()
    pair = store.get_arena_pair(state["pair_id"])
    reply_a = store.get_message(pair.message_a_id)
    # shown as said (markup characters as entities), a reply cut at its limit marked
    assert chat_a[-1]["content"] == text_views.literal_html(reply_a.content) + arena.cut_badge(reply_a)
    assert store.arena_vote(pair.id) is None

    chat_a, chat_b, reveal, *buttons = arena.submit_vote(services, "b", state, "alice")
    vote = store.arena_vote(pair.id)
    assert vote.winner == "b" and not any(b.interactive for b in buttons)
    assert f"**A** was **{labels[vote.policy_a_id]}**" in reveal and labels[vote.policy_b_id] in reveal
    assert chat_a.constructor_args["label"] == f"Model A · {labels[vote.policy_a_id]}"
    _, _, again, *_ = arena.submit_vote(services, "a", state, "alice")  # a double click
    assert "first vote counts" in again and store.count("comparisons") == 1


def test_tab_asks_for_the_vote_before_continuing(services, versions):
    store = services.store
    state = drain(arena.play_round(services, "First", arena.empty_state(), "assistant", "alice"))[-1][2]
    before = store.count("messages")
    *_, status, a, b, tie, bad = drain(arena.play_round(services, "Second", state, "assistant", "alice"))[-1]
    assert "Vote on the current round first" in status and a.interactive and store.count("messages") == before
    arena.submit_vote(services, "tie", state, "alice")
    chat_a, chat_b, state2, *_ = drain(arena.play_round(services, "Second", state, "assistant", "alice"))[-1]
    assert state2["pair_id"] != state["pair_id"]
    assert [m["content"] for m in chat_a][::2] == ["First", "Second"]


def test_a_name_change_is_refused_like_rest_and_says_what_to_do(services, versions):
    store = services.store
    state = drain(arena.play_round(services, "Which?", arena.empty_state(), "assistant", "kim"))[-1][2]
    with pytest.warns(UserWarning):
        _, _, status, *buttons = arena.submit_vote(services, "a", state, "lou")
    assert "played as kim, and the name is now lou: nothing was stored" in status and "Start over" in status
    assert store.arena_vote(state["pair_id"]) is None and all(b.interactive for b in buttons)
    arena.submit_vote(services, "b", state, "kim")  # back to the player's name: the vote is stored
    vote = store.arena_vote(state["pair_id"])
    assert vote.winner == "b" and vote.annotator_id == store.annotator_id("kim")
    before = store.count("messages")
    *_, status, a, b, tie, bad = drain(arena.play_round(services, "More", state, "assistant", "lou"))[-1]
    assert "played as kim" in status and store.count("messages") == before  # no follow-up under lou either


def test_tab_warns_when_there_is_one_version(services):
    updates = drain(arena.play_round(services, "hi", arena.empty_state(), "assistant", "alice"))
    *_, status, a, b, tie, bad = updates[-1]
    assert "two versions" in status and not a.interactive and services.store.count("messages") == 0


def test_leaderboard_tables_follow_votes(services, versions):
    board, matrix = arena.leaderboard_tables(services, "assistant")
    assert list(board["Votes"]) == [0, 0, 0]
    _, _, pair = play(services)
    vote = flow.cast_vote(services.store, pair.id, "a")
    stale, _ = arena.leaderboard_tables(services, "assistant")  # at once: the last table, refitted behind it
    assert list(stale["Votes"]) == [0, 0, 0]
    services.leaderboards.table("assistant", fresh=True)
    board, matrix = arena.leaderboard_tables(services, "assistant")
    winner = f"v{services.store.get_policy(vote.policy_a_id).version}"
    assert board.iloc[0]["Version"] == winner and board.iloc[0]["W / L / T"] == "1 / 0 / 0"
    assert matrix.set_index("row beats →").loc[winner].tolist().count("100%") == 1


def test_start_over_forgets_the_round():
    chat_a, chat_b, state, status, *buttons = arena.start_over()
    assert state == {"pair_id": None} and chat_a.constructor_args["value"] == [] and not buttons[0].interactive


# ---- REST ------------------------------------------------------------------------------------------
def post_round(client, **body):
    r = client.post("/api/v1/arena", json={"messages": [{"role": "user", "content": "Hi both"}], **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_rest_round_is_blind_and_vote_reveals(client, services, versions):
    store = services.store
    r = post_round(client, agent="assistant", annotator="bob")
    assert set(r) == {"pair_id", "a", "b"} and set(r["a"]) == {"message_id", "content"} == set(r["b"])
    assert "policy" not in json.dumps(r)
    assert r["a"]["content"] == store.get_message(r["a"]["message_id"]).content
    vote = client.post(f"/api/v1/arena/{r['pair_id']}/vote", json={"winner": "b", "annotator": "bob"})
    assert vote.status_code == 200
    v = vote.json()
    assert set(v) == {"comparison_id", "a_policy_id", "b_policy_id"}
    assert v["a_policy_id"] == store.get_message(r["a"]["message_id"]).policy_id
    assert v["b_policy_id"] == store.get_message(r["b"]["message_id"]).policy_id != v["a_policy_id"]
    twice = client.post(f"/api/v1/arena/{r['pair_id']}/vote", json={"winner": "a"}).json()
    assert twice == v and store.count("comparisons") == 1
    board = client.get("/api/v1/leaderboard", params={"agent": "assistant"}).json()
    rows = {row["policy_id"]: row for row in board}
    assert rows[v["b_policy_id"]]["elo"] > rows[v["a_policy_id"]]["elo"]
    assert rows[v["b_policy_id"]]["votes"] == 1 and rows[v["b_policy_id"]]["win_rate"] == 1.0
    for row in board:
        assert {"policy_id", "version", "elo", "bt", "ci_low", "ci_high", "votes", "win_rate"} <= set(row)
    # multi-turn over REST: continue a voted pair under its preferred reply
    nxt = post_round(client, messages=[{"role": "user", "content": "Go on"}], continue_pair_id=r["pair_id"])
    user = store.get_message(store.get_message(nxt["a"]["message_id"]).parent_id)
    assert user.parent_id == r["b"]["message_id"]


def test_rest_errors(client, services, versions):
    v0, v1, v2 = versions
    assert client.post("/api/v1/arena/nope/vote", json={"winner": "a"}).status_code == 404
    r = post_round(client)
    bad = client.post(f"/api/v1/arena/{r['pair_id']}/vote", json={"winner": "A"})
    assert bad.status_code == 422 and "winner" in bad.json()["error"]
    assert client.get("/api/v1/leaderboard", params={"agent": "nobody"}).status_code == 404
    assert client.post("/api/v1/arena", json={"messages": [{"role": "user", "content": ""}]}).status_code == 422
    # archiving: the active version cannot go; an archived version's pairs cannot be voted on
    assert client.post(f"/api/v1/policies/{v0.id}/archive").status_code == 409
    assert client.post("/api/v1/policies/999/archive").status_code == 404
    for p in (v1, v2):
        out = client.post(f"/api/v1/policies/{p.id}/archive")
        assert out.status_code == 200 and out.json()["status"] == "archived"
    closed = client.post(f"/api/v1/arena/{r['pair_id']}/vote", json={"winner": "a"})
    assert closed.status_code == 409 and "archived" in closed.json()["error"]
    one_left = client.post("/api/v1/arena", json={"messages": [{"role": "user", "content": "hi"}]})
    assert one_left.status_code == 409 and "two versions" in one_left.json()["error"]
    assert services.store.count("comparisons") == 0


def team_mode(services):
    """Real users with roles: ann annotates, root is admin."""
    sync_users(services.store, [{"name": "ann", "password": "pw-ann", "role": "annotator"},
                                {"name": "root", "password": "pw-root", "role": "admin"}])
    services.auth = Auth(services.store, "users", {"ann": "annotator", "root": "admin"})


def test_rest_archive_needs_admin(services, versions):
    team_mode(services)
    url = f"/api/v1/policies/{versions[1].id}/archive"
    with TestClient(create_app(services, ui=False)) as c:
        r = c.post(url, auth=("ann", "pw-ann"))
        assert r.status_code == 403 and "admin" in r.json()["error"]
        assert services.store.get_policy(versions[1].id).status == "candidate"
        assert c.post(url, auth=("root", "pw-root")).json()["status"] == "archived"


def test_team_mode_stores_rounds_and_votes_under_the_signed_in_user(services, versions):
    store = services.store
    team_mode(services)
    nobody = drain(arena.play_round(services, "hi", arena.empty_state(), "assistant", "typed", None))[-1]
    assert "sign in" in nobody[4] and store.count("messages") == 0
    ann = gr.Request(username="ann")
    state = drain(arena.play_round(services, "hi", arena.empty_state(), "assistant", "typed", ann))[-1][2]
    arena.submit_vote(services, "a", state, "typed", ann)
    vote = store.arena_vote(state["pair_id"])
    assert vote.annotator_id == store.annotator_id("ann")
    conv = store.get_conversation(store.get_message(vote.message_a_id).conversation_id)
    assert conv.annotator_id == store.annotator_id("ann")


def test_arena_replies_stay_blind_over_rest_and_cannot_be_voted_twice(services, versions, client):
    pair = client.post("/api/v1/arena", json={"messages": [{"role": "user", "content": "Hi there"}]}).json()
    a, b = pair["a"]["message_id"], pair["b"]["message_id"]
    assert client.get(f"/api/v1/messages/{a}").json()["policy_id"] is None
    side = client.post("/api/v1/comparisons", json={"message_a_id": a, "message_b_id": b, "winner": "a"})
    assert side.status_code == 409 and "/vote" in side.json()["error"]
    client.post(f"/api/v1/arena/{pair['pair_id']}/vote", json={"winner": "b"}).raise_for_status()
    assert client.get(f"/api/v1/messages/{a}").json()["policy_id"] is not None
    assert services.store.count("comparisons") == 1


@pytest.mark.parametrize("text, problem", [(" ", "Type a message first"), ("y" * 8001, "8,001 characters")])
def test_arena_refuses_an_empty_or_over_long_prompt_with_a_reason(services, versions, text, problem):
    *_, status, a, b, tie, bad = drain(arena.play_round(services, text, arena.empty_state(), "assistant", "alice"))[-1]
    assert problem in status and services.store.count("messages") == 0
