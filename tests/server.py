"""A real `moerag serve` process on 127.0.0.1 for tests that need one (or need to kill one)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a dead child not yet reaped by its new parent)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def descendants(pid: int) -> list[int]:
    """Every live process `pid` started, and theirs (read from /proc: Linux)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text(encoding="ascii")
            except OSError:  # gone meanwhile
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return [p for p in found if alive(p)]


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    """The processes of `pids` still alive after `seconds` (each polled until then)."""
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, data_dir: Path, token: str, log: Path, **env: str) -> None:
        self.data_dir, self.token, self.log_path = data_dir, token, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "MOERAG_ADMIN_TOKEN": token, "MOERAG_DATA_DIR": str(data_dir), **env}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180, *args: str) -> httpx.Client:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        cmd = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_path.read_text()[-3000:]}")
            try:
                if client.get("/readyz").status_code == 200:
                    return client
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def serve_sample(data_dir: Path, token: str, log: Path) -> list[str]:
    """`moerag serve --sample` on an empty `data_dir` until it is ready, then stopped: returns the
    /readyz statuses seen meanwhile (in order, without repeats), polled from the start."""
    server = Server(data_dir, token, log)
    statuses: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                status = httpx.get(f"{server.url}/readyz", timeout=5).json()["status"]
                if not statuses or statuses[-1] != status:
                    statuses.append(status)
            except httpx.TransportError:
                pass
            stop.wait(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    try:
        poller.start()
        server.start(400, "--sample")  # returns once /readyz is 200
        stop.wait(0.3)  # the poller sees "ready" too
    finally:
        stop.set()
        poller.join(10)
        server.stop()
    return statuses
