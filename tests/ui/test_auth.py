"""Auth and roles over real HTTP: 401 without credentials on every REST route but /health, Basic and Bearer,
403 for annotators on admin actions, attribution to the signed-in user, rate limit, cross-origin writes."""
from __future__ import annotations

import base64

import gradio as gr
import httpx
import pytest
from starlette.requests import Request as StarletteRequest

from rlhf.config import load_config
from storage.credentials import hash_password, verify_password
from tests.conftest import LiveServer
from ui.auth import Auth, signed_in_annotator
from ui.users import AuthConfigError, load_users_file, parse_users
from ui.throttles import RateLimiter
from ui.permissions import Forbidden, is_admin

BASE = ["device=cpu", "serving.warmup=false", "serving.max_new_tokens=8", "scheduler.enabled=false"]
USERS = "alice:a-pass:admin,bob:b:pass:annotator"  # bob's password is "b:pass"


def team_config(tmp_path, tiny_model_dir, *extra, env=None):
    return load_config(env=env or {}, overrides=[f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}",
                                                 *BASE, *extra])


@pytest.fixture(scope="module")
def team(tmp_path_factory, tiny_model_dir, tiny_server):
    """One team app for the module (tests use distinct names, so they do not see each other's writes)."""
    from ui.webapp import build_services, create_app

    tmp_path = tmp_path_factory.mktemp("team")
    services = build_services(team_config(tmp_path, tiny_model_dir, f"server.users={USERS}"), server=tiny_server)
    with LiveServer(create_app(services)) as live:
        yield services, live
    services.store.close()


