"""Everything a running moerag holds: settings, database, model, index, jobs."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import numpy as np
import torch
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

import kernels
from app.clustering.content_fit import ContentFit
from app.clustering.indexing import IndexManager
from app.clustering.reclustering import recluster_job
from app.core.auth import load_or_create_token
from app.core.db import make_engine, make_sessionmaker
from app.core.errors import is_disk_full
from app.core.jobs import JobRunner
from app.core.locking import DataDirBusy, DataDirLock, SqlLease
from app.core.metrics import Metrics
from app.core.migrate import upgrade
from app.core.models import Chunk, Cluster, Document
from app.core.settings import Settings
from app.services.ask import SqlChunkStore
from app.services.bulk import bulk_handler, clean_spool, sync_handler
from app.services.console_sessions import ConsoleSessions
from app.services.documents import Ingestor
from app.services.expert_scopes import scope_handler
from app.services.expert_undo import undo_job
from app.services.ratelimit import RateLimiter
from app.services.refit import Refit
from app.services.routing import RouterManager, load_active, train_job
from app.services.tokens import Tokens
from app.serving.answer_cache import AnswerCache
from app.serving.generation import Generators
from app.serving.lexical import LexicalManager
from app.serving.states import ServingStates
from app.shards.link import ShardLink
from app.store.catalogue import ALL_PARTS, Catalogue
from engine.central_sample import SHARDED_SHARE
from engine.chunking import ChunkingConfig
from engine.device_choice import choose_device
from engine.embedder import Embedder
from engine.pipeline import AskPipeline, PipelineConfig
from engine.question_encoder import BatchStats, QuestionEncoder
from engine.serving import ServingState
from engine.turns import lower_this_thread

log = logging.getLogger(__name__)
_SNAPSHOT_LEASE = 0x6D6F6572  # "moer": the advisory lock key of the snapshot writer


def use_serving_threads(settings: Settings) -> int:
    """Torch and FAISS threads for a serving process: `torch_threads`, or 1 (returned).

    Measured on 2 cores (docs/performance.md): a server's work is many small operations from
    many request threads; with two OpenMP threads each small torch op paid a wake-up of the
    other thread (an exp over 215 values: 1 us alone, 465 us while the other core was busy),
    and one thread per process served more questions per second at every client count. Set
    before the runtime's threads start: a thread takes the count at its first parallel op.
    One-shot CLI commands keep torch's default (every core) for bulk embedding.
    """
    import faiss

    n = settings.torch_threads or 1
    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)
    return n


@dataclass(frozen=True)
class Services:
    """What a started runtime serves with: built once, together, by `Runtime.start` (the composition
    root) and never replaced. Freshness is the catalogue's job: each service follows it."""

    embedder: Embedder
    questions: QuestionEncoder
    indexes: IndexManager
    ingestor: Ingestor
    routers: RouterManager
    states: ServingStates
    pipeline: AskPipeline
    answers: AnswerCache
    jobs: JobRunner


def routing_sample(settings: Settings) -> float:
    """The central sample's share: MOERAG_ROUTING_SAMPLE, else one over shards and none in one process."""
    if settings.routing_sample is not None:
        return settings.routing_sample
    return SHARDED_SHARE if settings.shard_map is not None else 0.0


