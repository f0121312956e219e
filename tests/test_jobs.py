"""Issue 11 #1: a job is claimed once, a stopping runner cancels and waits (never abandons), the job resumes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from app.core.db import make_engine, make_sessionmaker
from app.core.jobs import JobContext, JobRunner
from app.core.migrate import upgrade
from app.core.models import Job


def sessions(tmp_path: Path):  # type: ignore[no-untyped-def]
    engine = make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
    upgrade(engine)
    return make_sessionmaker(engine)


def status(maker: Any, job_id: int) -> Job:
    with maker() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def test_a_job_runs_once_however_many_runners_see_it(tmp_path: Path) -> None:
    maker = sessions(tmp_path)
    calls: list[int] = []
    gate = threading.Event()

    def slow(ctx: JobContext) -> dict[str, Any]:
        calls.append(ctx.job_id)
        gate.wait(10)
        return {"ok": True}

    first = JobRunner(maker, {"slow": slow}, exclusive=False, poll_seconds=0.01)
    second = JobRunner(maker, {"slow": slow}, exclusive=False, poll_seconds=0.01)
    first.start()
    second.start()
    job = first.submit("slow", {})  # both runners poll the table: both try to claim it
    time.sleep(0.5)
    gate.set()
    first.stop()
    second.stop()
    assert calls == [job.id]
    assert status(maker, job.id).status == "done"


def test_stop_cancels_at_the_next_report_and_the_job_resumes_where_it_was(tmp_path: Path) -> None:
    maker = sessions(tmp_path)
    seen: list[dict[str, Any]] = []

    def counting(ctx: JobContext) -> dict[str, Any]:
        seen.append(dict(ctx.resumed))
        start = int(ctx.resumed.get("next", 0))
        for i in range(start, 200):
            time.sleep(0.01)
            ctx.progress(i + 1, 200, state={"next": i + 1})
        return {"finished_from": start}

    runner = JobRunner(maker, {"count": counting})
    job = runner.submit("count", {}, total=200)
    runner.start()
    while status(maker, job.id).done < 20:
        time.sleep(0.01)
    t = time.monotonic()
    runner.stop()
    assert time.monotonic() - t < 2  # cancelled at the next report, not waited out
    assert runner._threads == []
    stopped = status(maker, job.id)
    assert stopped.status == "queued" and 20 <= stopped.done < 200
    assert stopped.result == {"partial": {"next": stopped.done}}

    again = JobRunner(maker, {"count": counting})
    again.start()
    while status(maker, job.id).status != "done":
        time.sleep(0.05)
    again.stop()
    assert seen[1] == {"next": stopped.done}  # the second run started from the recorded state
    assert status(maker, job.id).result == {"finished_from": stopped.done}


def test_a_runtime_started_without_jobs_leaves_them_for_the_server(settings, embedder) -> None:  # type: ignore[no-untyped-def]
    """One-shot CLI commands and `--sample` start with run_jobs=False: a queued job is not theirs to run."""
    from app.runtime import Runtime

    rt = Runtime(settings, embedder=embedder)
    rt.start(run_jobs=False)
    try:
        job = rt.jobs.submit("recluster", {})
        time.sleep(0.5)
        assert status(rt.sessions, job.id).status == "queued"
    finally:
        rt.close()
    rt = Runtime(settings, embedder=embedder)
    rt.start()  # the server runs it
    try:
        deadline = time.monotonic() + 60
        while status(rt.sessions, job.id).status not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert status(rt.sessions, job.id).status == "done"
    finally:
        rt.close()


def test_a_job_whose_runner_died_is_taken_over_by_another(tmp_path: Path) -> None:
    """A running job without a heartbeat for the lease (its process killed) is finished elsewhere."""
    maker = sessions(tmp_path)
    with maker.begin() as s:  # as a SIGKILLed runner leaves it: running, its heartbeat stopped
        s.add(Job(kind="count", status="running", params={}, total=3, done=1, result={"partial": {"next": 1}}))
    seen: list[dict[str, Any]] = []

    def counting(ctx: JobContext) -> dict[str, Any]:
        seen.append(dict(ctx.resumed))
        return {"ok": True}

    other = JobRunner(maker, {"count": counting}, exclusive=False, poll_seconds=0.05, lease_seconds=0.5)
    other.start()
    try:
        time.sleep(0.2)
        assert status(maker, 1).status == "running"  # within its lease: maybe alive, left alone
        deadline = time.monotonic() + 10
        while status(maker, 1).status != "done" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status(maker, 1).status == "done" and seen == [{"next": 1}]  # resumed from its state
    finally:
        other.stop()


def test_a_live_runner_keeps_its_job_with_a_heartbeat(tmp_path: Path) -> None:
    maker = sessions(tmp_path)
    gate = threading.Event()
    calls: list[int] = []

    def slow(ctx: JobContext) -> dict[str, Any]:
        calls.append(ctx.job_id)
        gate.wait(10)
        return {}

    kw: dict[str, Any] = {"exclusive": False, "poll_seconds": 0.05, "lease_seconds": 0.6}
    first, second = JobRunner(maker, {"slow": slow}, **kw), JobRunner(maker, {"slow": slow}, **kw)
    first.start()
    job = first.submit("slow", {})
    time.sleep(0.3)
    second.start()
    time.sleep(2.0)  # several leases: the heartbeat keeps the job first's
    gate.set()
    first.stop()
    second.stop()
    assert calls == [job.id] and status(maker, job.id).status == "done"


def test_the_queue_is_bounded_and_a_repeated_job_waits_once(tmp_path: Path) -> None:
    """Issue 40 #6: five minutes of admin calls queued 1,994 jobs, ingestion waiting behind every
    recluster. A recluster asked for while one waits gets that one; the queue has a bound."""
    import pytest

    from engine.errors import TooManyJobs

    maker = sessions(tmp_path)
    runner = JobRunner(maker, {"recluster": lambda ctx: {}, "ingest": lambda ctx: {}}, max_queued=3)  # not started
    first = runner.submit("recluster", {}, coalesce=True)
    assert runner.submit("recluster", {}, coalesce=True).id == first.id
    assert runner.submit("ingest", {"files": [1]}).id != first.id
    runner.submit("ingest", {"files": [2]})
    with pytest.raises(TooManyJobs, match="MOERAG_MAX_QUEUED_JOBS=3"):
        runner.submit("ingest", {"files": [3]})
    assert runner.submit("recluster", {}, coalesce=True).id == first.id  # a waiting twin still answers


def test_an_expected_job_failure_is_one_line(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Issue 40 #6: training with no mapped cluster was an ERROR with a traceback; it is the user's to fix."""
    import logging

    from engine.errors import NotTrainable

    def train(ctx: JobContext) -> dict[str, Any]:
        raise NotTrainable("no expert owns a cluster yet")

    maker = sessions(tmp_path)
    runner = JobRunner(maker, {"train": train}, poll_seconds=0.01)
    job = runner.submit("train", {})
    with caplog.at_level(logging.INFO, logger="app.core.jobs"):
        runner.start()
        deadline = time.monotonic() + 10
        while status(maker, job.id).status != "failed" and time.monotonic() < deadline:
            time.sleep(0.02)
        runner.stop()
    assert status(maker, job.id).error == "NotTrainable: no expert owns a cluster yet"
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelname == "WARNING" and failed[0].exc_info is None
    assert "not_trainable" in failed[0].getMessage()
