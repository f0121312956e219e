"""Expert shards on Ray Serve (the `ray` extra): one deployment per shard of the shard map, each
replica holding only the FAISS lists of its experts, following the index log for them.

`ShardReplica` is the deployment's class and runs without Ray too (tests, one machine): it
boots from its part or the newest index snapshot (app.shards.parts), keeping only its lists, and
replays the index log after it; without a usable one it builds its part from SQL. It answers
`search(q, k, lists)` and applies the index log after its position, only for its lists
(`follow`; a new clustering is read again). `deploy` starts or joins a Ray cluster and runs one
Serve application with a deployment a shard (`shard-<name>`, its replicas from the map);
app.shards.client is the serving side of them.
Ray places the replicas, health-checks and restarts them; nothing here is cluster code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from app.core.db import make_engine, make_sessionmaker
from app.core.models import Chunk, IndexState
from app.shards import parts as shard_parts
from app.shards.map import ShardMap
from app.shards.postings import ShardPostings
from app.store.catalogue import read_version
from app.store.index_log import apply_log, carries, read_log
from app.store.profiles import profiles
from app.store.sql_index import index_from_sql
from engine.errors import NotConfigured
from engine.lexical import QueryWeights
from engine.sharded_lexical import LexicalAnswer
from index import ClusteredIndex

log = logging.getLogger(__name__)
# scores, ids, lo, hi (and when the search carried the question's weights, the ids' BM25 scores
# and the shard's best BM25 score per list: lists, best)
Stamped = (
    tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], int, int]
    | tuple[
        npt.NDArray[np.float32],
        npt.NDArray[np.int64],
        int,
        int,
        npt.NDArray[np.float32],
        npt.NDArray[np.int64],
        npt.NDArray[np.float32],
    ]
)
# A replica scans its lists for milliseconds a question: a tenth of a CPU each lets Ray place a
# shard map's replicas on a small machine; memory, not CPU, is what a shard needs (`replica_memory`).
_LIGHT = {"num_cpus": 0.1}
# Serve asks each replica `check_health` this often and replaces one that does not answer in time
# (a frozen or wedged process): seconds, not Serve's default 30 s of searches timing out.
HEALTH_PERIOD_S, HEALTH_TIMEOUT_S = 2.0, 5.0
REPLICA_BASE_BYTES = 160 * 2**20  # a replica's interpreter, FAISS, SQLAlchemy and Ray's worker, measured
_MEMORY_STEP = 64 * 2**20  # a replica's declared memory, in whole steps
BATCH = 32  # the most searches a replica answers in one FAISS scan
POSTINGS_SHARE = 0.1  # the share of a replica's time its BM25 rebuilds may take (as the server's)


def require() -> Any:
    """Ray Serve's module, or NotConfigured naming the extra that brings it."""
    try:
        from ray import serve
    except ImportError:
        raise NotConfigured("the Ray tier needs the ray extra: pip install 'moerag[ray]'") from None
    return serve


def join(address: str) -> None:
    """Connect this process to the Ray cluster at `address` (once), or NotConfigured saying how to
    start one."""
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=address, log_to_driver=False)
    except ConnectionError as exc:
        raise NotConfigured(
            f"no Ray cluster at {address!r} ({exc}): start one with `moerag ray up --config MAP`"
        ) from None


def alive_nodes() -> int:
    """The nodes of the Ray cluster this process joined that are alive now."""
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive"))


def refuse_local_store(nodes: int, db_url: str, snapshots: str) -> None:
    """On a cluster of more than one node, every replica must read the same store: NotConfigured,
    with the reason and the fix, for a SQLite database (a file on one machine) or snapshots in a
    plain local folder (`file://` names a mount every node is taken to share)."""
    if nodes <= 1:
        return
    from sqlalchemy.engine import make_url

    why = []
    if make_url(db_url).get_backend_name() == "sqlite":
        why.append("the database is SQLite, a file on this machine: set MOERAG_DATABASE_URL to PostgreSQL")
    if "://" not in snapshots:
        why.append(
            f"index snapshots are a local folder ({snapshots}): set MOERAG_SNAPSHOT_URL to a place every node "
            "reads (s3://bucket/moerag, or file:///mount shared by every node)"
        )
    if why:
        raise NotConfigured(
            f"the Ray cluster has {nodes} nodes and replicas on the others cannot read " + "; ".join(why)
        )


