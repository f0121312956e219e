"""Automatic expert proposals: clusters grouped by centroid, named from their documents' titles and
headings, and the change they would make to today's mapping (the diff an operator accepts)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.models import Chunk, Cluster, Document, Expert, stack
from index import kmeans

# A title or heading splits into labels at these: "json — JSON encoder — Python 3.11 documentation".
_SEPARATORS = re.compile(r"\s+[—–|>-]\s+|:\s+")
_NUMBERING = re.compile(r"^(?:[\dA-Z]+\.)+\d*\s+|^\d+(?:\.\d+)*\s+")  # "8.5. ", "19.12 ", "A.1. "
MAX_NAME = 80


def labels(title: str, heading: str, source: str = "") -> set[str]:
    """The labels one chunk offers a name: its title's parts, its top heading (numbering dropped)
    and the top folder of its source ("postgresql-doc-15/" for "postgresql-doc-15/html/x.html")."""
    parts = [p for p in _SEPARATORS.split(title) if p]
    top = heading.split(" > ")[0] if heading else ""
    found = {_NUMBERING.sub("", p).strip() for p in [*parts, top]}
    if "/" in source.strip("/") and not source.startswith(("/", "\\")) and "://" not in source:
        found.add(source.split("/")[0] + "/")
    return {p for p in found if 2 <= len(p) <= MAX_NAME}


def name_groups(groups: list[Counter[str]], chunks: list[int], titles: list[Counter[str]]) -> list[str]:
    """A name per group: its most distinctive labels, else its most common titles.

    groups[g]: chunks of group g per label; chunks[g]: its chunks; titles[g]: chunks per title.
    A label names a group when it covers at least a fifth of the group's chunks and 60%
    of its own chunks lie in that group (coverage x purity ranks them; a folder counts 0.9 of a
    title or heading, which say more); up to two labels are kept.
    """
    everywhere: Counter[str] = Counter()
    for group in groups:
        everywhere.update(group)
    names = []
    for g, counts in enumerate(groups):
        n = max(chunks[g], 1)
        scored = sorted(
            ((cnt / n) * (cnt / everywhere[label]) * (0.9 if label.endswith("/") else 1.0), label)
            for label, cnt in counts.items()
            if cnt / n >= 0.2 and cnt / everywhere[label] >= 0.6
        )[::-1]
        chosen: list[str] = []
        for score, label in scored:
            if len(chosen) == 2 or (chosen and score < 0.5 * scored[0][0]):
                break
            if not any(label in c or c in label for c in chosen):
                chosen.append(label)
        if not chosen:
            chosen = [t for t, _ in titles[g].most_common(2)]
        names.append(" · ".join(chosen)[:MAX_NAME] or f"group {g + 1}")
    return names


def _labels_per_cluster(
    s: Session, clusters: list[int]
) -> tuple[dict[int, Counter[str]], dict[int, Counter[str]], dict[int, int]]:
    """Per cluster (of these): chunks per label, chunks per document title, chunks."""
    per_label: dict[int, Counter[str]] = {}
    per_title: dict[int, Counter[str]] = {}
    size: dict[int, int] = {}
    rows = s.execute(
        select(Chunk.cluster_id, Document.title, Document.source, Chunk.heading, func.count(Chunk.id))
        .join(Document, Document.id == Chunk.document_id)
        .where(Chunk.cluster_id.in_(clusters))
        .group_by(Chunk.cluster_id, Document.title, Document.source, Chunk.heading)
    )
    for cluster, title, source, heading, n in rows:
        for label in labels(title or "", heading or "", source or ""):
            per_label.setdefault(cluster, Counter())[label] += n
        per_title.setdefault(cluster, Counter())[title or ""] += n
        size[cluster] = size.get(cluster, 0) + n
    return per_label, per_title, size


def _merged(counters: Iterable[Counter[str] | None]) -> Counter[str]:
    total: Counter[str] = Counter()
    for c in counters:
        total.update(c or {})
    return total


def distinctive(groups: list[Counter[str]], k: int = 5) -> list[list[str]]:
    """Each group's k keywords most frequent in it and rarest in the others."""
    spread = Counter(word for g in groups for word in g)
    return [sorted(g, key=lambda w: (-g[w] / spread[w], -g[w], w))[:k] for g in groups]


def propose(s: Session, n: int, dim: int, keep_mapped: bool = True) -> dict[str, Any]:
    """Group clusters into n proposed experts by their centroids, with the diff against today.

    keep_mapped: clusters an expert already owns stay where they are and only unmapped clusters
    are grouped (the operator's mapping is never undone unless asked); otherwise every cluster is
    regrouped and `diff` lists each cluster taken from its expert and the experts left empty.
    """
    clusters = s.scalars(select(Cluster).order_by(Cluster.id)).all()
    movable = [c for c in clusters if not (keep_mapped and c.expert_id is not None)]
    experts: dict[int, str] = {e: name for e, name in s.execute(select(Expert.id, Expert.name))}
    diff: dict[str, Any] = {"keep_mapped": keep_mapped, "kept_clusters": len(clusters) - len(movable), "moved": []}
    if not movable:
        return {"proposals": [], "diff": diff | {"emptied_experts": []}}
    n = max(1, min(n, len(movable)))
    centroids = stack((c.centroid for c in movable), dim)  # [C, D]
    groups = kmeans(centroids, n, niter=50)  # [n, D]
    assign = np.argmax(centroids @ groups.T, axis=1)  # [C]
    per_label, per_title, size = _labels_per_cluster(s, [c.id for c in movable])
    members: list[list[Cluster]] = [[c for c, a in zip(movable, assign, strict=True) if a == g] for g in range(n)]
    members = [m for m in members if m]
    group_labels = [_merged(per_label.get(c.id) for c in m) for m in members]
    group_titles = [_merged(per_title.get(c.id) for c in m) for m in members]
    chunks = [sum(size.get(c.id, 0) for c in m) for m in members]
    names = name_groups(group_labels, chunks, group_titles)
    keywords = distinctive([Counter(k for c in m for k in (c.keywords or [])) for m in members])
    proposals = []
    for g, m in enumerate(members):
        moved = Counter(experts[c.expert_id] for c in m if c.expert_id is not None)
        diff["moved"] += [
            {"cluster_id": c.id, "from_expert_id": c.expert_id, "from_expert": experts[c.expert_id], "to": g}
            for c in m
            if c.expert_id is not None
        ]
        proposals.append(
            {
                "name": names[g],
                "keywords": keywords[g],
                "titles": [t for t, _ in group_titles[g].most_common(5)],
                "cluster_ids": [c.id for c in m],
                "chunks": chunks[g],
                "takes_from": dict(moved),
            }
        )
    # Kept mappings leave every expert its clusters; a regroup takes all of them.
    owners = set() if keep_mapped else {c.expert_id for c in clusters if c.expert_id is not None}
    diff["emptied_experts"] = [{"id": e, "name": experts[e]} for e in sorted(owners)]
    return {"proposals": proposals, "diff": diff}
