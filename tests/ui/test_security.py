"""Side doors, in process: host and origin rules, the login throttle, text that Markdown cannot turn into HTML,
private UI exports, and annotators seeing only their own feedback (issue #15; the real-process versions are in
tests/e2e/test_side_doors.py)."""
from __future__ import annotations

import html
import re
import stat
from pathlib import Path

import gradio as gr
import httpx
import pytest
from starlette.datastructures import Headers

from rlhf.config import ConfigError, load_config
from tests.conftest import LiveServer
from ui.throttles import LoginThrottle
from ui.request_guard import allowed_hosts, check_origins, foreign_origin, host_name, space_host
from ui.tabs import data as data_tab
from ui.views.text import literal_html

USERS = "alice:a-pass:admin,bob:b-pass,carol:c-pass"


def team_services(tmp_path, tiny_model_dir, tiny_server, *extra):
    from ui.webapp import build_services

    config = load_config(env={}, overrides=[f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}", "device=cpu",
                                            "serving.warmup=false", "scheduler.enabled=false",
                                            f"server.users={USERS}", *extra])
    return build_services(config, server=tiny_server)


# ---- hosts and origins ---------------------------------------------------------------------------------
def test_host_names_and_the_space_host():
    assert host_name("127.0.0.1:7860") == "127.0.0.1" and host_name("[::1]:7860") == "::1"
    assert host_name("Studio.Example.") == "studio.example" and host_name("::1") == "::1"
    assert space_host("Team/RLHF_studio.v2") == "team-rlhf-studio-v2.hf.space"


def test_which_hosts_each_mode_accepts():
    local = load_config(env={})
    assert allowed_hosts(local, local_mode=True) == {"127.0.0.1", "localhost", "::1"}
    wide = load_config(env={}, overrides=["server.host=0.0.0.0", "server.allowed_hosts=lab.example"])
    assert allowed_hosts(wide, local_mode=True) == {"127.0.0.1", "localhost", "::1", "lab.example"}
    named = load_config(env={}, overrides=["server.host=box.lan"])
    assert "box.lan" in allowed_hosts(named, local_mode=True)
    assert allowed_hosts(load_config(env={}, overrides=["server.host=0.0.0.0"]), local_mode=False) is None
    assert allowed_hosts(load_config(env={}, overrides=['server.allowed_hosts=["*"]']), local_mode=True) is None
    space = load_config(env={"SPACE_ID": "team/studio"})
    assert "team-studio.hf.space" in allowed_hosts(space, local_mode=False)


def test_foreign_origins():
    def foreign(origin, host="studio.example", allowed=(), forwarded=None):
        headers = {"host": host, **({"origin": origin} if origin else {}),
                   **({"x-forwarded-host": forwarded} if forwarded else {})}
        return foreign_origin(Headers(headers), list(allowed))

    assert not foreign(None) and not foreign("https://studio.example")
    assert foreign("https://evil.example") and foreign("null") and foreign("https://studio.example.evil.example")
    assert not foreign("https://tool.example", allowed=["https://tool.example"])
    assert not foreign("https://studio.example", host="10.0.0.5:7860", forwarded="studio.example")
    assert check_origins(["https://Tool.example/"]) == ["https://tool.example"]
    for bad in ("*", "tool.example", "https://tool.example/path"):
        with pytest.raises(ConfigError, match="allowed_origins"):
            check_origins([bad])


# ---- the login throttle --------------------------------------------------------------------------------
def test_login_throttle_counts_before_the_check_and_refunds_successes():
    throttle = LoginThrottle(3, window=600)
    keys = ["ip:a", "user:bob"]
    for t in range(3):
        assert throttle.attempt(keys, now=t) is None  # three guesses go ahead (each reserved as a failure)
    assert throttle.attempt(keys, now=10) == pytest.approx(590)  # the 4th waits for the 1st to age out
    assert throttle.attempt(["ip:b", "user:bob"], now=10) is not None  # the name is locked from any address
    assert throttle.attempt(["ip:a", "user:carol"], now=10) is not None  # the address is locked for any name
    assert throttle.attempt(["ip:b", "user:carol"], now=10) is None
    assert throttle.attempt(keys, now=601) is None  # the first failure left the window
    ok = LoginThrottle(2, window=600)
    for t in range(5):
        assert ok.attempt(keys, now=t) is None
        ok.succeeded(keys)  # right passwords never count
    assert LoginThrottle(0, window=600).attempt(keys) is None


