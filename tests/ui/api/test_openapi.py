"""The OpenAPI document describes every REST route (issue 28): a response body for success, the one error shape
for every refusal, and the status codes each route can answer. The fuzz test checks live responses against it."""
from __future__ import annotations

from ui.api.errors import COMMON, PREFIX, WRITE


def test_every_route_documents_its_body_and_its_refusals(services):
    from ui.webapp import create_app

    doc = create_app(services, ui=False).openapi()
    error_ref = "#/components/schemas/ErrorBody"
    operations = [(method, path, op) for path, item in doc["paths"].items() for method, op in item.items()]
    assert len(operations) >= 36 and all(path.startswith(PREFIX) for _, path, _ in operations)
    for method, path, op in operations:
        where = f"{method.upper()} {path}"
        codes = {int(c) for c in op["responses"]}
        assert set(COMMON) <= codes, where
        assert "requestBody" not in op or set(WRITE) <= codes, f"{where}: a body may be too large (413)"
        success = op["responses"]["200"]["content"]
        assert all(media.get("schema") for media in success.values()), f"{where}: undocumented success body"
        for code in codes - {200, 204}:
            body = op["responses"][str(code)]["content"]["application/json"]["schema"]
            assert body == {"$ref": error_ref}, f"{where} {code}"
    assert doc["components"]["schemas"]["ErrorBody"]["required"] == ["error"]


def test_statuses_a_route_answers_beyond_the_common_ones_are_documented(services):
    from ui.webapp import create_app

    doc = create_app(services, ui=False).openapi()["paths"]
    assert "204" in doc[f"{PREFIX}/queue/next"]["get"]["responses"]  # nothing left to vote on
    assert "409" in doc[f"{PREFIX}/arena"]["post"]["responses"]  # fewer than two servable versions
    assert "404" in doc[f"{PREFIX}/messages/{{message_id}}"]["get"]["responses"]
    assert "application/x-ndjson" in doc[f"{PREFIX}/chat/stream"]["post"]["responses"]["200"]["content"]
