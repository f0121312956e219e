"""The query log as operators use it: recent questions, labels, router examples, routing share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import Expert, QueryLog, RouterExample, RouterVersion
from app.core.paging import scalar_page
from engine.errors import NotFound, UnknownExperts


def recent(sessions: sessionmaker[Session], offset: int, limit: int) -> tuple[int, list[QueryLog]]:
    """(questions logged, one page of them, newest first)."""
    with sessions() as s:
        return scalar_page(s, select(QueryLog).order_by(QueryLog.id.desc()), offset, limit)


def label(sessions: sessionmaker[Session], query_id: int, expert_id: int | None) -> None:
    """An operator marks the right expert, or (None) "none of these / a new topic": the question
    becomes router training data (None teaches the gate's "none" class)."""
    with sessions.begin() as s:
        q = s.get(QueryLog, query_id)
        if q is None:
            raise NotFound(f"question {query_id} not found")
        if expert_id is not None and s.get(Expert, expert_id) is None:
            raise NotFound(f"expert {expert_id} not found")
        q.feedback_expert_id, q.feedback_new_topic = expert_id, expert_id is None
        s.add(RouterExample(question=q.question, expert_id=expert_id, origin="feedback"))


def add_examples(sessions: sessionmaker[Session], examples: Sequence[tuple[str, int]]) -> int:
    """Labelled (question, expert id) pairs for the next router version; all or none."""
    with sessions.begin() as s:
        known = set(s.scalars(select(Expert.id)))
        unknown = sorted({e for _, e in examples} - known)
        if unknown:
            raise UnknownExperts(f"experts not found: {unknown}")
        s.add_all(RouterExample(question=q, expert_id=e, origin="api") for q, e in examples)
    return len(examples)


def overview(sessions: sessionmaker[Session], buckets: int, window: int = 5000) -> dict[str, Any]:
    """The active router, routing share over time (`buckets` slices of the last `window`
    questions) and questions per expert on the expert path."""
    with sessions() as s:
        recent_rows = s.execute(
            select(QueryLog.created_at, QueryLog.path, QueryLog.expert_id).order_by(QueryLog.id.desc()).limit(window)
        ).all()
        active = s.scalars(select(RouterVersion).where(RouterVersion.active)).first()
        names = {e.id: e.name for e in s.scalars(select(Expert))}
    share: list[dict[str, object]] = []
    if recent_rows:
        times = [r[0].timestamp() for r in recent_rows]
        lo, hi = min(times), max(times) + 1e-6
        width = (hi - lo) / buckets
        counts = [[0, 0] for _ in range(buckets)]
        for t, (_, path, _) in zip(times, recent_rows, strict=True):
            counts[min(int((t - lo) / width), buckets - 1)][0 if path == "expert" else 1] += 1
        share = [{"start": lo + i * width, "expert": c[0], "fallback": c[1]} for i, c in enumerate(counts)]
    load: dict[str, int] = {}
    for _, path, eid in recent_rows:
        if path == "expert" and eid is not None:
            name = names.get(eid, str(eid))
            load[name] = load.get(name, 0) + 1
    scalar = {k: v for k, v in (active.metrics if active else {}).items() if isinstance(v, int | float)}
    return {
        "router": {"id": active.id, "created_at": active.created_at.isoformat(), "metrics": scalar} if active else None,
        "questions": len(recent_rows),
        "share": share,
        "load": [{"expert": k, "hits": v} for k, v in sorted(load.items(), key=lambda kv: -kv[1])],
    }
