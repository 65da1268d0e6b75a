"""Server errors the REST fuzzer found (issue 28), each pinned: a clear 4xx or a correct 200, never a 500."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient


@pytest.fixture
def client(services):
    from ui.webapp import create_app

    with TestClient(create_app(services, ui=False)) as c:
        yield c


@pytest.mark.parametrize("base_model", ["\u0301" * 300, "m" * 4096, "org/" + "\u0301" * 200])
def test_an_over_long_or_odd_base_model_is_a_clear_422(services, client, base_model):
    """A few hundred bytes of combining characters as ``base_model``: resolve_model took it for a path and
    ``OSError: File name too long`` became a 500."""
    r = client.post("/api/v1/agents", json={"name": "odd", "system_prompt": "s", "base_model": base_model})
    assert r.status_code == 422 and "cannot find base model" in r.json()["error"]
    assert [a.name for a in services.store.list_agents()] == ["assistant"]


@pytest.mark.parametrize("name", ["\x1d\xa0\xcd", "  carol ", "\tdave\n"])
def test_a_token_for_a_name_with_surrounding_whitespace_names_the_stored_user(services, client, name):
    """The Store keeps annotator names stripped; POST /tokens looked the new token up by the unstripped name,
    found none, and answered 500 after storing the token."""
    r = client.post("/api/v1/tokens", json={"name": name, "label": "ci"})
    assert r.status_code == 200, r.text
    stored = name.strip()
    assert r.json()["name"] == stored and r.json()["expires"] is None
    assert [t["user"] for t in services.store.list_api_tokens()] == [stored]
    assert services.store.token_owner(r.json()["token"]) == stored
