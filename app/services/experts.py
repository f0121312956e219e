"""Experts: CRUD, cluster mapping, automatic proposals, and the profiles the engine routes to."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import Cluster, Expert, cluster_owners
from app.services import proposals
from app.services.paging import scalar_page
from engine.errors import Conflict, NotFound
from engine.serving import ExpertProfile

EXPERT_FIELDS = ("name", "description", "system_prompt", "generator", "top_k", "threshold")


def create_expert(s: Session, fields: dict[str, Any]) -> Expert:
    expert = Expert(**{k: v for k, v in fields.items() if k in EXPERT_FIELDS})
    s.add(expert)
    try:
        s.flush()
    except IntegrityError:
        raise Conflict(f"an expert named {fields.get('name')!r} already exists") from None
    return expert


def update_expert(s: Session, expert_id: int, fields: dict[str, Any]) -> Expert:
    expert = s.get(Expert, expert_id)
    if expert is None:
        raise NotFound(f"expert {expert_id} not found")
    for k, v in fields.items():
        if k in EXPERT_FIELDS:
            setattr(expert, k, v)
    try:
        s.flush()
    except IntegrityError:
        raise Conflict(f"an expert named {fields.get('name')!r} already exists") from None
    return expert


def delete_expert(s: Session, expert_id: int) -> None:
    expert = s.get(Expert, expert_id)
    if expert is None:
        raise NotFound(f"expert {expert_id} not found")
    s.execute(update(Cluster).where(Cluster.expert_id == expert_id).values(expert_id=None))
    s.delete(expert)


def assign_clusters(s: Session, cluster_ids: list[int], expert_id: int | None) -> int:
    """Map clusters to an expert (None: unmap). Unknown ids are an error, and nothing changes.

    The UPDATE comes first: it takes the write lock (SQLite) or the rows' locks (PostgreSQL), so a
    recluster cannot replace the clusters between the check and the change; the check follows."""
    wanted = set(cluster_ids)
    try:
        result = s.execute(update(Cluster).where(Cluster.id.in_(wanted)).values(expert_id=expert_id))
    except IntegrityError:  # the foreign key: no such expert
        raise NotFound(f"expert {expert_id} not found") from None
    changed = cast(CursorResult[Any], result).rowcount
    if expert_id is not None and s.get(Expert, expert_id) is None:
        raise NotFound(f"expert {expert_id} not found")
    if changed != len(wanted):
        known = set(s.scalars(select(Cluster.id).where(Cluster.id.in_(wanted))))
        raise NotFound(f"clusters not found: {sorted(wanted - known)[:20]}")
    return changed


# ---- the API's use cases: one transaction each ------------------------------------------------------


def list_page(sessions: sessionmaker[Session], offset: int, limit: int) -> tuple[int, list[Expert]]:
    with sessions() as s:
        return scalar_page(s, select(Expert).order_by(Expert.id), offset, limit)


def create(sessions: sessionmaker[Session], fields: dict[str, Any]) -> Expert:
    with sessions.begin() as s:
        return create_expert(s, fields)


def edit(sessions: sessionmaker[Session], expert_id: int, fields: dict[str, Any]) -> Expert:
    with sessions.begin() as s:
        return update_expert(s, expert_id, fields)


def delete(sessions: sessionmaker[Session], expert_id: int) -> None:
    with sessions.begin() as s:
        delete_expert(s, expert_id)


def assign(sessions: sessionmaker[Session], cluster_ids: list[int], expert_id: int | None) -> int:
    with sessions.begin() as s:
        return assign_clusters(s, cluster_ids, expert_id)


def propose_and_apply(
    sessions: sessionmaker[Session],
    n: int,
    dim: int,
    *,
    apply: bool,
    keep_mapped: bool = True,
    names: list[str] | None = None,
    delete_emptied: bool = True,
) -> dict[str, Any]:
    """`proposals.propose`; with `apply`, each proposal becomes an expert (under the operator's
    `names` where given, made unique) owning its clusters, in one transaction; the experts the
    proposal empties are deleted first unless `delete_emptied` is false."""
    with sessions.begin() as s:
        result = proposals.propose(s, n, dim, keep_mapped)
        if names is not None and len(names) != len(result["proposals"]):
            raise Conflict(
                f"the proposal now has {len(result['proposals'])} experts and {len(names)} names were given:"
                " the store changed since it was shown; propose again"
            )
        for p, name in zip(result["proposals"], names or [], strict=False):  # the operator's edits
            p["name"] = name.strip() or p["name"]
        if apply:
            if delete_emptied:
                for emptied in result["diff"]["emptied_experts"]:
                    delete_expert(s, emptied["id"])
                s.flush()
            result["deleted_experts"] = result["diff"]["emptied_experts"] if delete_emptied else []
            taken = set(s.scalars(select(Expert.name)))
            for p in result["proposals"]:
                name, i = p["name"], 2
                while name in taken:
                    name, i = f"{p['name']} ({i})", i + 1
                taken.add(name)
                p["name"] = name
                description = "Covers: " + "; ".join(p["titles"][:3])
                e = create_expert(s, {"name": name, "description": description[:1000]})
                assign_clusters(s, p["cluster_ids"], e.id)
                p["expert_id"] = e.id
    return result


def profiles(s: Session) -> dict[int, ExpertProfile]:
    """Every expert with the clusters it owns, as routing reads them."""
    owned: dict[int, list[int]] = {}
    for cid, eid in cluster_owners(s).items():
        if eid is not None:
            owned.setdefault(eid, []).append(cid)
    return {
        e.id: ExpertProfile(
            e.id, e.name, e.system_prompt, e.generator, e.top_k, e.threshold, tuple(sorted(owned.get(e.id, [])))
        )
        for e in s.scalars(select(Expert))
    }


def load_profiles(sessions: sessionmaker[Session]) -> dict[int, ExpertProfile]:
    """`profiles` in a session of its own (app.services.serving)."""
    with sessions() as s:
        return profiles(s)
