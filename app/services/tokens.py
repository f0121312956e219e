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
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.clustering.expert_documents import matches
from app.core.models import ApiToken, Chunk, Document, utcnow
from engine.access import Allowed
from engine.errors import InvalidRequest, NotConfigured, NotFound
from engine.serving import ExpertProfile, ServingState

ROLES = ("read", "write", "admin")
# Other workers learn that a first scoped token closed anonymous reads within this many seconds.
CLOSED_TTL_S = 2.0
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

    def allowed(self, principal: Principal, version: int, experts: Mapping[int, ExpertProfile]) -> Allowed | None:
        """What `principal` may read at catalogue `version` (None: everything)."""
        scope = principal.scope
        if scope is None:
            return None
        key = (scope.key, version)
        with self._lock:
            found = self._reach.get(key)
            if found is not None:
                self._reach.move_to_end(key)
                return found
        ids, documents, whole_lists = self._chunks(scope, experts)
        # The experts it may be routed to and see named: those it names, and those whose every
        # chunk it may read (such an expert's name tells nothing of what lies outside the scope).
        visible = {e for e in scope.experts if e in experts} | {
            e for e, p in experts.items() if p.clusters and all(c in whole_lists for c in p.clusters)
        }
        reach = Allowed(ids, frozenset(visible), scope.key, documents)
        with self._lock:
            self._reach[key] = reach
            while len(self._reach) > 64:
                self._reach.popitem(last=False)
        return reach

    def _chunks(
        self, scope: Scope, experts: Mapping[int, ExpertProfile]
    ) -> tuple[np.ndarray, dict[int, int], set[int]]:
        """([A] ascending: the chunks of the scope's experts' lists and of its tagged or prefixed
        documents, {document id: its chunks among them}, the lists all of whose chunks are among them)."""
        lists = {c for e in scope.experts if e in experts for c in experts[e].clusters}
        with self.sessions() as s:
            docs = {
                d
                for d, source, meta in s.execute(select(Document.id, Document.source, Document.meta))
                if any(matches({"source_prefix": p}, None, source, meta) for p in scope.source_prefixes)
                or any(matches({"tag": t}, None, source, meta) for t in scope.tags)
            }
            rows = s.execute(select(Chunk.id, Chunk.document_id, Chunk.cluster_id)).all()
        kept = [(i, d) for i, d, c in rows if d in docs or c in lists]
        documents: dict[int, int] = {}
        for _, d in kept:
            documents[d] = documents.get(d, 0) + 1
        partial = {c for _, d, c in rows if not (d in docs or c in lists)}  # lists with a chunk outside
        whole = {c for _, _, c in rows if c is not None} - partial
        return np.array(sorted(i for i, _ in kept), dtype=np.int64), documents, whole


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
    return tokens.allowed(who, state.version, state.experts)