def deployed(shard_map: ShardMap, states: Callable[[str], dict[str, dict[str, int]] | None] | None = None) -> bool:
    """Whether this map version's application runs already, every shard deployment in it;
    `states`: how to read Serve's replica states (default `replica_states`, in this process)."""
    found = (states or replica_states)(shard_map.app_name)
    return found is not None and all(f"shard-{s.name}" in found for s in shard_map.shards)


def replica_states(app_name: str, running_only: bool = True) -> dict[str, dict[str, int]] | None:
    """{deployment: {replica state: how many}} of a Serve application; None when it is not
    running (`running_only`; else only when it does not exist), or Serve cannot say."""
    try:
        app = require().status().applications.get(app_name)
    except Exception:  # Serve's controller away for a moment: figures are not worth a failure
        return None
    if app is None or (running_only and getattr(app.status, "value", app.status) != "RUNNING"):
        return None
    return {
        name: {getattr(state, "value", str(state)): n for state, n in (d.replica_states or {}).items()}
        for name, d in app.deployments.items()
    }


def _replica_actors(app_name: str, deployment: str) -> list[dict[str, str]]:
    """The named actors of a deployment's live replicas ({"name", "namespace"}): Serve names each
    `SERVE_REPLICA::<app>#<deployment>#<id>` (no dashboard needed, unlike Ray's state API)."""
    import ray

    prefix = f"SERVE_REPLICA::{app_name}#{deployment}#"
    return [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]


def _replica_id() -> str | None:
    """This Serve replica's unique id (None outside a replica)."""
    try:
        return str(require().get_replica_context().replica_id.unique_id)
    except Exception:  # not in a replica: tests, one machine
        return None


def _searched_by(shard_map: ShardMap, deployment: str, replicas: set[str], asks: int = 16) -> dict[str, int]:
    """{replica id: searches it answered} for those of `replicas` that `asks` figures calls reached."""
    handle = require().get_deployment_handle(deployment, app_name=shard_map.app_name)
    seen: dict[str, int] = {}
    for response in [handle.stats.remote() for _ in range(asks)]:
        try:
            figures = response.result(timeout_s=5)
        except Exception:  # a replica ending or starting: the next round asks again
            continue
        if figures.get("replica") in replicas:
            seen[figures["replica"]] = figures["searched"]
    return seen


def _running(app_name: str, deployment: str) -> int:
    """How many of a deployment's replicas Serve counts RUNNING now (whatever the application's state)."""
    return (replica_states(app_name, running_only=False) or {}).get(deployment, {}).get("RUNNING", 0)


def restart(
    shard_map: ShardMap, shard: str, timeout_s: float = 300.0, told: Any = print, settle_s: float = 10.0
) -> list[dict[str, Any]]:
    """Replace the replicas of shard `shard` one at a time: each is ended and Serve's controller
    starts another in its place (booting as any new replica does: its part, a snapshot or SQL);
    the next goes only once the shard has all its replicas running again and its successor has
    answered a search (the servers' routers know it then; `settle_s` at most when none comes), so
    a shard of two or more keeps answering throughout (a search whose replica ends is asked again
    on another: app.shards.client). A shard still replacing a replica it lost first has all of
    them again. -> each replaced replica (`replica`, `seconds` until its successor ran,
    `searched_after_s` until it answered a search, None when none came). NotConfigured for a
    shard the map does not name or a map not deployed; TimeoutError when a successor is not
    running within `timeout_s`."""
    import ray

    names = [s.name for s in shard_map.shards]
    if shard not in names:
        raise NotConfigured(f"shard map {shard_map.version} has no shard {shard!r}; its shards: {', '.join(names)}")
    deployment = f"shard-{shard}"
    if replica_states(shard_map.app_name) is None and not _replica_actors(shard_map.app_name, deployment):
        raise NotConfigured(f"shard map {shard_map.version} is not deployed: nothing to restart")
    spec = shard_map.shards[names.index(shard)]
    wanted = spec.replicas if spec.autoscaling is None else spec.autoscaling.min_replicas
    old, wanted = _all_running(shard_map.app_name, deployment, max(wanted, 1), timeout_s)
    replaced = []
    for n, actor in enumerate(old, start=1):
        t0 = time.monotonic()
        told(f"replica {n} of {len(old)} of shard {shard}: replacing {actor['name']}")
        before = {a["name"] for a in _replica_actors(shard_map.app_name, deployment)}
        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
        alive, _ = _all_running(shard_map.app_name, deployment, wanted, timeout_s, without=actor["name"])
        ran = time.monotonic() - t0
        # Before the next is ended: the servers' routers send the successor searches, so a search
        # whose replica ends next is asked again where it can be answered.
        successors = {a["name"].rsplit("#", 1)[-1] for a in alive if a["name"] not in before}
        searched_after = _first_search(shard_map, deployment, successors, settle_s)
        replaced.append({"replica": actor["name"], "seconds": round(ran, 1), "searched_after_s": searched_after})
    return replaced


