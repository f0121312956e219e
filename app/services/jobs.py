"""Long work (bulk ingest, recluster) as persisted jobs run by one worker thread.

Jobs survive a crash: at start-up, jobs left queued or running are queued again. Handlers
must therefore be idempotent (re-ingesting the same bytes is a no-op, reclustering twice is
harmless), which is what lets a killed bulk ingest finish after a restart.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.models import Job

log = logging.getLogger(__name__)

_PROGRESS_INTERVAL_S = 0.5


@dataclass
class JobContext:
    job_id: int
    params: dict[str, Any]
    _sessions: sessionmaker[Session]
    _last: float = 0.0

    def progress(self, done: int, total: int, *, force: bool = False) -> None:
        """Record progress, at most twice a second unless forced."""
        now = time.monotonic()
        if not force and now - self._last < _PROGRESS_INTERVAL_S and done < total:
            return
        self._last = now
        with self._sessions.begin() as s:
            job = s.get(Job, self.job_id)
            if job is not None:
                job.done, job.total = done, total


Handler = Callable[[JobContext], dict[str, Any]]


class JobRunner:
    def __init__(self, sessions: sessionmaker[Session], handlers: dict[str, Handler]) -> None:
        self.sessions = sessions
        self.handlers = handlers
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, kind: str, params: dict[str, Any], total: int = 0) -> Job:
        if kind not in self.handlers:
            raise ValueError(f"unknown job kind {kind!r}")
        with self.sessions.begin() as s:
            job = Job(kind=kind, status="queued", params=params, total=total, done=0, result={})
            s.add(job)
            s.flush()
            s.expunge(job)
        self._queue.put(job.id)
        return job

    def start(self) -> None:
        with self.sessions.begin() as s:
            unfinished = s.scalars(select(Job).where(Job.status.in_(("queued", "running"))).order_by(Job.id)).all()
            for job in unfinished:
                if job.status == "running":
                    log.warning("job %d (%s) was interrupted; resuming it", job.id, job.kind)
                job.status = "queued"
            ids = [j.id for j in unfinished]
        for job_id in ids:
            self._queue.put(job_id)
        self._thread = threading.Thread(target=self._work, name="moerag-jobs", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    def _work(self) -> None:
        while True:
            job_id = self._queue.get()
            if job_id is None:
                return
            self._run(job_id)

    def _run(self, job_id: int) -> None:
        with self.sessions.begin() as s:
            job = s.get(Job, job_id)
            if job is None or job.status not in ("queued", "running"):
                return
            job.status = "running"
            kind, params = job.kind, dict(job.params)
        ctx = JobContext(job_id, params, self.sessions)
        try:
            result = self.handlers[kind](ctx)
        except Exception as exc:
            log.exception("job %d (%s) failed", job_id, kind)
            with self.sessions.begin() as s:
                job = s.get(Job, job_id)
                if job is not None:
                    job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"
            return
        with self.sessions.begin() as s:
            job = s.get(Job, job_id)
            if job is not None:
                job.status, job.result = "done", result
                job.done = max(job.done, job.total)
        log.info("job %d (%s) done: %s", job_id, kind, result)
