"""/docs and /redoc work with no network: their scripts and styles are served by moerag itself."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import TOKEN

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ASSET = re.compile(r"""(?:src|href)=["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_doc_pages_reference_only_assets_moerag_serves(client: TestClient, page: str) -> None:
    html = client.get(page)
    assert html.status_code == 200
    urls = ASSET.findall(html.text)
    assert urls, html.text[:500]
    for url in urls:
        assert url.startswith("/"), f"{page} loads {url} from elsewhere"
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 100, url
    assert "fonts.googleapis" not in html.text


@pytest.mark.slow  # Chromium
def test_doc_pages_render_in_chromium_with_the_network_cut(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is needed for the docs test")
        pytest.skip("chromium not installed")
    from playwright.sync_api import expect, sync_playwright

    from tests.server import Server

    server = Server(tmp_path / "data", TOKEN, tmp_path / "server.log")
    refused: list[str] = []

    def only_local(route):  # type: ignore[no-untyped-def]
        if route.request.url.startswith(server.url):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    try:
        server.start().close()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            page.route("**/*", only_local)
            page.goto(f"{server.url}/docs")
            expect(page.locator(".swagger-ui .opblock-summary-path").first).to_be_visible(timeout=20_000)
            expect(page.locator(".swagger-ui .opblock-summary-path", has_text="/ask")).to_have_count(1)
            page.goto(f"{server.url}/redoc")
            expect(page.locator("h1", has_text="moerag").first).to_be_visible(timeout=20_000)
            browser.close()
    finally:
        server.stop()
    assert refused == [], refused