def basic(name, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


ALICE, BOB = basic("alice", "a-pass"), basic("bob", "b:pass")


# ---- parsing and config -------------------------------------------------------------------------------
def test_parse_users_spec():
    users = parse_users(USERS + ", carol:c")
    assert [(u["name"], u["password"], u["role"]) for u in users] == [
        ("alice", "a-pass", "admin"), ("bob", "b:pass", "annotator"), ("carol", "c", "annotator")]
    assert parse_users("") == []
    for bad, problem in (("alice", "name:password"), ("alice:", "empty password"), (":pw:admin", "user name")):
        with pytest.raises(AuthConfigError, match=problem):
            parse_users(bad)


def test_users_file_yaml_and_json(tmp_path):
    path = tmp_path / "users.yaml"
    path.write_text(f"users:\n  - {{name: dana, password: d, role: admin}}\n"
                    f"  - {{name: eve, password_hash: '{hash_password('e')}'}}\n")
    users = {u["name"]: u for u in load_users_file(path)}
    assert users["dana"]["role"] == "admin" and users["eve"]["role"] == "annotator"
    (tmp_path / "bad.json").write_text('[{"name": "x", "password": "p", "password_hash": "h"}]')
    with pytest.raises(AuthConfigError, match="exactly one"):
        load_users_file(tmp_path / "bad.json")
    (tmp_path / "plain.json").write_text('[{"name": "x", "password_hash": "hunter2"}]')
    with pytest.raises(AuthConfigError, match="not a scrypt hash"):
        load_users_file(tmp_path / "plain.json")
    with pytest.raises(AuthConfigError, match="not found"):
        load_users_file(tmp_path / "nope.yaml")


def test_env_names_map_to_config(tmp_path):
    cfg = load_config(env={"RLHF_USERS": "a:b:admin", "RLHF_ADMINS": "x,y", "HF_TOKEN": "hf_secret"})
    assert cfg.server.users == "a:b:admin" and cfg.server.admins == ["x", "y"] and cfg.server.hf_token == "hf_secret"
    assert "a:b" not in cfg.to_json() and "hf_secret" not in cfg.to_json()  # secrets never reach job configs


def test_from_config_modes_and_hashes(store, tmp_path, tiny_model_dir, space_oauth):
    assert Auth.from_config(team_config(tmp_path, tiny_model_dir), store) is None
    auth = Auth.from_config(team_config(tmp_path, tiny_model_dir, f"server.users={USERS}"), store)
    assert auth.mode == "users" and auth.roles == {"alice": "admin", "bob": "annotator"}
    stored = store.password_hash("alice")
    assert stored.startswith("scrypt$") and verify_password("a-pass", stored)
    assert auth.login("alice", "a-pass") and not auth.login("alice", "b:pass") and not auth.login("zed", "x")
    again = Auth.from_config(team_config(tmp_path, tiny_model_dir, f"server.users={USERS}"), store)
    assert store.password_hash("alice") == stored and again.login("bob", "b:pass")  # unchanged password: same hash
    Auth.from_config(team_config(tmp_path, tiny_model_dir, "server.users=alice:new:admin"), store)
    assert store.password_hash("bob") is None  # removed from config: can no longer sign in
    hf = Auth.from_config(team_config(tmp_path, tiny_model_dir, "server.space_id=me/studio", "server.admins=boss"),
                          store)
    assert hf.mode == "hf" and hf.role_for("boss") == "admin" and hf.role_for("someone") == "annotator"


@pytest.mark.parametrize("secret", [None, "", "  "])
def test_hf_sign_in_refuses_to_start_without_a_session_secret(store, tmp_path, tiny_model_dir, space_oauth,
                                                              monkeypatch, secret):
    """Issue #24, finding 7: Gradio signs HF sessions with sha256(secret + "-v4"); with an empty secret anyone could
    sign a cookie naming an admin, so the app does not start."""
    from gradio import oauth

    monkeypatch.setattr(oauth, "OAUTH_CLIENT_SECRET", secret)
    with pytest.raises(AuthConfigError, match="OAUTH_CLIENT_SECRET"):
        Auth.from_config(team_config(tmp_path, tiny_model_dir, "server.space_id=me/studio"), store)


def test_hf_sign_in_refuses_to_start_off_a_real_space(store, tmp_path, tiny_model_dir, space_oauth, monkeypatch):
    """Issue #33, finding 2: SPACE_ID and OAUTH_CLIENT_SECRET set but SYSTEM unset: Gradio would mock OAuth and sign
    every visitor in as this machine's HF user (an admin when listed). Only an explicit insecure flag starts it, never
    with admins."""
    monkeypatch.delenv("SYSTEM")
    with pytest.raises(AuthConfigError, match="not a Hugging Face Space"):
        Auth.from_config(team_config(tmp_path, tiny_model_dir, "server.space_id=me/studio"), store)
    flag = "server.insecure_hf_sign_in_off_space=true"
    with pytest.raises(AuthConfigError, match="admins"):
        Auth.from_config(team_config(tmp_path, tiny_model_dir, "server.space_id=me/studio", flag, "server.admins=me"),
                         store)
    tried = Auth.from_config(team_config(tmp_path, tiny_model_dir, "server.space_id=me/studio", flag), store)
    assert tried.mode == "hf"


def test_spaces_defaults_apply_only_on_a_real_space(tmp_path, tiny_model_dir, tiny_server, space_oauth, monkeypatch):
    """Off a Space, SPACE_ID changes no default: the app stays on loopback and trusts no proxy, so a forwarded host
    cannot carry a rebinding Host past the host check."""
    from fastapi.testclient import TestClient

    from ui.webapp import build_services, create_app

    off = load_config(env={"SPACE_ID": "team/studio"})
    assert (off.server.host, off.server.trusted_proxies, off.base_model) == ("127.0.0.1", [],
                                                                            "smollm2-135m-instruct")
    on = load_config(env={"SPACE_ID": "team/studio", "SYSTEM": "spaces"})
    assert (on.server.host, on.server.trusted_proxies) == ("0.0.0.0", ["*"])
    monkeypatch.delenv("SYSTEM")
    services = build_services(team_config(tmp_path, tiny_model_dir, "server.insecure_hf_sign_in_off_space=true",
                                          env={"SPACE_ID": "team/studio"}), server=tiny_server)
    try:
        with TestClient(create_app(services, ui=False), base_url="http://evil.example") as client:
            r = client.get("/api/v1/me", headers={"X-Forwarded-Host": "team-studio.hf.space"})
            assert r.status_code == 400 and "unknown host" in r.json()["error"]
    finally:
        services.store.close()


def test_gradio_requests_and_oauth_session(store):
    users = Auth(store, "users", {"alice": "admin", "bob": "annotator"})
    assert users.user_of(gr.Request(username="bob")) == "bob" and users.role_of(gr.Request(username="bob")) == "annotator"
    assert users.user_of(gr.Request(username="stranger")) is None
    promoted = Auth(store, "users", {"bob": "annotator"}, admins=["bob", "boss"])
    assert promoted.role_for("bob") == "admin" and promoted.role_for("boss") is None  # admins must be users
    hf = Auth(store, "hf", admins=["boss"])
    signed = StarletteRequest({"type": "http", "headers": [], "session": {
        "oauth_info": {"userinfo": {"preferred_username": "boss"}}}})
    assert hf.user_of(gr.Request(request=signed)) == "boss" and hf.role_of(gr.Request(request=signed)) == "admin"
    anonymous = StarletteRequest({"type": "http", "headers": []})
    assert hf.user_of(gr.Request(request=anonymous)) is None


def test_signed_in_annotator_ignores_the_typed_name(services, store):
    assert signed_in_annotator(services, None, " typed ") == "typed"  # local mode
    services.auth = Auth(services.store, "users", {"bob": "annotator"})
    assert signed_in_annotator(services, gr.Request(username="bob"), "mallory") == "bob"
    with pytest.raises(Forbidden, match="sign in"):
        signed_in_annotator(services, gr.Request(), "mallory")
    assert not is_admin(services, gr.Request(username="bob"))


def test_rate_limiter_window():
    limiter = RateLimiter(2, window=60)
    assert limiter.retry_after("u", now=0) is None and limiter.retry_after("u", now=1) is None
    assert limiter.retry_after("u", now=2) == pytest.approx(58)
    assert limiter.retry_after("other", now=2) is None
    assert limiter.retry_after("u", now=61) is None  # the first request left the window
    assert RateLimiter(0).retry_after("u") is None


# ---- over HTTP --------------------------------------------------------------------------------------
def test_every_rest_route_but_health_needs_credentials(team):
    services, live = team
    spec = httpx.get(live.url + "/api/v1/openapi.json").json()  # the API's own list of routes (public)
    assert len(spec["paths"]) >= 15
    checked = 0
    for route, methods in spec["paths"].items():
        path = "/".join("1" if part.startswith("{") else part for part in route.split("/"))
        for method in methods:
            r = httpx.request(method.upper(), live.url + path, json={})
            expected = 200 if route == "/api/v1/health" else 401
            assert r.status_code == expected, (method, route, r.status_code, r.text)
            if expected == 401:
                assert "error" in r.json() and "Basic" in r.headers["www-authenticate"]
                checked += 1
    assert checked >= 14
    assert httpx.get(live.url + "/api/v1/agents", headers=basic("alice", "wrong")).status_code == 401
    assert httpx.get(live.url + "/api/v1/agents", headers={"Authorization": "Bearer rlhf_nope"}).status_code == 401


def test_roles_over_http(team):
    services, live = team
    api = live.url + "/api/v1"
    assert httpx.get(f"{api}/me", headers=BOB).json() == {"user": "bob", "admin": False, "mode": "users"}
    admin_only = [("POST", "/train", {}), ("POST", "/policies/1/promote", None), ("POST", "/policies/1/archive", None),
                  ("POST", "/agents", {"name": "x", "system_prompt": "s"}), ("GET", "/export?format=jsonl", None),
                  ("POST", "/annotators/alice/exclude", {"excluded": True}), ("POST", "/tokens", {"name": "bob"}),
                  ("GET", "/flagged", None), ("POST", "/jobs/1/cancel", None)]
    for method, path, body in admin_only:
        r = httpx.request(method, api + path, headers=BOB, json=body)
        assert r.status_code == 403 and "admin" in r.json()["error"], (path, r.status_code, r.text)
    assert httpx.get(f"{api}/quality", headers=BOB).status_code == 200  # dashboards are for everyone
    made = httpx.post(f"{api}/agents", headers=ALICE, json={"name": "helper", "system_prompt": "Be brief."})
    assert made.status_code == 200 and made.json()["name"] == "helper"
    assert httpx.post(f"{api}/tokens", headers=ALICE, json={"name": "zed"}).status_code == 404  # not a user


def test_writes_are_attributed_to_the_signed_in_user(team):
    services, live = team
    api = live.url + "/api/v1"
    token = httpx.post(f"{api}/tokens", headers=ALICE, json={"name": "bob", "label": "script"}).json()["token"]
    bearer = {"Authorization": f"Bearer {token}"}
    reply = httpx.post(f"{api}/chat", headers=bearer, timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_new_tokens": 4, "annotator": "mallory"}).json()
    httpx.post(f"{api}/feedback", headers=bearer, json={"message_id": reply["message_id"], "thumb": 1,
                                                        "annotator": "mallory"}).raise_for_status()
    rows = services.store.feedback_rows("assistant")
    assert [r["annotator"] for r in rows["ratings"]] == ["bob"]
    assert rows["conversations"][-1]["annotator"] == "bob"
    services.store.revoke_api_token(services.store.list_api_tokens("bob")[0]["id"])
    assert httpx.get(f"{api}/agents", headers=bearer).status_code == 401


def test_cross_origin_writes_are_refused(team):
    services, live = team
    api = live.url + "/api/v1"
    body = {"name": "evil", "system_prompt": "x"}
    r = httpx.post(f"{api}/agents", headers={**ALICE, "Origin": "https://evil.example"}, json=body)
    assert r.status_code == 403 and "cross-origin" in r.json()["error"]
    assert httpx.post(f"{api}/agents", headers={**ALICE, "Origin": "null"}, json=body).status_code == 403
    same = httpx.post(f"{api}/agents", headers={**ALICE, "Origin": live.url}, json=body)
    assert same.status_code == 200
    assert httpx.get(f"{api}/agents", headers={**ALICE, "Origin": "https://evil.example"}).status_code == 200


def test_gradio_login_uses_the_same_users(team):
    services, live = team
    bad = httpx.post(live.url + "/login", data={"username": "alice", "password": "nope"})
    assert bad.status_code >= 400
    good = httpx.post(live.url + "/login", data={"username": "alice", "password": "a-pass"})
    assert good.status_code == 200 and any(c.startswith("access-token") for c in good.cookies)
    assert httpx.get(live.url + "/gradio_api/login_check").status_code == 401
    assert httpx.get(live.url + "/gradio_api/login_check", cookies=good.cookies).status_code == 200


def test_rate_limit_per_user(tmp_path, tiny_model_dir, tiny_server):
    from ui.webapp import build_services, create_app

    services = build_services(team_config(tmp_path, tiny_model_dir, f"server.users={USERS}",
                                          "server.rate_limit_per_minute=3"), server=tiny_server)
    try:
        with LiveServer(create_app(services)) as live:
            codes = [httpx.get(live.url + "/api/v1/agents", headers=BOB).status_code for _ in range(4)]
            assert codes == [200, 200, 200, 429]
            r = httpx.get(live.url + "/api/v1/agents", headers=BOB)
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and "error" in r.json()
            assert httpx.get(live.url + "/api/v1/agents", headers=ALICE).status_code == 200  # per user
            assert httpx.get(live.url + "/api/v1/health").status_code == 200
    finally:
        services.store.close()


def test_local_mode_stays_open(live_app):
    assert httpx.get(live_app.url + "/api/v1/agents").status_code == 200
    assert httpx.get(live_app.url + "/api/v1/me").json() == {"user": None, "admin": True, "mode": "local"}
    r = httpx.post(live_app.url + "/api/v1/agents", headers={"Origin": "http://evil.example"},
                   json={"name": "x", "system_prompt": "y"})
    assert r.status_code == 403  # cross-origin writes are refused even without users
