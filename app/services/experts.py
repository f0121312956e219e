"""Experts: CRUD, cluster mapping, automatic proposals, and the profiles the engine routes to."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, distinct, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.clustering import expert_history as history
from app.clustering import proposals
from app.core.models import Chunk, Cluster, Expert
from app.core.paging import scalar_page
from engine.errors import Conflict, NotFound
from engine.topics import slug

EXPERT_FIELDS = ("name", "description", "system_prompt", "generator", "top_k", "threshold")


def _slug_for(s: Session, expert: Expert) -> str:
    """The expert's name as a model-id tail no other expert answers to (its id added when one does)."""
    wanted = slug(expert.name)
    for other, slugs in s.execute(select(Expert.id, Expert.slugs).where(Expert.id != expert.id)):
        if wanted in (slugs or []) or wanted == f"expert-{other}":
            return f"{wanted}-{expert.id}"
    return wanted


def create_expert(s: Session, fields: dict[str, Any], *, owned: bool = True) -> Expert:
    """A new expert; `owned` unless machine-made and not yet accepted (the sample's first experts)."""
    expert = Expert(**{k: v for k, v in fields.items() if k in EXPERT_FIELDS}, owned=owned)
    s.add(expert)
    try:
        s.flush()
    except IntegrityError:
        raise Conflict(f"an expert named {fields.get('name')!r} already exists") from None
    expert.slugs = [_slug_for(s, expert)]
    return expert


def update_expert(s: Session, expert_id: int, fields: dict[str, Any]) -> Expert:
    """Edit an expert: it becomes the team's (owned), unless the edit is `owned: false` (released
    to automation). A new name adds a model-id slug; the old ones keep answering."""
    expert = s.get(Expert, expert_id)
    if expert is None:
        raise NotFound(f"expert {expert_id} not found")
    history.record(s, "edit", f"edited {expert.name!r} ({', '.join(sorted(fields))})")
    for k, v in fields.items():
        if k in EXPERT_FIELDS:
            setattr(expert, k, v)
    expert.owned = fields.get("owned") is not False
    try:
        s.flush()
    except IntegrityError:
        raise Conflict(f"an expert named {fields.get('name')!r} already exists") from None
    current = _slug_for(s, expert) if "name" in fields or not expert.slugs else (expert.slugs or [""])[0]
    expert.slugs = [current, *(old for old in expert.slugs or [] if old != current)]
    return expert


def documents_held(s: Session, expert_id: int) -> int:
    """Documents with chunks in the expert's lists."""
    lists = select(Cluster.id).where(Cluster.expert_id == expert_id)
    return s.scalar(select(func.count(distinct(Chunk.document_id))).where(Chunk.cluster_id.in_(lists))) or 0


def delete_expert(s: Session, expert_id: int) -> dict[str, Any]:
    """Delete an expert. -> what was deleted and where its documents go: its lists stay, without an
    expert, so the fallback answers their questions until lists are mapped or a re-fit places them."""
    expert = s.get(Expert, expert_id)
    if expert is None:
        raise NotFound(f"expert {expert_id} not found")
    held = documents_held(s, expert_id)
    lists = len(s.scalars(select(Cluster.id).where(Cluster.expert_id == expert_id)).all())
    s.execute(update(Cluster).where(Cluster.expert_id == expert_id).values(expert_id=None))
    s.delete(expert)
    return {
        "deleted": {"id": expert_id, "name": expert.name, "owned": expert.owned},
        "documents": held,
        "lists": lists,
        "documents_go_to": DELETED_DOCUMENTS_GO_TO,
    }


DELETED_DOCUMENTS_GO_TO = (
    "no expert: the fallback (whole-store retrieval) answers them until their lists are mapped to an "
    "expert or a re-fit gives them one; POST /admin/api/experts/undo restores the expert"
)


def assign_clusters(s: Session, cluster_ids: list[int], expert_id: int | None, *, record: bool = True) -> int:
    """Map clusters to an expert (None: unmap). Unknown ids are an error, and nothing changes.

    The UPDATE comes first: it takes the write lock (SQLite) or the rows' locks (PostgreSQL), so a
    recluster cannot replace the clusters between the check and the change; the check follows."""
    wanted = set(cluster_ids)
    if record:
        history.record(s, "map", f"{len(wanted)} list(s) mapped to expert {expert_id}")
    try:
        result = s.execute(update(Cluster).where(Cluster.id.in_(wanted)).values(expert_id=expert_id))
    except IntegrityError:  # the foreign key: no such expert
        raise NotFound(f"expert {expert_id} not found") from None
    changed = cast(CursorResult[Any], result).rowcount
    target = s.get(Expert, expert_id) if expert_id is not None else None
    if expert_id is not None and target is None:
        raise NotFound(f"expert {expert_id} not found")
    if target is not None:
        target.owned = True  # the operator's mapping
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
        history.record(s, "create", f"created {fields.get('name')!r}")
        return create_expert(s, fields)


def edit(sessions: sessionmaker[Session], expert_id: int, fields: dict[str, Any]) -> Expert:
    with sessions.begin() as s:
        return update_expert(s, expert_id, fields)


def delete(sessions: sessionmaker[Session], expert_id: int) -> dict[str, Any]:
    with sessions.begin() as s:
        expert = s.get(Expert, expert_id)
        history.record(s, "delete", f"deleted {expert.name if expert else expert_id!r}")
        return delete_expert(s, expert_id)


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
    accepted: bool = True,
) -> dict[str, Any]:
    """`proposals.propose`; with `apply`, each proposal becomes an expert (under the operator's
    `names` where given, made unique) owning its clusters, in one transaction (a version undo
    restores); the experts the proposal empties (never owned ones) are deleted first unless
    `delete_emptied` is false. The new experts are owned (`accepted`), unless machine-made."""
    with sessions.begin() as s:
        result = proposals.propose(s, n, dim, keep_mapped)
        if apply:
            made = len(result["proposals"])
            history.record(s, "propose", f"a proposal of {made} expert(s) accepted (keep mappings: {keep_mapped})")
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
                e = create_expert(s, {"name": name, "description": description[:1000]}, owned=accepted)
                assign_clusters(s, p["cluster_ids"], e.id, record=False)
                e.owned = accepted
                p["expert_id"] = e.id
    return result
