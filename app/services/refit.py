"""Re-fit the experts to the content, as one action: recluster -> proposal -> diff -> accept -> retrain.

`plan` computes everything in memory and changes nothing: the lists (their count from the
corpus size unless given), the experts they group into, named from their documents' titles,
and the diff against today (experts kept, created, emptied). `apply` computes the same plan on
the store as it is then and writes it in one transaction (lists, experts, every chunk's list
and fit), deletes the experts it empties (unless told not to), and trains and activates a router.

A group keeps today's expert that already held most of its chunks, one group per expert,
counting only chunks that fit that expert's content (index.fit): a new topic that landed in an
old expert's lists is not that expert's content, so it gets an expert of its own.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.models import Document, Expert, stack
from app.services import expert_documents, expert_scopes, reclustering
from app.services.experts import create_expert, delete_expert
from app.services.indexing import IndexManager
from app.services.jobs import JobContext
from app.services.proposals import Group, ListFacts, fewer_note, group_lists, labels, named_groups
from app.services.routing import RouterManager
from engine.errors import NotTrainable
from engine.keywords import cluster_keywords
from index import ClusteredIndex, auto_cluster_count, kmeans

log = logging.getLogger(__name__)
Progress = Callable[[int, int], None]

NEW_TOPIC_JOIN = 0.5  # lists of new content whose centroids are at least this alike become one expert
KEEP_SHARE = 0.5  # a group keeps today's expert when that expert held at least this share of its chunks
DEFAULT_EXPERTS = 6  # experts asked for when neither the request nor today's experts say


@dataclass
class _Plan:
    layout: reclustering.Clustering
    groups: list[Group]
    group_of_list: np.ndarray  # [C] group of each list
    keeps: list[int | None]  # per group: today's expert it keeps, else None (a new expert)
    experts: dict[int, str]  # today's experts
    asked: int

    def emptied(self) -> list[int]:
        return sorted(set(self.experts) - {e for e in self.keeps if e is not None})

    def to_json(self) -> dict[str, Any]:
        sizes = np.bincount(self.layout.assigned, minlength=self.layout.k)
        out = []
        for g, group in enumerate(self.groups):
            lists = np.flatnonzero(self.group_of_list == g)
            keep = self.keeps[g]
            out.append(
                {
                    "name": self.experts[keep] if keep is not None else group.name,
                    "expert_id": keep,
                    "new": keep is None,
                    "lists": len(lists),
                    "chunks": int(sizes[lists].sum()),
                    "titles": group.titles,
                    "keywords": group.keywords,
                }
            )
        smallest = int(sizes.min(initial=0))
        return {
            "chunks": len(self.layout.ids),
            "clusters": self.layout.k,
            "smallest_list": smallest,
            "experts": out,
            "emptied_experts": [{"id": e, "name": self.experts[e]} for e in self.emptied()],
            "note": fewer_note(self.asked, len(self.groups), self.layout.k, len(self.layout.ids)),
        }


class Refit:
    def __init__(
        self, indexes: IndexManager, routers: RouterManager, new_topics: Callable[[], dict[int, float]] | None = None
    ) -> None:
        self.indexes, self.routers = indexes, routers
        self.new_topics = new_topics  # {document: fit margin} of documents newer than the experts (index.fit)

    def job(self, ctx: JobContext) -> dict[str, Any]:
        """The `refit` job: params experts, clusters (0: automatic), apply (False: the plan only),
        delete_emptied (True)."""
        p = ctx.params
        experts, clusters = int(p.get("experts") or 0), int(p.get("clusters") or 0)
        if not p.get("apply"):
            return self.plan(experts, clusters, ctx.progress) | {"applied": False}
        return self.apply(experts, clusters, bool(p.get("delete_emptied", True)), ctx.progress)

    def plan(self, experts: int = 0, clusters: int = 0, progress: Progress | None = None) -> dict[str, Any]:
        """What `apply` would do now, changing nothing."""
        with self.indexes.write_lock:  # the store as one writer sees it
            return self._plan(experts, clusters, progress).to_json()

    def apply(
        self, experts: int = 0, clusters: int = 0, delete_emptied: bool = True, progress: Progress | None = None
    ) -> dict[str, Any]:
        """Plan and write it; then train and activate a router. -> the plan as applied, and the router."""
        report = progress or (lambda done, total: None)
        with self.indexes.write_lock:
            plan = self._plan(experts, clusters, lambda d, t: report(d * 40 // t, 100))
            created: dict[int, int] = {}

            def owners(s: Session) -> list[int | None]:
                if delete_emptied:
                    for e in plan.emptied():
                        delete_expert(s, e)
                    s.flush()
                taken = set(s.scalars(select(Expert.name)))
                ids: list[int | None] = []
                for g, group in enumerate(plan.groups):
                    keep = plan.keeps[g]
                    if keep is None:
                        name, i = group.name, 2
                        while name in taken:
                            name, i = f"{group.name} ({i})", i + 1
                        taken.add(name)
                        description = "Covers: " + "; ".join(group.titles[:3])
                        keep = created[g] = create_expert(s, {"name": name, "description": description[:1000]}).id
                    ids.append(keep)
                return [ids[int(g)] if g >= 0 else None for g in plan.group_of_list]

            fresh, n = reclustering.commit(self.indexes, plan.layout, owners)
            version = fresh.version
            with self.indexes.sessions() as s:
                carved = sorted(set(expert_documents.pinned(s)[0].values()))
            for e in carved:  # their documents' chunks were placed in the new lists: their own again
                version = expert_scopes.carve(self.indexes, e)["version"]
            report(50, 100)
        result = plan.to_json() | {"applied": True, "version": version, "deleted_emptied": delete_emptied}
        result["defined_by_documents"] = carved
        for g, e in created.items():
            result["experts"][g]["expert_id"] = e
        with self.routers.sessions() as s:
            names = dict(s.execute(select(Expert.id, Expert.name)).tuples().all())
        for entry in result["experts"]:
            entry["name"] = names.get(entry["expert_id"], entry["name"])
        result["router"] = self.routers.retrain(lambda d, t: report(50 + d * 50 // max(t, 1), 100))
        report(100, 100)
        log.info("experts re-fitted: %d lists, %d experts, %d chunks", plan.layout.k, len(plan.groups), n)
        return result

    def _plan(self, experts: int, clusters: int, progress: Progress | None) -> _Plan:
        report = progress or (lambda done, total: None)
        rows, owner = reclustering.read_chunks(self.indexes)
        with self.indexes.sessions() as s:
            where, defined = expert_documents.pinned(s)
        rows = [r for r in rows if r[4] not in where]  # experts defined by documents keep theirs (`apply`)
        if not rows:
            raise NotTrainable("nothing to re-fit: the store has no chunks outside experts defined by documents")
        report(1, 4)
        n = len(rows)
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=n)
        x = stack((r[2] for r in rows), self.indexes.dim)  # [N, D]
        documents = np.fromiter((r[4] for r in rows), dtype=np.int64, count=n)
        with self.indexes.sessions() as s:
            today = {e: name for e, name in s.execute(select(Expert.id, Expert.name)) if e not in defined}
            titles = dict(s.execute(select(Document.id, Document.title)).tuples().all())
        # Today's expert of each chunk, where the chunk fits its list (unknown fit counts as fitting)
        # or its document does: a few outliers of a document that fits are not new content; a
        # document newer than the experts that fits none of them is (the drift report's rules,
        # app.services.content_fit).
        below = np.array([r[6] is not None and r[6] < 0 for r in rows], dtype=bool)  # [N]
        new = [d for d, m in (self.new_topics() if self.new_topics is not None else {}).items() if m < 0]
        fitting = ~(below & outgrown_documents(documents, below)) & ~np.isin(documents, new)  # [N]
        held = [owner.get(r[1]) if ok else None for r, ok in zip(rows, fitting, strict=True)]
        extend = experts == 0 and bool(today) and not fitting.all()
        if extend:  # the content that fits no expert gets lists of its own, so it is not split into old ones
            known = reclustering.cluster(self.indexes, x[fitting], clusters)  # [C1, D]
            fresh = kmeans(
                x[~fitting], auto_cluster_count(int((~fitting).sum())), seed=self.indexes.settings.cluster_seed
            )
            centroids = np.concatenate([known, fresh])  # [C, D]
        else:
            centroids = reclustering.cluster(self.indexes, x, clusters)  # [C, D]
        k = len(centroids)
        nearest = ClusteredIndex.create(centroids, "").assign(x)  # [N]
        report(2, 4)
        facts = _facts(rows, nearest, k, titles)
        asked = experts or (len(today) if len(today) >= 2 else DEFAULT_EXPERTS)
        if extend:
            groups, keeps, group_of_list = _extend(nearest, held, facts, centroids, k - len(fresh))
            asked = len(groups)
        else:
            groups = group_lists(centroids, facts, asked)
            group_of_list = np.zeros(k, dtype=np.int64)
            for g, group in enumerate(groups):
                group_of_list[group.lists] = g
            keeps = _match(group_of_list[nearest], held, len(groups))
        report(3, 4)
        layout = reclustering.lay_out(ids, x, documents, [r[3] for r in rows], centroids, group_of_list)
        report(4, 4)
        return _Plan(layout, groups, group_of_list, keeps, today, asked)


def _facts(rows: list[Any], lists: np.ndarray, k: int, titles: dict[int, str]) -> list[ListFacts]:
    """Per list (chunks by their nearest list): what naming reads."""
    per_label = [Counter[str]() for _ in range(k)]
    per_title = [Counter[str]() for _ in range(k)]
    for r, c in zip(rows, lists, strict=True):
        title = titles.get(r[4], "") or ""
        per_label[c].update(labels(title, r[5] or ""))
        per_title[c][title] += 1
    keywords = cluster_keywords([r[3] for r in rows], lists, k)
    sizes = np.bincount(lists, minlength=k)
    return [ListFacts(per_label[c], per_title[c], int(sizes[c]), keywords[c]) for c in range(k)]


def _match(group: np.ndarray, held: list[int | None], n_groups: int) -> list[int | None]:
    """[N] each chunk's group and today's expert holding it -> per group, the expert it keeps.

    One group per expert and one expert per group, largest overlaps first; a group keeps an
    expert only when that expert held at least KEEP_SHARE of the group's chunks.
    """
    overlap = Counter((int(g), e) for g, e in zip(group, held, strict=True) if e is not None)
    size = np.bincount(group, minlength=n_groups)
    keeps: list[int | None] = [None] * n_groups
    used: set[int] = set()
    for (g, e), count in sorted(overlap.items(), key=lambda kv: (-kv[1], kv[0])):
        if keeps[g] is None and e not in used and count >= KEEP_SHARE * size[g]:
            keeps[g] = e
            used.add(e)
    return keeps


def _extend(
    nearest: np.ndarray, held: list[int | None], facts: list[ListFacts], centroids: np.ndarray, first_new: int
) -> tuple[list[Group], list[int | None], np.ndarray]:
    """Today's experts keep the lists their fitting content dominates; the lists from `first_new`
    on (the content that fits no expert) become new experts, lists joined when their centroids
    are alike (NEW_TOPIC_JOIN). -> (groups, the expert each keeps or None, [C] group of each list, -1: none)."""
    k = len(facts)
    dominant: list[int | None] = []
    for c in range(first_new):
        votes = Counter(e for e, at in zip(held, nearest, strict=True) if at == c)
        dominant.append(votes.most_common(1)[0][0] if votes else None)
    experts = sorted({e for e in dominant if e is not None})
    members = [[c for c in range(first_new) if dominant[c] == e] for e in experts]
    occupied = [c for c in range(first_new, k) if facts[c].chunks]  # a new list nothing is nearest to stays empty
    members += [[occupied[i] for i in m] for m in _components(centroids[occupied], NEW_TOPIC_JOIN)]
    groups = named_groups(members, facts)
    keeps: list[int | None] = [*experts, *([None] * (len(groups) - len(experts)))]
    group_of_list = np.full(k, -1, dtype=np.int64)
    for g, group in enumerate(groups):
        group_of_list[group.lists] = g
    return groups, keeps, group_of_list


def _components(centroids: np.ndarray, join: float) -> list[list[int]]:
    """Positions of centroids [M, D] joined where two cosines are at least `join`, transitively."""
    parent = list(range(len(centroids)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    sims = centroids @ centroids.T  # [M, M]
    for i, j in zip(*np.nonzero(np.triu(sims >= join, 1)), strict=True):
        parent[root(int(i))] = root(int(j))
    found: dict[int, list[int]] = {}
    for i in range(len(centroids)):
        found.setdefault(root(i), []).append(i)
    return list(found.values())


def outgrown_documents(documents: np.ndarray, below: np.ndarray) -> np.ndarray:
    """[N] each chunk's document, [N] chunk below its floor -> [N] whether most of its document is."""
    _, inverse, counts = np.unique(documents, return_inverse=True, return_counts=True)
    outside = np.bincount(inverse.reshape(-1), weights=below.astype(np.float64), minlength=len(counts))
    return np.asarray((2 * outside > counts)[inverse.reshape(-1)], dtype=bool)
