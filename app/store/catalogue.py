"""One catalogue version: what every serving process follows to keep its state fresh.

Every committed transaction that changes what a serving process must see (documents and
chunks, clusters and their expert, experts, router versions, the index's clustering) bumps one
version in SQL *in the same transaction*, and records which parts it changed:

    catalogue_version (one row)   version -> version + 1, row-locked until commit
    catalogue_change              (version, parts)  one row per such commit

The bump is found, not called: session events see every flushed object and every ORM-enabled
INSERT/UPDATE/DELETE, so no writer can forget it. The version row's lock orders the commits,
so a follower that has read version v has seen every change up to v (a plain sequence would
let a later commit become visible before an earlier one).

Each process follows the version with one `Catalogue`: a thread asks for changes after the
last version it applied (PostgreSQL wakes it at once with LISTEN/NOTIFY; SQLite, and PostgreSQL
as a safety net, is polled every `poll_seconds`), and a commit made in this process is applied
before `commit()` returns, so a request sees its own writes. Subscribers get the parts that
changed and refresh exactly those. This replaces a TTL for experts, a poll for the active
router and generation counters; it is the same path for one process and for many.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from typing import Any

from sqlalchemy import Engine, event, insert, select, text, update
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction, sessionmaker

from app.core.models import Base, CatalogueChange, CatalogueVersion
from app.store import index_log

log = logging.getLogger(__name__)

# Which part of the catalogue each table belongs to; tables not named here (jobs, the query
# log, router examples, console sessions) are not followed by serving processes.
PARTS: dict[str, str] = {
    "document": "documents",
    "chunk": "documents",
    "cluster": "clusters",
    "expert": "experts",
    "router_version": "router",
    "index_state": "index",
}
ALL_PARTS = frozenset(PARTS.values())
CHANNEL = "moerag_catalogue"
_PENDING = "moerag_catalogue_parts"  # session.info key: parts changed in the open transaction
_BUMPED = "moerag_catalogue_bumped"  # session.info key: this commit bumped the version

Subscriber = Callable[[int, frozenset[str]], object]  # (version, parts changed); the result is ignored


def _note(session: Session, table: Any) -> None:
    part = PARTS.get(getattr(table, "name", ""))
    if part is not None:
        session.info.setdefault(_PENDING, set()).add(part)


def read_version(session: Session) -> int:
    return int(session.scalar(select(CatalogueVersion.version).where(CatalogueVersion.id == 1)) or 0)


class Catalogue:
    """Bumps the version in every writing transaction of `sessions`; follows it for subscribers."""

    def __init__(self, sessions: sessionmaker[Session], poll_seconds: float = 0.5) -> None:
        self.sessions = sessions
        self.engine: Engine = sessions.kw["bind"]
        self.poll_seconds = poll_seconds
        self.version = 0  # the last version applied in this process
        self._subscribers: list[tuple[frozenset[str], Subscriber]] = []
        self._lock = threading.RLock()  # a commit made by a subscriber re-enters sync
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._postgres = self.engine.dialect.name == "postgresql"
        event.listen(sessions, "before_flush", self._before_flush)
        event.listen(sessions, "do_orm_execute", self._on_execute)
        event.listen(sessions, "before_commit", self._before_commit)
        event.listen(sessions, "after_commit", self._after_commit)
        event.listen(sessions, "after_rollback", self._after_rollback)

    # ---- writing: the bump, in the writer's transaction ---------------------------------------------

    def _before_flush(self, session: Session, _ctx: UOWTransaction, _instances: object) -> None:
        for obj in (*session.new, *session.dirty, *session.deleted):
            if isinstance(obj, Base):
                _note(session, obj.__table__)

    def _on_execute(self, state: ORMExecuteState) -> None:
        if state.is_insert or state.is_update or state.is_delete:
            _note(state.session, getattr(state.statement, "table", None))

    def _before_commit(self, session: Session) -> None:
        session.flush()  # commit flushes after this hook: flush first so every change is noted
        parts = session.info.pop(_PENDING, set())
        if index_log.staged(session):
            parts.add(index_log.PART)
        if not parts:
            return
        version = session.execute(
            update(CatalogueVersion)
            .where(CatalogueVersion.id == 1)
            .values(version=CatalogueVersion.version + 1)
            .returning(CatalogueVersion.version)
        ).scalar_one()
        session.execute(insert(CatalogueChange).values(version=version, parts=sorted(parts)))
        index_log.write(session, version)
        if self._postgres:  # delivered at commit, to every process that listens
            session.execute(text("SELECT pg_notify(:channel, :version)"), {"channel": CHANNEL, "version": str(version)})
        session.info[_BUMPED] = True

    def _after_commit(self, session: Session) -> None:
        if session.info.pop(_BUMPED, False):
            self.sync()  # read your own writes: applied before commit() returns

    def _after_rollback(self, session: Session) -> None:
        session.info.pop(_PENDING, None)
        index_log.discard(session)
        session.info.pop(_BUMPED, None)

    # ---- following ---------------------------------------------------------------------------------

    def subscribe(self, parts: Collection[str], fn: Subscriber) -> None:
        """Call fn(version, parts changed) after a change to any of `parts` is committed anywhere."""
        unknown = set(parts) - ALL_PARTS
        if unknown:
            raise ValueError(f"unknown catalogue parts {sorted(unknown)}; known: {sorted(ALL_PARTS)}")
        self._subscribers.append((frozenset(parts), fn))

    def sync(self) -> int:
        """Apply every change committed after the last version applied; returns the version now.
        A follower behind the compacted horizon cannot know what changed: everything did."""
        with self._lock:
            with self.sessions() as s:
                now, horizon = s.execute(
                    select(CatalogueVersion.version, CatalogueVersion.log_horizon).where(CatalogueVersion.id == 1)
                ).one()
                if now <= self.version:
                    return self.version
                parts = s.scalars(
                    select(CatalogueChange.parts).where(
                        CatalogueChange.version > self.version, CatalogueChange.version <= now
                    )
                ).all()
            changed = frozenset(ALL_PARTS if self.version < horizon else (p for ps in parts for p in ps))
            for wanted, fn in self._subscribers:
                if wanted & changed:
                    try:
                        fn(int(now), changed)
                    except Exception:  # one failing subscriber must not starve the others
                        log.exception("catalogue subscriber failed at version %d", now)
            self.version = int(now)
            return self.version

    def open(self) -> int:
        """Take the version committed now as applied: state built after this reads it or a later one."""
        with self.sessions() as s:
            self.version = read_version(s)
        return self.version

    def follow(self) -> None:
        """Apply what was committed since `open`, then follow in a thread until `close`."""
        self.sync()
        self._thread = threading.Thread(target=self._follow, name="moerag-catalogue", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _follow(self) -> None:
        listener = self._listen() if self._postgres else None
        try:
            while not self._stop.is_set():
                try:
                    if listener is not None:
                        for _ in listener.notifies(timeout=self.poll_seconds, stop_after=1):
                            pass
                    elif self._stop.wait(self.poll_seconds):
                        return
                    self.sync()
                except Exception:  # the database away for a moment: keep following
                    log.exception("catalogue follow failed; retrying")
                    if listener is not None:  # a broken LISTEN connection: poll from here on
                        _close_quietly(listener)
                        listener = None
                    self._stop.wait(self.poll_seconds)
        finally:
            if listener is not None:
                _close_quietly(listener)

    def _listen(self) -> Any:
        """PostgreSQL: a psycopg connection of its own that LISTENs (None: poll instead)."""
        try:
            import psycopg

            url = self.engine.url.set(drivername="postgresql")
            conn = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)
            conn.execute(f"LISTEN {CHANNEL}")
            return conn
        except Exception:
            log.exception("LISTEN failed; polling the catalogue version instead")
            return None


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        log.debug("closing the LISTEN connection failed", exc_info=True)