def _all_running(
    app_name: str, deployment: str, wanted: int, timeout_s: float, without: str | None = None
) -> tuple[list[dict[str, str]], int]:
    """(the deployment's replica actors, how many it keeps) once at least `wanted` are named and
    running and `without` (a replica ended) is gone; TimeoutError past `timeout_s`."""
    t0 = time.monotonic()
    while True:
        alive = _replica_actors(app_name, deployment)
        running = _running(app_name, deployment)
        if without is None:
            wanted = max(wanted, len(alive), running)
        if len(alive) >= wanted and running >= wanted and all(a["name"] != without for a in alive):
            return alive, wanted
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{deployment}: {running} of its {wanted} replicas running after {timeout_s:g} s")
        time.sleep(0.25)


def _first_search(shard_map: ShardMap, deployment: str, successors: set[str], settle_s: float) -> float | None:
    """Seconds until one of `successors` (replica ids) answered a search; None when none did
    within `settle_s` (no searches came)."""
    t0 = time.monotonic()
    while successors and time.monotonic() - t0 < settle_s:
        if any(n > 0 for n in _searched_by(shard_map, deployment, successors).values()):
            return round(time.monotonic() - t0, 1)
        time.sleep(0.25)
    return None


class ShardReplica:
    """One replica of one shard: the vectors of `lists` only, in an index with every centroid."""

    def __init__(
        self,
        db_url: str,
        shard_map: ShardMap,
        shard: int,
        dim: int,
        poll_seconds: float = 0.5,
        snapshots: str | None = None,
        codec: str = "flat",
    ) -> None:
        self.engine = make_engine(db_url)
        self.sessions = make_sessionmaker(self.engine)
        self.shard_map, self.shard = shard_map, shard
        self.lists = np.zeros(0, dtype=np.int64)  # its lists: the map applied to the store's experts
        self.dim, self.codec = dim, codec  # a build from SQL stores vectors as `codec` (MOERAG_INDEX_CODEC)
        self._lock = threading.Lock()
        self.searched = 0  # searches answered (a successor that has some is known to the servers' routers)
        self._following = threading.Lock()
        self.booted = "sql"  # or "part@<position>", "snapshot@<position>": what the replica started from
        self.bm25 = ShardPostings(self.sessions, POSTINGS_SHARE)  # BM25 over its chunks (engine.postings)
        booted = self._from_snapshot(snapshots) if snapshots else None
        self.index, self.position, self.clustering = booted or self._build()
        self.snapshots, self.part_written = snapshots, self.position if self.booted.startswith("part@") else -1
        self.bm25.read(self.lists)
        self._stop = threading.Event()
        if poll_seconds > 0:  # a replica follows the catalogue on its own
            threading.Thread(target=self._follow, args=(poll_seconds,), name="shard-follow", daemon=True).start()

    def _follow(self, poll_seconds: float) -> None:
        last_part = time.monotonic()
        while not self._stop.wait(poll_seconds):
            try:
                self.follow()
                self.bm25.refresh(self.lists)
                if self.snapshots and time.monotonic() - last_part >= shard_parts.PART_SECONDS:
                    last_part = time.monotonic()
                    self.write_part()
            except Exception:  # the database away for a moment: keep following
                log.exception("shard replica: following the index log failed; retrying")

    def lexical(
        self,
        w: QueryWeights,
        k: int,
        lists: npt.NDArray[np.int64] | None,
        ids: npt.NDArray[np.int64] | None,
        at_least: int = 0,
    ) -> LexicalAnswer:
        """Its chunks' BM25 scored with the whole store's term weights (engine.sharded_lexical): its k
        best (within `lists`), its best per list and the scores of `ids`, at catalogue version
        `at_least` or later (for the lists its chunks are in)."""
        if at_least > self.position:
            self.follow()
        return self.bm25.answer(w, k, lists, ids, self.index.clusters_of)

    def write_part(self) -> bool:
        """Write this shard's part to the snapshot store if it moved on since the last one."""
        with self._lock:
            index, position, clustering, lists = self.index, self.position, self.clustering, self.lists
        if not self.snapshots or position <= self.part_written:
            return False
        with self.sessions() as s:  # every shard's lists now: parts of other lists are stale
            live = self.shard_map.lists_of_shards(profiles(s), index.nlist)
        shard_parts.write(self.snapshots, index, clustering, lists, position, live)  # content at or after position
        self.part_written = position
        return True

    def close(self) -> None:
        self._stop.set()
        self.engine.dispose()

    def _build(self) -> tuple[ClusteredIndex, int, str]:
        self.booted = "sql"
        with self.sessions() as s:
            position = read_version(s)  # rows read below are this version's or later (replays are idempotent)

            def own(nlist: int) -> npt.NDArray[np.int64]:
                self.lists = self._own_lists(s, nlist)
                return self.lists

            index = index_from_sql(s, self.dim, own, codec=self.codec)
        log.info("shard replica: %d vectors in %d lists at version %d", index.ntotal, len(self.lists), position)
        return index, position, index.version

    def _from_snapshot(self, where: str) -> tuple[ClusteredIndex, int, str] | None:
        """Its newest part at `where` (a folder or fsspec URL), else the newest whole snapshot cut
        to its lists (app.shards.parts), brought to now by the log; None when there is none to
        trust (then SQL builds it)."""
        try:
            with self.sessions() as s:
                clustering, nlist = s.execute(select(IndexState.version, IndexState.nlist)).one()
                self.lists = self._own_lists(s, nlist)
                found = shard_parts.newest(s, where, clustering, self.lists)
            if found is None or found[0].codec != self.codec:
                return None
            index, position, self.booted = found
            self.index, self.position, self.clustering = index, position, clustering
            self._follow_once()  # the log after the snapshot, for its lists (or SQL, if it cannot)
            with self.sessions() as s:
                rows = s.scalar(select(func.count(Chunk.id)).where(Chunk.cluster_id.in_(self.lists.tolist()))) or 0
            if self.clustering != clustering or rows != self.index.ntotal:  # not what SQL holds: distrust it
                log.warning("shard replica: the snapshot at %d disagrees with SQL; building from SQL", position)
                return None
        except Exception as exc:  # unreadable, corrupt, or gone meanwhile: SQL is the truth
            log.warning("shard replica: cannot boot from a snapshot at %s (%s); building from SQL", where, exc)
            return None
        log.info("shard replica: %d vectors in %d lists from %s", self.index.ntotal, len(self.lists), self.booted)
        return self.index, self.position, self.clustering

    def _own_lists(self, s: Session, nlist: int) -> npt.NDArray[np.int64]:
        return self.shard_map.lists_of_shards(profiles(s), nlist)[self.shard]

    def search(
        self,
        q: npt.NDArray[np.float32],
        k: int,
        lists: npt.NDArray[np.int64],
        at_least: int = 0,
        bm25: QueryWeights | None = None,
    ) -> Stamped:
        """As `ClusteredIndex.search` over `lists` (those this shard holds), at catalogue version
        `at_least` or later: the asking state's index position. A replica behind it follows the
        log first, so a question sees every write its serving state saw (read your writes).
        -> (scores, ids, lo, hi): the catalogue versions the searched content lies between (the
        log may be applied while a search runs), for `ShardedIndex`'s one cut across shards."""
        return self.search_many([q], [k], [lists], [at_least], [bm25])[0]

    def search_many(
        self,
        qs: Sequence[npt.NDArray[np.float32]],
        ks: Sequence[int],
        lists: Sequence[npt.NDArray[np.int64]],
        at_least: Sequence[int],
        bm25: Sequence[QueryWeights | None] | None = None,
    ) -> list[Stamped]:
        """Several `search`es at once (what Serve batches on a replica): one FAISS scan for all the
        searches asking the same k, each row over its own lists; results in the callers' order,
        each exactly what `search` gives it."""
        if max(at_least, default=0) > self.position:
            self.follow()
        with self._lock:
            index, lo = self.index, self.position
            self.searched += len(qs)
        found: list[tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]] = [None] * len(qs)  # type: ignore[list-item]
        for k in sorted(set(ks)):
            which = [i for i, ki in enumerate(ks) if ki == k]
            rows = np.vstack([qs[i] for i in which])  # [R, D]
            row_lists = [lists[i] for i in which for _ in range(len(qs[i]))]
            scores, ids = index.search_rows(rows, k, row_lists)  # [R, k] each
            start = 0
            for i in which:
                end = start + len(qs[i])
                found[i] = (scores[start:end], ids[start:end])
                start = end
        with self._lock:  # a follow applied meanwhile finished its slice before this returns
            hi = self.position
        out: list[Stamped] = []
        for (scores, ids), w in zip(found, bm25 or [None] * len(found), strict=True):
            if w is None:
                out.append((scores, ids, lo, hi))
            else:  # with the question's weights: the found chunks' BM25 scores and each list's best (the fusion's)
                a = self.bm25.answer(w, 1, None, ids.ravel(), index.clusters_of)
                out.append((scores, ids, lo, hi, a.of_ids.reshape(ids.shape), a.lists, a.best))
        return out

    def rows(
        self,
        q: npt.NDArray[np.float32],
        k: int,
        lists: Sequence[npt.NDArray[np.int64]],
        through: int | None = None,
        at_least: int = 0,
    ) -> Stamped:
        """`ClusteredIndex.search_rows` of this shard (each row over its own lists here, only ids
        <= `through` when given) at catalogue version `at_least` or later: the probes of many rows
        at once (a router's training, a new document's fit). -> (scores, ids, lo, hi)."""
        if at_least > self.position:
            self.follow()
        with self._lock:
            index, lo = self.index, self.position
        scores, ids = index.search_rows(q, k, lists, through)
        return scores, ids, lo, self.position

    def follow(self) -> int:
        """Apply what the index log says of this shard's lists since its position; the catalogue
        version it holds now. A new clustering, or a log compacted past it, is read again. One
        follow at a time (the poll thread's, a search's): slices are applied in order."""
        with self._following:
            return self._follow_once()

    def _follow_once(self) -> int:
        with self.sessions() as s:
            now = read_version(s)
            if now <= self.position:
                return self.position
            carried = carries(s, self.clustering, self.position)
            carried = carried and np.array_equal(self._own_lists(s, self.index.nlist), self.lists)  # no expert moved
            changes = read_log(s, self.position, now, self.dim) if carried else None
        with self._lock:
            if changes is None:
                before, clustering = self.lists, self.clustering
                self.index, self.position, self.clustering = self._build()
            else:
                mine = np.isin(changes.clusters, self.lists)  # [N]: entering or moving into this shard
                # Every touched chunk leaves (moving elsewhere, or gone); only this shard's enter again.
                apply_log(
                    self.index,
                    replace(changes, ids=changes.ids[mine], x=changes.x[mine], clusters=changes.clusters[mine]),
                )
                self.position = now
        # BM25: the chunks entering it at once, the rest when its postings are read again (spaced).
        if changes is None and self.clustering != clustering:  # new lists altogether: read them all now
            self.bm25.read(self.lists)
        elif changes is None:
            lists = np.setdiff1d(self.lists, before)
            self.bm25.entered(Chunk.cluster_id.in_(lists.tolist()) if len(lists) else None)
        else:
            self.bm25.entered(Chunk.id.in_(changes.ids[mine].tolist()) if mine.any() else None)
        return self.position

    def check_health(self) -> None:
        """Serve's health check (every HEALTH_PERIOD_S): answering at all is the check; a replica
        that cannot (stopped, wedged) is replaced."""

    def stats(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),  # the replica's process, for an operator's tools
            "replica": _replica_id(),  # Serve's id of this replica (its actor's name ends with it); None off Ray
            "searched": self.searched,
            "vectors": self.index.ntotal,
            "lists": len(self.lists),
            "position": self.position,
            "booted": self.booted,
            "bm25_chunks": len(self.bm25),
            "bm25_position": self.bm25.position,
        }


