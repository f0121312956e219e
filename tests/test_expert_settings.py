"""Issue 11 #6: an expert's generator must resolve when it is written, not fail every /ask later."""

from fastapi.testclient import TestClient

from engine.generators import GENERATOR_NAME
from tests.conftest import AUTH


def test_unknown_generators_are_refused_at_write_time(client: TestClient) -> None:
    # A name outside the spec's pattern is a validation error, naming the field.
    r = client.post("/admin/api/experts", json={"name": "a", "generator": "no-such-generator"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    assert r.json()["error"]["details"][0]["loc"][-1] == "generator"
    spec = client.get("/openapi.json").json()["components"]["schemas"]["ExpertIn"]["properties"]["generator"]
    assert spec["pattern"] == GENERATOR_NAME
    # A well-formed openai:* name needs a configured server (MOERAG_OPENAI_BASE_URL is unset in
    # tests): the request is right, this server's state refuses it, so 409 and not 422.
    r = client.post("/admin/api/experts", json={"name": "a", "generator": "openai:x"}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_configured"
    assert "MOERAG_OPENAI_BASE_URL" in r.json()["error"]["message"]
    assert client.get("/admin/api/experts", headers=AUTH).json()["items"] == []  # nothing half-created
    ok = client.post("/admin/api/experts", json={"name": "a"}, headers=AUTH)
    assert ok.status_code == 201
    r = client.patch(f"/admin/api/experts/{ok.json()['id']}", json={"generator": "gpt-nowhere"}, headers=AUTH)
    assert r.status_code == 422
    assert client.get("/admin/api/experts", headers=AUTH).json()["items"][0]["generator"] == "extractive"
    # With a server configured the same name is accepted.
    client.app.state.runtime.settings.openai_base_url = "http://127.0.0.1:9/v1"  # type: ignore[attr-defined]
    r = client.patch(f"/admin/api/experts/{ok.json()['id']}", json={"generator": "openai:x"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["generator"] == "openai:x"
