"""The app built exactly as Hugging Face Spaces builds it (app.py with SPACE_ID set), without a server; and the
Space's metadata: the README front matter (requirements.txt: tests/test_requirements.py)."""
from __future__ import annotations

import re
import tomllib

import pytest
import yaml
from fastapi.testclient import TestClient

from rlhf.config import SPACES_BASE_MODEL, load_config
from tests.conftest import ROOT

SPACE_ENV = ("SPACE_ID", "HF_TOKEN", "RLHF_USERS", "RLHF_ADMINS")


@pytest.fixture
def space_env(monkeypatch, tiny_model_dir, space_oauth):
    """The environment a Space with HF sign-in gives the app (plus a tiny model and no background work)."""
    import os

    for name in list(os.environ):
        if name.startswith("RLHF_") or name in SPACE_ENV:
            monkeypatch.delenv(name)
    monkeypatch.setenv("SPACE_ID", "team/rlhf-studio")
    monkeypatch.setenv("RLHF_ADMINS", "boss")
    monkeypatch.setenv("RLHF_BASE_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("RLHF_DEVICE", "cpu")
    monkeypatch.setenv("RLHF_SERVING_WARMUP", "false")
    monkeypatch.setenv("RLHF_SCHEDULER_ENABLED", "false")
    return monkeypatch


def build_space_app():
    import app as app_module

    return app_module.build([])


def test_spaces_defaults_in_the_config(tmp_path):
    cfg = load_config(env={"SYSTEM": "spaces", "SPACE_ID": "team/rlhf-studio",
                           "RLHF_SERVER_PERSISTENT_DIR": str(tmp_path)})
    assert cfg.base_model == SPACES_BASE_MODEL and cfg.server.host == "0.0.0.0"
    assert cfg.data_dir == str(tmp_path / "rlhf-studio")  # the persistent mount exists: data lives there
    kept = load_config(env={"SYSTEM": "spaces", "SPACE_ID": "x/y", "RLHF_BASE_MODEL": "mine",
                            "RLHF_DATA_DIR": "/elsewhere"},
                       overrides=["server.host=127.0.0.1"])
    assert (kept.base_model, kept.data_dir, kept.server.host) == ("mine", "/elsewhere", "127.0.0.1")
    assert load_config(env={}).base_model == "smollm2-135m-instruct"  # not on a Space: the shipped GGUF


def test_app_builds_as_on_spaces_with_persistent_storage(space_env, tmp_path):
    from ui.app import header

    mount = tmp_path / "data-mount"
    mount.mkdir()
    space_env.setenv("RLHF_SERVER_PERSISTENT_DIR", str(mount))
    app = build_space_app()
    services = app.state.services
    try:
        cfg = services.config
        assert cfg.server.space_id == "team/rlhf-studio" and cfg.server.host == "0.0.0.0"
        assert services.store.path == mount / "rlhf-studio" / "studio.db"
        assert services.auth is not None and services.auth.mode == "hf" and services.auth.role_for("boss") == "admin"
        text = header(services)
        assert "Hugging Face sign-in" in text and "NOT persistent" not in text
        with TestClient(app, base_url="http://127.0.0.1") as client:
            assert client.get("/api/v1/health").json()["status"] == "ok"
            assert client.get("/api/v1/agents").status_code == 401  # the REST API wants a token on a Space
            page = client.get("/")
            assert page.status_code == 200 and "<html" in page.text.lower()
        gradio_app = next(r.app for r in app.routes if getattr(r, "path", None) == "")
        assert "/login/huggingface" in {getattr(r, "path", None) for r in gradio_app.routes}  # HF sign-in is on
    finally:
        services.close()


def test_app_warns_loudly_without_persistent_storage(space_env, tmp_path):
    from ui.app import header

    space_env.setenv("RLHF_SERVER_PERSISTENT_DIR", str(tmp_path / "no-mount"))
    space_env.setenv("RLHF_DATA_DIR", str(tmp_path / "ephemeral"))
    app = build_space_app()
    services = app.state.services
    try:
        assert "Data is NOT persistent" in header(services) and "lost on restart" in header(services)
    finally:
        services.close()


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text()
    match = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert match, "README.md must start with the Spaces front matter (--- YAML ---)"
    return yaml.safe_load(match.group(1))


def pyproject_deps() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(split_requirement(d) for d in deps)


def split_requirement(line: str) -> tuple[str, str]:
    """('gradio', '==6.31.0') from 'gradio[oauth]==6.31.0' (extras dropped, name normalised)."""
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*?)\s*$", line)
    return m.group(1).lower().replace("_", "-"), m.group(3).replace(" ", "")


