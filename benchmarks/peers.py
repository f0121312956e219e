"""The peer pipelines moerag is measured against, built the way their own docs show.

LangChain (the "Build a RAG app" tutorial shape): `BSHTMLLoader` per page →
`RecursiveCharacterTextSplitter(chunk_size=1000, chunk_overlap=200, add_start_index=True)` →
`HuggingFaceEmbeddings` (the same packaged all-MiniLM-L6-v2, normalised) → `FAISS` vector store
(flat, exact) → `similarity_search(question, k)`.

    python benchmarks/peers.py langchain-build --corpus /tmp/evalcorpus --out /tmp/peer-langchain

semantic-router (a `SemanticRouter` with one `Route` per expert, utterances drawn from the
corpus the way moerag's router draws its samples, thresholds fitted with `fit`) lives in
`benchmarks/compare.py`, where the training data is at hand.

Needs the `peers` extra: `pip install -e .[peers]`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result
from benchmarks.evalcorpus import html_files

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", category=DeprecationWarning)  # langchain-community's own notice

CHUNK_SIZE = 1000  # characters, the tutorial's values
CHUNK_OVERLAP = 200
EMBED_BATCH = 256  # documents handed to the vector store per add_documents call (progress granularity)


def langchain_embeddings(dtype: str = "float32") -> Any:
    """The packaged all-MiniLM-L6-v2 through LangChain; `dtype` "bfloat16" matches moerag on an AMX CPU."""
    from langchain_huggingface import HuggingFaceEmbeddings

    from engine.embedder import packaged_model_path

    model_kwargs: dict[str, Any] = {"device": "cpu"}
    if dtype != "float32":
        model_kwargs["model_kwargs"] = {"torch_dtype": dtype}
    return HuggingFaceEmbeddings(
        model_name=str(packaged_model_path()),
        model_kwargs=model_kwargs,
        encode_kwargs={"normalize_embeddings": True},
    )


def load_split(files: list[Path], corpus: Path) -> Iterator[Any]:
    from langchain_community.document_loaders import BSHTMLLoader
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    splitter = RecursiveCharacterTextSplitter(chunk_size=CHUNK_SIZE, chunk_overlap=CHUNK_OVERLAP, add_start_index=True)
    for path in files:
        docs = BSHTMLLoader(str(path), open_encoding="utf-8").load()
        for d in docs:
            d.metadata["source"] = path.relative_to(corpus).as_posix()  # the eval's page key
        yield from splitter.split_documents(docs)


def langchain_build(
    corpus: Path, out: Path, files: list[Path] | None = None, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """Index `files` (default: every *.html under `corpus`) and save the store under `out`."""
    from langchain_community.vectorstores import FAISS

    files = files if files is not None else html_files(corpus)
    emb = langchain_embeddings()
    t0 = time.perf_counter()
    chunks = list(load_split(files, corpus))
    t_split = time.perf_counter() - t0
    progress(f"langchain: {len(files)} pages → {len(chunks)} chunks in {t_split:.1f} s; embedding ...")
    store = None
    t1 = time.perf_counter()
    for start in range(0, len(chunks), EMBED_BATCH):
        batch = chunks[start : start + EMBED_BATCH]
        if store is None:
            store = FAISS.from_documents(batch, emb)
        else:
            store.add_documents(batch)
        done = start + len(batch)
        if done % (EMBED_BATCH * 8) < EMBED_BATCH or done == len(chunks):
            rate = done / (time.perf_counter() - t1)
            progress(f"langchain: {done}/{len(chunks)} chunks, {rate:.1f} chunks/s")
    t_embed = time.perf_counter() - t1
    assert store is not None, "no chunks"
    out.mkdir(parents=True, exist_ok=True)
    store.save_local(str(out))
    stats = {
        "documents": len(files),
        "chunks": len(chunks),
        "load_split_seconds": round(t_split, 1),
        "embed_seconds": round(t_embed, 1),
        "total_seconds": round(
            time.perf_counter() - t0, 4
        ),  # rounded to 0.0 on tiny runs, a division by zero in compare.py
        "chunks_per_second": round(len(chunks) / (time.perf_counter() - t0), 2),
    }
    write_result(out / "build.json", stats)
    return stats


def langchain_build_cached(
    corpus: Path, out: Path, cache_path: Path, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """The same split as `langchain_build`, vectors from the embedding cache (misses embedded and stored)."""
    from langchain_community.vectorstores import FAISS

    from benchmarks.embcache import EmbeddingCache
    from engine.embedder import Embedder

    t0 = time.perf_counter()
    chunks = list(load_split(html_files(corpus), corpus))
    progress(f"langchain: {len(chunks)} chunks split in {time.perf_counter() - t0:.1f} s; embedding (cached) ...")
    embedder = Embedder()
    vecs = EmbeddingCache(cache_path, embedder).encode([c.page_content for c in chunks], progress=True)  # [N, D]
    store = FAISS.from_embeddings(
        [(c.page_content, v.tolist()) for c, v in zip(chunks, vecs, strict=True)],
        langchain_embeddings(embedder.dtype_name),
        metadatas=[c.metadata for c in chunks],
    )
    out.mkdir(parents=True, exist_ok=True)
    store.save_local(str(out))
    stats = {"chunks": len(chunks), "total_seconds": round(time.perf_counter() - t0, 1), "dtype": embedder.dtype_name}
    write_result(out / "build.json", stats)
    return stats


class LangChainRetriever:
    """similarity_search over a saved LangChain FAISS store; returns (text, source) best first."""

    def __init__(self, path: Path, dtype: str = "float32") -> None:
        from langchain_community.vectorstores import FAISS

        # Our own file, written by langchain_build above: loading its pickle is safe.
        self.store = FAISS.load_local(str(path), langchain_embeddings(dtype), allow_dangerous_deserialization=True)

    @property
    def size(self) -> int:
        return int(self.store.index.ntotal)

    def search(self, question: str, k: int = 10) -> list[tuple[str, str]]:
        return [(d.page_content, d.metadata["source"]) for d in self.store.similarity_search(question, k=k)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("langchain-build")
    b.add_argument("--corpus", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument(
        "--cache",
        type=Path,
        help="embed through moerag's embedding cache (benchmarks/embcache.py: same model, text-hash keyed) "
        "and hand the vectors to FAISS.from_embeddings; for the load benchmark, where only serving is timed",
    )
    args = ap.parse_args()
    if args.cmd == "langchain-build":
        log = lambda m: print(m, flush=True)  # noqa: E731
        if args.cache:
            stats = langchain_build_cached(args.corpus, args.out, args.cache, progress=log)
        else:
            stats = langchain_build(args.corpus, args.out, progress=log)
        print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
