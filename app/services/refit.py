"""Re-fit the experts to the content, as one action: plan -> diff -> accept -> retrain.

Automation proposes; it never overrules the team (docs/decisions/expert-ownership.md). An owned
expert (app.core.models.Expert.owned: named, edited, defined, mapped or accepted by an operator)
keeps its lists exactly and every document it holds: nothing here deletes, renames or merges it,
or moves its documents. (A document stored since the last fitting that fits none of the experts,
a new topic, is not its own because it landed in its lists; a document it is defined by is.)
What a plan groups is the rest, a document at a time:

- the documents of experts nobody owns, which stay with their expert while they fit it;
- new content: documents that fit no expert (index.fit, the drift report's rules) or sit in
  lists no expert owns. It is grouped by topic (engine.topics): one new expert per topic of at
  least MIN_TOPIC_DOCUMENTS documents, named from the words that set it apart (c-TF-IDF); a
  smaller topic stays unassigned (the fallback answers it) and the plan lists it as such.

`experts=n` asks for n experts in all: the owned ones stay, and every document nobody owns is
grouped into the other n - owned by topic, each topic keeping the unowned expert that held most
of its chunks. Each group gets lists fitted on its own chunks (k-means, the automatic count),
and each document is placed in its group's lists.

`plan` computes all this in memory and changes nothing. `apply` computes it again on the store
as it is then and writes it in one transaction, with a version undo restores (lists included):
the experts the plan empties are deleted (never owned ones), every expert in the plan becomes
owned (the operator accepted it), and a router is trained and activated.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.clustering import expert_documents, reclustering
from app.clustering import expert_history as history
from app.clustering.indexing import IndexManager
from app.core.jobs import JobContext
from app.core.models import Cluster, Document, Expert, stack
from app.services.experts import DELETED_DOCUMENTS_GO_TO, create_expert, delete_expert
from app.services.routing import RouterManager
from engine.errors import NotTrainable
from engine.topics import MIN_TOPIC_DOCUMENTS, document_vectors, topic_names, topics
from index import auto_cluster_count, kmeans

log = logging.getLogger(__name__)
Progress = Callable[[int, int], None]

KEEP_SHARE = 0.5  # a topic keeps an unowned expert that held at least this share of its chunks
UNASSIGNED = -1  # the group of documents no expert holds: the fallback answers them
_DOCUMENT_TEXT = 5_000  # characters of a document that naming reads


@dataclass
class _Group:
    """One expert of the plan: kept (owned or not) or new; its documents and lists."""

    expert_id: int | None
    name: str
    owned: bool
    documents: list[int]
    lists: list[int] = field(default_factory=list)
    chunks: int = 0


@dataclass(frozen=True)
class _Store:
    """What a plan reads: chunk rows (reclustering.read_chunks) and vectors x [N, D], each chunk's
    document [N], the documents [M] with their vectors [M, D], each chunk's document row [N] and
    expert [N] (held), each document's expert [M] (holder), whether it fits it [M], whether it is
    a new topic stored since the fitting [M] (fresh) or one an expert is defined by [M], today's
    experts {id: (name, owned)}, titles, each expert's lists and the lists' centroids."""

    rows: list[Any]
    x: np.ndarray
    documents: np.ndarray
    doc_ids: np.ndarray
    doc_vectors: np.ndarray
    doc_of: np.ndarray
    held: np.ndarray
    holder: np.ndarray
    today: dict[int, tuple[str, bool]]
    fits: np.ndarray
    fresh: np.ndarray
    by_selector: np.ndarray
    titles: dict[int, str]
    lists_of: dict[int, list[int]]
    centroid_of: dict[int, Any]
    defined: set[int]

    @property
    def owned(self) -> set[int]:
        return {e for e, (_, owned) in self.today.items() if owned}


@dataclass
class _Plan:
    layout: reclustering.Clustering
    groups: list[_Group]
    unassigned: list[int]  # documents of topics too small to stand alone
    emptied: dict[int, str]  # unowned experts left without documents: deleted on apply
    titles: dict[int, str]
    keywords: list[list[str]]  # per group
    note: str | None
    defined: set[int]  # experts defined by documents: they keep theirs, with their lists

    def to_json(self) -> dict[str, Any]:
        sizes = np.bincount(self.layout.assigned, minlength=self.layout.k)
        out = []
        for g, group in enumerate(self.groups):
            out.append(
                {
                    "name": group.name,
                    "expert_id": group.expert_id,
                    "new": group.expert_id is None,
                    "owned": group.owned,
                    "documents": len(group.documents),
                    "lists": len(group.lists),
                    "chunks": int(sizes[group.lists].sum()) if group.lists else 0,
                    "titles": [self.titles.get(d, "") for d in group.documents[:5]],
                    "keywords": self.keywords[g],
                }
            )
        return {
            "chunks": len(self.layout.ids),
            "clusters": self.layout.k,
            "smallest_list": int(sizes.min(initial=0)),
            "experts": out,
            "emptied_experts": [
                {"id": e, "name": name, "documents_go_to": "the new groups above, or the fallback when unassigned"}
                for e, name in sorted(self.emptied.items())
            ],
            "owned_kept": [g.name for g in self.groups if g.owned],
            "unassigned": {
                "documents": len(self.unassigned),
                "titles": [self.titles.get(d, "") for d in self.unassigned[:10]],
                "why": f"topics of fewer than {MIN_TOPIC_DOCUMENTS} documents stay with the fallback",
            },
            "note": self.note,
        }


class Refit:
    def __init__(
        self, indexes: IndexManager, routers: RouterManager, new_topics: Callable[[], dict[int, float]] | None = None
    ) -> None:
        self.indexes, self.routers = indexes, routers
        self.new_topics = new_topics  # {document: fit margin} of documents newer than the experts (index.fit)

    def job(self, ctx: JobContext) -> dict[str, Any]:
        """The `refit` job: params experts (0: keep today's, new ones by topic), clusters (0:
        automatic), apply (False: the plan only), delete_emptied (True: unowned experts left empty)."""
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
            created = [g.expert_id is None for g in plan.groups]
            ids: list[int] = []

            def owners(s: Session) -> list[int | None]:
                history.record(s, "refit", _summary(plan), layout=True)
                if delete_emptied:
                    for e in plan.emptied:
                        delete_expert(s, e)
                    s.flush()
                for group in plan.groups:
                    if group.expert_id is None:
                        description = "Covers: " + "; ".join(plan.titles.get(d, "") for d in group.documents[:3])
                        group.expert_id = create_expert(s, {"name": group.name, "description": description[:1000]}).id
                    expert = s.get(Expert, group.expert_id)
                    if expert is not None:
                        expert.owned = True  # accepted from the plan
                    ids.append(group.expert_id)
                return [ids[g] if g >= 0 else None for g in plan.layout.groups]

            fresh, n = reclustering.commit(self.indexes, plan.layout, owners)
            report(50, 100)
        result = plan.to_json() | {"applied": True, "version": fresh.version, "deleted_emptied": delete_emptied}
        for entry, group, new in zip(result["experts"], plan.groups, created, strict=True):
            entry["expert_id"], entry["new"] = group.expert_id, new
        if delete_emptied:
            result["deleted_experts"] = [
                {"id": e, "name": name, "documents_go_to": DELETED_DOCUMENTS_GO_TO} for e, name in plan.emptied.items()
            ]
        result["defined_by_documents"] = sorted(plan.defined)
        result["router"] = self.routers.retrain(lambda d, t: report(50 + d * 50 // max(t, 1), 100))
        report(100, 100)
        log.info("experts re-fitted: %d lists, %d experts, %d chunks", plan.layout.k, len(plan.groups), n)
        return result

    def _plan(self, experts: int, clusters: int, progress: Progress | None) -> _Plan:
        report = progress or (lambda done, total: None)
        store = self._read()
        report(1, 4)
        groups, assign = _grouped(store, experts)
        report(2, 4)
        layout, keywords = self._lay_out(store, assign, groups, clusters)
        report(3, 4)
        self._name(store, assign, groups)
        kept_ids = {g.expert_id for g in groups}
        emptied = {e: name for e, (name, o) in store.today.items() if not o and e not in kept_ids}
        unassigned = store.doc_ids[assign == UNASSIGNED].tolist()
        report(4, 4)
        new = [g for g in groups if not g.owned]
        note = None
        if experts > 0 and len(groups) < experts:
            note = (
                f"{len(groups)} expert(s), not {experts}: {len(store.owned)} are owned by the team and stay as they "
                f"are; the documents nobody owns form only {len(new)} topic(s) of at least {MIN_TOPIC_DOCUMENTS} "
                "documents"
            )
        elif not new and unassigned:
            note = f"no new topic has {MIN_TOPIC_DOCUMENTS} documents yet: {len(unassigned)} stay with the fallback"
        return _Plan(layout, groups, unassigned, emptied, store.titles, keywords, note, store.defined)

    def _read(self) -> _Store:
        rows, owner = reclustering.read_chunks(self.indexes)
        if not rows:
            raise NotTrainable("nothing to re-fit: the store has no chunks; upload documents first")
        n = len(rows)
        x = stack((r[2] for r in rows), self.indexes.dim)  # [N, D]
        documents = np.fromiter((r[4] for r in rows), dtype=np.int64, count=n)  # [N]
        with self.indexes.sessions() as s:
            where, defined = expert_documents.pinned(s)
            experts = s.execute(select(Expert.id, Expert.name, Expert.owned)).all()
            today = {e: (name, bool(owned) or e in defined) for e, name, owned in experts}
            titles = dict(s.execute(select(Document.id, Document.title)).tuples().all())
            lists = s.execute(select(Cluster.id, Cluster.centroid, Cluster.expert_id)).all()
        held = np.array([owner.get(r[1]) or UNASSIGNED for r in rows], dtype=np.int64)  # [N] each chunk's expert
        doc_ids, doc_vectors = document_vectors(x, documents)  # [M], [M, D]
        doc_of = np.searchsorted(doc_ids, documents)  # [N] row of each chunk's document
        by_majority = reclustering.documents_held(rows, x, documents, owner, {c: v for c, v, _ in lists})
        by_majority |= where  # a document an expert is defined by is that expert's
        holder = np.fromiter((by_majority.get(int(d), UNASSIGNED) for d in doc_ids), dtype=np.int64, count=len(doc_ids))
        newer = self.new_topics() if self.new_topics else {}
        fresh = np.isin(doc_ids, [d for d, margin in newer.items() if margin < 0])  # [M]
        lists_of: dict[int, list[int]] = {}
        for c, _, owner_id in lists:
            if owner_id is not None:
                lists_of.setdefault(owner_id, []).append(c)
        return _Store(
            rows=rows,
            x=x,
            documents=documents,
            doc_ids=doc_ids,
            doc_vectors=doc_vectors,
            doc_of=doc_of,
            held=held,
            holder=holder,
            today=today,
            fits=~_new_content(rows, documents, doc_ids, fresh),
            fresh=fresh,
            by_selector=np.isin(doc_ids, list(where)),
            titles=titles,
            lists_of=lists_of,
            centroid_of={c: centroid for c, centroid, _ in lists},
            defined=defined,
        )

    def _lay_out(
        self, store: _Store, assign: np.ndarray, groups: list[_Group], clusters: int
    ) -> tuple[reclustering.Clustering, list[list[str]]]:
        """Lists for each group (an owned expert's as they are; k-means lists of the others' chunks),
        every chunk placed in its document's group. -> (the clustering, keywords per group)."""
        rows, x, lists_of = store.rows, store.x, store.lists_of
        chunk_group = assign[store.doc_of]  # [N]
        seed = self.indexes.settings.cluster_seed
        parts: list[np.ndarray] = []
        group_of_list: list[int] = []
        for g in [*range(len(groups)), UNASSIGNED]:
            mine = chunk_group == g
            group = groups[g] if g >= 0 else None
            if group is not None and group.owned and lists_of.get(group.expert_id or -1):
                mapped = sorted(lists_of[group.expert_id or -1])
                centroids = stack((store.centroid_of[c] for c in mapped), self.indexes.dim)
            elif mine.any():
                asked = max(1, round(clusters * mine.sum() / len(x))) if clusters else 0
                centroids = kmeans(x[mine], auto_cluster_count(int(mine.sum()), requested=asked), seed=seed)
            else:
                continue
            if group is not None:
                group.lists = list(range(len(group_of_list), len(group_of_list) + len(centroids)))
                group.chunks = int(mine.sum())
            parts.append(centroids)
            group_of_list += [g] * len(centroids)
        if not parts:
            raise NotTrainable("nothing to re-fit: no document is left to group")
        pins = {int(d): int(a) for d, a in zip(store.doc_ids, assign, strict=True)}
        layout = reclustering.lay_out(
            np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
            x,
            store.documents,
            [r[3] for r in rows],
            np.concatenate(parts).astype(np.float32),
            np.array(group_of_list, dtype=np.int64),
            (pins, set(range(len(groups)))),
        )
        keywords = [_merged_keywords(layout.keywords, group.lists) for group in groups]
        return layout, keywords

    def _name(self, store: _Store, assign: np.ndarray, groups: list[_Group]) -> None:
        """New groups get topic names (engine.topics), set apart from every other group and the rest."""
        unnamed = [g for g, group in enumerate(groups) if not group.name]
        if not unnamed:
            return
        headings: dict[int, set[str]] = {}
        texts: dict[int, list[str]] = {}
        for r in store.rows:
            if r[5]:
                headings.setdefault(r[4], set()).add(r[5].split(" > ")[-1])
            if sum(map(len, texts.setdefault(r[4], []))) < _DOCUMENT_TEXT:
                texts[r[4]].append(r[3])
        docs = [
            (store.titles.get(int(d), "") or "", sorted(headings.get(int(d), ())), " ".join(texts.get(int(d), [])))
            for d in store.doc_ids
        ]
        names = topic_names(docs, assign.tolist(), unnamed, [name for name, _ in store.today.values()])
        for g in unnamed:
            groups[g].name = names[g]


