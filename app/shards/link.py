"""The server's link to Ray: a child process that joins the Ray cluster and makes the shard calls,
so the server's life is not Ray's.

A process that joins a Ray cluster (a driver) is ended by Ray when the cluster goes away (its
raylet gone, or its GCS away longer than `gcs_rpc_server_reconnect_timeout_s`), and cannot join the
new cluster a later `ray up` starts. So the serving process never joins: `ShardLink` starts a child
that does, and sends it each call (a Serve handle's method and arguments) over a pipe; a reader
thread resolves each call's future with the child's answer. The child watches its cluster and
exits when it is gone; the link then fails the calls in flight and every new one at once (the
shards' breakers open: answers say `partial`, `/readyz` says `degraded`) and starts a new child,
which tries to join every `RETRY_S` until the cluster `ray up` starts again is there; then the
link tells its listeners (the breakers probe at once). `LinkedHandle` has the surface of a Serve `DeploymentHandle` that
app.shards.client uses (`handle.method.remote(*args).result(timeout_s)`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection
from typing import Any

from engine.errors import NotConfigured

log = logging.getLogger(__name__)

RETRY_S = 1.0  # while Ray is away, a child tries to join it this often (a new child once one has gone)
WATCH_S = 1.0  # the child checks its cluster this often, and exits when two checks in a row fail
CALL_LIMIT_S = 60.0  # the longest the child waits on one call (the server's own wait is shorter)
_THREADS = 64  # calls the child awaits at once


class ShardLinkDown(ConnectionError):
    """No child is joined to Ray now: the call was not sent."""


class ShardCallFailed(RuntimeError):
    """The call reached Ray and failed there (the child's error, by type name and message)."""


class ShardLink:
    """The serving process's side: one child joined to the Ray cluster at `address` at a time."""

    def __init__(self, address: str = "auto") -> None:
        self.address = address
        self.connected = threading.Event()
        self.reason = "not started"  # why no child is joined now (for /readyz and logs)
        self._ctx = multiprocessing.get_context("spawn")  # never fork a process that runs threads
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._child: Any = None
        self._pending: dict[int, Future[Any]] = {}
        self._next = 0
        self._listeners: list[Callable[[], object]] = []
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.joins = 0  # children that joined the cluster (1 at start; more after Ray came back)

    def start(self, wait_s: float = 60.0) -> None:
        """Start the first child and wait for it to join; NotConfigured, with Ray's reason, if it cannot."""
        reader = self._spawn()
        deadline = time.monotonic() + wait_s
        while not self.connected.wait(0.1):
            if not self._child.is_alive() or time.monotonic() > deadline:
                reader.join(2)  # its last word: why it could not join
                self.close()
                raise NotConfigured(
                    f"no Ray cluster at {self.address!r} ({self.reason}): start one with `moerag ray up --config MAP`"
                )
        self._supervisor = threading.Thread(target=self._supervise, name="shard-link", daemon=True)
        self._supervisor.start()

    def on_up(self, listener: Callable[[], object]) -> None:
        """Call `listener` each time a new child joins the cluster after a loss."""
        self._listeners.append(listener)

    # ---- calls ---------------------------------------------------------------------------------

    def call(self, kind: str, *payload: Any) -> Future[Any]:
        """Send one request to the child: its answer to come (ShardLinkDown at once when none is joined)."""
        future: Future[Any] = Future()
        with self._lock:
            conn = self._conn if self.connected.is_set() else None
            if conn is None:
                future.set_exception(ShardLinkDown(f"Ray is not reachable: {self.reason}"))
                return future
            self._next += 1
            rid = self._next
            self._pending[rid] = future
            try:
                conn.send((rid, kind, payload))
            except (OSError, ValueError) as exc:  # the child just went
                del self._pending[rid]
                future.set_exception(ShardLinkDown(f"Ray link lost: {exc}"))
        return future

    def handle(self, app_name: str, deployment: str) -> LinkedHandle:
        return LinkedHandle(self, app_name, deployment)

    def function(self, name: str, *args: Any, timeout_s: float = 10.0) -> Any:
        """One of the child's functions (`_FUNCTIONS`), its answer awaited at most `timeout_s`."""
        return self.call("fn", name, args).result(timeout=timeout_s)

    def replica_states(self, app_name: str) -> dict[str, dict[str, int]] | None:
        """app.shards.replicas.replica_states, asked of the child; None while Ray is away."""
        try:
            return self.function("replica_states", app_name, timeout_s=2.0)
        except Exception:  # Ray away, or too slow: Serve cannot say
            return None

    # ---- the child's life ------------------------------------------------------------------------

    def _spawn(self) -> threading.Thread:
        parent, child = self._ctx.Pipe()
        retry = self.joins > 0  # after a loss, the child waits for the cluster; at start, it says why not
        process = self._ctx.Process(target=_child_main, args=(child, self.address, os.getpid(), retry), daemon=True)
        process.start()
        child.close()
        self._child = process
        reader = threading.Thread(target=self._read, args=(parent, process), name="shard-link-reader", daemon=True)
        reader.start()
        return reader

    def _read(self, conn: Connection, process: Any) -> None:
        """The child's messages until it goes: its join ("up", or "down" with the reason), then answers."""
        try:
            while True:
                message = conn.recv()
                if message[0] == "up":
                    with self._lock:
                        self._conn = conn
                        self.connected.set()
                    self.joins += 1
                    log.info("shard link: joined the Ray cluster at %s", self.address)
                    if self.joins > 1:
                        for told in self._listeners:
                            told()
                elif message[0] == "down":
                    self.reason = message[1]
                else:
                    rid, ok, value = message
                    with self._lock:
                        future = self._pending.pop(rid, None)
                    if future is not None and not future.done():
                        if ok:
                            future.set_result(value)
                        else:
                            future.set_exception(_error(value))
        except (EOFError, OSError):
            pass
        finally:
            self._lost(conn, process)

    def _lost(self, conn: Connection, process: Any) -> None:
        with self._lock:
            was = self._conn is conn
            if was:
                self._conn = None
                self.connected.clear()
            pending, self._pending = (self._pending, {}) if was else ({}, self._pending)
        for future in pending.values():
            if not future.done():
                future.set_exception(ShardLinkDown(f"Ray link lost: {self.reason}"))
        if was and not self._stop.is_set():
            log.warning("shard link: lost the Ray cluster (%s); reconnecting every %.0f s", self.reason, RETRY_S)
        process.join(5)
        conn.close()

    def _supervise(self) -> None:
        while not self._stop.wait(RETRY_S):
            child = self._child
            if child is not None and not child.is_alive() and not self.connected.is_set():
                self._spawn()

    def close(self) -> None:
        """End the child; its reader sees the pipe close and fails whatever was in flight."""
        self._stop.set()
        child, self._child = self._child, None
        self.reason = "the server is stopping"
        if child is not None and child.is_alive():
            child.terminate()
            child.join(5)


class LinkedHandle:
    """A Serve deployment handle through the link: `handle.method.remote(*args)`."""

    def __init__(self, link: ShardLink, app_name: str, deployment: str) -> None:
        self.link, self.app_name, self.deployment = link, app_name, deployment

    def __getattr__(self, method: str) -> _LinkedMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _LinkedMethod(self, method)


class _LinkedMethod:
    def __init__(self, handle: LinkedHandle, method: str) -> None:
        self.handle, self.method = handle, method

    def remote(self, *args: Any) -> LinkedResponse:
        h = self.handle
        return LinkedResponse(h.link.call("call", h.app_name, h.deployment, self.method, args))


class LinkedResponse:
    """A call's answer to come: `result(timeout_s)` as a Serve `DeploymentResponse`'s."""

    def __init__(self, future: Future[Any]) -> None:
        self.future = future

    def result(self, timeout_s: float | None = None) -> Any:
        try:
            return self.future.result(timeout=timeout_s)
        except FutureTimeout:
            raise TimeoutError("the shard did not answer in time") from None


def _error(value: tuple[str, str]) -> Exception:
    kind, message = value
    if kind == "TimeoutError" or kind == "GetTimeoutError":
        return TimeoutError(message)
    return ShardCallFailed(f"{kind}: {message}")


# ---- the child -----------------------------------------------------------------------------------


def _replica_states(app_name: str) -> Any:
    from app.shards.replicas import replica_states

    return replica_states(app_name)


_FUNCTIONS: dict[str, Callable[..., Any]] = {"replica_states": _replica_states}


def _child_main(conn: Connection, address: str, parent: int, retry: bool) -> None:  # pragma: no cover
    """Join the cluster, then answer the server's requests until the cluster or the server goes.
    retry: while there is no cluster, try again every RETRY_S (Ray imported once); else say why and go."""
    from app.core.locking import exit_with_parent

    exit_with_parent(parent)
    import ray

    while True:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            break
        except Exception as exc:  # no cluster (yet): say why
            conn.send(("down", f"{type(exc).__name__}: {exc}"))
            if not retry:
                return
            ray.shutdown()
            time.sleep(RETRY_S)
    _Child(conn).serve()


class _Child:  # pragma: no cover - runs in the child process
    """The child joined to Ray: each request answered on a thread of its own."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.send_lock = threading.Lock()
        self.handles: dict[tuple[str, str], Any] = {}

    def serve(self) -> None:
        # Its threads mostly wait (on the pipe, on Serve): hand the GIL over sooner than the 5 ms
        # default, so a call's answer is not held up behind another thread's slice.
        sys.setswitchinterval(0.0002)
        threading.Thread(target=self.watch, name="watch-cluster", daemon=True).start()
        self.conn.send(("up",))
        pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="shard-call")
        while True:
            try:
                rid, kind, payload = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the server went
            pool.submit(self.answer, rid, kind, payload)

    def answer(self, rid: int, kind: str, payload: tuple[Any, ...]) -> None:
        try:
            out = (rid, True, self.run(kind, payload))
        except Exception as exc:
            out = (rid, False, (type(exc).__name__, str(exc)[:500]))
        with self.send_lock:
            try:
                self.conn.send(out)
            except (OSError, ValueError):
                os._exit(0)  # the server went

    def run(self, kind: str, payload: tuple[Any, ...]) -> Any:
        if kind == "fn":
            name, args = payload
            return _FUNCTIONS[name](*args)
        from ray import serve
        from ray.exceptions import RayActorError

        app_name, deployment, method, args = payload
        key = (app_name, deployment)
        if key not in self.handles:
            self.handles[key] = serve.get_deployment_handle(deployment, app_name=app_name)
        try:
            return getattr(self.handles[key], method).remote(*args).result(timeout_s=CALL_LIMIT_S)
        except RayActorError:  # the replica died with it: once more, Serve picks another
            return getattr(self.handles[key], method).remote(*args).result(timeout_s=CALL_LIMIT_S)

    def watch(self) -> None:
        """Exit when two checks of the cluster in a row fail or go unanswered for `WATCH_S`: the
        server starts a new child. (A driver whose cluster is gone can hang in Ray's calls for
        Ray's own minute, so each check runs on a thread of its own and is only waited for.)"""
        import ray

        failures = 0
        while True:
            time.sleep(WATCH_S)
            answered = threading.Event()

            def check(answered: threading.Event = answered) -> None:
                try:
                    ray.nodes()  # a GCS round trip
                except Exception:
                    return
                answered.set()

            threading.Thread(target=check, name="check-cluster", daemon=True).start()
            if answered.wait(WATCH_S):
                failures = 0
            else:
                failures += 1
                if failures >= 2:
                    os._exit(3)
