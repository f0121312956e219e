"""Embeddings cached by the hash of the exact text embedded, so a chunking experiment re-embeds
only the chunks it changed (the whole eval corpus takes ~45 min to embed on 2 cores).

    cache = EmbeddingCache(Path("EMB_CACHE"), embedder)
    vecs = cache.encode(texts)          # [N, D], misses embedded in batches and stored
    cached(embedder, cache)             # the same for every `embedder.encode` call (ingest too)

The key is sha256(model name + dtype + text): a cache never serves vectors of another model.
"""

from __future__ import annotations

import hashlib
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class EmbeddingCache:
    def __init__(self, path: Path, embedder: Any, batch: int = 2048) -> None:
        self.embedder, self.batch = embedder, batch
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute("CREATE TABLE IF NOT EXISTS emb (h BLOB PRIMARY KEY, v BLOB NOT NULL)")
        self.salt = f"{embedder.name}:{embedder.dtype_name}:".encode()
        self.uncached = embedder.encode  # the real one, even after `cached` wraps the embedder

    def _key(self, text: str) -> bytes:
        return hashlib.sha256(self.salt + text.encode()).digest()

    def encode(self, texts: Sequence[str], progress: bool = False, *, background: bool = False) -> np.ndarray:
        """[N, D]: stored vectors where the text was seen, the rest embedded in batches and stored
        (`background` as `Embedder.encode` takes it)."""
        out = np.zeros((len(texts), self.embedder.dim), dtype=np.float32)
        keys = [self._key(t) for t in texts]
        found: dict[bytes, bytes] = {}
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            q = f"SELECT h, v FROM emb WHERE h IN ({','.join('?' * len(part))})"
            found.update(self.db.execute(q, part).fetchall())
        missing = []
        for i, k in enumerate(keys):
            if k in found:
                out[i] = np.frombuffer(found[k], dtype=np.float32)
            else:
                missing.append(i)
        t0 = time.perf_counter()
        for start in range(0, len(missing), self.batch):
            idx = missing[start : start + self.batch]
            vecs = self.uncached([texts[i] for i in idx], background=background)  # [B, D]
            out[idx] = vecs
            self.db.executemany(
                "INSERT OR REPLACE INTO emb VALUES (?, ?)",
                [(keys[i], v.tobytes()) for i, v in zip(idx, vecs, strict=True)],
            )
            self.db.commit()
            if progress:
                done = start + len(idx)
                rate = done / (time.perf_counter() - t0)
                print(f"  embedded {done}/{len(missing)} new texts ({rate:.1f}/s)", file=sys.stderr, flush=True)
        return out


def cached(embedder: Any, cache: EmbeddingCache) -> Any:
    """Route every `embedder.encode` through the cache (the ingest pipeline's included)."""
    embedder.encode = cache.encode
    return embedder
