"""The ask flow: embed -> gate -> expert path (scoped search) or fallback (hybrid) -> answer.

The engine does not know SQL: it reads chunks through `ChunkStore` and experts through a
provider, both supplied by `app`. "No confident route" is a value (a fallback with a reason),
never an exception.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, Protocol

import numpy as np

from engine.access import Allowed, scan_size
from engine.embedder import Embedder
from engine.generators import GENERIC_SYSTEM_PROMPT, Generator, Passage
from engine.lexical import BestChunks, Fusion, LexicalIndex, Terms, convex_fusion, reciprocal_rank_fusion
from engine.question_encoder import done_future
from engine.route_check import (
    Outside,
    best_outside,
    lexical_best_outside,
    no_expert_fits,
    outside_lists,
    outside_of,
    overruled,
)
from engine.router import Router
from engine.serving import ExpertProfile, ServingState
from index import Ask, SearchIndex
from index.shards import shard_failures

__all__ = ["AskPipeline", "AskRequest", "ChunkRecord", "ChunkStore", "ExpertProfile", "Prepared", "Route"]

Mode = Literal["auto", "expert", "fallback"]


@dataclass(frozen=True)
class ChunkRecord:
    id: int
    document_id: int
    source: str
    title: str
    heading: str
    text: str
    cluster_id: int
    fit_margin: float | None = None  # its fit minus its list's floor (index.fit): < 0 fits no expert; None: unknown


class ChunkStore(Protocol):
    def fetch(self, ids: Sequence[int]) -> dict[int, ChunkRecord]: ...


@dataclass(frozen=True)
class AskRequest:
    question: str
    top_k: int | None = None
    mode: Mode = "auto"
    expert_id: int | None = None
    # A scoped caller's reach (engine.access): the searches see only these chunks, the route only
    # these experts; None: the whole store.
    allowed: Allowed | None = None


@dataclass
class Citation:
    n: int
    chunk: ChunkRecord
    score: float


@dataclass
class Route:
    path: Literal["expert", "fallback"]
    reason: str  # a code: confident, forced, one_expert, no_router, none_class, low_confidence, ...
    detail: str  # the same in words
    expert: ExpertProfile | None
    confidence: float | None
    top: list[tuple[ExpertProfile | None, float]]
    threshold: float
    router_version: int | None
    entropy: float | None = None
    clusters_scanned: int = 0
    vectors_scanned: int = 0
    catalogue_version: int = 0  # the version of the experts, mapping and router this was answered with
    versions: dict[str, int | str | None] = field(default_factory=dict)  # the serving state's (ServingState.versions)
    missing_shards: list[str] = field(default_factory=list)  # shards that did not answer: a partial answer
    # False: a scoped caller was routed to an expert it may read only part of (engine.access): its
    # part was searched, and the expert is not named to it (nor its prompt or generator used).
    named: bool = True

    def expert_words(self) -> str:
        """How a detail names the route's expert."""
        return f"expert {self.expert.name!r}" if self.named and self.expert is not None else "the expert"


@dataclass
class Prepared:
    """Everything up to generation; `answer_stream` produces the text."""

    question: str
    route: Route
    citations: list[Citation]
    generator: Generator
    system_prompt: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    started: float = 0.0

    def passages(self) -> list[Passage]:
        return [Passage(c.n, c.chunk.source, c.chunk.title, c.chunk.text) for c in self.citations]

    def answer_stream(self) -> Iterator[str]:
        t0 = time.perf_counter()
        yield from self.generator.stream(self.question, self.passages(), self.system_prompt)
        self.timings_ms["generate"] = (time.perf_counter() - t0) * 1000
        self.timings_ms["total"] = (time.perf_counter() - self.started) * 1000