def _grouped(store: _Store, experts: int) -> tuple[list[_Group], np.ndarray]:
    """Every document's group: an owned expert's documents stay with it; the rest are grouped by
    topic (see the module doc). -> (groups, [M] group of each document, UNASSIGNED: none)."""
    owned = store.owned
    groups = [_Group(e, store.today[e][0], True, []) for e in sorted(owned)]
    assign = np.full(len(store.doc_ids), UNASSIGNED, dtype=np.int64)  # [M]
    stays = ~store.fresh | store.by_selector  # a new topic that landed in an owned expert's lists is not its own
    for g, group in enumerate(groups):
        assign[(store.holder == group.expert_id) & stays] = g
    open_docs = np.flatnonzero(assign == UNASSIGNED)  # rows of documents nobody owns
    if experts > 0:  # regroup everything nobody owns into the experts asked for beyond the owned
        found = topics(store.doc_vectors[open_docs], max(1, experts - len(owned)))
        for t in range(int(found.max(initial=-1)) + 1):
            members = open_docs[found == t]
            keep = _kept_expert(members, store, {g.expert_id for g in groups})
            groups.append(_Group(keep, store.today[keep][0] if keep else "", False, []))
            assign[members] = len(groups) - 1
    else:
        kept = open_docs[store.fits[open_docs] & (store.holder[open_docs] != UNASSIGNED)]
        for e in sorted(set(store.holder[kept].tolist())):  # unowned experts keep what still fits them
            groups.append(_Group(e, store.today[e][0], False, []))
            assign[kept[store.holder[kept] == e]] = len(groups) - 1
        new = np.setdiff1d(open_docs, kept)
        found = topics(store.doc_vectors[new])
        for t in range(int(found.max(initial=-1)) + 1):
            groups.append(_Group(None, "", False, []))
            assign[new[found == t]] = len(groups) - 1
    for g, group in enumerate(groups):
        group.documents = store.doc_ids[assign == g].tolist()
    return groups, assign


