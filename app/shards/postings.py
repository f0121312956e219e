"""A shard replica's BM25 postings (engine.postings), kept in step with SQL.

The postings of every chunk in the shard's lists are read from SQL at boot and read again, spaced
as the server's BM25 rebuilds are (at most `share` of the time: app.serving.lexical), after its
chunks changed. Chunks that enter the shard meanwhile (an upload, a list moved to it, a chunk
re-placed into one of its lists) are read at once into a small second set of postings: a chunk
moving between shards is then in the postings of the one it enters before that one answers for
it, and still in the one it leaves until that one reads its postings again (the ask flow keeps the
higher of two equal scores, and a shard's best per list counts only chunks in its own lists).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import Chunk
from app.store.catalogue import read_version
from engine.lexical import QueryWeights
from engine.postings import Postings
from engine.sharded_lexical import LexicalAnswer, answer_from

Ints = npt.NDArray[np.int64]


def _texts(s: Session, where: Any) -> dict[int, str]:
    """{chunk id: the text BM25 indexes (heading and text)} of the chunks `where` selects."""
    rows = s.execute(select(Chunk.id, Chunk.heading, Chunk.text).where(where).order_by(Chunk.id)).all()
    return {r[0]: f"{r[1]}\n{r[2]}" for r in rows}


def _postings(texts: dict[int, str]) -> Postings:
    ids = sorted(texts)
    return Postings(ids, [texts[i] for i in ids])


class ShardPostings:
    def __init__(self, sessions: sessionmaker[Session], share: float = 0.1) -> None:
        self.sessions, self.share = sessions, share
        self.base, self.extra = Postings([], []), Postings([], [])
        self.position = 0  # the catalogue version the base was read at
        self._entered: dict[int, str] = {}  # chunks that entered since the base was read
        self.stale, self._next = False, 0.0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.base) + len(self.extra)

    def read(self, lists: Ints) -> None:
        """Every chunk of `lists`, from SQL."""
        with self.sessions() as s:
            position = read_version(s)
            base = _postings(_texts(s, Chunk.cluster_id.in_(lists.tolist())))
        held = set(base.ids.tolist())
        with self._lock:
            self._entered = {i: t for i, t in self._entered.items() if i not in held}  # entered after the read
            self.base, self.extra, self.position = base, _postings(self._entered), position
        self.stale = False

    def refresh(self, lists: Ints, *, force: bool = False) -> bool:
        """`read` when its chunks changed and the spacing allows (`force`: now)."""
        if not (self.stale or force) or (not force and time.monotonic() < self._next):
            return False
        t0 = time.monotonic()
        self.read(lists)
        self._next = t0 + (time.monotonic() - t0) / self.share
        return True

    def entered(self, where: Any | None) -> None:
        """Its chunks changed: those entering the shard (what `where` selects; None: none) get their
        postings now, and the whole set is read again later (stale)."""
        texts: dict[int, str] = {}
        if where is not None:
            with self.sessions() as s:
                texts = _texts(s, where)
        if texts:
            with self._lock:
                self._entered |= texts
                self.extra = _postings(self._entered)
        self.stale = True

    def answer(
        self, w: QueryWeights, k: int, lists: Ints | None, ids: Ints | None, clusters_of: Callable[[Ints], Ints]
    ) -> LexicalAnswer:
        """engine.sharded_lexical's answer over both sets (a chunk in both: the newer's score)."""
        with self._lock:
            base, extra = self.base, self.extra
        if not len(extra):
            return answer_from(base.scores(w), base.ids, clusters_of, k, lists, ids)
        keep = ~np.isin(base.ids, extra.ids)  # [N]
        scores = np.concatenate([base.scores(w)[keep], extra.scores(w)])  # [N']
        held = np.concatenate([base.ids[keep], extra.ids])  # [N']
        return answer_from(scores, held, clusters_of, k, lists, ids)