# ---- text that Markdown cannot re-open ----------------------------------------------------------------
SNIPPETS = ["<b>pwn</b>", "<img src=http://beacon.invalid/x.png>", "<a href=javascript:alert(1)>pwn</a>",
            "<script>window.__xss=1</script>", "![pwn](http://beacon.invalid/y.png)", "&lt;b&gt;pwn"]
# Backticks (and the other code openers) in every position Markdown gives them a meaning, or none.
CONTEXTS = ["{h}", "```{h}", "a ``` {h}", "a ```{h}``` b", "```\n{h}\n```", "```\n{h}", "`{h}`", "`` {h} ``",
            "a ` {h}", "{h} ```", "`a` {h} `b`", "    {h}", "\t{h}", "~~~\n{h}\n~~~", "> ```\n> {h}",
            "- ```\n  {h}", "\\`{h}", "\\{h}", "[x]({h})", "``` py\n{h}\n``` trailing"]
RAW_TAG = re.compile(r"<(?!/?(p|br|em|strong|ul|ol|li|blockquote|hr|h[1-6])\b)[a-z/]", re.I)


@pytest.mark.parametrize("context", CONTEXTS)
def test_literal_html_leaves_markdown_nothing_to_open(context):
    markdown_it = pytest.importorskip("markdown_it")
    md = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table")
    for snippet in SNIPPETS:
        text = context.format(h=snippet)
        shown = literal_html(text)
        assert "<" not in shown and "`" not in shown, shown
        rendered = md.render(shown)
        assert not RAW_TAG.search(rendered), (text, rendered)  # no code, link, image or raw HTML element
        visible = html.unescape(re.sub(r"<[^>]+>", "", rendered)).replace("\xa0", " ")
        assert snippet.replace("\\", "") in visible.replace("\\", ""), (text, visible)  # shown as typed
    assert html.unescape(literal_html("x <b> & `y`").replace("&nbsp;", " ")) == "x <b> & `y`"