@dataclass
class PipelineConfig:
    threshold: float = 0.7
    default_top_k: int = 5
    expert_min_score: float = 0.2  # best scoped cosine below this: the expert has nothing good
    candidates: int = 50  # per retriever, before fusion
    # BM25's weight in the fusion (dense has 1.0); chosen on dev (docs/decisions/convex-fusion.md)
    lexical_weight: float = 0.1
    # How dense and BM25 are fused, both over the dense candidates: by scores ("convex": cosine +
    # weight x BM25 / the scope's best BM25) or weighted reciprocal ranks ("rrf"). Convex on dev,
    # paired against RRF: hit@1 +0.075, hit@5 +0.040, MRR +0.053 (intervals above 0), hit@10 +0.006.
    fusion: Fusion = "convex"
    # The expert path probes only this many of its lists nearest the question (0 = all): on the
    # eval corpus 32 lists found 2 more dev answers than 16 (Python's ~80 lists), for ~2,300 more
    # vectors; at 1M chunks, still a fraction of the expert.
    expert_nprobe: int = 32
    expert_hybrid: bool = True  # the expert path fuses BM25 over the expert's chunks, as the fallback does
    # The route's check: probe the question's nearest lists outside the expert (0 = off); a chunk
    # there better than the best inside by more than the margin sends the question to the fallback.
    expert_verify_lists: int = 8
    expert_verify_margin: float = 0.0
    # The check's second witness: when BM25's best chunk over the whole store lies outside the
    # expert too, an outside chunk within this much of the best inside is enough (0 = off).
    # Chosen on dev (docs/decisions/route-check-lexical-witness.md): with it, 1 confident misroute
    # of 141 instead of 6 of 150.
    expert_verify_lexical_slack: float = 0.06
    # Retrieval (both paths and the route's check) reads the question through the active router's
    # query adapter, when it has one (engine.adapter); the gate reads the model's vector either way.
    query_adapter: bool = True
    # Open-set routing: when most of the expert path's best this-many passages fit below their
    # lists' floors (content that arrived after the experts were fitted, index.fit), no expert
    # fits the question and it goes to the fallback (reason no_expert_fits); 0 = off.
    open_set_passages: int = 3
    # The route (the gate's vote, the check's witnesses) reads the central sample when the serving
    # state has one (MOERAG_ROUTING_SAMPLE, engine.central_sample); False: the whole index.
    routing_sample: bool = True


