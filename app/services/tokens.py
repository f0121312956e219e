"""Scoped API tokens: who may read what.

The admin names tokens, each with a role (read, write, admin) and a scope: the whole store, or
some experts, tags (a document's `metadata.tags`) and source prefixes. Only a token's SHA-256 is
stored; the token itself is shown once, at creation. A token is checked against SQL on every
request, so a revocation or an expiry holds from the next one. The configured admin token and
read token keep working as "admin, all" and "read, all".

A scope resolves, in one serving state, to the chunks it may read and the experts it may be
routed to (engine.access.Allowed), cached by the catalogue version: the searches are limited to
those chunks before their top k (engine.pipeline), never filtered after.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, timedelta
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.clustering.expert_documents import matches
from app.core.models import ApiToken, Chunk, Document, utcnow
from app.store import index_log
from engine.access import Allowed
from engine.errors import InvalidRequest, NotConfigured, NotFound
from engine.serving import ExpertProfile, ServingState
from index.store import SearchIndex

ROLES = ("read", "write", "admin")
# Other workers learn that a first scoped token closed anonymous reads within this many seconds.
CLOSED_TTL_S = 2.0
# The scopes asked for last whose reach is made before each new serving state (each ~9 ms on the
# writer's commit at 46k chunks); another scope's first question after a change makes its own.
_SCOPES_PREPARED = 8
_REACHES_KEPT = 64
TOKEN_PREFIX = "mrg_"  # a scoped token's prefix: it is never mistaken for the admin or read token


@dataclass(frozen=True)
class Scope:
    """What a token may read: chunks of these experts' lists, of documents tagged with any of
    these tags, or whose source starts with any of these prefixes (their union)."""

    experts: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    source_prefixes: tuple[str, ...] = ()

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Scope:
        unknown = set(raw) - {"experts", "tags", "source_prefixes"}
        if unknown:
            raise InvalidRequest(f"a scope names experts, tags and source_prefixes; not {sorted(unknown)}")
        scope = cls(
            tuple(sorted({int(e) for e in raw.get("experts") or []})),
            tuple(sorted({str(t) for t in raw.get("tags") or []})),
            tuple(sorted({str(p) for p in raw.get("source_prefixes") or []})),
        )
        if not (scope.experts or scope.tags or scope.source_prefixes):
            raise InvalidRequest("an empty scope reads nothing: name experts, tags or source_prefixes (or no scope)")
        return scope

    def admits(self, source: str, meta: Mapping[str, Any] | None) -> bool:
        """Whether a document with this source and metadata lies in the scope by its own fields
        (a tag or a source prefix): what a scoped writer may create, replace or delete."""
        return any(matches({"source_prefix": p}, None, source, meta) for p in self.source_prefixes) or any(
            matches({"tag": t}, None, source, meta) for t in self.tags
        )

    @property
    def writes(self) -> str:
        """The documents this scope writes, in words (for the refusal of a write outside it)."""
        named = [f"whose source starts with {p!r}" for p in self.source_prefixes]
        named += [f"tagged {t!r} (metadata.tags)" for t in self.tags]
        return "documents " + " or ".join(named)

    def as_json(self) -> dict[str, list[Any]]:
        return {"experts": list(self.experts), "tags": list(self.tags), "source_prefixes": list(self.source_prefixes)}

    @property
    def key(self) -> str:
        return json.dumps(self.as_json(), sort_keys=True)


@dataclass(frozen=True)
class Principal:
    """Who is asking: a role, and a scope (None: the whole store)."""

    role: str
    scope: Scope | None = None
    name: str = ""

    def may(self, role: str) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)

    @property
    def owner(self) -> str | None:
        """What it owns by (conversations, jobs): a scoped token's name; None for the unscoped,
        who read everyone's."""
        return self.name if self.scope is not None else None