def test_readme_front_matter_is_a_valid_gradio_space():
    meta = front_matter()
    for key in ("title", "emoji", "sdk", "sdk_version", "app_file", "hf_oauth"):
        assert key in meta, f"front matter lacks {key}"
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py" and meta["hf_oauth"] is True
    assert (ROOT / meta["app_file"]).is_file()
    assert "==" + str(meta["sdk_version"]) == pyproject_deps()["gradio"], "sdk_version must match the gradio pin"
    assert len(str(meta.get("short_description", ""))) <= 60


# requirements.txt against pyproject.toml (pins, extras, the CPU engine): tests/test_requirements.py


# ---- a Space process: HF sign-in end to end (issue #24, finding 7) -------------------------------------------------
def space_process(tmp_path, tiny_model_dir, **env):
    from tests.conftest import SPACE_OAUTH
    from tests.e2e.app_process import TEST_APP, AppProcess, write_config

    config = write_config(tmp_path / "space.yaml", TEST_APP, {"scheduler": {"enabled": False}})
    space = {"SYSTEM": "spaces", "SPACE_ID": "team/rlhf-studio", "RLHF_ADMINS": "boss", "RLHF_SERVER_HOST": "127.0.0.1",
             "RLHF_SERVER_PERSISTENT_DIR": str(tmp_path / "no-mount"), "GRADIO_TEMP_DIR": str(tmp_path / "gradio"),
             **SPACE_OAUTH, **env}
    return AppProcess(tmp_path / "data", tiny_model_dir, config, env=space)


def session_cookie(secret: str, username: str) -> str:
    """A session cookie signed the way Gradio's HF sign-in signs it (Starlette's SessionMiddleware, key
    sha256(OAUTH_CLIENT_SECRET + "-v4")), holding the profile the OAuth callback stores."""
    import base64
    import hashlib
    import json

    from itsdangerous import TimestampSigner

    key = hashlib.sha256((secret + "-v4").encode()).hexdigest()
    payload = base64.b64encode(json.dumps({"oauth_info": {"userinfo": {"preferred_username": username}}}).encode())
    return TimestampSigner(key).sign(payload).decode()


@pytest.mark.slow
def test_a_space_signs_in_with_a_signed_session_and_refuses_forged_ones(tmp_path, tiny_model_dir):
    from pathlib import Path

    from tests.conftest import SPACE_OAUTH
    from tests.support.gradio_page import page_call

    app = space_process(tmp_path, tiny_model_dir).start()
    try:
        def export_as(cookie: str):  # the Data tab's Export, as the page calls it
            return page_call(app.url, "export", "assistant", "jsonl", headers={"Cookie": f"session={cookie}"})

        button, status = export_as(session_cookie(SPACE_OAUTH["OAUTH_CLIENT_SECRET"], "boss"))
        assert "Exported" in status  # boss (RLHF_ADMINS) signed in through the signed session
        folder = Path(button["value"]["path"]).parent
        assert folder.is_dir()
        _, forged = export_as(session_cookie("", "boss"))  # what an empty secret would have let anyone sign
        assert "admin" in forged and "Exported" not in forged
        _, annotator = export_as(session_cookie(SPACE_OAUTH["OAUTH_CLIENT_SECRET"], "someone"))
        assert "admin" in annotator  # a real session of an annotator: signed in, but not an admin
    finally:
        app.stop()  # SIGTERM, as a Space restart sends
    assert app.proc.returncode is not None
    assert not folder.exists(), "the undownloaded UI export outlived SIGTERM"