def deploy(shard_map: ShardMap, db_url: str, dim: int, snapshots: str | None = None, codec: str = "flat") -> list[Any]:
    """Run one Serve application with a deployment per shard (Ray started or joined by the caller,
    `ray.init`), its replicas booting from the snapshots at `snapshots` (a folder every replica's
    machine reads, or an fsspec URL) when given; returns their handles, in map order."""
    serve = require()
    replica = _batched(serve)
    deployments = []
    memory = replica_memory(make_engine(db_url), shard_map, dim)
    for n, shard in enumerate(shard_map.shards):
        scaling = shard.autoscaling
        replicas: dict[str, Any] = {"num_replicas": shard.replicas}
        if scaling is not None:  # Serve scales between the bounds, starting at the map's replicas
            replicas = {"autoscaling_config": dataclasses.asdict(scaling) | {"initial_replicas": shard.replicas}}
        deployment = serve.deployment(
            replica,
            name=f"shard-{shard.name}",
            ray_actor_options=_LIGHT | {"memory": memory[n]},  # so Ray places it where it fits
            max_ongoing_requests=BATCH * 2,  # room for a batch in flight and the next one forming
            health_check_period_s=HEALTH_PERIOD_S,
            health_check_timeout_s=HEALTH_TIMEOUT_S,
            **replicas,
        )
        deployments.append(deployment.bind(db_url, shard_map, n, dim, snapshots=snapshots, codec=codec))
    serve.start(proxy_location="Disabled")  # handles only: no HTTP proxy to start (it timed out on busy cores)
    holder = serve.deployment(_Shards, name="shards", ray_actor_options=_LIGHT)
    serve.run(holder.bind(*deployments), name=shard_map.app_name, route_prefix=None)
    return [serve.get_deployment_handle(f"shard-{s.name}", app_name=shard_map.app_name) for s in shard_map.shards]


