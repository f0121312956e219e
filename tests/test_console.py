"""The admin console: auth on every admin route, CSRF, and an end-to-end run in a real browser."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import AUTH, TOKEN
from tests.helpers import TOPICS, topic_doc, wait_job

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "console"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def test_every_admin_route_needs_credentials(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()["paths"]
    routes = [(m.upper(), p) for p, ops in spec.items() if p.startswith("/admin/api") for m in ops]
    assert len(routes) >= 19
    for method, path in routes:
        url = re.sub(r"\{[^}]+\}", "1", path)
        r = client.request(method, url, json={})
        assert r.status_code == 401, (method, path, r.status_code)
    r = client.get("/admin", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/admin/login"


def test_session_cookie_needs_csrf_for_changes(client: TestClient) -> None:
    assert client.post("/admin/login", data={"token": "wrong"}).status_code == 401
    r = client.post("/admin/login", data={"token": TOKEN}, follow_redirects=False)
    assert r.status_code == 303
    cookie = r.cookies["moerag_session"]
    assert "httponly" in r.headers["set-cookie"].lower() and "samesite=strict" in r.headers["set-cookie"].lower()
    client.cookies.clear()  # every request below states its cookie explicitly

    def with_cookie(value: str, **headers: str) -> dict[str, str]:
        return {"Cookie": f"moerag_session={value}", **headers}

    page = client.get("/admin", headers=with_cookie(cookie))
    csrf = re.search(r'name="csrf" content="([0-9a-f]+)"', page.text).group(1)  # type: ignore[union-attr]
    assert TOKEN not in page.text  # the token itself never reaches the page
    assert client.get("/admin/api/experts", headers=with_cookie(cookie)).status_code == 200
    r = client.post("/admin/api/experts", json={"name": "a"}, headers=with_cookie(cookie))
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf"
    r = client.post("/admin/api/experts", json={"name": "a"}, headers=with_cookie(cookie, **{"X-CSRF-Token": "0" * 64}))
    assert r.status_code == 403
    r = client.post("/admin/api/experts", json={"name": "a"}, headers=with_cookie(cookie, **{"X-CSRF-Token": csrf}))
    assert r.status_code == 201
    forged = cookie.split(".")[0] + ".deadbeef"
    assert client.get("/admin/api/experts", headers=with_cookie(forged)).status_code == 401
    expired = "1000." + cookie.split(".")[1]
    assert client.get("/admin/api/experts", headers=with_cookie(expired)).status_code == 401


@pytest.mark.slow
def test_logout_revokes_the_session_everywhere(client: TestClient) -> None:
    """Issue 11 #8: the old cookie and its CSRF header still created experts after logout."""
    cookie = client.post("/admin/login", data={"token": TOKEN}, follow_redirects=False).cookies["moerag_session"]
    client.cookies.clear()
    headers = {"Cookie": f"moerag_session={cookie}"}
    page = client.get("/admin", headers=headers)
    csrf = re.search(r'name="csrf" content="([0-9a-f]+)"', page.text).group(1)  # type: ignore[union-attr]
    r = client.post("/admin/logout", data={"csrf": csrf}, headers=headers, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/admin/login"
    r = client.post("/admin/api/experts", json={"name": "a"}, headers={**headers, "X-CSRF-Token": csrf})
    assert r.status_code == 401
    assert client.get("/admin", headers=headers, follow_redirects=False).status_code == 303
    # A new sign-in works; the bearer token is unaffected.
    assert client.post("/admin/login", data={"token": TOKEN}, follow_redirects=False).status_code == 303
    assert client.get("/admin/api/experts", headers=AUTH).status_code == 200


def test_console_pages_forbid_framing_sniffing_and_foreign_scripts(client: TestClient) -> None:
    for path in ("/admin/login", "/admin/static/console.js"):
        r = client.get(path)
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert client.get("/healthz").headers["x-content-type-options"] == "nosniff"


def test_console_end_to_end_in_chromium(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is needed for the console test")
        pytest.skip("chromium not installed")
    from playwright.sync_api import expect, sync_playwright

    from tests.server import Server

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = Server(tmp_path / "data", TOKEN, tmp_path / "server.log", MOERAG_CLUSTERS="4", MOERAG_ROUTER_SAMPLES="300")
    try:
        api = server.start()
        files = [
            ("files", (f"{t}-{i}.md", topic_doc(t, i, 4).encode(), "text/markdown")) for i in range(6) for t in TOPICS
        ]
        assert wait_job(api, api.post("/documents/bulk", files=files).json()["id"], AUTH)["status"] == "done"  # type: ignore[arg-type]
        assert wait_job(api, api.post("/admin/api/recluster").json()["id"], AUTH)["status"] == "done"  # type: ignore[arg-type]
        git_clusters = [
            c["id"]
            for c in api.get("/admin/api/clusters").json()["items"]
            if any("git-" in s["source"] for s in api.get(f"/admin/api/clusters/{c['id']}").json()["samples"])
        ]
        assert git_clusters
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM,
                args=[
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--no-first-run",
                    "--disable-quic",
                ],
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{server.url}/admin")
            expect(page).to_have_url(re.compile(r"/admin/login$"))
            page.fill("#token", TOKEN)
            page.click("#signin")
            expect(page.locator("#ov-chunks")).not_to_have_text("0")
            page.screenshot(path=str(ARTIFACTS / "1-overview.png"), full_page=True)

            page.click("#tab-experts")
            page.fill("#ex-name", "git")
            page.click("#ex-create")
            expect(page.locator("#ex-rows input[value='git']")).to_have_count(1)
            page.screenshot(path=str(ARTIFACTS / "2-experts.png"), full_page=True)

            page.click("#tab-clusters")
            expect(page.locator(".cluster-dot")).to_have_count(4)
            for cid in git_clusters:
                page.check(f".cl-check[value='{cid}']")
            page.select_option("#cl-target", label="git")
            page.click("#cl-assign")
            expect(page.locator("#status")).to_have_text(f"{len(git_clusters)} clusters assigned")
            page.screenshot(path=str(ARTIFACTS / "3-clusters.png"), full_page=True)

            page.click("#tab-router")
            for n in (1, 2):  # two versions, so one can be rolled back to
                page.click("#rt-train")
                expect(page.locator("#status")).to_have_text(f"router version {n} trained", timeout=120_000)
            expect(page.locator("#rt-rows tr")).to_have_count(2)
            expect(page.locator("#rt-reliability svg")).to_have_count(1)
            expect(page.locator("#rt-coverage line.threshold")).to_have_count(1)
            page.fill("#try-q", "How does a git rebase replay commits onto another branch?")
            page.click("#try-go")
            expect(page.locator("#try-path")).to_have_class("path-expert")
            expect(page.locator("#try-path")).to_contain_text("git")
            page.screenshot(path=str(ARTIFACTS / "4-router.png"), full_page=True)
            page.click("#activate-1")  # roll back to the first version
            expect(page.locator("#rt-rows tr[data-id='1']")).to_contain_text("(active)")
            versions = api.get("/admin/api/router/versions").json()["items"]
            assert [v["id"] for v in versions if v["active"]] == [1]

            # Issue 13: the mapping moves on, the active router does not: a banner says so, retrain clears it.
            page.click("#tab-overview")
            expect(page.locator("#stale-banner")).to_be_hidden()
            moved = git_clusters[0]
            other = api.post("/admin/api/experts", json={"name": "git, moved"}).json()["id"]
            assert api.put(f"/admin/api/clusters/{moved}", json={"expert_id": other}).status_code == 200
            page.click("#tab-clusters")
            expect(page.locator("#stale-banner")).to_be_visible()
            expect(page.locator("#stale-text")).to_contain_text(f"(clusters: {moved})")
            page.screenshot(path=str(ARTIFACTS / "4b-stale-router.png"), full_page=True)
            page.click("#stale-retrain")
            expect(page.locator("#status")).to_have_text("router version 3 trained", timeout=120_000)
            expect(page.locator("#stale-banner")).to_be_hidden()

            api.post("/ask", json={"question": "What does SQLite's write-ahead log do?"})
            page.click("#tab-questions")
            expect(page.locator("#q-rows tr")).to_have_count(1)
            page.screenshot(path=str(ARTIFACTS / "5-questions.png"), full_page=True)
            page.click("#tab-documents")
            expect(page.locator("#doc-rows tr")).to_have_count(24)
            upload = tmp_path / "new-note.md"
            upload.write_text("# A new note\n\nUploaded from the console, ingested by a bulk job.\n")
            page.set_input_files("#doc-files", str(upload))
            page.click("#doc-go")
            expect(page.locator("#status")).to_have_text("ingested: 1 new, 0 already there, 0 failed", timeout=60_000)
            expect(page.locator("#doc-rows tr")).to_have_count(25)
            page.screenshot(path=str(ARTIFACTS / "6-documents.png"), full_page=True)
            page.click("#tab-overview")
            expect(page.locator("#ov-share svg")).to_have_count(1)
            page.screenshot(path=str(ARTIFACTS / "7-overview-after.png"), full_page=True)
            browser.close()
    finally:
        server.stop()
