"""Hostile and odd input, one table driving the REST API (real HTTP on loopback) and the UI handlers.

Every refused case must answer a clear 4xx with {"error"} (a warning line in the UI), store nothing at
all (no message, rating, vote, annotator, job...) and leave the server healthy. Odd but valid text (emoji,
right-to-left, HTML/script) is accepted, stored byte for byte, and shown escaped in the chat views.
"""
from __future__ import annotations

import contextlib
import json
import math

import gradio as gr
import httpx
import pytest

from rlhf.config import load_config
from tests.conftest import LiveServer, make_adapter
from ui.tabs import arena, chat
from ui.tabs import chat_labels as labels
from ui.webapp import build_services, create_app

GEN = (8, 0.0, 1.0, None)  # max tokens, temperature, top_p, seed
TABLES = ("conversations", "messages", "ratings", "comparisons", "arena_pairs", "annotators", "jobs", "policies")
HUGE_ID = 2**64  # beyond SQLite's 64-bit integers
LIMIT = 1_000_000  # server.max_body_bytes default

# Odd but valid text: accepted everywhere, stored exactly, shown as typed.
EMOJI = "Thumbs 👍🏽, a family 👨‍👩‍👧 and a flag 🏳️‍🌈"
RTL = "שלום עולם — مرحبا بالعالم \u202bembedded\u202c \u200f!"
HTML = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"> <b>bold?</b> & AT&T'


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir, tiny_server):
    """A live app on the tiny model with replies, siblings, other contexts, an archived and a broken version."""
    root = tmp_path_factory.mktemp("bad-input")
    config = load_config(env={}, overrides=[
        f"data_dir={root / 'data'}", f"base_model={tiny_model_dir}", "device=cpu", "serving.warmup=false",
        "serving.max_new_tokens=8", "scheduler.enabled=false"])
    services = build_services(config, server=tiny_server)
    store = services.store
    v0 = store.active_policy("assistant")
    good = store.register_policy_version("assistant", make_adapter(tiny_model_dir, root / "good", seed=41), v0.id,
                                         promote=False)
    archived = store.register_policy_version("assistant", str(root), v0.id, promote=False)
    broken = store.register_policy_version("assistant", str(root), v0.id, promote=False)

    def replies(prompt: str, *policies) -> list[int]:
        conv = store.create_conversation("assistant", "setup", messages=[{"role": "user", "content": prompt}])
        user = store.leaf(conv.id)
        return [user.id] + [store.record_reply(user.id, f"reply {i} to {prompt}", p.id).id
                            for i, p in enumerate(policies)]

    user1, reply, sibling, from_archived = replies("first question", v0, v0, archived)
    _, other_context = replies("second question", v0)
    _, arch_a, arch_b = replies("arena with an archived version", archived, v0)
    _, broken_a, broken_b = replies("arena with a broken version", broken, v0)
    _, open_a, open_b = replies("an arena round nobody voted on", v0, good)
    w = {"user": user1, "reply": reply, "sibling": sibling, "from_archived": from_archived,
         "other_context": other_context, "archived": archived.id, "broken": broken.id, "good": good.id,
         "pair_archived": store.create_arena_pair("assistant", arch_a, arch_b).id,
         "pair_broken": store.create_arena_pair("assistant", broken_a, broken_b).id,
         "pair_open": store.create_arena_pair("assistant", open_a, open_b).id, "open_a": open_a, "open_b": open_b}
    store.archive_policy(archived.id)
    store.mark_policy_broken(broken.id, "adapter directory missing (deleted by hand)")
    with LiveServer(create_app(services)) as live:
        w["services"], w["http"] = services, httpx.Client(base_url=live.url + "/api/v1", timeout=60)
        yield w
        w["http"].close()
    store.close()


def snapshot(store) -> dict:
    """Every row count plus each version's status: what 'nothing stored' compares."""
    counts = {t: store.count(t) for t in TABLES}
    counts["statuses"] = [(p.id, p.status) for p in store.list_policies()]
    return counts


def healthy(w) -> None:
    r = w["http"].get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def raw(text: str) -> bytes:
    return text.encode()


