"""Folder sync: between two runs, exactly the edited, added and deleted files change their
documents (unchanged ones keep their ids and cost no embedding), a failing file is reported
without stopping the run; the admin API runs it as a job inside MOERAG_SYNC_ROOTS only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.cli.common import local_runtime
from app.cli.main import main
from app.cli.sync import every_seconds
from app.core.settings import Settings
from app.runtime import Runtime
from app.services.sync import sync_folder
from tests.conftest import AUTH
from tests.helpers import topic_doc, wait_job


def _folder(root: Path) -> Path:
    (root / "notes").mkdir(parents=True)
    (root / "a.md").write_text(topic_doc("git", 1))
    (root / "notes" / "b.txt").write_text(topic_doc("sqlite", 2))
    (root / "c.md").write_text(topic_doc("debian", 3))
    (root / "ignored.bin").write_bytes(b"\x00\x01")
    return root


def _ids(rt: Runtime, root: Path) -> dict[str, int]:
    from sqlalchemy import select

    from app.core.models import Document

    with rt.sessions() as s:
        return {
            Path(src).name: i for src, i in s.execute(select(Document.source, Document.id)) if src.startswith(str(root))
        }


def test_a_sync_changes_exactly_what_changed_in_the_folder(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _folder(tmp_path / "docs")
    seen: list[tuple[int, int]] = []
    first = sync_folder(runtime.ingestor, runtime.sessions, root, lambda d, t: seen.append((d, t)))
    assert (first["added"], first["failed"], first["deleted"]) == (3, 0, 0) and seen[-1] == (3, 3)
    before = _ids(runtime, root.resolve())

    def no_embedding(*_: object) -> None:
        raise AssertionError("an unchanged file was embedded")

    with monkeypatch.context() as m:
        m.setattr(runtime.ingestor, "_embed", no_embedding)
        again = sync_folder(runtime.ingestor, runtime.sessions, root)
    assert (again["unchanged"], again["added"], again["updated"], again["deleted"]) == (3, 0, 0, 0)

    (root / "a.md").write_text(topic_doc("git", 9))  # edited
    (root / "c.md").unlink()  # deleted
    (root / "d.md").write_text(topic_doc("python", 4))  # added
    (root / "broken.pdf").write_bytes(b"%PDF-1.4 not really a pdf")  # fails, the run goes on
    third = sync_folder(runtime.ingestor, runtime.sessions, root)
    counts = {k: third[k] for k in ("added", "updated", "deleted", "unchanged", "failed")}
    assert counts == {"added": 1, "updated": 1, "deleted": 1, "unchanged": 1, "failed": 1}, third
    assert third["failures"][0]["source"].endswith("broken.pdf") and third["failures"][0]["error"]
    after = _ids(runtime, root.resolve())
    assert after["a.md"] == before["a.md"] and after["b.txt"] == before["b.txt"]  # the same documents
    assert "c.md" not in after and after["d.md"] > max(before.values())


def test_the_api_syncs_only_inside_the_configured_roots(client: TestClient, settings: Settings, tmp_path: Path) -> None:
    root = _folder(tmp_path / "shared" / "docs")
    refused = client.post("/admin/api/sync", json={"folder": str(root)}, headers=AUTH)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_configured"
    settings.sync_roots = str(tmp_path / "shared")
    outside = client.post("/admin/api/sync", json={"folder": str(tmp_path)}, headers=AUTH)
    assert outside.status_code == 422 and "outside MOERAG_SYNC_ROOTS" in outside.json()["error"]["message"]
    assert client.post("/admin/api/sync", json={"folder": "docs"}, headers=AUTH).status_code == 422
    assert client.post("/admin/api/sync", json={"folder": str(root)}).status_code == 401
    job = wait_job(client, client.post("/admin/api/sync", json={"folder": str(root)}, headers=AUTH).json()["id"])
    assert job["status"] == "done" and job["result"]["added"] == 3 and job["result"]["folder"] == str(root.resolve())


def test_the_cli_syncs_here_and_reads_periods(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _folder(tmp_path / "docs")
    main(["--data-dir", str(tmp_path / "data"), "sync", str(root), "--quiet"])
    assert json.loads(capsys.readouterr().out)["added"] == 3
    (root / "a.md").unlink()
    main(["--data-dir", str(tmp_path / "data"), "sync", str(root), "--quiet"])
    assert json.loads(capsys.readouterr().out)["deleted"] == 1
    with local_runtime(Settings(data_dir=tmp_path / "data")) as rt:  # each local run is listed with the jobs
        _, recorded = rt.jobs.recent(0, 10)
    assert [(j.kind, j.status, j.result["added"], j.result["deleted"]) for j in recorded] == [
        ("sync", "done", 0, 1),
        ("sync", "done", 3, 0),
    ]
    assert [every_seconds(p) for p in ("30s", "10m", "2h", "1d", "45")] == [30, 600, 7200, 86400, 45]
    for bad in ("0s", "ten", "5w"):
        with pytest.raises(Exception, match="not a period"):
            every_seconds(bad)