EVERYONE = Principal("read")  # reads when no read token is set and no scoped token exists
ADMIN = Principal("admin", name="admin token")
READER = Principal("read", name="read token")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Tokens:
    """The tokens in SQL, and each scope's reach per serving state (a small cache)."""

    sessions: sessionmaker[Session]
    _reach: OrderedDict[tuple[str, int], Allowed] = field(default_factory=OrderedDict)
    # Each scope's latest reach with what it was made of: a new catalogue version that moved none
    # of it (a router trained or activated, an expert renamed) takes it as it is.
    _made_of: dict[str, tuple[tuple[Any, ...], Allowed]] = field(default_factory=dict)
    _used: OrderedDict[str, Scope] = field(default_factory=OrderedDict)  # scopes asked for, the latest last
    _chunk_table: _ChunkTable | None = None
    _table_lock: threading.Lock = field(default_factory=threading.Lock)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: tuple[float, bool] | None = None  # (when read, whether a scoped token closes anonymous reads)

    def create(
        self, name: str, role: str, scope: Mapping[str, Any] | None, expires_days: float | None
    ) -> tuple[dict[str, Any], str]:
        """A new token: (its row, the token itself: shown this once, never stored)."""
        if role not in ROLES:
            raise InvalidRequest(f"role must be one of {', '.join(ROLES)}")
        parsed = Scope.of(scope) if scope is not None else None
        if parsed is not None and role == "admin":
            raise InvalidRequest("an admin token reads everything: give it no scope")
        if parsed is not None and role == "write" and not (parsed.tags or parsed.source_prefixes):
            raise InvalidRequest(
                "a write token's scope names tags or source_prefixes: the documents it writes must lie in "
                "its scope when written, and a new document's expert is known only once it is placed"
            )
        if expires_days is not None and expires_days <= 0:
            raise InvalidRequest("expires_days must be positive")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        row = ApiToken(
            name=name,
            token_hash=token_hash(secret),
            role=role,
            scope=parsed.as_json() if parsed is not None else None,
            created_at=utcnow(),
            expires_at=utcnow() + timedelta(days=expires_days) if expires_days is not None else None,
        )
        try:
            with self.sessions.begin() as s:
                s.add(row)
                s.flush()
                made = _public(row)
            self._closed = (time.monotonic(), True)  # anonymous reads end now in this process
            return made, secret
        except IntegrityError:
            raise InvalidRequest(f"a token named {name!r} exists already") from None

    def list(self) -> list[dict[str, Any]]:
        with self.sessions() as s:
            return [_public(t) for t in s.scalars(select(ApiToken).order_by(ApiToken.id))]

    def revoke(self, token_id: int) -> dict[str, Any]:
        """Revoke a token (from its next request on); the row stays, so the revocation can be seen."""
        with self.sessions.begin() as s:
            row = s.get(ApiToken, token_id)
            if row is None:
                raise NotFound(f"no token {token_id}")
            if row.revoked_at is None:
                row.revoked_at = utcnow()
            revoked = _public(row)
        self._closed = None  # read again at the next anonymous request
        return revoked

    def reads_closed(self) -> bool | None:
        """Whether a scoped token closes anonymous reads, as read within `CLOSED_TTL_S` (no I/O);
        None: not known that recently (`refresh_reads_closed`)."""
        known = self._closed
        return known[1] if known is not None and time.monotonic() - known[0] < CLOSED_TTL_S else None

    def refresh_reads_closed(self) -> bool:
        """Whether some scoped token is usable now (anonymous reads are then refused), from SQL."""
        now, closed = utcnow(), False
        with self.sessions() as s:
            for expires in s.scalars(select(ApiToken.expires_at).where(ApiToken.revoked_at.is_(None))):
                if expires is None or _aware(expires) > now:
                    closed = True
                    break
        self._closed = (time.monotonic(), closed)
        return closed

    def resolve(self, token: str) -> Principal | None:
        """The principal a token names, None for a token that is unknown, revoked or expired."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        with self.sessions() as s:
            row = s.scalar(select(ApiToken).where(ApiToken.token_hash == token_hash(token)))
            if row is None or row.revoked_at is not None:
                return None
            if row.expires_at is not None and _aware(row.expires_at) <= utcnow():
                return None
            return Principal(row.role, Scope.of(row.scope) if row.scope else None, row.name)

    def allowed(
        self, principal: Principal, version: int, experts: Mapping[int, ExpertProfile], index: SearchIndex
    ) -> Allowed | None:
        """What `principal` may read at catalogue `version` (None: everything): made before the
        state of that version was published (`prepare`) for a scope in use, else now."""
        scope = principal.scope
        if scope is None:
            return None
        with self._lock:
            self._used[scope.key] = scope
            self._used.move_to_end(scope.key)
            while len(self._used) > _SCOPES_PREPARED:
                self._used.popitem(last=False)
        return self._reach_of(scope, version, experts, index)

    def prepare(self, version: int, experts: Mapping[int, ExpertProfile], index: SearchIndex) -> None:
        """Before the state of catalogue `version` is published (app.serving.states): the reach of
        every scope in use, so that no question after a change reads the chunk table on its path."""
        with self._lock:
            scopes = list(self._used.values())
        if scopes:  # the chunk table follows the log here, once for every scope
            self._table(version)
        for scope in scopes:
            _ = self._reach_of(scope, version, experts, index).id_set  # FAISS's selector too, built now

    def _reach_of(
        self, scope: Scope, version: int, experts: Mapping[int, ExpertProfile], index: SearchIndex
    ) -> Allowed:
        key = (scope.key, version)
        with self._lock:
            found = self._reach.get(key)
            if found is not None:
                self._reach.move_to_end(key)
                return found
        table = self._table(version)
        inputs = (table.content, index.version, index.writes, _lists_of(experts))
        with self._lock:
            made = self._made_of.get(scope.key)
        if made is not None and made[0] == inputs:
            return self._keep(key, scope.key, inputs, made[1])
        ids, documents, whole_lists, per_list = self._chunks(scope, experts, table, index)
        # The experts it may see named: those it names, and those whose every chunk it may read
        # (such an expert's name tells nothing of what lies outside the scope). Any other expert
        # holding some of its chunks may still be routed to, unnamed, its part searched.
        visible = {e for e in scope.experts if e in experts} | {
            e for e, p in experts.items() if p.clusters and all(c in whole_lists for c in p.clusters)
        }
        held = {e: int(per_list[[c for c in p.clusters if 0 <= c < len(per_list)]].sum()) for e, p in experts.items()}
        partly = {e: n for e, n in held.items() if n and e not in visible}
        reach = Allowed(ids, frozenset(visible), scope.key, documents, partly)
        reach.place(index, per_list)  # counted here: no question's route or search counts it again
        return self._keep(key, scope.key, inputs, reach)

    def _keep(self, key: tuple[str, int], scope: str, inputs: tuple[Any, ...], reach: Allowed) -> Allowed:
        with self._lock:
            self._reach[key] = reach
            while len(self._reach) > _REACHES_KEPT:
                self._reach.popitem(last=False)
            self._made_of[scope] = (inputs, reach)
            while len(self._made_of) > _REACHES_KEPT:
                del self._made_of[next(iter(self._made_of))]
        return reach

    def _table(self, version: int) -> _ChunkTable:
        """Every chunk's (id, document) and its documents' source and metadata at catalogue
        `version`, for all scopes: the table held brought forward by the index log (every chunk
        that enters or leaves is logged, and a document's fields change only with its chunks), or
        read whole when there is none or the log no longer reaches back to it. A table newer
        than `version` serves a question on an older state too: it is the fresher account of
        which document each chunk belongs to and of those documents' fields."""
        with self._table_lock:  # one reader at a time: the others take what it made
            table = self._chunk_table
            if table is not None and table.version >= version:
                return table
            with self.sessions() as s:
                if table is not None and index_log.horizon(s) <= table.version < version:
                    table = _follow_table(s, table, version)
                else:
                    table = _read_table(s, version)
            self._chunk_table = table
            return table

    @staticmethod
    def _chunks(
        scope: Scope, experts: Mapping[int, ExpertProfile], table: _ChunkTable, index: SearchIndex
    ) -> tuple[npt.NDArray[np.int64], dict[int, int], set[int], npt.NDArray[np.int64]]:
        """([A] ascending: the chunks of the scope's experts' lists (as `index` holds them) and of
        its tagged or prefixed documents, {document id: its chunks among them}, the lists all of
        whose chunks are among them, [nlist] the chunks among them in each list)."""
        named = np.array(
            sorted({c for e in scope.experts if e in experts for c in experts[e].clusters}), dtype=np.int64
        )
        docs = np.array(
            sorted(d for d, (source, meta) in table.docs.items() if scope.admits(source, meta)), dtype=np.int64
        )
        lists = index.clusters_of(table.ids)  # [N] -1: not in the index
        keep = np.isin(table.owners, docs) | np.isin(lists, named)  # [N]
        kept_docs, counts = np.unique(table.owners[keep], return_counts=True)
        partial = set(np.unique(lists[~keep]).tolist())  # lists with a chunk outside
        whole = set(np.unique(lists[lists >= 0]).tolist()) - partial
        inside = lists[keep]
        per_list = np.bincount(inside[inside >= 0], minlength=index.nlist).astype(np.int64)  # [nlist]
        return table.ids[keep], dict(zip(kept_docs.tolist(), counts.tolist(), strict=True)), whole, per_list


@dataclass(frozen=True)
class _ChunkTable:
    """The chunks' ids [N] ascending and their documents [N], and the documents' (id, source,
    metadata), at one catalogue version."""

    version: int
    ids: npt.NDArray[np.int64]
    owners: npt.NDArray[np.int64]
    docs: dict[int, tuple[str, dict[str, Any] | None]]
    content: int  # the version its content last changed at (a chunk in or out)


def _lists_of(experts: Mapping[int, ExpertProfile]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Each expert's lists: what a scope's reach reads of the experts."""
    return tuple((e, tuple(p.clusters)) for e, p in sorted(experts.items()))


def _read_table(s: Session, version: int) -> _ChunkTable:
    found = s.execute(select(Document.id, Document.source, Document.meta))
    docs = {d: (source, meta) for d, source, meta in found}
    # The driver's own cursor: the rows as plain tuples (SQLAlchemy's rows cost more than the read).
    cursor = s.connection().connection.cursor()
    try:
        cursor.execute(f"SELECT id, document_id FROM {Chunk.__tablename__} ORDER BY id")
        rows = cursor.fetchall()
    finally:
        cursor.close()
    pairs = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=2 * len(rows)).reshape(-1, 2)  # [N, 2]
    return _ChunkTable(version, pairs[:, 0].copy(), pairs[:, 1].copy(), docs, version)


def _follow_table(s: Session, table: _ChunkTable, version: int) -> _ChunkTable:
    """`table` brought to `version` by the index log in (table.version, version]: the chunks that
    left or moved are dropped, those that entered (and SQL still holds) added with their documents."""
    changes = index_log.read_log(s, table.version, version, 0, vectors=False)
    if not changes.touched:
        return _ChunkTable(version, table.ids, table.owners, table.docs, table.content)
    entering: dict[int, int] = {}  # chunk id -> its document
    ids = changes.ids.tolist()
    for start in range(0, len(ids), 900):  # bounded IN lists
        entering.update(
            s.execute(select(Chunk.id, Chunk.document_id).where(Chunk.id.in_(ids[start : start + 900]))).all()
        )
    docs = dict(table.docs)
    fresh = sorted(set(entering.values()))
    for start in range(0, len(fresh), 900):
        batch = fresh[start : start + 900]
        docs.update(
            {
                d: (src, meta)
                for d, src, meta in s.execute(
                    select(Document.id, Document.source, Document.meta).where(Document.id.in_(batch))
                )
            }
        )
    kept = ~np.isin(table.ids, np.array(changes.touched, dtype=np.int64))  # [N]
    new_ids = np.fromiter(entering, dtype=np.int64, count=len(entering))
    new_owners = np.fromiter(entering.values(), dtype=np.int64, count=len(entering))
    ids_all = np.concatenate([table.ids[kept], new_ids])  # [M]
    owners_all = np.concatenate([table.owners[kept], new_owners])  # [M]
    order = np.argsort(ids_all, kind="stable")
    return _ChunkTable(version, ids_all[order], owners_all[order], docs, version)


def _aware(when: Any) -> Any:
    """SQLite hands back naive datetimes: they were written in UTC."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _public(row: ApiToken) -> dict[str, Any]:
    """A token as the API shows it: never the token nor its hash."""
    return {
        "id": row.id,
        "name": row.name,
        "role": row.role,
        "scope": row.scope,
        "created_at": _aware(row.created_at).isoformat(),
        "expires_at": _aware(row.expires_at).isoformat() if row.expires_at else None,
        "revoked": row.revoked_at is not None,
    }


def reach(tokens: Tokens, who: Principal | None, state: ServingState) -> Allowed | None:
    """What `who` may read in `state` (None: everything). NotConfigured over expert shards, where
    a scope is not enforced yet: a scoped caller is refused rather than shown everything."""
    if who is None or who.scope is None:
        return None
    if state.shard_map is not None:
        raise NotConfigured("scoped tokens are not enforced over expert shards yet: use the admin or read token")
    return tokens.allowed(who, state.version, state.experts, state.index)
