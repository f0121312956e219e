"""Console page load with 500 clusters and 50 experts, measured in headless Chromium.

    python benchmarks/console_load.py

Builds a synthetic store (500 clusters with random centroids, 50 experts owning 10 clusters
each, 5,000 chunks), starts a real server on 127.0.0.1 and times, in the browser, sign-in to
the overview and each tab until its content is drawn. Medians of 5 loads.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOKEN = "bench-token"


def build_store(data_dir: Path, clusters: int = 500, experts: int = 50, chunks: int = 5000) -> None:
    from app.core.models import Chunk, Cluster, Document, Expert, IndexState
    from app.core.settings import Settings
    from app.runtime import Runtime

    rt = Runtime(Settings(data_dir=data_dir, admin_token=TOKEN))  # type: ignore[arg-type]
    rt.start()
    rng = np.random.default_rng(0)
    dim = rt.embedder.dim
    c = rng.standard_normal((clusters, dim)).astype(np.float32)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    with rt.sessions.begin() as s:
        s.query(Cluster).delete()
        s.add_all(Expert(name=f"expert {i}", description=f"synthetic {i}") for i in range(experts))
        s.flush()
        s.add_all(
            Cluster(id=i, centroid=c[i], keywords=[f"kw{i}", f"topic{i % 37}", "word"],
                    expert_id=1 + i // (clusters // experts))
            for i in range(clusters)
        )  # fmt: skip
        doc = Document(source="synthetic", title="synthetic", mime="text/plain", content_hash="0" * 64, size=1)
        s.add(doc)
        s.flush()
        x = c[rng.integers(0, clusters, chunks)] + 0.05 * rng.standard_normal((chunks, dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        s.add_all(
            Chunk(document_id=doc.id, ordinal=i, text=f"chunk {i}", heading="", char_start=0, char_end=1,
                  token_count=3, cluster_id=int(np.argmax(c @ x[i])), embedding=x[i])
            for i in range(chunks)
        )  # fmt: skip
        state = s.get(IndexState, 1)
        assert state is not None
        state.nlist, state.version = clusters, "synthetic"
    rt.close()


def main() -> None:
    from playwright.sync_api import sync_playwright

    from tests.server import Server

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        build_store(data)
        server = Server(data, TOKEN, Path(tmp) / "server.log")
        try:
            server.start()
            timings: dict[str, list[float]] = {}
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path="/usr/bin/chromium",
                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
                )
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{server.url}/admin/login")
                page.fill("#token", TOKEN)
                t = time.perf_counter()
                page.click("#signin")
                page.wait_for_selector("#ov-chunks")
                timings["sign-in to overview"] = [(time.perf_counter() - t) * 1000]
                checks = {
                    "clusters": "#cl-rows tr:nth-child(50)",
                    "experts": "#ex-rows tr:nth-child(50)",
                    "router": "#rt-rows tr",
                    "overview": "#ov-chunks",
                }
                for _ in range(5):
                    for tab, selector in checks.items():
                        page.click("#tab-questions")
                        page.wait_for_timeout(50)
                        t = time.perf_counter()
                        page.click(f"#tab-{tab}")
                        page.wait_for_selector(f"section#{tab} {selector}" if tab != "overview" else selector)
                        if tab == "clusters":
                            page.wait_for_function("document.querySelectorAll('.cluster-dot').length === 500")
                        timings.setdefault(tab, []).append((time.perf_counter() - t) * 1000)
                rows = page.locator("#cl-rows tr").count()
                browser.close()
        finally:
            server.stop()
    result = {k: round(statistics.median(v), 1) for k, v in timings.items()}
    result["cluster rows rendered per page"] = rows
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
