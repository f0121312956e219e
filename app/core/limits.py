"""The limits on a question and its `k`, one rule for every route that retrieves (/ask, /search).

The bounds are settings (MOERAG_MAX_QUESTION_CHARS, MOERAG_MAX_TOP_K): `check_question` applies
them, `state_question_limits` writes the same numbers into the OpenAPI spec, so clients and
fuzzers see the bounds the server enforces.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from app.core.errors import ApiError
from app.core.settings import Settings

SEARCH_K = 10  # /search's passages when k is absent or null


def Passages(description: str) -> Any:
    """`k` on every route that retrieves (/ask, /search): a JSON number >= 1, or null/absent for the
    route's default; its upper bound is MOERAG_MAX_TOP_K, checked by `check_question`."""
    return Field(None, description=f"{description} At most MOERAG_MAX_TOP_K (50 by default); null: the default.")


def state_question_limits(spec: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Write the limits `check_question` applies into the OpenAPI spec (they are settings, so no
    static schema can hold them): clients and fuzzers see the same bounds the server enforces."""
    max_chars, max_k = settings.max_question_chars, settings.max_top_k
    schemas = spec.get("components", {}).get("schemas", {})
    for name in ("AskIn", "SearchIn"):
        props = schemas.get(name, {}).get("properties", {})
        for text in ("query", "question"):
            if text in props:
                props[text]["maxLength"] = max_chars
        for k in ("k", "top_k"):
            if k in props:
                props[k]["anyOf"][0]["maximum"] = max_k
    return spec


def check_question(query: str, k: int | None, settings: Settings) -> None:
    """The one rule for a question's text and its k, on /ask and /search alike (limits from the settings)."""
    if len(query) > settings.max_question_chars:
        raise ApiError("question_too_long", f"questions are limited to {settings.max_question_chars} characters")
    if k is not None and k > settings.max_top_k:
        raise ApiError("top_k_too_large", f"k is limited to {settings.max_top_k}")