@pytest.mark.slow
@pytest.mark.parametrize("secret", ["", "   "])
def test_a_space_without_an_oauth_secret_refuses_to_start(tmp_path, tiny_model_dir, secret):
    app = space_process(tmp_path, tiny_model_dir, OAUTH_CLIENT_SECRET=secret)
    app.launch()
    assert app.wait_exit(120) == 2
    assert "OAUTH_CLIENT_SECRET" in app.output() and "Traceback" not in app.output()


# ---- llama.cpp serves a Space's hub-id base (issue #43) -----------------------------------------------------------
@pytest.fixture
def offline_hub(monkeypatch, tmp_path, tiny_model_dir):
    """The tiny model as the Space's hub base, in a Hugging Face cache under tmp, with the Hub switched off
    (huggingface_hub reads HF_HOME and HF_HUB_OFFLINE once at import: in this process they go where it keeps them)."""
    from huggingface_hub import constants

    from tests.support.hf_cache import hf_home_with

    home = hf_home_with(tmp_path / "hf", SPACES_BASE_MODEL, tiny_model_dir)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}


def test_a_hub_base_is_found_in_the_hugging_face_cache_and_converted_once(offline_hub, tmp_path):
    from rlhf.serving.llama_cpp.base import llama_base
    from tests.support.hf_cache import REVISION

    gguf, tokenizer_source = llama_base(SPACES_BASE_MODEL, tmp_path / "data")
    assert gguf.is_file() and gguf.name.startswith("HuggingFaceTB--SmolLM2-135M-Instruct-q8_0-")
    assert tokenizer_source.endswith(f"snapshots/{REVISION}")  # the cached snapshot, not a download
    converted = gguf.stat().st_mtime_ns
    again, _ = llama_base(SPACES_BASE_MODEL, tmp_path / "data")
    assert again == gguf and again.stat().st_mtime_ns == converted  # converted once, then read from the data dir


def test_a_hub_base_missing_from_an_offline_cache_says_why(offline_hub, tmp_path):
    from rlhf.serving.interface import EngineUnavailable
    from rlhf.serving.llama_cpp.base import llama_base

    with pytest.raises(EngineUnavailable, match="cannot fetch someone/elsewhere .*Hugging Face cache"):
        llama_base("someone/elsewhere", tmp_path / "data")
    assert not (tmp_path / "data" / "gguf").exists() or not any((tmp_path / "data" / "gguf").iterdir())


@pytest.mark.slow
def test_a_space_serves_its_hub_base_with_llama_cpp(tmp_path, tiny_model_dir, offline_hub):
    """The Space's own base (a hub id), fetched from the Hugging Face cache with the Hub off: llama.cpp serves it
    and /health names the CPU kernels it runs on. Where llama-cpp-python is not installed, /health says so."""
    import httpx

    from rlhf.serving.llama_cpp.spec import llama_cpp_installed

    app = space_process(tmp_path, SPACES_BASE_MODEL, **offline_hub).start()
    try:
        health = httpx.get(app.api + "/health", timeout=30).json()
    finally:
        app.stop()
    assert health["model"] == SPACES_BASE_MODEL
    if llama_cpp_installed():
        assert health["engine"] == "llama_cpp", health["engine_status"]
        # llama.cpp as built, or its safe load on a CPU where the AMX repack faults: either proved in its own process
        assert re.match(r"llama\.cpp(, safe load \(.*?\))? \(proved in its own process: ", health["engine_status"])
        assert health["engine_build"] and health["engine_build"] in health["engine_status"]
        assert f"llama.cpp runs on {health['engine_build']}" in app.output()  # and the log says it too
    else:  # transformers serves, and says why llama.cpp does not
        assert health["engine"] == "transformers"
        assert "llama.cpp: llama-cpp-python is not installed" in health["engine_status"]
        assert "serving engine llama.cpp cannot serve here: llama-cpp-python is not installed" in app.output()
