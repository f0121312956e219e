"""The route's check: does the evidence outside a confident expert overrule the route?

On the dev questions the misroutes the gate is confident of are questions whose best chunks lie
elsewhere: a chunk outside beats the best inside, or BM25's best chunk over the whole store lies
outside and the best dense chunk outside comes close. The pipeline asks `overruled` after the
expert's scoped search; a verdict sends the question to the fallback, with its reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.lexical import BestChunks
from index import SearchIndex


@dataclass(frozen=True)
class Outside:
    """The best score in the lists probed outside the expert, and those lists."""

    score: float
    probed: tuple[int, ...]


def outside_lists(q: np.ndarray, index: SearchIndex, scope: list[int], lists: int) -> list[int]:
    """q [1, D]: the check's probe, its `lists` nearest lists outside `scope` ([]: off or none)."""
    probe = index.probe_budget(lists)
    if probe <= 0:
        return []
    rest = np.ones(index.nlist, dtype=bool)  # [C]: the lists outside the expert
    rest[scope] = False
    return [int(c) for c in index.nearest_lists(q[0], np.flatnonzero(rest), probe)]


def outside_of(scores: np.ndarray, probed: list[int]) -> Outside | None:
    """The probe's result (scores [1, 1] over the lists `probed`) as the check reads it."""
    return Outside(float(scores[0, 0]), tuple(probed)) if probed else None


def best_outside(q: np.ndarray, index: SearchIndex, scope: list[int], lists: int) -> Outside | None:
    """q [1, D]: the best chunk in its `lists` nearest lists outside `scope` (None: off or nothing there)."""
    nearest = outside_lists(q, index, scope, lists)
    return outside_of(index.search(q, 1, nearest)[0], nearest) if nearest else None


def lexical_best_outside(terms: BestChunks | None, index: SearchIndex, scope: list[int]) -> bool:
    """Whether BM25's best chunk over the whole store lies outside `scope`'s lists (False: no BM25 hit)."""
    hits = terms.search(1) if terms is not None else []
    if not hits:
        return False
    (cluster,) = index.clusters_of(np.array([hits[0][0]], dtype=np.int64))
    return int(cluster) >= 0 and int(cluster) not in scope  # -1: not in the index (yet), no witness


def overruled(
    outside: float, best: float, expert: str, margin: float, slack: float, lexical_outside: Callable[[], bool]
) -> tuple[str, str] | None:
    """(reason, detail) when `outside` (the best score outside `expert`: the words naming it, as
    "expert 'git'") overrules `best` (the best inside), else None.

    A chunk outside better than the best inside by more than `margin` overrules; so does one
    within `slack` of it when BM25's best chunk lies outside too (`lexical_outside`, asked only
    then; 0 slack never asks).
    """
    if outside > best + margin:
        detail = f"a chunk outside {expert} scores {outside:.3f} > {best:.3f}, the best inside"
        return "nearer_outside_expert", detail + ": searched everything"
    if slack <= 0 or outside <= best - slack or not lexical_outside():
        return None
    detail = (
        f"BM25's best chunk lies outside {expert} and a chunk there scores {outside:.3f}, "
        f"within {slack:.2f} of {best:.3f}, the best inside"
    )
    return "lexical_outside_expert", detail + ": searched everything"


def no_expert_fits(margins: Sequence[float | None], expert: str) -> str | None:
    """Open-set routing: why no expert fits, in words (`expert`: the words naming it), when most
    of the expert path's best passages (their fit margins: fit minus their list's floor,
    index.fit; None: unknown, counted as fitting) fit below their lists' floors; None otherwise,
    or for no passages."""
    outside = sum(1 for m in margins if m is not None and m < 0)
    if not margins or 2 * outside <= len(margins):
        return None
    return (
        f"{outside} of the best {len(margins)} passages in {expert} fit none of its content "
        "(a topic newer than the experts): searched everything"
    )