class AskPipeline:
    def __init__(
        self,
        *,
        embedder: Embedder,
        state: Callable[[], ServingState],
        store: ChunkStore,
        generator: Callable[[str], Generator],
        config: PipelineConfig | None = None,
        submit_question: Callable[[str, bool], Future[np.ndarray]] | None = None,
        in_flight: Callable[[], int] | None = None,
        wide_questions: bool = False,
    ) -> None:
        self.embedder = embedder
        # The serving state (engine.serving), taken once per question: its router, experts,
        # mapping, index and BM25 are one version's, however the catalogue moves meanwhile.
        self.state = state
        # (question, alone: no other question being prepared) -> its [1, D] vector to come; the
        # server passes a QuestionEncoder's (cache + dynamic batching, the model in a batch thread,
        # on every core when alone); by default embedded here, at once.
        self.submit_question = submit_question or (lambda text, alone: done_future(embedder.encode([text])))
        # A question is alone when it is the only one in `prepare` and, where the server counts
        # requests from arrival to reply (`in_flight`), the only one there: one that is between
        # its answer and its reply still needs a core.
        self.in_flight = in_flight or (lambda: 0)
        self.wide_questions = wide_questions  # the encoder runs a lone question on every core
        self._preparing = 0  # questions in `prepare` now (guarded by the lock)
        self._preparing_lock = threading.Lock()
        self.store, self.generator = store, generator
        self.config = config or PipelineConfig()
        # Per BM25 index (weakly held: a rebuilt one starts afresh), scope masks by index state.
        self._masks: weakref.WeakKeyDictionary[LexicalIndex, dict[tuple[str, int, tuple[int, ...]], np.ndarray]]
        self._masks = weakref.WeakKeyDictionary()

    def prepare(self, req: AskRequest, state: ServingState | None = None) -> Prepared:
        """Route and retrieve `req` in `state` (the caller's, taken once per question; else now's)."""
        state = state or self.state()
        with self._preparing_lock:
            self._preparing += 1
            alone = self._preparing == 1 and self.in_flight() <= 1
        try:
            with shard_failures() as failed:  # expert shards (index.shards) that did not answer
                prepared = self._prepare(req, alone, state)
            prepared.route.missing_shards = sorted(set(failed))
            return prepared
        finally:
            with self._preparing_lock:
                self._preparing -= 1

    def _prepare(self, req: AskRequest, alone: bool, state: ServingState) -> Prepared:  # noqa: PLR0915
        cfg = self.config
        started = time.perf_counter()
        timings: dict[str, float] = {}

        t = time.perf_counter()
        pending = self.submit_question(req.question, alone)  # [1, D] to come
        lexical, index = state.lexical, state.index  # one BM25 index per question; its scores computed once
        allowed = req.allowed
        within = allowed.id_set if allowed is not None else None  # the only candidates (engine.access)
        scanned = partial(scan_size, index, allowed)
        terms = self._terms(req, state)
        if terms is not None and not (alone and self.wide_questions and isinstance(lexical, LexicalIndex)):
            terms.prefetch()  # BM25 while the model runs: on another core when idle (here), or on the shards
        q = pending.result()  # [1, D]
        timings["embed"] = (time.perf_counter() - t) * 1000  # the model, BM25's scores overlapped

        t = time.perf_counter()
        # What the route reads: the central sample when there is one (no shard asked), else the store.
        sample = state.sample if cfg.routing_sample else None
        route_index = state.route_index if sample is not None else index
        route_terms = sample.terms(req.question) if sample is not None and terms is not None else terms
        route = self._route(q, req, route_terms, state, route_index)
        route.catalogue_version, route.versions = state.version, state.versions
        q = self.retrieval_vector(q, state.router)  # [1, D]
        timings["route"] = (time.perf_counter() - t) * 1000

        t = time.perf_counter()
        citations: list[Citation] = []
        if route.path == "expert" and route.expert is not None:
            k = self.top_k(req, route.expert)
            n = max(cfg.candidates, k)
            scope = [c for c in route.expert.clusters if 0 <= c < index.nlist]
            clusters = scope
            matrix = state.matrix
            checked = req.mode != "expert"  # a forced expert is searched as asked
            outside: Outside | Literal[False] | None = False  # the check's probe, once searched
            if matrix is not None and allowed is None:  # GPU deployments: the expert-sorted copy and the scoped kernel
                scores, ids = matrix.search(q, [route.expert.id], n)  # [1, N]
                route.vectors_scanned += matrix.sizes([route.expert.id])
            else:  # FAISS: only the expert's inverted lists (the nearest ones, when capped)
                if cfg.expert_nprobe:
                    clusters = index.nearest_lists(q[0], scope, cfg.expert_nprobe).tolist()
                # The route's check probe goes with the scoped search (over shards: one round trip),
                # unless the sample serves it (then no shard outside the expert's is asked).
                probed = outside_lists(q, index, scope, cfg.expert_verify_lists) if checked and sample is None else []
                asks: list[Ask] = [(n, clusters), (1, probed)] if probed else [(n, clusters)]
                (scores, ids), *probe = index.search_each(q, asks, within)  # [1, N]; [1, 1]
                outside = outside_of(probe[0][0], probed) if probe else None
                route.vectors_scanned += scanned(clusters)[1]
            route.clusters_scanned += len(clusters)
            dense = [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]
            best = dense[0][1] if dense else float("-inf")
            if checked and best < cfg.expert_min_score:
                route.path, route.reason = "fallback", "weak_expert_results"
                route.detail = f"best scoped score {best:.2f} < {cfg.expert_min_score:.2f}: searched everything"
            elif checked and (
                verdict := self._check_route(q, route_terms, route_index, scope, best, route, outside, allowed)
            ):
                route.path, route.reason, route.detail = "fallback", *verdict
            elif cfg.expert_hybrid:  # BM25 over the expert's chunks, fused as on the fallback
                citations = self._fuse(dense, terms, k, n, index, scope)
            else:
                citations = self._citations(dense[:k])
            margins = [c.chunk.fit_margin for c in citations[: cfg.open_set_passages]]
            if checked and (unfit := no_expert_fits(margins, route.expert_words())):
                route.path, route.reason, route.detail = "fallback", "no_expert_fits", unfit
        if route.path == "fallback":
            k = req.top_k or cfg.default_top_k
            n = max(cfg.candidates, k)
            # Exact over every list; a scoped caller's over the lists holding its chunks only.
            reach = allowed.lists_in(index) if allowed is not None else None
            scores, ids = index.search(q, n, reach, within)  # [1, N]
            hits = [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]
            citations = self._fuse(hits, terms, k, n, index, None)
            lists, vectors = scanned(reach)
            route.clusters_scanned += lists
            route.vectors_scanned += vectors
        timings["retrieve"] = (time.perf_counter() - t) * 1000

        expert = route.expert if route.path == "expert" and route.named else None
        generator = self.generator(expert.generator if expert else "")  # "": the server's default
        system_prompt = expert.system_prompt if expert and expert.system_prompt else GENERIC_SYSTEM_PROMPT
        return Prepared(req.question, route, citations, generator, system_prompt, timings, started)

    def _terms(self, req: AskRequest, state: ServingState) -> Terms | None:
        """The question's BM25 in `state`, over the rows a scoped caller may read only."""
        lexical, allowed = state.lexical, req.allowed
        if isinstance(lexical, LexicalIndex):
            rows = allowed.rows_mask(lexical, lexical.ids) if allowed is not None else None  # [N]
            return lexical.terms(req.question, partial(self._scope_mask, lexical, state.index), rows)
        if lexical is None:
            return None
        if allowed is not None:
            raise ValueError("a scoped caller's BM25 is not enforced over expert shards")
        return lexical.terms(req.question)

    def top_k(self, req: AskRequest, expert: ExpertProfile) -> int:
        """The k an answer on `expert`'s path takes: the question's, else the expert's, else the default."""
        return req.top_k or expert.top_k or self.config.default_top_k

    def retrieval_vector(self, q: np.ndarray, router: Router | None) -> np.ndarray:
        """q [Q, D] -> [Q, D] as retrieval reads it: through `router`'s query adapter unless it is
        switched off (`PipelineConfig.query_adapter`) or the version has none."""
        return router.retrieval_vector(q) if router is not None and self.config.query_adapter else q

    def _route(  # noqa: C901
        self,
        q: np.ndarray,
        req: AskRequest,
        terms: BestChunks | None = None,
        state: ServingState | None = None,
        index: SearchIndex | None = None,
    ) -> Route:
        """The route of `req` in `state`: the gate's vote reads `index` (the state's, else what the
        route reads: engine.central_sample) and BM25's best of `terms`."""
        cfg = self.config
        state = state or self.state()
        experts, router = state.experts, state.router
        index = index if index is not None else state.index
        neighbours, probed, hits = None, 0, None
        if router is not None and req.mode != "fallback":  # the gate's votes: a small IVF probe, BM25's best
            neighbours, probed = router.probe(index, q)
            hits = router.lexical_probe(index, [terms]) if terms is not None else None
        decision = router.route(q, k=3, neighbours=neighbours, lexical=hits)[0] if router is not None else None
        top: list[tuple[ExpertProfile | None, float]] = []
        if decision is not None and router is not None:
            for cls, p in zip(decision.classes, decision.probs, strict=True):
                eid = router.expert_of(cls)
                top.append((experts.get(eid) if eid is not None else None, p))
        allowed = req.allowed
        top, experts, unnamed, out_of_scope = in_scope(top, experts, allowed, partial(self.top_k, req))
        confidence = unnamed[1] if unnamed is not None else top[0][1] if top else None
        version = router.version_id if router is not None else None
        entropy = decision.entropy if decision is not None else None

        def make(
            path: Literal["expert", "fallback"],
            reason: str,
            detail: str,
            expert: ExpertProfile | None,
            threshold: float = cfg.threshold,
        ) -> Route:
            lists = router.probe_size[0] if neighbours is not None and router is not None else 0
            named = unnamed is None or expert is not unnamed[0]
            return Route(
                path, reason, detail, expert, confidence, top, threshold, version, entropy, lists, probed, named=named
            )

        if req.mode == "fallback":
            return make("fallback", "forced", "fallback requested", None)
        if req.mode == "expert":
            chosen = experts.get(req.expert_id) if req.expert_id is not None else (top[0][0] if top else None)
            return make(*forced(chosen, req.expert_id))
        if out_of_scope and unnamed is None:
            detail = "the likeliest expert for it is outside this token's scope: searched what the token may read"
            return make("fallback", "out_of_scope", detail, None)
        mapped = state.mapped  # once per serving state, not per question
        if len(mapped) < 2:  # no gate to choose: no confidence is claimed (1.000 over one class means nothing)
            why = one_expert(mapped, experts, allowed)
            detail = f"{why}: there is no gate to route between, so the whole store is searched"
            return Route("fallback", "one_expert", detail, None, None, [], cfg.threshold, version, None, 0, 0)
        if router is None or not (top or unnamed):
            return make("fallback", "no_router", "no router is trained and active yet", None)
        best, p = unnamed if unnamed is not None else top[0]
        if best is None:
            return make("fallback", "none_class", f"most likely no expert's domain (p={p:.2f})", None)
        threshold = best.threshold if best.threshold is not None else cfg.threshold
        if p < threshold:
            return make("fallback", "low_confidence", f"confidence {p:.3f} < {threshold:.2f}", None, threshold)
        if not best.clusters:
            return make(
                "fallback",
                "expert_has_no_clusters",
                f"expert {best.name!r} owns no clusters",
                None,
                threshold,
            )
        detail = f"confidence {p:.3f} >= {threshold:.2f}"
        if unnamed is not None:
            detail += "; the expert is not named: part of it lies outside this token's scope"
        return make("expert", "confident", detail, best, threshold)

    def _citations(self, hits: Sequence[tuple[int, float]]) -> list[Citation]:
        rows = self.store.fetch([i for i, _ in hits])
        # An id the index returned but SQL no longer has (a racing delete) is skipped.
        kept = [(rows[i], s) for i, s in hits if i in rows]
        return [Citation(n, chunk, s) for n, (chunk, s) in enumerate(kept, start=1)]

    def _check_route(
        self,
        q: np.ndarray,
        terms: BestChunks | None,
        index: SearchIndex,
        scope: list[int],
        best: float,
        route: Route,
        outside: Outside | Literal[False] | None = False,
        allowed: Allowed | None = None,
    ) -> tuple[str, str] | None:
        """The route's check (engine.route_check): (reason, detail) when the evidence outside the expert
        overrules it, else None; its probe's result is `outside` (False: searched here), its scan
        counted (of what `allowed`, a scoped caller's, may read)."""
        cfg = self.config
        if outside is False:
            outside = best_outside(q, index, scope, cfg.expert_verify_lists)
        if outside is None:
            return None
        lists, vectors = scan_size(index, allowed, list(outside.probed))
        route.clusters_scanned += lists
        route.vectors_scanned += vectors
        lexical = partial(lexical_best_outside, terms, index, scope)
        words = route.expert_words()
        return overruled(outside.score, best, words, cfg.expert_verify_margin, cfg.expert_verify_lexical_slack, lexical)

    def _fuse(
        self,
        dense: list[tuple[int, float]],
        terms: Terms | None,
        k: int,
        n: int,
        index: SearchIndex,
        scope: list[int] | None,
    ) -> list[Citation]:
        """Dense candidates (id, cosine) + BM25 (over `scope`'s lists only, when given), fused by
        weighted RRF or by scores (`PipelineConfig.fusion`)."""
        cfg = self.config
        if cfg.fusion == "convex":
            scale = terms.best(scope) if terms is not None else 0.0  # the scope's best BM25 score
            if terms is None or scale <= 0:
                return self._citations(dense[:k])
            lexical = terms.scores_of([i for i, _ in dense]) / scale  # [n] in [0, 1]
            return self._citations(convex_fusion(dense, lexical, cfg.lexical_weight)[:k])
        sparse = [i for i, _ in terms.search(n, scope)] if terms is not None else []
        fused = reciprocal_rank_fusion([[i for i, _ in dense], sparse], weights=[1.0, cfg.lexical_weight])[:k]
        return self._citations(fused)

    def _scope_mask(self, lexical: LexicalIndex, index: SearchIndex, scope: Sequence[int]) -> np.ndarray:
        """[N] bool over the BM25 index's chunks: those in `scope`'s lists (cached until either changes)."""
        masks = self._masks.setdefault(lexical, {})
        key = (index.version, index.writes, tuple(scope))
        mask = masks.get(key)
        if mask is None:
            mask = np.isin(index.clusters_of(lexical.ids), np.asarray(scope, dtype=np.int64))  # [N]
            if len(masks) >= 64:
                masks.clear()
            masks[key] = mask
        return mask