def _batched(serve: Any) -> type[ShardReplica]:
    """ShardReplica whose `search` Serve batches: the searches waiting on a replica are answered by
    one `search_many` (at most BATCH, none held back to wait for more), run off the replica's event
    loop so the next batch forms meanwhile."""

    class BatchedShardReplica(ShardReplica):
        @serve.batch(max_batch_size=BATCH, batch_wait_timeout_s=0.0)
        async def search(
            self,
            q: list[npt.NDArray[np.float32]],
            k: list[int],
            lists: list[npt.NDArray[np.int64]],
            at_least: list[int],
            bm25: list[QueryWeights | None],
        ) -> list[Stamped]:
            return await asyncio.to_thread(self.search_many, q, k, lists, at_least, bm25)

        async def lexical(  # type: ignore[override]
            self,
            w: QueryWeights,
            k: int,
            lists: npt.NDArray[np.int64] | None,
            ids: npt.NDArray[np.int64] | None,
            at_least: int = 0,
        ) -> LexicalAnswer:
            """`ShardReplica.lexical` off the replica's event loop (its searches keep being batched)."""
            return await asyncio.to_thread(ShardReplica.lexical, self, w, k, lists, ids, at_least)

        async def rows(  # type: ignore[override]
            self,
            q: npt.NDArray[np.float32],
            k: int,
            lists: Sequence[npt.NDArray[np.int64]],
            through: int | None = None,
            at_least: int = 0,
        ) -> Stamped:
            """`ShardReplica.rows` off the replica's event loop."""
            return await asyncio.to_thread(ShardReplica.rows, self, q, k, lists, through, at_least)

    return BatchedShardReplica


