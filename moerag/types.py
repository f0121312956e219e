"""The shapes the client returns (the API's JSON, typed for editors and mypy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

Progress = Callable[[int, int], None]
Json = dict[str, Any]


class Route(TypedDict):
    path: str
    expert: Json | None
    confidence: float | None
    reason: str
    detail: str


class Citation(TypedDict):
    n: int
    document_id: int
    source: str
    title: str
    chunk_id: int
    heading: str
    score: float
    text: str
    used: bool


class Answer(TypedDict):
    answer: str | None
    citations: list[Citation]
    route: Route
    timings_ms: dict[str, float]
    query_id: int | None
    conversation_id: str | None
    standalone_question: str | None


class Job(TypedDict):
    id: int
    kind: str
    status: str
    done: int
    total: int
    error: str | None
    result: Json | None