# ---- REST: the same throttle for HTTP Basic ----------------------------------------------------------------
def client_at(address: str) -> httpx.Client:
    """An HTTP client whose connections come from another loopback address (a second 'client address')."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=60)


def test_rest_basic_lockout_says_nothing_about_the_password(tmp_path, tiny_model_dir, tiny_server):
    from ui.webapp import create_app

    services = team_services(tmp_path, tiny_model_dir, tiny_server, "server.login_max_failures=3")
    try:
        with LiveServer(create_app(services)) as live:
            api = live.url + "/api/v1/agents"
            with client_at("127.0.0.2") as one:
                assert [one.get(api, auth=("bob", f"guess{i}")).status_code for i in range(3)] == [401] * 3
                right = one.get(api, auth=("bob", "b-pass"))
                wrong = one.get(api, auth=("bob", "guess4"))
                assert right.status_code == wrong.status_code == 429 and right.json() == wrong.json()
                assert int(right.headers["retry-after"]) > 500
                login = one.post(live.url + "/login", data={"username": "carol", "password": "c-pass"})
                assert login.status_code == 429  # the address is locked on /login too
            with client_at("127.0.0.3") as two:
                # Issue #24, finding 9: guesses from another address do not lock bob out (no name-only key)
                assert two.get(api, auth=("bob", "b-pass")).status_code == 200
                assert two.get(api, auth=("carol", "c-pass")).status_code == 200
                assert two.get(api, auth=("carol", "c-pass")).status_code == 200  # successes are not failures
    finally:
        services.store.close()


def test_the_sign_in_cookie_stays_on_this_site(tmp_path, tiny_model_dir, tiny_server):
    from ui.webapp import create_app

    services = team_services(tmp_path, tiny_model_dir, tiny_server)
    try:
        with LiveServer(create_app(services)) as live:
            r = httpx.post(live.url + "/login", data={"username": "alice", "password": "a-pass"})
            cookies = r.headers.get_list("set-cookie")
            assert r.status_code == 200 and len(cookies) == 2
            assert all(c.lower().count("samesite") == 1 and "samesite=lax" in c.lower() for c in cookies), cookies
    finally:
        services.store.close()


# ---- annotators see their own feedback ----------------------------------------------------------------
@pytest.fixture
def noted(tmp_path, tiny_model_dir, tiny_server):
    """A team app where bob and carol rated the same reply, each with a private note."""
    services = team_services(tmp_path, tiny_model_dir, tiny_server)
    store = services.store
    conv = store.create_conversation("assistant", "bob", messages=[{"role": "user", "content": "secret prompt?"}])
    reply = store.record_reply(store.leaf(conv.id).id, "an answer", store.active_policy("assistant").id)
    store.record_rating(reply.id, "bob", thumb=1, note="bob's note")
    store.record_rating(reply.id, "carol", flags=["Unsafe"], note="carol's private note")
    yield services, reply.id
    services.store.close()


def test_an_annotator_reads_only_their_own_notes(noted):
    from ui.webapp import create_app

    services, reply = noted
    with LiveServer(create_app(services)) as live:
        url = f"{live.url}/api/v1/messages/{reply}"
        bob = httpx.get(url, auth=("bob", "b-pass")).json()
        assert [r["note"] for r in bob["ratings"]] == ["bob's note"] and bob["content"] == "an answer"
        admin = httpx.get(url, auth=("alice", "a-pass")).json()
        assert sorted(r["note"] for r in admin["ratings"]) == ["bob's note", "carol's private note"]
    table = data_tab.refresh_data(services, "assistant", "all", "all", "all", "", gr.Request(username="bob"))["table"]
    assert list(table["annotator"]) == ["bob"] and "carol's private note" not in table.to_string()
    unsafe = data_tab.refresh_data(services, "assistant", "all", "all", "Unsafe", "",
                                   gr.Request(username="bob"))["table"]
    assert unsafe.empty  # the Flag filter cannot find others' flags either
    everyone = data_tab.refresh_data(services, "assistant", "all", "all", "all", "",
                                     gr.Request(username="alice"))["table"]
    assert set(everyone["annotator"]) == {"bob", "carol"}
    services.config.server.open_feedback = True
    opened = data_tab.refresh_data(services, "assistant", "all", "all", "all", "", gr.Request(username="bob"))["table"]
    assert set(opened["annotator"]) == {"bob", "carol"}


# ---- private UI exports --------------------------------------------------------------------------------
def test_ui_export_is_private_and_deleted(noted):
    services, _ = noted
    button, status = data_tab.run_export(services, "assistant", "openrlhf", gr.Request(username="alice"))
    path = Path(button.value["path"])
    folder = services.downloads.owner_dir(path)
    assert folder is not None and "kept for" in status
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert path in files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    services.downloads.remove(folder)
    assert not folder.exists() and services.downloads.owner_dir(path) is None
    refused, status = data_tab.run_export(services, "assistant", "jsonl", gr.Request(username="bob"))
    assert "admin" in status and refused.visible is False


# ---- uploads -----------------------------------------------------------------------------------------------
def test_gradio_uploads_are_refused_and_store_nothing(services):
    """Issue #41: /gradio_api/upload took 263 MB in 4.4 s from one annotator; nothing in the UI uploads a file."""
    from ui.downloads import upload_folder
    from ui.webapp import create_app

    def stored() -> set:
        return {p for p in upload_folder().rglob("*") if p.is_file()}

    before = stored()
    with LiveServer(create_app(services)) as live:
        assert httpx.get(live.url + "/", timeout=60).status_code == 200  # the UI itself still loads
        for path in ("/gradio_api/upload", "/gradio_api/upload/", "/gradio_api/upload?upload_id=x"):
            r = httpx.post(live.url + path, files={"files": ("big.bin", b"\0" * 100_000)}, timeout=60)
            assert r.status_code == 403 and "no file uploads" in r.json()["error"], (path, r.text)
    assert stored() == before
