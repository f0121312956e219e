"""Issue 13: the CLI beside a running server: it finds the server from the data dir (or --server),
says what failed in one line, and its exit status says whether everything worked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from app.core.locking import running_server
from tests.conftest import TOKEN, SampleStore, copy_sample
from tests.server import Server


def cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "MOERAG_LOG_LEVEL": "WARNING", "MOERAG_ADMIN_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "app.cli", "--data-dir", str(data_dir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parent.parent)


def one_line_error(run: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in run.stderr, run.stderr
    lines = [ln for ln in run.stderr.splitlines() if ln.strip() and "sending the work there" not in ln]
    assert len(lines) == 1, run.stderr
    return lines[0]


def test_cli_commands_against_a_live_server(tmp_path: Path, sample_store: SampleStore) -> None:
    data = copy_sample(sample_store, tmp_path / "data")
    server = Server(data, TOKEN, tmp_path / "server.log")
    try:
        server.start(300, "--sample").close()
        assert f"open {server.url}/admin" in server.log_path.read_text()  # start-up ends saying where to go

        # Found from the data dir: no --server, no lock error, no model loaded here.
        run = cli(data, "ask", "How do I read a CSV file?")
        assert run.returncode == 0, run.stderr
        assert "sending the work there" in run.stderr and server.url in run.stderr
        assert "[1]" in run.stdout and ("expert" in run.stdout or "fallback" in run.stdout)

        run = cli(data, "ask", "How do I read a CSV file?", "--json", "--server", server.url)
        assert run.returncode == 0, run.stderr
        body = json.loads(run.stdout)
        assert body["route"]["path"] in ("expert", "fallback") and body["citations"]

        run = cli(data, "search", "csv reader", "-k", "3", "--json")
        assert run.returncode == 0, run.stderr
        assert len(json.loads(run.stdout)["hits"]) == 3

        run = cli(data, "router", "train", "--quiet", "--no-activate")
        assert run.returncode == 0, run.stderr
        assert "train router" not in run.stderr  # --quiet: no progress bar
        assert json.loads(run.stdout.splitlines()[-1])["active"] is False

        # Failures: a status that says so and one line that says what.
        run = cli(data, "ask", "x", "--mode", "expert", "--expert", "9999")
        assert run.returncode == 1 and "expert_not_found" in one_line_error(run)

        run = cli(data, "search", "x", "--clusters", "foo")
        assert run.returncode == 2 and "comma-separated cluster ids" in run.stderr and "Traceback" not in run.stderr

        broken = tmp_path / "broken.pdf"
        broken.write_bytes(b"%PDF-1.4 this is not really a pdf")
        good = tmp_path / "good.md"
        good.write_text("# Good\n\nA perfectly fine note about writing CSV files with csv.writer.\n")
        run = cli(data, "ingest", str(broken), str(good), "--quiet")
        assert run.returncode == 1, run.stderr  # one of two files failed
        counts = json.loads(run.stdout)
        assert counts["failed"] == 1 and counts["created"] == 1

        # Issue 40 #6: recluster goes to the server like the others (it had no --server, while the
        # lock error told it to use one); a command without --server says to stop the server.
        run = cli(data, "recluster", "--quiet")
        assert run.returncode == 0, run.stderr
        assert isinstance(json.loads(run.stdout.splitlines()[-1]), dict)
        run = cli(data, "index", "rebuild")
        error = one_line_error(run)
        assert run.returncode == 1 and "stop it first" in error and "--server" not in error
    finally:
        server.stop()

    run = cli(data, "ask", "anything", "--server", "http://127.0.0.1:9")  # nothing listens there
    assert run.returncode == 1 and one_line_error(run).startswith("moerag: cannot reach http://127.0.0.1:9")
    assert running_server(data) is None  # a stopped server's address is not followed
