"""Long work (bulk ingest, sync, recluster, re-fit, undo, training) as persisted jobs run by
worker threads, one per lane.

Jobs of a lane run one at a time, in order; lanes run beside each other. A sync waits on the
network (a slow page, a large repository), so it has a lane of its own: an ingest, a training
or a re-fit submitted meanwhile does not wait for it.

Jobs survive a crash: at start-up, jobs left queued or running are queued again. Handlers
must therefore be idempotent (re-ingesting the same bytes is a no-op, reclustering twice is
harmless), which is what lets a killed bulk ingest finish after a restart. A job is claimed
by one conditional UPDATE (queued -> running), so it runs once however many runners look at
it; stopping a runner cancels its job at the next progress report (the job is queued again,
its recorded progress kept for the resume) and waits for the thread: never abandons it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import func, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import Job
from app.core.paging import scalar_page
from engine.errors import MoeragError, NotFound, TooManyJobs

log = logging.getLogger(__name__)

_PROGRESS_INTERVAL_S = 0.5


def record(
    sessions: sessionmaker[Session], kind: str, params: dict[str, Any], result: dict[str, Any] | None, error: str = ""
) -> int:
    """A job done outside any runner (the CLI's local `sync`) recorded as finished, so its result
    is listed with the server's jobs: -> its id."""
    with sessions.begin() as s:
        job = Job(
            kind=kind, status="failed" if error else "done", params=params, result=result or {}, error=error or None
        )
        counted = ("added", "updated", "deleted", "unchanged", "duplicate", "failed")
        job.done = job.total = sum(int((result or {}).get(k, 0)) for k in counted)
        s.add(job)
        s.flush()
        return job.id


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
    # Queue another job (JobRunner.submit): a handler's follow-up, such as the training a recluster asks for.
    submit: Callable[..., Job] | None = None

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


Lane = tuple[str, frozenset[str] | None]  # (name, its kinds; None: every kind no other lane names)
LANES: tuple[tuple[str, frozenset[str]], ...] = (("sync", frozenset({"sync"})),)


class JobRunner:
    """Claims queued jobs from SQL and runs them on a thread per lane (`lanes`: {name: kinds};
    every other kind runs on the main lane); any number of runners (processes) may share the job
    table.

    A claim is `SELECT ... FOR UPDATE SKIP LOCKED` (PostgreSQL; SQLite has one process) and the
    status change in one transaction. While a job runs, a heartbeat refreshes its `updated_at`;
    a running job whose heartbeat is older than `lease_seconds` belongs to a dead runner and is
    queued again, so another process finishes it (handlers are idempotent). `exclusive`: this
    runner is the only one (SQLite, the data dir locked), so every running job at start is dead.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        handlers: dict[str, Handler],
        *,
        exclusive: bool = True,
        poll_seconds: float = 1.0,
        lease_seconds: float = 15.0,
        max_queued: int = 100,
        lanes: tuple[tuple[str, frozenset[str]], ...] = LANES,
    ) -> None:
        self.sessions = sessions
        self.handlers = handlers
        self.max_queued = max_queued
        self.exclusive, self.poll_seconds, self.lease_seconds = exclusive, poll_seconds, lease_seconds
        named = [(name, kinds & handlers.keys()) for name, kinds in lanes if kinds & handlers.keys()]
        self.lanes: list[Lane] = [("main", None), *((name, frozenset(kinds)) for name, kinds in named)]
        self._elsewhere = frozenset().union(*(kinds for _, kinds in named))  # kinds the main lane leaves
        self._wakes = {name: threading.Event() for name, _ in self.lanes}
        self._threads: list[threading.Thread] = []
        self._cancel = threading.Event()
        self._running: set[int] = set()  # the jobs this runner holds (their heartbeats)

    def submit(
        self, kind: str, params: dict[str, Any], total: int = 0, *, coalesce: bool = False, owner: str | None = None
    ) -> Job:
        """Queue a job. coalesce: the same kind with the same params already waiting is returned instead
        (a recluster or a training asked for twice runs once). A full queue raises TooManyJobs.
        owner: the scoped token submitting it (only it and the unscoped read it)."""
        if kind not in self.handlers:
            raise ValueError(f"unknown job kind {kind!r}")
        with self.sessions.begin() as s:
            if coalesce:
                waiting = s.scalars(select(Job).where(Job.status == "queued", Job.kind == kind).order_by(Job.id))
                for same in waiting:
                    if same.params == params:
                        s.expunge(same)
                        return same
            queued = s.scalar(select(func.count(Job.id)).where(Job.status == "queued")) or 0
            if queued >= self.max_queued:
                raise TooManyJobs(
                    f"{queued} jobs are waiting (MOERAG_MAX_QUEUED_JOBS={self.max_queued}); retry once some have run"
                )
            job = Job(kind=kind, status="queued", params=params, total=total, done=0, result={}, owner=owner)
            s.add(job)
            s.flush()
            s.expunge(job)
        for wake in self._wakes.values():
            wake.set()
        return job

    def recent(self, offset: int, limit: int, owner: str | None = None) -> tuple[int, list[Job]]:
        """(jobs in all, one page of them, newest first); `owner`: that scoped token's only."""
        query = select(Job) if owner is None else select(Job).where(Job.owner == owner)
        with self.sessions() as s:
            return scalar_page(s, query.order_by(Job.id.desc()), offset, limit)

    def get(self, job_id: int, owner: str | None = None) -> Job:
        """The job; `owner`: only if that scoped token submitted it (another's is not found)."""
        with self.sessions() as s:
            job = s.get(Job, job_id)
        if job is None or (owner is not None and job.owner != owner):
            raise NotFound(f"job {job_id} not found")
        return job

    def start(self) -> None:
        self._cancel.clear()
        self._requeue_dead(everything=self.exclusive)
        for name, kinds in self.lanes:
            thread = threading.Thread(target=self._work, args=(name, kinds), name=f"moerag-jobs-{name}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, warn_every: float = 10.0) -> None:
        """Cancel the running jobs at their next progress report and wait for the threads to end."""
        self._cancel.set()
        for wake in self._wakes.values():
            wake.set()
        for thread in self._threads:
            while thread.is_alive():
                thread.join(warn_every)
                if thread.is_alive():
                    log.warning("waiting for the %s job thread to reach a progress report and stop", thread.name)
        self._threads = []

    def _requeue_dead(self, *, everything: bool = False) -> None:
        """Running jobs whose runner died (no heartbeat for `lease_seconds`) are queued again."""
        stale = datetime.now(UTC) - timedelta(seconds=self.lease_seconds)
        with self.sessions.begin() as s:
            query = select(Job).where(Job.status == "running").order_by(Job.id)
            if not everything:
                query = query.where(Job.updated_at < stale, Job.id.not_in(list(self._running)))
            for job in s.scalars(query.with_for_update(skip_locked=True)):
                log.warning("job %d (%s) was interrupted; resuming it", job.id, job.kind)
                job.status = "queued"

    def _claim(self, kinds: frozenset[str] | None) -> tuple[int, str, dict[str, Any], dict[str, Any]] | None:
        """The oldest queued job of the lane's `kinds` (None: of the main lane's), or None; two
        runners never claim the same one."""
        lane = Job.kind.in_(kinds) if kinds is not None else Job.kind.not_in(self._elsewhere)
        with self.sessions.begin() as s:
            job_id = s.scalar(
                select(Job.id)
                .where(Job.status == "queued", lane)
                .order_by(Job.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            )
            if job_id is None:
                return None
            claim = update(Job).where(Job.id == job_id, Job.status == "queued")
            if not cast("CursorResult[Any]", s.execute(claim.values(status="running"))).rowcount:
                return None  # another runner got there first (SQLite takes no row locks)
            job = s.get(Job, job_id)
            assert job is not None
            return job.id, job.kind, dict(job.params), dict((job.result or {}).get("partial", {}))

    def _heartbeat(self, job_id: int, done: threading.Event) -> None:
        while not done.wait(min(self.lease_seconds / 3, 5.0)):
            with self.sessions.begin() as s:
                s.execute(
                    update(Job).where(Job.id == job_id, Job.status == "running").values(updated_at=datetime.now(UTC))
                )

    def _work(self, lane: str, kinds: frozenset[str] | None) -> None:
        wake = self._wakes[lane]
        while not self._cancel.is_set():
            claimed = self._claim(kinds)
            if claimed is None:  # idle: sleep until a submit here, or poll for one made elsewhere
                wake.wait(self.poll_seconds)
                wake.clear()
                if not self._cancel.is_set() and kinds is None:  # one lane looks for dead runners' jobs
                    self._requeue_dead()
                continue
            done = threading.Event()
            beat = threading.Thread(target=self._heartbeat, args=(claimed[0], done), daemon=True)
            self._running.add(claimed[0])
            beat.start()
            try:
                self._run(*claimed)
            finally:
                done.set()
                beat.join()
                self._running.discard(claimed[0])

    def _run(self, job_id: int, kind: str, params: dict[str, Any], resumed: dict[str, Any]) -> None:
        ctx = JobContext(job_id, params, self.sessions, resumed=resumed, _cancel=self._cancel, submit=self.submit)
        try:
            result = self.handlers[kind](ctx)
        except JobCancelled:
            with self.sessions.begin() as s:
                s.execute(update(Job).where(Job.id == job_id, Job.status == "running").values(status="queued"))
            log.warning("job %d (%s) stopped with the runtime; it resumes at the next start", job_id, kind)
            return
        except Exception as exc:
            if isinstance(exc, MoeragError):  # expected and the caller's to fix (nothing to train yet): one line
                log.warning("job %d (%s) failed: %s: %s", job_id, kind, exc.code, exc.message)
            else:
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
