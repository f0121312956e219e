"""Which documents define an expert (app.services.expert_scopes): a selector of ids, a source
folder or a tag, matched against the store and against documents as they arrive.

A selector is `{"ids": [..], "source_prefix": "docs/k8s/", "tag": "k8s"}`, any of them; a
document matches when one does. A document carries tag T when its metadata's `tags` is T or a
list holding T. Where two experts' selectors match one document, the lower expert id holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.clustering import expert_history as history
from app.core.models import Document, Expert
from engine.errors import Conflict, NotFound


def matches(selector: dict[str, Any], document_id: int | None, source: str, meta: Mapping[str, Any] | None) -> bool:
    """Whether a document (its id, source and metadata) is one of the selector's."""
    if document_id is not None and document_id in (selector.get("ids") or []):
        return True
    prefix = selector.get("source_prefix")
    if prefix and source.startswith(prefix):
        return True
    tag = selector.get("tag")
    tags = (meta or {}).get("tags")
    return bool(tag) and (tags == tag or (isinstance(tags, list) and tag in tags))


def defined(s: Session) -> dict[int, dict[str, Any]]:
    """{expert id: its selector} of the experts defined by documents, lowest id first."""
    rows = s.execute(select(Expert.id, Expert.documents).where(Expert.documents.is_not(None)).order_by(Expert.id))
    return {e: sel for e, sel in rows if sel}


def expert_for(selectors: dict[int, dict[str, Any]], document_id: int | None, source: str, meta: Any) -> int | None:
    """The defined expert a document belongs to (the lowest id among those matching), else None."""
    return next((e for e, sel in selectors.items() if matches(sel, document_id, source, meta)), None)


def pinned(s: Session) -> tuple[dict[int, int], set[int]]:
    """({document: its defined expert}, the defined experts) over the whole store."""
    selectors = defined(s)
    if not selectors:
        return {}, set()
    out: dict[int, int] = {}
    for d, source, meta in s.execute(select(Document.id, Document.source, Document.meta)):
        e = expert_for(selectors, d, source, meta)
        if e is not None:
            out[d] = e
    return out, set(selectors)


def define(sessions: sessionmaker[Session], expert_id: int, selector: dict[str, Any] | None) -> int:
    """Set an expert's selector (None: clear it; the expert keeps its lists, defined by them now).
    -> the stored documents it holds now. Conflict when none: nothing would be scoped."""
    with sessions.begin() as s:
        expert = s.get(Expert, expert_id)
        if expert is None:
            raise NotFound(f"expert {expert_id} not found")
        what = f"defined {expert.name!r} by {selector}" if selector else f"{expert.name!r} defined by its lists again"
        history.record(s, "define", what, layout=bool(selector))  # the scope job replaces its lists
        expert.documents = selector or None
        expert.owned = True
        if not selector:
            return 0
        s.flush()
        held = sum(1 for e in pinned(s)[0].values() if e == expert_id)
        if not held:
            raise Conflict(
                f"no stored document matches {selector} for expert {expert_id!r} (or an expert with a lower id "
                "holds them): upload them first, or check the ids, folder or tag"
            )
    return held
