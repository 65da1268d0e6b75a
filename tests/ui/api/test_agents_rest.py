"""POST /agents refuses a base model it cannot find with 422 {"error"}, whatever the name (issue 28)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize("base_model", ["\u0301" * 300, "m" * 4096, "org/" + "\u0301" * 200])
def test_an_over_long_or_odd_base_model_is_a_clear_422(services, base_model):
    from ui.server import create_app

    with TestClient(create_app(services, ui=False)) as client:
        r = client.post("/api/v1/agents", json={"name": "odd", "system_prompt": "s", "base_model": base_model})
    assert r.status_code == 422 and "cannot find base model" in r.json()["error"]
    assert [a.name for a in services.store.list_agents()] == ["assistant"]
