"""Long work (bulk ingest, recluster) as persisted jobs run by one worker thread.

Jobs survive a crash: at start-up, jobs left queued or running are queued again. Handlers
must therefore be idempotent (re-ingesting the same bytes is a no-op, reclustering twice is
harmless), which is what lets a killed bulk ingest finish after a restart. A job is claimed
by one conditional UPDATE (queued -> running), so it runs once however many runners look at
it; stopping a runner cancels its job at the next progress report (the job is queued again,
its recorded progress kept for the resume) and waits for the thread: never abandons it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, sessionmaker

from app.models import Job
from engine.errors import NotFound

log = logging.getLogger(__name__)

_PROGRESS_INTERVAL_S = 0.5


class JobCancelled(Exception):
    """Raised inside a handler at a progress report once its runner is stopping."""


@dataclass
class JobContext:
    job_id: int
    params: dict[str, Any]
    _sessions: sessionmaker[Session]
    _last: float = 0.0
    resumed: dict[str, Any] = field(default_factory=dict)  # the `state` last recorded by an interrupted run
    _cancel: threading.Event = field(default_factory=threading.Event)

    def progress(self, done: int, total: int, *, force: bool = False, state: dict[str, Any] | None = None) -> None:
        """Record progress (and a handler's resumable state), at most twice a second unless forced.

        Raises JobCancelled when the runner is stopping: the handler's work so far must be
        committed, because the job resumes from the last recorded state.
        """
        cancelled = self._cancel.is_set()
        now = time.monotonic()
        if not (force or cancelled) and now - self._last < _PROGRESS_INTERVAL_S and done < total:
            return
        self._last = now
        with self._sessions.begin() as s:
            job = s.get(Job, self.job_id)
            if job is not None:
                job.done, job.total = done, total
                if state is not None:
                    job.result = {"partial": state}
        if cancelled:  # after the write: the resume starts from exactly this report
            raise JobCancelled


Handler = Callable[[JobContext], dict[str, Any]]


class JobRunner:
    def __init__(self, sessions: sessionmaker[Session], handlers: dict[str, Handler]) -> None:
        self.sessions = sessions
        self.handlers = handlers
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()

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

    def recent(self, limit: int) -> list[Job]:
        with self.sessions() as s:
            return list(s.scalars(select(Job).order_by(Job.id.desc()).limit(limit)))

    def get(self, job_id: int) -> Job:
        with self.sessions() as s:
            job = s.get(Job, job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        return job

    def start(self) -> None:
        self._cancel.clear()
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

    def stop(self, warn_every: float = 10.0) -> None:
        """Cancel the running job at its next progress report and wait for the thread to end."""
        if self._thread is not None:
            self._cancel.set()
            self._queue.put(None)
            while self._thread.is_alive():
                self._thread.join(warn_every)
                if self._thread.is_alive():
                    log.warning("waiting for the job thread to reach a progress report and stop")
            self._thread = None

    def _work(self) -> None:
        while True:
            job_id = self._queue.get()
            if job_id is None:
                return
            self._run(job_id)

    def _run(self, job_id: int) -> None:
        if self._cancel.is_set():
            return  # stopping: the job stays queued for the next start
        with self.sessions.begin() as s:
            claim = update(Job).where(Job.id == job_id, Job.status == "queued").values(status="running")
            claimed = cast("CursorResult[Any]", s.execute(claim)).rowcount
            job = s.get(Job, job_id)
            if not claimed or job is None:
                return  # finished, failed, or claimed by another runner
            kind, params = job.kind, dict(job.params)
            resumed = dict((job.result or {}).get("partial", {}))
        ctx = JobContext(job_id, params, self.sessions, resumed=resumed, _cancel=self._cancel)
        try:
            result = self.handlers[kind](ctx)
        except JobCancelled:
            with self.sessions.begin() as s:
                s.execute(update(Job).where(Job.id == job_id, Job.status == "running").values(status="queued"))
            log.warning("job %d (%s) stopped with the runtime; it resumes at the next start", job_id, kind)
            return
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