def chunks(total: int):
    """A JSON body sent without Content-Length (chunked), ``total`` bytes long."""
    def body():
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(total // 65536):
            yield b"x" * 65536
        yield b'"}]}'
    return body()


def msg(text, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_new_tokens": 4, "annotator": "mallory", **extra}


# (case id, method, path, body: dict | bytes | callable(world) -> those, status, words the error must contain)
REST_CASES = [
    # chat text
    ("chat-empty", "POST", "/chat", msg(""), 422, "empty"),
    ("chat-whitespace", "POST", "/chat", msg(" \t\n\u3000 "), 422, "empty"),
    ("chat-100k", "POST", "/chat", msg("x" * 100_000), 422, "limit"),
    ("chat-nul", "POST", "/chat", msg("before\x00after"), 422, "NUL"),
    ("chat-lone-surrogate", "POST", "/chat", raw('{"messages": [{"role": "user", "content": "hi \\ud800"}]}'), 422,
     "Unicode"),
    ("chat-no-messages", "POST", "/chat", {"messages": []}, 422, "non-empty"),
    ("chat-system-role", "POST", "/chat", {"messages": [{"role": "system", "content": "obey"}]}, 422, "role"),
    ("chat-ends-with-assistant", "POST", "/chat", {"messages": [{"role": "assistant", "content": "hi"}]}, 422,
     "last message"),
    ("chat-temperature-nan", "POST", "/chat", raw('{"messages": [{"role": "user", "content": "hi"}], '
                                                  '"temperature": NaN}'), 422, "temperature"),
    ("chat-top-p-inf", "POST", "/chat", raw('{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}'),
     422, "top_p"),
    # unknown ids and versions that may not answer
    ("chat-unknown-agent", "POST", "/chat", msg("hi", agent="nobody"), 404, "unknown agent"),
    ("chat-unknown-policy", "POST", "/chat", msg("hi", policy_id=987654), 404, "unknown policy"),
    ("chat-huge-policy-id", "POST", "/chat", msg("hi", policy_id=HUGE_ID), 404, "no record"),
    ("chat-unknown-conversation", "POST", "/chat", msg("hi", conversation_id=987654), 404, "unknown conversation"),
    ("chat-huge-conversation-id", "POST", "/chat", msg("hi", conversation_id=HUGE_ID), 404, "no record"),
    ("chat-archived-version", "POST", "/chat", lambda w: msg("hi", policy_id=w["archived"]), 409, "archived"),
    ("chat-broken-version", "POST", "/chat", lambda w: msg("hi", policy_id=w["broken"]), 409, "broken"),
    ("regenerate-unknown", "POST", "/messages/987654/regenerate", {}, 404, "unknown message"),
    ("regenerate-huge-id", "POST", f"/messages/{HUGE_ID}/regenerate", {}, 404, "no record"),
    ("regenerate-user-message", "POST", lambda w: f"/messages/{w['user']}/regenerate", {}, 422, "not a reply"),
    ("regenerate-archived", "POST", lambda w: f"/messages/{w['reply']}/regenerate",
     lambda w: {"policy_id": w["archived"]}, 409, "archived"),
    ("regenerate-blind", "POST", lambda w: f"/messages/{w['open_a']}/regenerate", {}, 409, "vote first"),
    # ratings
    ("score-nan", "POST", "/feedback", lambda w: raw(f'{{"message_id": {w["reply"]}, "score": NaN}}'), 422, "score"),
    ("score-inf", "POST", "/feedback", lambda w: raw(f'{{"message_id": {w["reply"]}, "score": Infinity}}'), 422,
     "score"),
    ("score-minus-inf", "POST", "/feedback", lambda w: raw(f'{{"message_id": {w["reply"]}, "score": -Infinity}}'),
     422, "score"),
    ("score-0", "POST", "/feedback", lambda w: {"message_id": w["reply"], "score": 0}, 422, "score"),
    ("score-6", "POST", "/feedback", lambda w: {"message_id": w["reply"], "score": 6}, 422, "score"),
    ("score-five", "POST", "/feedback", lambda w: {"message_id": w["reply"], "score": "five"}, 422, "score"),
    ("score-2.5", "POST", "/feedback", lambda w: {"message_id": w["reply"], "score": 2.5}, 422, "score"),
    ("score-true", "POST", "/feedback", lambda w: {"message_id": w["reply"], "score": True}, 422, "score"),
    ("score-2**64", "POST", "/feedback", lambda w: {"message_id": w["reply"], "score": HUGE_ID}, 422, "score"),
    ("thumb-0", "POST", "/feedback", lambda w: {"message_id": w["reply"], "thumb": 0}, 422, "thumb"),
    ("flag-unknown", "POST", "/feedback", lambda w: {"message_id": w["reply"], "flags": ["<b>Evil</b>"]}, 422,
     "flags"),
    ("note-100k", "POST", "/feedback", lambda w: {"message_id": w["reply"], "note": "n" * 100_000}, 422, "limit"),
    ("note-nul", "POST", "/feedback", lambda w: {"message_id": w["reply"], "note": "a\x00b"}, 422, "NUL"),
    ("note-lone-surrogate", "POST", "/feedback", lambda w: raw(f'{{"message_id": {w["reply"]}, "note": "\\udfff"}}'),
     422, "Unicode"),
    ("annotator-nul", "POST", "/feedback", lambda w: {"message_id": w["reply"], "thumb": 1, "annotator": "m\x00"}, 422,
     "NUL"),
    ("annotator-too-long", "POST", "/feedback", lambda w: {"message_id": w["reply"], "thumb": 1, "annotator": "m" * 65},
     422, "limit"),
    ("feedback-empty", "POST", "/feedback", lambda w: {"message_id": w["reply"], "annotator": "mallory"}, 422,
     "at least one"),
    ("feedback-unknown-message", "POST", "/feedback", {"message_id": 987654, "thumb": 1}, 404, "unknown message"),
    ("feedback-huge-message-id", "POST", "/feedback", {"message_id": HUGE_ID, "thumb": 1}, 404, "no record"),
    ("feedback-on-user-message", "POST", "/feedback", lambda w: {"message_id": w["user"], "thumb": 1}, 422,
     "only replies"),
    # comparisons and arena votes
    ("compare-across-contexts", "POST", "/comparisons",
     lambda w: {"message_a_id": w["reply"], "message_b_id": w["other_context"], "winner": "a",
                "annotator": "mallory"}, 422, "different contexts"),
    ("compare-with-itself", "POST", "/comparisons",
     lambda w: {"message_a_id": w["reply"], "message_b_id": w["reply"], "winner": "a"}, 422, "two different"),
    ("compare-bad-winner", "POST", "/comparisons",
     lambda w: {"message_a_id": w["reply"], "message_b_id": w["sibling"], "winner": "c"}, 422, "winner"),
    ("compare-unknown-message", "POST", "/comparisons",
     lambda w: {"message_a_id": w["reply"], "message_b_id": 987654, "winner": "a"}, 404, "unknown message"),
    ("compare-archived-version", "POST", "/comparisons",
     lambda w: {"message_a_id": w["reply"], "message_b_id": w["from_archived"], "winner": "b",
                "annotator": "mallory"}, 409, "archived"),
    ("compare-arena-pair-outside-arena", "POST", "/comparisons",
     lambda w: {"message_a_id": w["open_a"], "message_b_id": w["open_b"], "winner": "a"}, 409, "arena pair"),
    ("vote-unknown-pair", "POST", "/arena/no-such-pair/vote", {"winner": "a"}, 404, "unknown arena pair"),
    ("vote-archived-version", "POST", lambda w: f"/arena/{w['pair_archived']}/vote",
     {"winner": "a", "annotator": "mallory"}, 409, "archived"),
    ("vote-deleted-version", "POST", lambda w: f"/arena/{w['pair_broken']}/vote",
     {"winner": "b", "annotator": "mallory"}, 409, "broken"),
    ("vote-bad-winner", "POST", lambda w: f"/arena/{w['pair_open']}/vote", {"winner": "c"}, 422, "winner"),
    ("arena-empty-prompt", "POST", "/arena", {"messages": [{"role": "user", "content": "  "}]}, 422, "empty"),
    ("arena-unknown-continuation", "POST", "/arena",
     {"messages": [{"role": "user", "content": "more"}], "continue_pair_id": "nope"}, 404, "unknown arena pair"),
    # ids in paths, jobs and admin calls
    ("get-huge-message-id", "GET", f"/messages/{HUGE_ID}", None, 404, "no record"),
    ("cancel-unknown-job", "POST", "/jobs/987654/cancel", {}, 404, "unknown job"),
    ("cancel-huge-job-id", "POST", f"/jobs/{HUGE_ID}/cancel", {}, 404, "no record"),
    ("promote-huge-policy-id", "POST", f"/policies/{HUGE_ID}/promote", {}, 404, "no record"),
    ("promote-broken", "POST", lambda w: f"/policies/{w['broken']}/promote", {}, 409, "broken"),
    ("archive-active", "POST", "/policies/1/archive", {}, 409, "active"),
    ("train-nan-steps", "POST", "/train", raw('{"config": {"ppo.steps": NaN}}'), 422, "ppo.steps"),
    ("train-unknown-key", "POST", "/train", {"dry_run": True, "config": {"ppo.warp_speed": 9}}, 422, "unknown config"),
    # bodies
    ("malformed-json", "POST", "/chat", raw('{"messages": [{"role": "user", "content": "hi"'), 400, "malformed JSON"),
    ("not-utf8", "POST", "/feedback", b'{"message_id": 1, "note": "\xff\xfe"}', 400, "parsing the body"),
    ("json-array", "POST", "/feedback", raw("[1, 2, 3]"), 422, "dictionary"),
    ("empty-body", "POST", "/feedback", b"", 422, "required"),
    ("unknown-field", "POST", "/chat", msg("hi", admin=True), 422, "admin"),
    ("oversized", "POST", "/chat", msg("x" * (LIMIT + 10)), 413, "larger than"),
    ("oversized-chunked", "POST", "/chat", lambda w: chunks(2 * LIMIT), 413, "larger than"),
]


def resolve(value, w):
    return value(w) if callable(value) else value


@pytest.mark.parametrize("name, method, path, body, status, problem", REST_CASES, ids=[c[0] for c in REST_CASES])
def test_rest_refuses_clearly_and_stores_nothing(world, name, method, path, body, status, problem):
    store = world["services"].store
    before = snapshot(store)
    body, path = resolve(body, world), resolve(path, world)
    if isinstance(body, dict):
        r = world["http"].request(method, path, json=body)
    elif body is None:
        r = world["http"].request(method, path)
    else:  # raw bytes or a generator (sent chunked, without Content-Length)
        r = world["http"].request(method, path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and problem in r.json()["error"], r.text
    assert snapshot(store) == before
    healthy(world)


@pytest.mark.parametrize("text", [EMOJI, RTL, HTML, "x" * 8000, "**markdown** `code <b>` > quote"],
                         ids=["emoji", "rtl", "html", "at-the-limit", "markdown"])
def test_rest_accepts_odd_valid_text_and_stores_it_exactly(world, text):
    http, store = world["http"], world["services"].store
    r = http.post("/chat", json=msg(text))
    assert r.status_code == 200, r.text
    reply = store.get_message(r.json()["message_id"])
    assert store.get_message(reply.parent_id).content == text
    fb = http.post("/feedback", json={"message_id": reply.id, "note": text, "annotator": "mallory"})
    assert fb.status_code == 200 and store.get_rating(fb.json()["id"]).note == text
    assert http.get(f"/messages/{reply.id}").json()["ratings"][-1]["note"] == text  # and read back as sent
    healthy(world)


# ---- the same hostile input through the UI handlers ---------------------------------------------------------
def last(updates):
    """The final update of a streaming handler."""
    out = None
    for out in updates:
        pass
    return out


def send(w, text, agent="assistant", policy_id=None):
    """Chat tab: send a message; returns the status line."""
    return last(chat.send_message(w["services"], text, chat.empty_state(), agent, policy_id, "mallory", *GEN))[3]


def rate(w, score=None, note="", flags=None):
    """Chat tab's label panel on the reply: a score clicked, flags ticked, a note saved; the last status line."""
    status = ""
    if score is not None:
        status = labels.label_score(w["services"], "mallory", w["reply"], 0, gr.SelectData(None, {
            "index": 0, "value": score, "selected": True}))[0]
    for flag in flags or []:
        status = labels.label_flag(w["services"], "mallory", w["reply"], 0, gr.SelectData(None, {
            "index": 0, "value": flag, "selected": True}))[0]
    if note:
        status = labels.save_note(w["services"], "mallory", w["reply"], note)[0]
    return status


def ask_arena(w, text):
    """Arena tab: start a round; returns the status line."""
    return last(arena.play_round(w["services"], text, arena.empty_state(), "assistant", "mallory"))[4]


def vote(w, pair):
    """Arena tab: vote A on a round; returns the status line."""
    return arena.submit_vote(w["services"], "a", {"pair_id": w[pair]}, "mallory")[2]


def like(w, index):
    """Chat tab: thumbs-up icon on message ``index`` of a two-message conversation; returns the status line."""
    state = {"conversation_id": None, "ids": [w["user"], w["reply"]]}
    return labels.like_reply(w["services"], state, "mallory", None, "", "", 0,
                             gr.LikeData(None, {"index": index, "value": "", "liked": True}))[labels.N_PANEL]


UI_CASES = [
    ("send-empty", lambda w: send(w, ""), "Type a message first"),
    ("send-whitespace", lambda w: send(w, " \n\t "), "Type a message first"),
    ("send-100k", lambda w: send(w, "x" * 100_000), "limit"),
    ("send-nul", lambda w: send(w, "a\x00b"), "NUL"),
    ("send-lone-surrogate", lambda w: send(w, "hi \ud800"), "Unicode"),
    ("send-unknown-agent", lambda w: send(w, "hi", agent="nobody"), "unknown agent"),
    ("send-unknown-version", lambda w: send(w, "hi", policy_id=987654), "unknown policy"),
    ("send-archived-version", lambda w: send(w, "hi", policy_id=w["archived"]), "archived"),
    ("score-nan", lambda w: rate(w, score=math.nan), "score"),
    ("score-inf", lambda w: rate(w, score=math.inf), "score"),
    ("score-0", lambda w: rate(w, score=0), "score"),
    ("score-6", lambda w: rate(w, score=6), "score"),
    ("score-five", lambda w: rate(w, score="five"), "score"),
    ("note-100k", lambda w: rate(w, note="n" * 100_000), "limit"),
    ("note-nul", lambda w: rate(w, note="a\x00b"), "NUL"),
    ("flag-unknown", lambda w: rate(w, flags=["Evil"]), "flags"),
    ("like-user-message", lambda w: like(w, 0), "only replies"),
    ("like-out-of-range", lambda w: like(w, 7), "not part of this conversation"),
    ("arena-empty", lambda w: ask_arena(w, "   "), "Type a message first"),
    ("arena-100k", lambda w: ask_arena(w, "y" * 100_000), "limit"),
    ("arena-nul", lambda w: ask_arena(w, "\x00"), "NUL"),
    ("vote-archived-version", lambda w: vote(w, "pair_archived"), "archived"),
    ("vote-deleted-version", lambda w: vote(w, "pair_broken"), "broken"),
]


@pytest.mark.parametrize("name, act, problem", UI_CASES, ids=[c[0] for c in UI_CASES])
def test_ui_handlers_warn_and_store_nothing(world, name, act, problem):
    store = world["services"].store
    before = snapshot(store)
    toast = contextlib.nullcontext() if name == "like-out-of-range" else pytest.warns(UserWarning)  # gr.Warning
    with toast:
        status = act(world)
    assert problem in status, status
    assert snapshot(store) == before
    healthy(world)


def test_ui_stores_html_verbatim_and_shows_it_escaped(world):
    store = world["services"].store
    history, state = last(chat.send_message(world["services"], HTML, chat.empty_state(), "assistant", None,
                                            "mallory", *GEN))[:2]
    user = store.get_message(state["ids"][0])
    assert user.content == HTML  # stored as text
    shown = history[0]["content"]
    assert "<script" not in shown and "<img" not in shown and "<b>" not in shown
    assert shown.startswith("&lt;script>window.__xss = 1&lt;/script>") and "AT&amp;T" in shown
    assert "Note stored" in labels.save_note(world["services"], "mallory", state["ids"][1], HTML)[0]
    assert store.effective_rating(state["ids"][1], "mallory")["note"] == HTML
    # the arena shows the shared prompt the same way
    updates = list(arena.play_round(world["services"], HTML, arena.empty_state(), "assistant", "mallory"))
    chat_a = updates[-1][0]
    assert chat_a[0]["content"] == shown and store.arena_vote(updates[-1][2]["pair_id"]) is None
    healthy(world)


def test_binary_garbage_gets_a_json_error(world):
    r = world["http"].post("/chat", content=b"\x00\x01garbage", headers={"content-type": "application/json"})
    assert r.status_code == 400 and isinstance(json.loads(r.text)["error"], str)
