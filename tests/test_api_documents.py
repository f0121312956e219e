from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.core.settings import Settings
from app.runtime import Runtime
from engine.embedder import Embedder
from tests.conftest import AUTH, TOKEN
from tests.helpers import topic_doc, wait_job
from tests.test_parsing import make_pdf


def stats(client: TestClient) -> dict[str, int]:
    return client.get("/stats").json()


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200
    body = r.json()
    assert body["model"]["dim"] == 384 and body["database"] == "sqlite" and body["index"]["clusters"] == 1
    assert body["kernels"] == "torch" and body["scoped_kernel"] == "torch twin"  # no GPU here: the twins serve


def test_writes_need_the_admin_token(client: TestClient) -> None:
    for method, path in [
        ("post", "/documents"),
        ("put", "/documents/1"),
        ("delete", "/documents/1"),
        ("post", "/documents/bulk"),
        ("post", "/admin/api/recluster"),
        ("get", "/admin/api/clusters"),
    ]:
        r = client.request(method.upper(), path, json={"text": "x"})
        assert r.status_code == 401, (method, path)
        assert r.json()["error"]["code"] == "unauthorized"
        r = client.request(method.upper(), path, json={"text": "x"}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
    assert stats(client)["documents"] == 0


def test_upload_every_format_dedup_and_read_back(client: TestClient) -> None:
    files = {
        "a.txt": (b"Plain text about sqlite journals.\n\nSecond paragraph about WAL.", "text/plain"),
        "b.md": (topic_doc("git", 1).encode(), "text/markdown"),
        "c.html": (
            b"<html><head><title>Deb</title></head><body><h1>Apt</h1><p>apt installs packages.</p></body></html>",
            "text/html",
        ),
        "d.pdf": (make_pdf(["Python lists are mutable.", "Tuples are not."]), "application/pdf"),
    }
    ids = {}
    for name, (data, ctype) in files.items():
        r = client.post("/documents", files={"file": (name, data, ctype)}, headers=AUTH)
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["status"] == "created" and body["chunks"] >= 1 and body["source"] == name
        ids[name] = body["id"]
    # The same bytes again: same document and its chunks, nothing new stored.
    before = stats(client)
    r = client.post("/documents", files={"file": ("renamed.md", files["b.md"][0], "text/markdown")}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {
        "id": ids["b.md"],
        "source": "b.md",
        "chunks": len(client.get(f"/documents/{ids['b.md']}").json()["chunk_list"]),
        "status": "duplicate",
    }
    assert r.json()["chunks"] >= 1
    assert stats(client) == before
    # JSON text with metadata and an explicit source.
    r = client.post(
        "/documents",
        json={"text": "Some note.", "title": "Note", "source": "notes/1", "metadata": {"k": 1}},
        headers=AUTH,
    )
    assert r.status_code == 201
    doc = client.get(f"/documents/{r.json()['id']}").json()
    assert doc["title"] == "Note" and doc["metadata"] == {"k": 1} and doc["mime"] == "text/plain"
    # Listing is paginated and counts chunks.
    page = client.get("/documents", params={"offset": 1, "limit": 2}).json()
    assert page["total"] == 5 and len(page["items"]) == 2 and page["offset"] == 1
    pdf = client.get(f"/documents/{ids['d.pdf']}").json()
    assert pdf["mime"] == "application/pdf" and pdf["chunks"] == len(pdf["chunk_list"]) >= 1
    chunk = client.get(f"/chunks/{pdf['chunk_list'][0]['id']}").json()
    assert "mutable" in chunk["text"] and chunk["document_id"] == ids["d.pdf"] and chunk["source"] == "d.pdf"
    s = stats(client)
    assert s["chunks"] == s["index_vectors"]


def test_bad_input_gets_clear_errors_and_writes_nothing(client: TestClient) -> None:
    client.post("/documents", json={"text": "seed document"}, headers=AUTH)
    before = stats(client)
    cases = [
        (
            {"files": {"file": ("x.key", b"PK\x03\x04 binary", "application/octet-stream")}},
            415,
            "unsupported_type",
        ),
        ({"files": {"file": ("empty.txt", b"", "text/plain")}}, 422, "empty_document"),
        (
            {"files": {"file": ("bin.txt", b"\x00\xff\x00\xfe" * 100 + b"\xc3", "text/plain")}},
            422,
            "undecodable_document",
        ),
        (
            {"files": {"file": ("bad.pdf", b"%PDF-1.4\n garbage garbage", "application/pdf")}},
            422,
            "corrupt_document",
        ),
        ({"files": {"nofile": ("a.txt", b"hello", "text/plain")}}, 422, "missing_file"),
        ({"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 400, "malformed_json"),
        ({"json": {"text": ""}}, 422, "invalid_request"),
        ({"json": {"text": "x", "unknown": 1}}, 422, "invalid_request"),
        ({"content": b"abc", "headers": {"Content-Type": "application/xml"}}, 415, "unsupported_media_type"),
    ]
    for kwargs, status, code in cases:
        headers = {**AUTH, **kwargs.pop("headers", {})}
        r = client.post("/documents", headers=headers, **kwargs)
        assert r.status_code == status, (code, r.text)
        assert r.json()["error"]["code"] == code
        assert r.json()["error"]["message"]
    for path in ("/documents/999", "/chunks/999", "/jobs/999"):
        r = client.get(path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert client.delete("/documents/999", headers=AUTH).status_code == 404
    assert client.put("/documents/999", json={"text": "x"}, headers=AUTH).status_code == 404
    assert client.get("/documents", params={"limit": 0}).status_code == 422
    assert stats(client) == before


def test_upload_over_the_limit_is_refused(client: TestClient) -> None:
    client.app.state.runtime.settings.max_upload_bytes = 1000  # type: ignore[attr-defined]
    big = b"word " * 400
    r = client.post("/documents", files={"file": ("big.txt", big, "text/plain")}, headers=AUTH)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    r = client.post("/documents", json={"text": "word " * 400}, headers=AUTH)
    assert r.status_code == 413
    assert stats(client)["documents"] == 0


def test_update_keeps_id_and_replaces_chunks(client: TestClient) -> None:
    r = client.post("/documents", json={"text": topic_doc("sqlite", 1), "format": "md"}, headers=AUTH)
    doc_id = r.json()["id"]
    old_chunks = [c["id"] for c in client.get(f"/documents/{doc_id}").json()["chunk_list"]]
    r = client.put(f"/documents/{doc_id}", json={"text": topic_doc("git", 2), "format": "md"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "updated" and r.json()["id"] == doc_id
    new_chunks = [c["id"] for c in client.get(f"/documents/{doc_id}").json()["chunk_list"]]
    assert not set(old_chunks) & set(new_chunks)
    hits = client.post("/search", json={"query": "write-ahead log checkpoint", "k": 10}).json()["hits"]
    assert all(h["chunk_id"] in new_chunks for h in hits)
    again = client.put(f"/documents/{doc_id}", json={"text": topic_doc("git", 2), "format": "md"}, headers=AUTH)
    assert again.json()["status"] == "unchanged"
    other = client.post("/documents", json={"text": "another"}, headers=AUTH).json()["id"]
    r = client.put(f"/documents/{other}", json={"text": topic_doc("git", 2), "format": "md"}, headers=AUTH)
    assert r.status_code == 409
    s = stats(client)
    assert s["chunks"] == s["index_vectors"]


def test_delete_removes_chunks_from_every_search(client: TestClient) -> None:
    ids = [
        client.post("/documents", json={"text": topic_doc(t, i), "format": "md"}, headers=AUTH).json()["id"]
        for i, t in enumerate(["sqlite", "git", "debian", "python"])
    ]
    hits = client.post("/search", json={"query": "git branch merge rebase", "k": 3}).json()["hits"]
    assert hits[0]["document_id"] == ids[1]
    r = client.delete(f"/documents/{ids[1]}", headers=AUTH)
    assert r.status_code == 200 and r.json()["chunks"] >= 1
    for body in ({"query": "git branch merge rebase", "k": 50}, {"query": "git", "k": 50, "clusters": [0]}):
        hits = client.post("/search", json=body).json()["hits"]
        assert hits and all(h["document_id"] != ids[1] for h in hits)
    s = stats(client)
    assert s["documents"] == 3 and s["chunks"] == s["index_vectors"]


def test_bulk_job_reports_progress_and_recluster_maps_clusters(client: TestClient) -> None:
    topics = ["sqlite", "git", "debian", "python"]
    files = [
        ("files", (f"{t}-{i}.md", topic_doc(t, i, paragraphs=4).encode(), "text/markdown"))
        for i in range(12)
        for t in topics
    ]
    files.append(("files", ("broken.pdf", b"%PDF-1.4 nope", "application/pdf")))
    r = client.post("/documents/bulk", files=files, headers=AUTH)
    assert r.status_code == 202
    job = wait_job(client, r.json()["id"])
    assert job["status"] == "done" and job["done"] == job["total"] == 49
    assert job["result"]["created"] == 48 and job["result"]["failed"] == 1
    assert job["result"]["failures"][0]["source"] == "broken.pdf"
    # Again: nothing new.
    job2 = wait_job(client, client.post("/documents/bulk", files=files[:10], headers=AUTH).json()["id"])
    assert job2["result"]["duplicate"] == 10 and job2["result"]["created"] == 0
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    assert not any(rt.settings.spool_dir.iterdir())  # spool cleaned once ingested

    rt.settings.clusters = 4  # the corpus is small; force a few lists
    job = wait_job(client, client.post("/admin/api/recluster", headers=AUTH).json()["id"])
    assert job["status"] == "done", job
    clusters = client.get("/admin/api/clusters", headers=AUTH).json()["items"]
    assert len(clusters) == 4 and sum(c["size"] for c in clusters) == stats(client)["chunks"]
    assert all(c["keywords"] for c in clusters if c["size"])
    # A scoped search only returns chunks of the chosen cluster.
    target = max(clusters, key=lambda c: c["size"])["id"]
    res = client.post("/search", json={"query": "packages", "k": 20, "clusters": [target]}).json()
    assert res["hits"] and {h["cluster_id"] for h in res["hits"]} == {target}
    assert res["vectors_scanned"] < stats(client)["chunks"]
    everything = client.post("/search", json={"query": "packages", "k": 20, "clusters": [c["id"] for c in clusters]})
    glob = client.post("/search", json={"query": "packages", "k": 20})
    assert [h["chunk_id"] for h in everything.json()["hits"]] == [h["chunk_id"] for h in glob.json()["hits"]]
    assert np.isclose(glob.json()["hits"][0]["score"], everything.json()["hits"][0]["score"])


def test_a_deleted_documents_id_is_never_handed_out_again(db_url: str, tmp_path: Path, embedder: Embedder) -> None:
    """Deleting the newest document used to give its id to the next upload on SQLite: a retried
    DELETE then removed somebody else's document. On both databases: a new id, the old one 404."""
    settings = Settings(data_dir=tmp_path / "ids", database_url=db_url, admin_token=TOKEN)  # type: ignore[arg-type]
    with TestClient(create_app(settings, runtime=Runtime(settings, embedder=embedder), start_in_background=False)) as c:
        first = c.post("/documents", json={"text": topic_doc("git", 0)}, headers=AUTH).json()["id"]
        assert c.delete(f"/documents/{first}", headers=AUTH).status_code == 200
        second = c.post("/documents", json={"text": topic_doc("sqlite", 0)}, headers=AUTH).json()["id"]
        assert second > first
        assert c.get(f"/documents/{first}", headers=AUTH).status_code == 404
        assert c.delete(f"/documents/{first}", headers=AUTH).status_code == 404  # the retried DELETE
        assert c.get(f"/documents/{second}", headers=AUTH).status_code == 200
