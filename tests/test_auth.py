import stat
from pathlib import Path

from app.core.auth import csrf_token, load_or_create_token, new_session, session_valid, token_matches


def test_token_generated_once_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "d" / "admin_token"
    first = load_or_create_token(None, path)
    assert len(first) >= 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_token(None, path) == first  # the same token on every later start
    assert load_or_create_token("configured", path) == "configured"


def test_bearer_and_session_checks() -> None:
    assert token_matches("t0k", "Bearer t0k") and token_matches("t0k", "bearer t0k")
    assert not token_matches("t0k", "Bearer nope") and not token_matches("t0k", None)
    assert not token_matches("t0k", "Basic t0k")
    cookie = new_session("t0k", now=1000.0)
    assert session_valid("t0k", cookie, now=1001.0)
    assert not session_valid("other", cookie, now=1001.0)  # a new token signs everyone out
    assert not session_valid("t0k", cookie, now=10**9)  # expired
    assert csrf_token("t0k", cookie) != csrf_token("t0k", new_session("t0k", now=2000.0))


def test_a_read_token_closes_every_read(client) -> None:  # type: ignore[no-untyped-def]
    """Issue 11 #5: reads were open by design with no way to close them."""
    from pydantic import SecretStr

    from tests.conftest import AUTH

    gets = ["/documents", "/documents/1", "/chunks/1", "/jobs", "/jobs/1", "/stats", "/metrics"]
    reads = [("GET", p) for p in gets] + [("POST", "/search"), ("POST", "/ask")]
    bodies = {"/search": {"query": "x"}, "/ask": {"question": "x", "generate": False}}
    for method, path in reads:  # open by default
        assert client.request(method, path, json=bodies.get(path)).status_code != 401, path
    client.app.state.runtime.settings.read_token = SecretStr("reader")
    for method, path in reads:
        r = client.request(method, path, json=bodies.get(path))
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", path
        for token in ("reader", AUTH["Authorization"].split()[1]):  # the read token, or the admin token
            r = client.request(method, path, json=bodies.get(path), headers={"Authorization": f"Bearer {token}"})
            assert r.status_code != 401, (path, token)
    assert client.get("/healthz").status_code == 200  # probes stay open
    r = client.post("/documents", json={"text": "x"}, headers={"Authorization": "Bearer reader"})
    assert r.status_code == 401  # the read token never writes


def test_readyz_tells_readiness_to_all_and_details_to_readers(client) -> None:  # type: ignore[no-untyped-def]
    """Issue 52 #6: with a read token set, /readyz named the titles and sources of recent documents
    (the router's drift summary) to anyone. Readiness stays open; the details are a read."""
    from pydantic import SecretStr

    from tests.conftest import AUTH

    title = "Quarterly salaries of the finance team"
    assert client.post("/documents", json={"text": f"# {title}\n\nNumbers. " * 30}, headers=AUTH).status_code == 201
    open_body = client.get("/readyz").json()
    assert open_body["status"] == "ready" and "router" in open_body  # reads are open: details for all
    client.app.state.runtime.settings.read_token = SecretStr("reader")
    anonymous = client.get("/readyz")
    assert anonymous.status_code == 200 and set(anonymous.json()) == {"status", "pid"}, anonymous.text
    assert "finance" not in anonymous.text
    reader = client.get("/readyz", headers={"Authorization": "Bearer reader"}).json()
    assert {"router", "index", "serving"} <= set(reader)
