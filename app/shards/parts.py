"""Snapshots of a shard's part: a shard replica (app.shards.replicas) boots from its own part when one
was written, so the bytes it reads grow with its shard, not with the store.

A part is named by the clustering, a digest of the lists it holds (the shard map applied to the
store's experts) and the catalogue version it holds: `shard-<clustering>-<lists digest>@<position>.faiss`,
beside the whole-index snapshots in the snapshot store (`MOERAG_SNAPSHOT_URL`, or the data
directory's index folder). A replica writes its part every PART_SECONDS when it moved on (replicas
of one shard write the same name; a write is atomic), and removes its older parts and every part
of another clustering or of lists no shard of its map holds now. Booting, a replica takes its
part if one holds its lists, else the whole newest snapshot cut to its lists, else (app.shards.replicas)
SQL.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from app.store.index_log import carries
from app.store.snapshots import SUFFIX, SnapshotStore
from index import ClusteredIndex

log = logging.getLogger(__name__)
PART_SECONDS = 60.0  # how often a replica that moved on writes its part


def store_at(where: str) -> SnapshotStore:
    """The snapshot store at a folder or an fsspec URL."""
    return SnapshotStore(Path(where), where)


def part_prefix(clustering: str, lists: npt.NDArray[np.int64]) -> str:
    digest = hashlib.sha256(np.ascontiguousarray(lists, dtype=np.int64).tobytes()).hexdigest()[:12]
    return f"shard-{clustering}-{digest}@"


def parts(store: SnapshotStore, prefix: str) -> list[tuple[int, str]]:
    """(position, location) of the parts named `prefix<position>.faiss`, newest last."""
    found = []
    for location in store.locations():
        name = location.rsplit("/", 1)[-1]
        tail = name[len(prefix) : -len(SUFFIX)] if name.startswith(prefix) and name.endswith(SUFFIX) else ""
        if tail.isdigit():
            found.append((int(tail), location))
    return sorted(found)


def newest(
    s: Session, where: str, clustering: str, lists: npt.NDArray[np.int64]
) -> tuple[ClusteredIndex, int, str] | None:
    """(index of `lists`, the position it holds, what it came from) from the newest part of these
    lists, else the newest whole snapshot cut to them; None when neither can be brought to now by
    the index log (none, or older than its compacted horizon)."""
    store = store_at(where)
    own = parts(store, part_prefix(clustering, lists))
    if own and carries(s, clustering, own[-1][0]):
        position, location = own[-1]
        return ClusteredIndex.from_bytes(store.read(location), clustering), position, f"part@{position}"
    whole = store.list(clustering)
    if whole and carries(s, clustering, whole[-1][0]):
        position, location = whole[-1]
        index = ClusteredIndex.from_bytes(store.read(location), clustering).subset(lists, clustering)
        return index, position, f"snapshot@{position}"
    return None


def write(
    where: str,
    index: ClusteredIndex,
    clustering: str,
    lists: npt.NDArray[np.int64],
    position: int,
    live: Sequence[npt.NDArray[np.int64]] = (),
) -> None:
    """Write this part at `position`; remove its older parts, and every part of another clustering
    or of lists no shard holds now (`live`: each shard's lists; a mapping or map change left them)."""
    store = store_at(where)
    prefix = part_prefix(clustering, lists)
    store.write_named(f"{prefix}{position}{SUFFIX}", index.serialized())
    keep = {prefix} | {part_prefix(clustering, ls) for ls in live}
    for location in store.locations():
        name = location.rsplit("/", 1)[-1]
        if not name.startswith("shard-") or name == f"{prefix}{position}{SUFFIX}":
            continue
        if name.startswith(prefix) or not any(name.startswith(p) for p in keep):
            store.remove(location)
