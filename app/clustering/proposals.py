"""Automatic expert proposals: clusters grouped by centroid, named from their documents' titles and
headings, and the change they would make to today's mapping (the diff an operator accepts)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.models import Chunk, Cluster, Document, Expert, stack
from index import kmeans

# A title or heading splits into labels at these: "json — JSON encoder — Python 3.11 documentation".
_SEPARATORS = re.compile(r"\s+[—–|>-]\s+|:\s+")
_NUMBERING = re.compile(r"^(?:[\dA-Z]+\.)+\d*\s+|^\d+(?:\.\d+)*\s+")  # "8.5. ", "19.12 ", "A.1. "
MAX_NAME = 80


def labels(title: str, heading: str) -> set[str]:
    """The labels one chunk offers a name: its title's parts and its top heading (numbering
    dropped). Never its source's folder: "docs/" names where files were kept, not what they say."""
    parts = [p for p in _SEPARATORS.split(title) if p]
    top = heading.split(" > ")[0] if heading else ""
    found = {_NUMBERING.sub("", p).strip() for p in [*parts, top]}
    return {p for p in found if 2 <= len(p) <= MAX_NAME}


def name_groups(
    groups: list[Counter[str]],
    chunks: list[int],
    titles: list[Counter[str]],
    keywords: list[list[str]] | None = None,
) -> list[str]:
    """A name per group, no two alike: its most distinctive labels, else its most common titles,
    else its keywords.

    groups[g]: chunks of group g per label; chunks[g]: its chunks; titles[g]: chunks per title;
    keywords[g]: its distinctive keywords. A label names a group when it covers at least a fifth
    of the group's chunks and 60% of its own chunks lie in that group (coverage x purity ranks
    them); up to two labels are kept. A name two groups share gets each group's first keyword
    the other lacks.
    """
    everywhere: Counter[str] = Counter()
    for group in groups:
        everywhere.update(group)
    names = []
    for g, counts in enumerate(groups):
        n = max(chunks[g], 1)
        scored = sorted(
            ((cnt / n) * (cnt / everywhere[label]), label)
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
            chosen = [t for t, _ in titles[g].most_common(2) if t]
        if not chosen and keywords:
            chosen = keywords[g][:2]
        names.append(" · ".join(chosen)[:MAX_NAME] or f"group {g + 1}")
    return _distinct(names, keywords or [[] for _ in names])


def _distinct(names: list[str], keywords: list[list[str]]) -> list[str]:
    """Names made unique: a shared one takes the group's first keyword not already in it, else a number."""
    seen = Counter(names)
    out, taken = [], set()
    for name, words in zip(names, keywords, strict=True):
        if seen[name] > 1:
            extra = next((w for w in words if w.lower() not in name.lower() and f"{name} · {w}" not in taken), None)
            name = f"{name} · {extra}" if extra else name
        base, i = name, 2
        while name in taken:
            name, i = f"{base} ({i})", i + 1
        taken.add(name)
        out.append(name)
    return out


def _labels_per_cluster(
    s: Session, clusters: list[int]
) -> tuple[dict[int, Counter[str]], dict[int, Counter[str]], dict[int, int]]:
    """Per cluster (of these): chunks per label, chunks per document title, chunks."""
    per_label: dict[int, Counter[str]] = {}
    per_title: dict[int, Counter[str]] = {}
    size: dict[int, int] = {}
    rows = s.execute(
        select(Chunk.cluster_id, Document.title, Chunk.heading, func.count(Chunk.id))
        .join(Document, Document.id == Chunk.document_id)
        .where(Chunk.cluster_id.in_(clusters))
        .group_by(Chunk.cluster_id, Document.title, Chunk.heading)
    )
    for cluster, title, heading, n in rows:
        for label in labels(title or "", heading or ""):
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


@dataclass(frozen=True)
class ListFacts:
    """What naming reads of one list: chunks per label, chunks per document title, chunks, keywords."""

    labels: Counter[str]
    titles: Counter[str]
    chunks: int
    keywords: list[str]


@dataclass(frozen=True)
class Group:
    """A proposed expert: its lists (positions in the caller's order), name, keywords, titles, chunks."""

    lists: list[int]
    name: str
    keywords: list[str]
    titles: list[str]
    chunks: int


def group_lists(centroids: np.ndarray, facts: list[ListFacts], n: int) -> list[Group]:
    """centroids [C, D] of lists with their facts -> up to n groups by k-means over the centroids,
    each named (`name_groups`); empty groups are dropped, so fewer than n may come back."""
    n = max(1, min(n, len(facts)))
    centres = kmeans(centroids, n, niter=50)  # [n, D]
    assign = np.argmax(centroids @ centres.T, axis=1)  # [C]
    return named_groups([m for m in ([i for i, a in enumerate(assign) if a == g] for g in range(n)) if m], facts)


def named_groups(members: list[list[int]], facts: list[ListFacts]) -> list[Group]:
    """Groups of lists (positions into `facts`) -> each named against the others (`name_groups`)."""
    group_labels = [_merged(facts[i].labels for i in m) for m in members]
    group_titles = [_merged(facts[i].titles for i in m) for m in members]
    chunks = [sum(facts[i].chunks for i in m) for m in members]
    keywords = distinctive([Counter(k for i in m for k in facts[i].keywords) for m in members])
    names = name_groups(group_labels, chunks, group_titles, keywords)
    return [
        Group(m, names[g], keywords[g], [t for t, _ in group_titles[g].most_common(5) if t], chunks[g])
        for g, m in enumerate(members)
    ]


def fewer_note(asked: int, made: int, lists: int, chunks: int) -> str | None:
    """Why a proposal made fewer experts than asked, and what to change (None: as many as asked)."""
    if made >= asked:
        return None
    if lists < asked:
        return (
            f"{made} expert(s), not {asked}: there are only {lists} list(s) to group ({chunks} chunks). "
            f"Recluster into more lists (the clusters parameter, at least {asked}) or refit the experts "
            "(POST /admin/api/experts/refit), which picks the lists and the experts together."
        )
    return (
        f"{made} expert(s), not {asked}: the lists' centroids form only {made} distinct groups; "
        "recluster into more lists or ask for fewer experts."
    )


def propose(s: Session, n: int, dim: int, keep_mapped: bool = True) -> dict[str, Any]:
    """Group clusters into n proposed experts by their centroids, with the diff against today.

    keep_mapped: clusters an expert already owns stay where they are and only unmapped clusters
    are grouped (the operator's mapping is never undone unless asked); otherwise the clusters of
    experts nobody owns are regrouped too, and `diff` lists each cluster taken from its expert and
    the experts left empty (deleted on apply). An owned expert's clusters never move.
    """
    clusters = s.scalars(select(Cluster).order_by(Cluster.id)).all()
    owned = {e: name for e, name in s.execute(select(Expert.id, Expert.name).where(Expert.owned))}
    movable = [c for c in clusters if c.expert_id is None or not (keep_mapped or c.expert_id in owned)]
    experts: dict[int, str] = {e: name for e, name in s.execute(select(Expert.id, Expert.name))}
    diff: dict[str, Any] = {
        "keep_mapped": keep_mapped,
        "kept_clusters": len(clusters) - len(movable),
        "owned_kept": [{"id": e, "name": name} for e, name in sorted(owned.items())],
        "moved": [],
    }
    if not movable:
        why = "every cluster belongs to an expert the team owns" if owned and not keep_mapped else "no unmapped cluster"
        return {"proposals": [], "diff": diff | {"emptied_experts": []}, "note": f"nothing to group: {why}"}
    per_label, per_title, size = _labels_per_cluster(s, [c.id for c in movable])
    facts = [
        ListFacts(per_label.get(c.id, Counter()), per_title.get(c.id, Counter()), size.get(c.id, 0), c.keywords or [])
        for c in movable
    ]
    groups = group_lists(stack((c.centroid for c in movable), dim), facts, n)
    proposals = []
    for g, group in enumerate(groups):
        m = [movable[i] for i in group.lists]
        moved = Counter(experts[c.expert_id] for c in m if c.expert_id is not None)
        diff["moved"] += [
            {"cluster_id": c.id, "from_expert_id": c.expert_id, "from_expert": experts[c.expert_id], "to": g}
            for c in m
            if c.expert_id is not None
        ]
        proposals.append(
            {
                "name": group.name,
                "keywords": group.keywords,
                "titles": group.titles,
                "cluster_ids": [c.id for c in m],
                "chunks": group.chunks,
                "takes_from": dict(moved),
            }
        )
    # Kept mappings leave every expert its clusters; a regroup takes all of an unowned expert's.
    owners = set() if keep_mapped else {c.expert_id for c in movable if c.expert_id is not None}
    diff["emptied_experts"] = [{"id": e, "name": experts[e]} for e in sorted(owners)]
    note = fewer_note(n, len(groups), len(movable), sum(size.values()))
    return {"proposals": proposals, "diff": diff, "note": note}
