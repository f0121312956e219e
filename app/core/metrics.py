"""Prometheus metrics of routing and latency, plus load-balance gauges over recent questions.

The gauges are computed when scraped (`Gauge.set_function`), not on every answer: an answer only
appends its route to a bounded window (recounting a 1,000-question window on each answer took
~0.2 ms of the GIL per question). The question encoder's counters are read when scraped too.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.pipeline import Route
from engine.question_encoder import BatchStats

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _QuestionModel(Collector):
    """The question encoder's counters since start (`BatchStats`), read when scraped; none before
    the encoder exists."""

    def __init__(self, stats: Callable[[], BatchStats | None]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        if s is None:
            return
        calls = CounterMetricFamily(
            "moerag_question_model_calls",
            "Calls to the question model: 'wide' ran a lone question on every core, 'one' a batch on one",
            labels=["threads"],
        )
        calls.add_metric(["one"], s.batches - s.wide)
        calls.add_metric(["wide"], s.wide)
        yield calls
        yield CounterMetricFamily("moerag_questions_embedded", "Questions the model embedded", value=s.questions)
        yield CounterMetricFamily(
            "moerag_question_cache_hits", "Questions whose vector came from the question cache", value=s.cache_hits
        )
        yield GaugeMetricFamily("moerag_question_batch_largest", "Most questions in one model call", value=s.largest)


class _Shards(Collector):
    """Each expert shard as this process sees it (app.shards.client.RayShards.health): calls,
    errors and timeouts, calls skipped by its open breaker, and whether the breaker is open."""

    def __init__(self, health: Callable[[], list[dict[str, Any]] | None]) -> None:
        self.health = health

    def collect(self) -> Iterator[Metric]:
        rows = self.health()
        if not rows:
            return
        families = {
            "calls": CounterMetricFamily("moerag_shard_calls", "Calls sent to each expert shard", labels=["shard"]),
            "errors": CounterMetricFamily(
                "moerag_shard_errors", "Shard calls that failed or timed out", labels=["shard"]
            ),
            "skipped": CounterMetricFamily(
                "moerag_shard_skipped", "Shard calls not made: the shard's breaker was open", labels=["shard"]
            ),
        }
        open_ = GaugeMetricFamily(
            "moerag_shard_breaker_open", "1 while a shard's breaker is open or half-open", labels=["shard"]
        )
        for row in rows:
            for key, family in families.items():
                family.add_metric([row["shard"]], row[key])
            open_.add_metric([row["shard"]], 0.0 if row["breaker"] == "closed" else 1.0)
        yield from families.values()
        yield open_


class Metrics:
    def __init__(
        self,
        window: int = 1000,
        question_stats: Callable[[], BatchStats | None] | None = None,
        drift: Callable[[], dict[str, Any] | None] | None = None,
        shards: Callable[[], list[dict[str, Any]] | None] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        if question_stats is not None:
            self.registry.register(_QuestionModel(question_stats))
        if shards is not None:
            self.registry.register(_Shards(shards))
        self.requests = PCounter(
            "moerag_ask_requests",
            "Questions answered, by path and expert",
            ["path", "expert", "reason"],
            registry=self.registry,
        )
        self.confidence = Histogram(
            "moerag_route_confidence",
            "Calibrated top-1 router probability",
            registry=self.registry,
            buckets=tuple(i / 20 for i in range(1, 21)),
        )
        self.latency = Histogram(
            "moerag_stage_seconds",
            "Latency per stage of /ask",
            ["stage"],
            registry=self.registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.imbalance = Gauge(
            "moerag_expert_load_imbalance",
            "std/mean of expert-path hits per expert over recent questions",
            registry=self.registry,
        )
        self.entropy = Gauge(
            "moerag_routing_entropy",
            "Mean entropy (nats) of the router's distribution over recent questions",
            registry=self.registry,
        )
        # Content that fits no expert (app.clustering.content_fit): a re-fit is due while above 0.
        self.drift = drift or (lambda: None)
        for name, key, what in (
            ("moerag_documents_fitting_no_expert", "documents", "Documents most of whose chunks fit no expert"),
            ("moerag_chunks_fitting_no_expert", "chunks", "Chunks of those documents below their list's fit floor"),
        ):
            Gauge(name, what, registry=self.registry).set_function(partial(self._drift_count, key))
        self._recent: deque[tuple[str | None, float | None]] = deque(maxlen=window)
        self._lock = threading.Lock()
        self.imbalance.set_function(self._imbalance)
        self.entropy.set_function(self._entropy)

    def _drift_count(self, key: str) -> float:
        report = self.drift()
        return float(report[key]) if report else 0.0

    def _window(self) -> list[tuple[str | None, float | None]]:
        with self._lock:
            return list(self._recent)

    def _imbalance(self) -> float:
        """std/mean of expert-path hits per expert over the window (0 without any)."""
        hits = Counter(e for e, _ in self._window() if e is not None)
        if not hits:
            return 0.0
        values = list(hits.values())
        mean = sum(values) / len(values)
        return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) / mean

    def _entropy(self) -> float:
        """Mean entropy over the window's routed questions (0 without any)."""
        entropies = [h for _, h in self._window() if h is not None]
        return sum(entropies) / len(entropies) if entropies else 0.0

    def observe(self, route: Route, timings_ms: dict[str, float]) -> None:
        expert = route.expert.name if route.path == "expert" and route.expert else "-"
        self.requests.labels(route.path, expert, route.reason).inc()
        if route.confidence is not None:
            self.confidence.observe(route.confidence)
        for stage, ms in timings_ms.items():
            self.latency.labels(stage).observe(ms / 1000)
        with self._lock:
            self._recent.append((expert if route.path == "expert" else None, route.entropy))
