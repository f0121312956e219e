"""The server's life is not Ray's (app.shards.link): a server over expert shards on a Ray cluster
it did not start outlives that cluster. With the cluster gone it stays up, answers `partial` at
once and `/readyz` says `degraded`; when the cluster is started and the map deployed again, its
answers are whole again within 10 s. The test process never joins Ray: the cluster and `moerag
ray up` run as processes of their own, as an operator runs them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.core.settings import Settings
from app.runtime import Runtime
from engine.embedder import Embedder
from tests.conftest import AUTH, ROUTED_SETTINGS, RoutedStore

pytest.importorskip("ray")
pytestmark = pytest.mark.slow
RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """A Ray cluster of its own (its own port and temporary folder), started and ended by process."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.temp = tempfile.mkdtemp(prefix="rl-", dir="/tmp")  # short: Ray's socket paths have a bound
        self.address = f"127.0.0.1:{self.port}"

    def start(self) -> None:
        subprocess.run(
            [
                RAY,
                "start",
                "--head",
                f"--port={self.port}",
                "--node-ip-address=127.0.0.1",
                f"--temp-dir={self.temp}",
                "--num-cpus=2",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            env=os.environ | {"RAY_USAGE_STATS_ENABLED": "0"},
        )

    def stop(self) -> None:
        """Every process of this cluster (and of no other), as `ray stop` ends a machine's: those
        naming its folder (its GCS server, raylet and agents), and their children (its workers,
        whose command lines Ray rewrites)."""
        parents: dict[int, int] = {}
        mine = set()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if self.temp in cmdline:
                mine.add(int(proc.name))
        grew = True
        while grew:  # their descendants too
            more = {pid for pid, ppid in parents.items() if ppid in mine} - mine
            mine |= more
            grew = bool(more)
        mine.discard(os.getpid())
        for pid in mine:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    # The cluster `ray start` starts takes Ray's token (~/.ray/auth_token); a process joining it by
    # its address says it has one (Ray enables the token on its own only for the address "auto").
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    c = Cluster()
    c.start()
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(c.temp, ignore_errors=True)


def _ray_up(data: Path, map_file: Path, address: str) -> None:
    """`moerag ray up` as an operator runs it: a process of its own."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "--data-dir",
            str(data),
            "ray",
            "up",
            "--config",
            str(map_file),
            "--address",
            address,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=300,
    )


def test_a_server_outlives_the_ray_cluster_and_answers_whole_again_when_it_is_back(
    settings: Settings, embedder: Embedder, routed_store: RoutedStore, cluster: Cluster, tmp_path: Path
) -> None:
    shutil.copytree(routed_store.data, settings.resolved_data_dir)
    for name, value in ROUTED_SETTINGS.items():
        setattr(settings, name, value)
    map_file = tmp_path / "map.yaml"
    raw: dict[str, Any] = {
        "shards": [
            {"name": "git", "experts": ["git"]},
            {"name": "rest", "experts": ["sqlite", "debian"], "default": True},
        ]
    }
    map_file.write_text(json.dumps(raw))
    _ray_up(settings.resolved_data_dir, map_file, cluster.address)
    settings.shard_map, settings.ray_address = map_file, cluster.address
    settings.answer_cache = 0  # every answer searched anew (a cached one would hide the shards' state)
    rt = Runtime(settings, embedder=embedder)
    body = {"query": "How do I rebase a branch onto another in git?", "mode": "fallback"}
    with TestClient(create_app(settings, runtime=rt, start_in_background=False)) as client:
        deadline = time.monotonic() + 60  # on a busy machine a first call can take its time
        while (whole := client.post("/ask", json=body).json())["route"]["partial"]:
            assert time.monotonic() < deadline, whole["route"]
            time.sleep(0.5)
        assert whole["citations"]
        assert client.get("/readyz").json()["status"] == "ready"
        child = rt.shard_link._child.pid  # type: ignore[union-attr]

        cluster.stop()  # `moerag ray down`: the cluster is gone
        deadline = time.monotonic() + 30
        while client.get("/readyz").json()["status"] != "degraded":
            assert time.monotonic() < deadline, "readyz never said degraded"
            time.sleep(0.2)
        t = time.monotonic()
        r = client.post("/ask", json=body)
        assert r.status_code == 200 and r.json()["route"]["partial"], r.text
        assert set(r.json()["route"]["missing_shards"]) == {"git", "rest"}
        assert time.monotonic() - t < settings.shard_timeout_seconds + 1  # one deadline at most, never Ray's minute
        time.sleep(5)  # longer than the link needs to see the cluster gone: the server is still here
        assert client.get("/readyz").json()["status"] == "degraded"
        ready = client.get("/readyz", headers=AUTH).json()
        assert all(row["ray"].startswith("unreachable") for row in ready["shards"]), ready

        cluster.start()  # `moerag ray up` again
        _ray_up(settings.resolved_data_dir, map_file, cluster.address)
        back = time.monotonic()
        while True:
            r = client.post("/ask", json=body)
            assert r.status_code == 200
            if not r.json()["route"]["partial"]:
                break
            assert time.monotonic() - back < 10, "answers not whole within 10 s of `ray up`"
            time.sleep(0.2)
        took = time.monotonic() - back
        assert [c["chunk_id"] for c in r.json()["citations"]] == [c["chunk_id"] for c in whole["citations"]]
        assert rt.shard_link._child.pid != child  # type: ignore[union-attr]  # a new child joined the new cluster
        assert client.get("/readyz").json()["status"] == "ready"
        print(f"answers whole {took:.1f} s after `ray up` returned")