class Runtime:
    """The composition root and life cycle: settings, database, catalogue and the process-wide parts
    exist from construction; `start` builds the frozen `Services` and follows the catalogue."""

    def __init__(self, settings: Settings, *, embedder: Embedder | None = None) -> None:
        self.settings = settings
        self.engine = make_engine(settings.db_url)
        self.sessions: sessionmaker[Session] = make_sessionmaker(self.engine)
        self._lock = DataDirLock(settings.resolved_data_dir)
        self._embedder = embedder  # a model already loaded (tests share one), else loaded at start
        self._services: Services | None = None
        self.announce_url: str | None = None  # set by `moerag serve`: its address, for the CLI
        self.question_model = "eager"
        # /ask requests from their handler's start to its reply: counted on the event loop (one
        # thread), read by the pipeline to tell a lone question (engine.question_encoder).
        self.asking = 0
        self.catalogue = Catalogue(self.sessions, settings.catalogue_poll_seconds)  # before anything writes
        self.snapshot_lease = SqlLease(self.engine, _SNAPSHOT_LEASE)  # one process writes index snapshots
        share, niceness = settings.lexical_rebuild_share, settings.background_niceness
        self.lexical = LexicalManager(
            self.sessions,
            share,
            in_child=settings.lexical_rebuild_in_child,
            niceness=niceness,
            postings=settings.shard_map is None,  # over shards: BM25's statistics here, postings there
            sample=routing_sample(settings),  # the central sample, read with BM25 (engine.central_sample)
        )
        self.generators = Generators(settings)  # name -> generator (the experts' and the fallback's)
        self.console_sessions = ConsoleSessions(self.sessions)
        self.tokens = Tokens(self.sessions)  # scoped API tokens (app.services.tokens)
        per_minute = settings.ask_rate_per_minute
        self.ask_limiter = RateLimiter(self.engine, per_minute) if per_minute else None
        self.metrics = Metrics(question_stats=self._question_stats, drift=self._drift, shards=self.shard_health)
        self.shard_link: ShardLink | None = None  # the child joined to Ray, with MOERAG_SHARD_MAP (app.shards.link)
        self.admin_token = ""
        self.ready = False
        self.phase = "starting"  # what /readyz says before ready: "preparing" (serve --sample), "starting"
        self.error: str | None = None
        self.index_status = ""
        self.kernel_backend = ""
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None

    # ---- parts, available once started ----------------------------------------------------------

    def _question_stats(self) -> BatchStats | None:
        """/metrics: the question model's batches, once started."""
        return self._services.questions.stats if self._services else None

    def shard_health(self) -> list[dict[str, Any]] | None:
        """Each expert shard as this process sees it (calls, errors, skipped, breaker); None without shards."""
        tier = self._services.states.shards if self._services else None
        return tier.health() if tier is not None else None

    def _drift(self) -> dict[str, Any] | None:
        """/metrics: the content-fit report, once started."""
        routers = self._services.routers if self._services else None
        return routers.drift() if routers is not None and routers.drift is not None else None

    @property
    def services(self) -> Services:
        assert self._services is not None, "runtime not started"
        return self._services

    @property
    def embedder(self) -> Embedder:
        return self.services.embedder

    @property
    def questions(self) -> QuestionEncoder:
        return self.services.questions

    @property
    def indexes(self) -> IndexManager:
        return self.services.indexes

    @property
    def ingestor(self) -> Ingestor:
        return self.services.ingestor

    @property
    def jobs(self) -> JobRunner:
        return self.services.jobs

    @property
    def routers(self) -> RouterManager:
        return self.services.routers

    @property
    def pipeline(self) -> AskPipeline:
        return self.services.pipeline

    @property
    def answers(self) -> AnswerCache:
        return self.services.answers

    def state(self) -> ServingState:
        """The serving state now (app.serving.states): take it once and read only it."""
        return self.services.states.current()

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Each text's tokens by the embedding model's tokenizer."""
        return self.embedder.count_tokens(texts)

    def retrieval_vector(self, state: ServingState) -> Callable[[np.ndarray], np.ndarray]:
        """The question as retrieval reads it, as /ask does: through `state`'s router's query adapter."""
        return lambda q: self.pipeline.retrieval_vector(q, state.router)

    @property
    def kernel_search(self) -> bool:
        mode = self.settings.scoped_search
        return mode == "kernel" or (mode == "auto" and self.kernel_backend == "triton")

    @property
    def scoped_kernel(self) -> str:
        """/readyz: the Triton kernel in use, and what the state's matrix measured faster (engine.expert_matrix)."""
        from kernels.scoped_search import kernel_in_use

        matrix = self.state().matrix
        if matrix is None or matrix.kernel == "by the backend":
            return kernel_in_use()
        return f"{matrix.kernel}; the Triton kernel: {kernel_in_use()}"

    # ---- life cycle ----------------------------------------------------------------------------------

    def start(self, *, run_jobs: bool = True) -> None:  # noqa: PLR0915
        """Lock the data dir, migrate, load the model, verify the index, resume jobs.

        run_jobs=False (one-shot CLI commands, the sample's preparation) leaves queued and
        interrupted jobs in SQL for the server to run: one runtime runs a job, never two.
        """
        try:
            s = self.settings
            s.resolved_data_dir.mkdir(parents=True, exist_ok=True)
            if s.worker_of:  # `serve --workers N`: the supervisor holds the data dir with its workers
                self._lock.join()
            else:
                self._lock.acquire(self.announce_url)  # the address: where CLI commands on this data dir go
            t0 = time.perf_counter()
            upgrade(self.engine)
            self.catalogue.open()  # the state built below reads this version or a later one
            self.kernel_backend = kernels.configure(s.kernel_backend)
            self.admin_token = load_or_create_token(
                s.admin_token.get_secret_value() if s.admin_token else None, s.token_file
            )
            shards, tier = None, None
            if s.shard_map is not None:  # searches go to the expert shards on Ray Serve (`moerag ray up`)
                from app.shards import client as ray_client
                from app.shards import map as shard_map

                shards = shard_map.load(s.shard_map)
                # Ray is joined by a child process: a server that loses Ray stays up (app.shards.link).
                self.shard_link = ShardLink(s.ray_address)
                self.shard_link.start()
                tier = ray_client.RayShards(shards, s.ray_address, s.shard_timeout_seconds, link=self.shard_link)
            emb = self._embedder or load_embedder(s, shards is not None and shards.embedder is not None)
            if run_jobs:  # serving: uploads embed behind the questions being answered
                emb.lower_document_priority(s.background_niceness)
            if s.trace_questions and run_jobs:  # serving: the model call without the GIL (one-shots skip it)
                lone = s.question_lone_threads or os.cpu_count() or 1
                self.question_model = emb.compile_questions(s.question_runtime, wide_threads=lone)
            questions = QuestionEncoder(
                emb.encode_questions,
                max_batch=s.question_batch,
                max_wait_ms=s.question_batch_wait_ms,
                cache_size=s.question_cache,
                workers=s.question_workers or os.cpu_count() or 1,
                encode_wide=partial(emb.encode_questions, wide=True) if emb.has_wide_questions else None,
            )
            indexes = IndexManager(
                s,
                self.sessions,
                emb.dim,
                emb.name,
                vectors=shards is None,  # else on the shards
                snapshot_writer=self.snapshot_lease.held,
            )
            self.index_status = indexes.open()
            max_tokens = emb.max_tokens
            target = min(s.chunk_target_tokens, max_tokens)
            chunking = ChunkingConfig(
                max_tokens=max_tokens,
                target_tokens=target,
                min_tokens=min(s.chunk_min_tokens, target),
                overlap_tokens=min(s.chunk_overlap_tokens, target // 2),
                merge_small_sections=s.chunk_merge_small_sections,
                heading_prefix=s.chunk_heading_prefix,
                max_chunks=s.max_chunks_per_document,
                max_chars=s.max_document_chars,
                max_ocr_pages=s.max_ocr_pages,
            )
            states = ServingStates(
                self.sessions,
                indexes,
                partial(load_active, self.sessions),
                kernel_matrix=self.kernel_search and not shards,
                matrix_dtype=s.matrix_dtype,  # how the kernel's copy stores the vectors
                shards=tier,
                prepare=self.tokens.prepare,  # the scopes in use, ready before each new state
            )
            ingestor = Ingestor(self.sessions, emb, indexes, chunking, self.catalogue.sync, states.search_index)
            self.lexical.refresh(force=True)
            content_fit = ContentFit(self.sessions, indexes, lambda: self.catalogue.version, states.search_index)
            content_fit.backfill()
            if s.shard_map is not None and tier is not None:  # the map read above (s.shard_map for the follower)
                from app.shards.map_follow import ShardMapFollower

                follow = ShardMapFollower(
                    s.shard_map, states, tier.shard_map.version, s.ray_address, tier.timeout_seconds, self.shard_link
                )
                threading.Thread(target=follow.run, args=(self._stop,), name="shard-map", daemon=True).start()
            routers = RouterManager(
                s,
                self.sessions,
                emb,
                states.search_index,
                lambda: states.current().lexical,  # whole here, or over the shards
                drift=content_fit.drift,
                active=lambda: states.current().router,
            )
            states.start(self.catalogue.version, self.lexical.current(), self.lexical.version, self.lexical.sample)
            self.lexical.subscribe(states.lexical_built)
            pipeline = AskPipeline(
                embedder=emb,
                state=states.current,
                store=SqlChunkStore(self.sessions, content_fit.new_topics),
                generator=self.generators,
                config=PipelineConfig(
                    threshold=s.route_threshold,
                    expert_min_score=s.expert_min_score,
                    lexical_weight=s.lexical_weight,
                    fusion=s.fusion,
                    expert_nprobe=s.expert_nprobe,
                    expert_verify_lists=s.expert_verify_lists,
                    expert_verify_lexical_slack=s.expert_verify_lexical_slack,
                    query_adapter=s.query_adapter,
                ),
                submit_question=questions.submit,
                in_flight=lambda: self.asking,
                wide_questions=emb.has_wide_questions,
            )
            answers = AnswerCache(s.answer_cache)
            jobs = JobRunner(
                self.sessions,
                {
                    "ingest": bulk_handler(ingestor),
                    "recluster": recluster_job(indexes, routers),
                    "realign": lambda ctx: indexes.realign(ctx.progress),
                    "train": train_job(routers),
                    "refit": Refit(indexes, routers, content_fit.new_topics).job,
                    "scope": scope_handler(indexes, routers),
                    "undo": undo_job(indexes, routers),
                    "sync": sync_handler(ingestor, s.resolved_data_dir / "sources", s),
                },
                exclusive=self.engine.dialect.name == "sqlite",  # else other processes may run jobs too
                lease_seconds=s.job_lease_seconds,
                max_queued=s.max_queued_jobs,
            )
            self._services = Services(emb, questions, indexes, ingestor, routers, states, pipeline, answers, jobs)
            self.catalogue.subscribe(["documents", "index"], indexes.follow)  # first: the others read it
            self.catalogue.subscribe(["documents"], self.lexical.mark_dirty)
            self.catalogue.subscribe(ALL_PARTS, states.changed)  # last: it reads what the others applied
            self.catalogue.follow()
            if not s.worker_of:  # a sibling worker may be spooling an upload right now
                clean_spool(self.sessions, s.spool_dir)
            if run_jobs:
                jobs.start()
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="moerag-checkpoint", daemon=True)
            self._checkpointer.start()
            self.ready = True
            where = f": open {self.announce_url}/admin" if self.announce_url else ""
            log.info("moerag ready in %.1fs (index %s)%s", time.perf_counter() - t0, self.index_status, where)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, DataDirBusy):  # the caller says that one in its own words (the CLI: one line)
                log.error("start-up failed: %s", self.error)
            raise

    def close(self) -> None:
        self._stop.set()
        svc = self._services
        if svc is not None:
            svc.jobs.stop()
        self.catalogue.close()
        self.lexical.close()
        if self.shard_link is not None:
            self.shard_link.close()
        if svc is not None:
            svc.questions.close()
        if self._checkpointer is not None:
            self._checkpointer.join(10)
        if svc is not None and self.ready:
            try:
                svc.indexes.checkpoint()
            except OSError:  # a full disk: SQL holds everything; the next start verifies and rebuilds
                log.exception("final index checkpoint failed")
        self.ready = False
        self.snapshot_lease.release()
        self._lock.release()
        self.engine.dispose()

    def _checkpoint_loop(self) -> None:
        lower_this_thread(self.settings.background_niceness)  # snapshots yield the cores to questions
        while not self._stop.wait(self.settings.checkpoint_seconds):
            try:
                self.indexes.checkpoint()  # and compacts the log a new snapshot covers
                self.lexical.refresh()
            except Exception as exc:  # a full disk must not kill the thread; SQL stays the truth
                if is_disk_full(exc):
                    log.warning("index checkpoint did not fit (disk full); SQL holds every change, retrying")
                else:
                    log.exception("index checkpoint failed")

    def mapping_changed(self) -> int:
        """The cluster -> expert mapping changed: documents are re-placed by a job (its id)."""
        return self.jobs.submit("realign", {}, total=3, coalesce=True).id

    # ---- facts --------------------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        with self.sessions() as s:
            return {
                "documents": s.scalar(select(func.count(Document.id))) or 0,
                "chunks": s.scalar(select(func.count(Chunk.id))) or 0,
                "clusters": s.scalar(select(func.count(Cluster.id))) or 0,
                "index_vectors": self.indexes.index.ntotal,
            }


def load_embedder(s: Settings, on_ray: bool) -> Embedder:
    """The model, loaded here, or (`on_ray`: the shard map has an `embedder:`) the embedder
    deployment `moerag ray up` runs, behind the same interface (app.shards.embedder)."""
    if on_ray:
        from app.shards.embedder import RemoteEmbedder

        return cast(Embedder, RemoteEmbedder.connect(s.ray_address, s.model_path))  # Embedder's serving interface
    device = choose_device(s.embed_device)  # a GPU when there is one (MOERAG_EMBED_DEVICE)
    return Embedder(
        s.model_path, dtype=s.embed_dtype, batch_size=s.embed_batch_size, device=device, cache_dir=s.resolved_cache_dir
    )
