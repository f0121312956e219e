"""The experts as serving reads them: each with the lists it owns (engine.serving.ExpertProfile)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import Expert, cluster_owners
from engine.serving import ExpertProfile


def profiles(s: Session) -> dict[int, ExpertProfile]:
    """Every expert with the clusters it owns, as routing reads them."""
    owned: dict[int, list[int]] = {}
    for cid, eid in cluster_owners(s).items():
        if eid is not None:
            owned.setdefault(eid, []).append(cid)
    return {
        e.id: ExpertProfile(
            e.id,
            e.name,
            e.system_prompt,
            e.generator,
            e.top_k,
            e.threshold,
            tuple(sorted(owned.get(e.id, []))),
            tuple(e.slugs or ()),
        )
        for e in s.scalars(select(Expert))
    }


def load_profiles(sessions: sessionmaker[Session]) -> dict[int, ExpertProfile]:
    """`profiles` in a session of its own (app.serving.states)."""
    with sessions() as s:
        return profiles(s)
