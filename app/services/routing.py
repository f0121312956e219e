"""Router versions: training (a job), storage, atomic activation; the serving state loads the active one."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import distinct, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.core.jobs import JobContext
from app.core.models import Chunk, Cluster, Expert, RouterExample, RouterVersion, cluster_owners, stack
from app.core.paging import scalar_page
from app.core.settings import Settings
from engine.adapter import AdapterConfig, fit
from engine.embedder import Embedder
from engine.errors import NotTrainable
from engine.lexical import LexicalIndex
from engine.router import LEXICAL_VOTE_CHUNKS, VOTE_CHUNKS, Router, bm25_hits
from engine.router_training import TrainConfig, TrainingSet, train, without_self
from engine.samples import Sample, heading_queries, held_out_documents, query_like_samples
from engine.sharded_lexical import ShardedLexical
from index.store import ClusteredIndex

log = logging.getLogger(__name__)
Progress = Callable[[int, int], None]

ONE_EXPERT = (
    "fewer than two experts own lists: there is no gate to train, and every question is answered from the "
    "whole store (route reason one_expert); re-fit the experts (POST /admin/api/experts/refit) to make more"
)


@dataclass
class _Corpus:
    """What router training reads, in one session."""

    expert_ids: list[int]  # class position -> expert id (the last class, "none", has no expert)
    lists: Sequence[Any]  # (cluster id, centroid, expert id) by cluster id
    rows: Sequence[Any]  # (cluster id, embedding, text, heading, document id, chunk id) by chunk id
    examples: Sequence[Any]  # (question, expert id)
    labels: npt.NDArray[np.int64]  # [N] class of each chunk

    def expert_of(self, label: int) -> int | None:
        return self.expert_ids[label] if label < len(self.expert_ids) else None


class RouterManager:
    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        embedder: Embedder,
        index: Callable[[], ClusteredIndex] | None = None,
        lexical: Callable[[], LexicalIndex | ShardedLexical | None] | None = None,
        drift: Callable[[], dict[str, Any]] | None = None,
        active: Callable[[], Router | None] = lambda: None,
    ) -> None:
        self.settings, self.sessions, self.embedder = settings, sessions, embedder
        self.drift = drift  # the content-fit report (app.clustering.content_fit): None reports none
        self.index = index  # for the gate's vote: None trains a gate without one
        self.lexical = lexical  # for the gate's BM25 vote: None (or no BM25 index) trains one without
        self.active = active  # the serving state's router (app.serving.states)

    # ---- the active version, shared by every worker through the database ------------------------------

    def current(self) -> Router | None:
        """The active router, as of the serving state this process publishes."""
        return self.active()

    def staleness(self) -> dict[str, Any]:
        """Was the active router trained on the cluster -> expert mapping in force now, and do the
        experts still fit the content?

        A router keeps its own copy of the mapping (it never mixes with another), so after a
        cluster moves to another expert, or a recluster, it routes by the old one until it is
        retrained. Returns router_version, stale (None: a router too old to tell),
        changed_clusters (whose expert differs from the router's copy), the reason in words, and
        drift: the documents whose content fits no expert (outgrown: enough of them to make an
        expert of their own, app.clustering.content_fit.DRIFT_SHARE; then a re-fit is due).
        """
        out = self._staleness()
        drift = self.drift() if self.drift is not None else None
        if drift is None or not drift.get("meaningful", drift["documents"]):
            return out | {"outgrown": False, "drift": drift}
        reason = drift["summary"] if out["reason"] in ("up to date", "no active router") else out["reason"]
        return out | {"outgrown": True, "drift": drift, "reason": reason}

    def _staleness(self) -> dict[str, Any]:
        router = self.current()
        if router is None:
            return {"router_version": None, "stale": False, "changed_clusters": [], "reason": "no active router"}
        trained = router.net.list_class.tolist()  # [L] class of each list at training
        with self.sessions() as s:
            owners = cluster_owners(s)
        out: dict[str, Any] = {"router_version": router.version_id}
        if not trained:
            return out | {"stale": None, "changed_clusters": [], "reason": "the router keeps no copy of its mapping"}
        if len(trained) != len(owners):
            reason = f"reclustered since training ({len(trained)} clusters then, {len(owners)} now); retrain it"
            return out | {"stale": True, "changed_clusters": sorted(owners), "reason": reason}
        changed = [c for c, e in sorted(owners.items()) if 0 <= c < len(trained) and router.expert_of(trained[c]) != e]
        reason = f"{len(changed)} cluster(s) changed expert since training; retrain it" if changed else "up to date"
        return out | {"stale": bool(changed), "changed_clusters": changed, "reason": reason}

    def versions(self, offset: int = 0, limit: int | None = None) -> tuple[int, list[RouterVersion]]:
        """(versions stored, one page of them, newest first)."""
        with self.sessions() as s:
            return scalar_page(s, select(RouterVersion).order_by(RouterVersion.id.desc()), offset, limit)

    def activate(self, version_id: int) -> None:
        """Exactly one version is active after this transaction; every process follows the catalogue to it."""
        with self.sessions.begin() as s:
            if s.get(RouterVersion, version_id) is None:
                raise LookupError(f"router version {version_id} not found")
            s.execute(update(RouterVersion).values(active=False))
            s.execute(update(RouterVersion).where(RouterVersion.id == version_id).values(active=True))

    # ---- training --------------------------------------------------------------------------------------

    def _corpus(self, exclude_documents: Collection[int] = ()) -> _Corpus:
        """Experts, lists, chunks (labelled by their list's expert) and labelled questions, in one read."""
        with self.sessions() as s:
            expert_ids = list(s.scalars(select(Expert.id).order_by(Expert.id)))
            lists = s.execute(select(Cluster.id, Cluster.centroid, Cluster.expert_id).order_by(Cluster.id)).all()
            query = select(
                Chunk.cluster_id, Chunk.embedding, Chunk.text, Chunk.heading, Chunk.document_id, Chunk.id
            ).order_by(Chunk.id)
            if exclude_documents:
                query = query.where(Chunk.document_id.not_in(list(exclude_documents)))
            rows = s.execute(query).all()
            examples = s.execute(select(RouterExample.question, RouterExample.expert_id)).all()
        if not expert_ids or not any(r[2] is not None for r in lists):
            raise NotTrainable("map at least one cluster to an expert before training the router")
        position = {e: i for i, e in enumerate(expert_ids)}
        none = len(expert_ids)
        list_class = {r[0]: position[r[2]] if r[2] is not None else none for r in lists}
        labels = np.array([list_class.get(r[0], none) for r in rows], dtype=np.int64)
        return _Corpus(expert_ids, lists, rows, examples, labels)

    def _split(self, corpus: _Corpus) -> tuple[list[Sample], npt.NDArray[np.bool_], set[int]]:
        """Query-like samples drawn from the chunks, which are held out (calibration), and the held documents.

        Held out by document: calibration then measures documents the gate never trained on,
        which is what real questions are mostly about.
        """
        rows = corpus.rows
        documents = [r[4] for r in rows]
        texts, headings = [r[2] for r in rows], [r[3] for r in rows]
        samples = query_like_samples(texts, headings, self.settings.router_samples, seed=self.settings.router_seed)
        held = held_out_documents(
            documents, corpus.labels.tolist(), self.settings.router_holdout, seed=self.settings.router_seed
        )
        calib = np.array([documents[smp.source] in held for smp in samples], dtype=bool)
        if not calib.any():  # too few documents to hold any out: hold out samples instead
            calib = np.random.default_rng(self.settings.router_seed).random(len(samples)) < self.settings.router_holdout
        return samples, calib, held

    def labelled_samples(self) -> tuple[list[Sample], npt.NDArray[np.bool_], list[int | None]]:
        """The samples training draws, which of them calibrate, and each one's expert id (None: no expert)."""
        corpus = self._corpus()
        samples, calib, _ = self._split(corpus)
        return samples, calib, [corpus.expert_of(int(corpus.labels[smp.source])) for smp in samples]

    def training_set(
        self, corpus: _Corpus, progress: Progress | None = None
    ) -> tuple[TrainingSet, list[int], dict[str, int]]:
        """Chunks labelled by their cluster's expert, query-like samples from them, labelled questions."""
        report = progress or (lambda d, t: None)
        rows, labels, examples = corpus.rows, corpus.labels, corpus.examples
        position = {e: i for i, e in enumerate(corpus.expert_ids)}
        none = len(corpus.expert_ids)
        dim = self.embedder.dim
        chunk_x = stack((r[1] for r in rows), dim)

        samples, sample_calib, held = self._split(corpus)
        # Chunks of held-out documents are not trained on: they calibrate, with the samples drawn
        # from them (samples alone are harder than real questions: the router came out
        # under-confident, ECE 0.11 on the dev questions; with the chunks 0.055).
        held_chunks = np.array([r[4] in held for r in rows], dtype=bool)
        texts = [smp.text for smp in samples] + [q for q, _ in examples]
        vectors = np.zeros((0, dim), dtype=np.float32)
        for start in range(0, len(texts), 256):  # embedded in slices so progress can be shown
            vectors = np.concatenate([vectors, self.embedder.encode(texts[start : start + 256])])
            report(min(start + 256, len(texts)), len(texts))
        sample_y = np.array([labels[smp.source] for smp in samples], dtype=np.int64)
        example_y = np.array([position.get(e, none) for _, e in examples], dtype=np.int64)
        # Labelled questions: a random share of them calibrates too.
        example_calib = (
            np.random.default_rng(self.settings.router_seed + 1).random(len(examples)) < self.settings.router_holdout
        )
        x = np.concatenate([chunk_x, vectors]) if len(vectors) else chunk_x
        y = np.concatenate([labels, sample_y, example_y])
        calib = np.concatenate([held_chunks, sample_calib, example_calib])
        info = {
            "chunks": int((~held_chunks).sum()),
            "held_out_documents": len(held),
            "samples": len(samples),
            "examples": len(examples),
            "holdout": int(calib.sum()),
        }
        lists = corpus.lists
        centroids = stack((r[1] for r in lists), dim)
        list_class = np.array([position[r[2]] if r[2] is not None else none for r in lists], dtype=np.int64)
        data = TrainingSet(x.astype(np.float32), y, calib, none + 1, centroids, list_class)
        # Each held-out row's own chunk (a sample's source; none for a labelled question) is not
        # its own neighbour: the vote is fitted as questions meet it, on other chunks.
        own = np.concatenate(
            [
                np.array([r[5] for r in rows], dtype=np.int64),
                np.array([rows[smp.source][5] for smp in samples], dtype=np.int64),
                np.full(len(examples), -1, dtype=np.int64),
            ]
        )
        self._probe(data, own)
        self._lexical_probe(data, own, texts, len(rows))
        return data, corpus.expert_ids, info

    def _probe(self, data: TrainingSet, own: npt.NDArray[np.int64]) -> None:
        """The held-out rows' nearest chunks (themselves excluded), for fitting the gate's vote."""
        index = self.index() if self.index is not None else None
        lists = index.probe_budget(self.settings.router_probe_lists) if index is not None else 0
        if index is None or lists <= 0 or index.ntotal <= VOTE_CHUNKS:
            return
        held = np.flatnonzero(data.calib)  # [H]
        scores, ids, _ = index.search_nearest(data.x[held], VOTE_CHUNKS + 1, lists)  # [H, M+1]
        scores, ids = without_self(scores, ids, own[held], VOTE_CHUNKS)  # [H, M]
        data.neighbours = (scores, index.clusters_of(ids))
        data.probe = (lists, VOTE_CHUNKS)

    def _lexical_probe(
        self, data: TrainingSet, own: npt.NDArray[np.int64], texts: Sequence[str], n_chunks: int
    ) -> None:
        """The held-out question-like rows' BM25 best chunks (their own excluded), for fitting the
        gate's BM25 vote. Whole chunks get none: a passage's hundred words are not a question."""
        index = self.index() if self.index is not None else None
        lexical = self.lexical() if self.lexical is not None else None
        if index is None or lexical is None or len(lexical) <= LEXICAL_VOTE_CHUNKS:
            return
        held = np.flatnonzero(data.calib)  # [H]
        queries = [lexical.terms(texts[i - n_chunks]) if i >= n_chunks else None for i in held.tolist()]
        scores, ids = bm25_hits(queries, LEXICAL_VOTE_CHUNKS + 1)  # [H, M+1]
        scores, ids = without_self(scores, ids, own[held], LEXICAL_VOTE_CHUNKS)  # [H, M]
        data.lexical = (scores, index.clusters_of(ids))  # padding (-1) is in no list

    def retrain(self, progress: Progress | None = None) -> dict[str, Any]:
        """After the experts changed shape (a re-fit, an expert scoped to its documents): a version
        trained and activated when two experts or more own lists; -> its summary, or why not."""
        with self.sessions() as s:
            owning = s.scalar(select(func.count(distinct(Cluster.expert_id))).where(Cluster.expert_id.is_not(None)))
        if (owning or 0) < 2:
            return {"skipped": ONE_EXPERT}
        trained = self.train(progress, activate=True, force=True)
        return {k: trained[k] for k in ("version", "active", "accuracy", "held_back") if k in trained}

    def train(
        self,
        progress: Progress | None = None,
        *,
        activate: bool = True,
        exclude_documents: Collection[int] = (),
        force: bool = False,
    ) -> dict[str, Any]:
        """Train a version; with `activate`, it goes live unless it is worse than the active one on
        held-out metrics (`held_back` in the result says by how much; `force` activates anyway).
        `exclude_documents` keeps those documents out of training and calibration alike (an
        evaluation can then ask about documents the router never saw)."""
        report = progress or (lambda d, t: None)
        # Progress: embedding the samples 0-40%, the epochs 40-70%, the query adapter 70-100%.
        corpus = self._corpus(exclude_documents)  # one read serves the gate and the adapter
        if len({r[2] for r in corpus.lists if r[2] is not None}) < 2:
            raise NotTrainable(ONE_EXPERT)
        data, expert_ids, info = self.training_set(corpus, lambda d, t: report(d * 40 // max(t, 1), 100))
        cfg = TrainConfig(threshold=self.settings.route_threshold, seed=self.settings.router_seed)
        net, temperature, metrics = train(data, cfg, lambda d, t: report(40 + d * 30 // t, 100))
        metrics.update(info)
        chunks = data.x[: len(corpus.rows)]  # [M, D] the chunk rows lead the training matrix
        adapter, adapter_metrics = self.fit_adapter(corpus, chunks, lambda d, t: report(70 + d * 30 // max(t, 1), 100))
        metrics.update(adapter_metrics)
        router = Router(net, temperature, expert_ids, adapter=adapter)
        held_back = None if force or not activate else self.worse_than_active(metrics)
        if held_back is not None:
            metrics["held_back"] = held_back  # the console shows why it waits, beside its figures
        with self.sessions.begin() as s:
            version = RouterVersion(
                weights=router.state_bytes(),
                dim=data.x.shape[1],
                hidden=cfg.hidden,
                expert_ids=expert_ids,
                temperature=temperature,
                metrics=metrics,
                active=False,
            )
            s.add(version)
            s.flush()
            version_id = version.id
        activate = activate and held_back is None
        if activate:
            self.activate(version_id)
        elif held_back is not None:
            log.warning("router version %d trained but not activated: %s", version_id, held_back["reason"])
        log.info(
            "router version %d trained: accuracy %.3f, ECE %.3f -> %.3f, coverage@%.2f %.3f",
            version_id,
            metrics["accuracy"],
            metrics["ece_before"],
            metrics["ece_after"],
            cfg.threshold,
            metrics["coverage_at_threshold"],
        )
        result = {"version": version_id, "active": activate, **{k: v for k, v in metrics.items() if _scalar(v)}}
        return result | ({"held_back": held_back} if held_back is not None else {})

    def fit_adapter(
        self, corpus: _Corpus, chunks: npt.NDArray[np.float32], progress: Progress | None = None
    ) -> tuple[npt.NDArray[np.float32] | None, dict[str, Any]]:
        """The query adapter for a new version (engine.adapter): heading questions of the corpus the
        router trains on (its chunk rows [M, D] as the store), embedded (half the progress), then fitted."""
        report = progress or (lambda d, t: None)
        limit = self.settings.query_adapter_queries
        if limit <= 0:
            return None, {"adapter": False}
        rows = corpus.rows
        texts, positives = heading_queries([r[3] for r in rows], [r[4] for r in rows], limit, self.settings.router_seed)
        if not texts:
            return None, {"adapter": False, "adapter_queries": 0}
        vectors = []
        for start in range(0, len(texts), 256):
            vectors.append(self.embedder.encode(texts[start : start + 256]))  # [<=256, D]
            report(min(start + 256, len(texts)) * 50 // len(texts), 100)
        config = AdapterConfig(seed=self.settings.router_seed)
        return fit(np.concatenate(vectors), chunks, positives, config, lambda d, t: report(50 + d * 50 // t, 100))

    def worse_than_active(self, metrics: dict[str, Any]) -> dict[str, Any] | None:
        """Why a new version should wait instead of replacing the active one, or None.

        Worse: held-out accuracy down by more than half a point, or coverage at the threshold
        down by more than two points without a gain in accuracy on the expert path. A stale
        active router (its mapping is gone) is replaced whatever the figures say. Held-out sets
        differ between versions when documents changed, so the rule is deliberately loose.
        """
        if self.current() is None or self.staleness()["stale"] is not False:
            return None
        with self.sessions() as s:
            old = s.scalars(select(RouterVersion.metrics).where(RouterVersion.active)).first() or {}
        keys = ("accuracy", "coverage_at_threshold", "accuracy_at_threshold")
        if not all(isinstance(old.get(k), int | float) for k in keys):
            return None
        delta = {k: round(float(metrics[k]) - float(old[k]), 4) for k in keys}
        worse_accuracy = delta["accuracy"] < -0.005
        worse_coverage = delta["coverage_at_threshold"] < -0.02 and delta["accuracy_at_threshold"] <= 0
        if not (worse_accuracy or worse_coverage):
            return None
        words = ", ".join(f"{k} {old[k]:.3f} -> {metrics[k]:.3f}" for k in keys)
        return {"delta": delta, "reason": f"worse than the active version on held-out documents ({words})"}


def load_active(sessions: sessionmaker[Session]) -> Router | None:
    """The active router version read from SQL (the serving state's builder calls this when it changed)."""
    with sessions() as s:
        v = s.scalars(select(RouterVersion).where(RouterVersion.active)).first()
        router = (
            Router.from_state(
                v.weights,
                dim=v.dim,
                hidden=v.hidden,
                expert_ids=v.expert_ids,
                temperature=v.temperature,
                version_id=v.id,
            )
            if v is not None
            else None
        )
        if router is not None and v is not None:
            router.metrics = v.metrics
    log.info("router version %s active", router.version_id if router else None)
    return router


def train_job(routers: RouterManager) -> Callable[[JobContext], dict[str, Any]]:
    """The "train" job (params: activate, default true; force: activate even when worse)."""

    def run(ctx: JobContext) -> dict[str, Any]:
        p = ctx.params
        return routers.train(ctx.progress, activate=bool(p.get("activate", True)), force=bool(p.get("force", False)))

    return run


def _scalar(v: object) -> bool:
    return isinstance(v, int | float | str | bool)
