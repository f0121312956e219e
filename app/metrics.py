"""Prometheus metrics of routing and latency, plus load-balance gauges over recent questions."""

from __future__ import annotations

import math
import threading
from collections import Counter, deque

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PCounter

from engine.pipeline import Route

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self, window: int = 1000) -> None:
        self.registry = CollectorRegistry()
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
        self._recent: deque[tuple[str | None, float | None]] = deque(maxlen=window)
        self._lock = threading.Lock()

    def observe(self, route: Route, timings_ms: dict[str, float]) -> None:
        expert = route.expert.name if route.path == "expert" and route.expert else "-"
        self.requests.labels(route.path, expert, route.reason).inc()
        if route.confidence is not None:
            self.confidence.observe(route.confidence)
        for stage, ms in timings_ms.items():
            self.latency.labels(stage).observe(ms / 1000)
        with self._lock:
            self._recent.append((expert if route.path == "expert" else None, route.entropy))
            hits = Counter(e for e, _ in self._recent if e is not None)
            entropies = [h for _, h in self._recent if h is not None]
        if hits:
            values = list(hits.values())
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
            self.imbalance.set(std / mean if mean else 0.0)
        if entropies:
            self.entropy.set(sum(entropies) / len(entropies))