def in_scope(
    top: list[tuple[ExpertProfile | None, float]],
    experts: Mapping[int, ExpertProfile],
    allowed: Allowed | None,
    top_k: Callable[[ExpertProfile], int],
) -> tuple[
    list[tuple[ExpertProfile | None, float]],
    Mapping[int, ExpertProfile],
    tuple[ExpertProfile, float] | None,
    bool,
]:
    """The gate's ranking and the experts as a scoped caller may see them (only experts it may see
    named); the gate's best expert with its probability when the caller may read part of it
    only, at least the k its answer takes there (`top_k`), so that its part, searched unnamed,
    still gives k results; and whether the gate's best expert is not one it may see. Unscoped:
    as they are."""
    if allowed is None:
        return top, experts, None, False
    best, p = top[0] if top else (None, 0.0)
    outside = best is not None and best.id not in allowed.experts
    held = allowed.partly.get(best.id, 0) if best is not None else 0
    unnamed = (best, p) if best is not None and outside and held >= top_k(best) else None
    kept: list[tuple[ExpertProfile | None, float]] = [
        (e, p) for e, p in top if e is not None and e.id in allowed.experts
    ]
    return kept, {i: e for i, e in experts.items() if i in allowed.experts}, unnamed, outside


def one_expert(mapped: Sequence[str], experts: Mapping[int, ExpertProfile], allowed: Allowed | None) -> str:
    """Why there is no gate to route between, naming the one expert only to a caller who may see it."""
    if not mapped:
        return "no expert owns lists"
    if allowed is None or mapped[0] in {e.name for e in experts.values()}:
        return f"one expert ({mapped[0]!r}) owns lists"
    return "one expert owns lists"


def forced(
    chosen: ExpertProfile | None, asked: int | None
) -> tuple[Literal["expert", "fallback"], str, str, ExpertProfile | None]:
    """A forced expert's route (path, reason, detail, expert): the expert asked for (or the
    gate's best), or the fallback when there is none (`asked`: the id asked for) or it owns no lists."""
    if chosen is None:
        return "fallback", "unknown_expert", f"no expert {asked}", None
    if not chosen.clusters:
        return "fallback", "expert_has_no_clusters", f"expert {chosen.name!r} owns no clusters", chosen
    return "expert", "forced", f"expert {chosen.name!r} requested", chosen