def _new_content(rows: list[Any], documents: np.ndarray, doc_ids: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """[M] whether each document is new content: most of its chunks fit their list below its floor,
    or it is newer than the experts and fits none of them (`fresh`; app.clustering.content_fit's rules)."""
    below = np.array([r[6] is not None and r[6] < 0 for r in rows], dtype=np.float64)  # [N]
    doc_of = np.searchsorted(doc_ids, documents)
    outside = np.bincount(doc_of, weights=below, minlength=len(doc_ids))
    size = np.bincount(doc_of, minlength=len(doc_ids))
    return np.asarray((2 * outside > size) | fresh, dtype=bool)


def _kept_expert(members: np.ndarray, store: _Store, taken: set[int | None]) -> int | None:
    """The unowned expert holding at least KEEP_SHARE of these documents' chunks (most first), else None."""
    mine = store.held[np.isin(store.doc_of, members)]
    votes = Counter(e for e in mine.tolist() if e != UNASSIGNED and e not in store.owned and e not in taken)
    for e, count in votes.most_common():
        if count >= KEEP_SHARE * len(mine):
            return int(e)
    return None


def _merged_keywords(per_list: list[list[str]], lists: list[int]) -> list[str]:
    counts = Counter(w for c in lists for w in per_list[c])
    return [w for w, _ in counts.most_common(5)]


def _summary(plan: _Plan) -> str:
    made = sum(g.expert_id is None for g in plan.groups)
    return (
        f"re-fit: {made} new expert(s), {len(plan.groups) - made} kept, {len(plan.emptied)} emptied, "
        f"{len(plan.unassigned)} document(s) unassigned"
    )