class _Shards:
    """The application's ingress: it only holds the shard deployments so one `serve.run` starts them."""

    def __init__(self, *shards: Any) -> None:
        self.shards = shards

    def __call__(self) -> int:
        return len(self.shards)


def replica_memory(engine: Engine, shard_map: ShardMap, dim: int) -> list[int]:
    """Bytes each shard's replica declares to Ray, from what it will hold: its lists' vectors
    (float32, twice over for a rebuild beside the live index), their BM25 postings (~1 kB a
    chunk) and the process itself (REPLICA_BASE_BYTES)."""
    try:
        with make_sessionmaker(engine)() as s:
            sizes = dict(s.execute(select(Chunk.cluster_id, func.count(Chunk.id)).group_by(Chunk.cluster_id)).all())
            nlist = s.scalar(select(IndexState.nlist).where(IndexState.id == 1)) or 1
            lists = shard_map.lists_of_shards(profiles(s), nlist)
    finally:
        engine.dispose()
    out = []
    for held in lists:
        vectors = sum(sizes.get(int(c), 0) for c in held)
        need = REPLICA_BASE_BYTES + vectors * (2 * dim * 4 + 1024)
        out.append(-(-need // _MEMORY_STEP) * _MEMORY_STEP)  # whole steps: a few more chunks change nothing
    return out


def store_dim(engine: Engine) -> int:
    """The embedding width of the store (its index state), for a shard's part."""
    with engine.connect() as conn:
        dim = conn.execute(select(IndexState.dim).where(IndexState.id == 1)).scalar()
    if dim is None:
        raise NotConfigured("the store has no index yet: start moerag on it once (moerag serve) before `ray up`")
    return int(dim)
