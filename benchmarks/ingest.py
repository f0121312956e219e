"""Ingestion throughput vs raw SentenceTransformer.encode on the same texts, in one run.

    python benchmarks/ingest.py                 # the pydoc sample corpus
    python benchmarks/ingest.py --folder DOCS   # any folder of txt/md/html/pdf

Order: raw encode, pipeline, raw encode again; the ratio uses the mean of the two raw runs,
since these machines are shared and their speed drifts within minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.cli.main import collect_files
from app.cli.sample import SAMPLE_MODULES, build_sample_corpus
from app.core.settings import Settings
from app.runtime import Runtime
from app.services.documents import Upload
from benchmarks.common import write_result
from engine.chunking import chunk_document
from engine.embedder import Embedder
from engine.parsing import parse


def pipeline_texts(files: list[Path], embedder: Embedder) -> list[str]:
    """The exact texts the pipeline embeds for these files (heading path + chunk): the raw baseline's input."""
    texts = []
    for f in files:
        doc = parse(f.read_bytes(), f.name)
        texts += [c.embed_text for c in chunk_document(doc, embedder.count_tokens)]
    return texts


def raw_encode(embedder: Embedder, texts: list[str]) -> float:
    """Seconds for a bare `SentenceTransformer.encode` of `texts` at the pipeline's batch size."""
    t0 = time.perf_counter()
    embedder.model.encode(texts, batch_size=embedder.batch_size, show_progress_bar=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, help="documents to ingest (default: the pydoc sample corpus)")
    ap.add_argument("--modules", type=int, default=len(SAMPLE_MODULES), help="sample modules to use")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        if args.folder:
            files = collect_files([str(args.folder)])
        else:
            files = build_sample_corpus(Path(tmp) / "corpus", SAMPLE_MODULES[: args.modules])
        embedder = Embedder()
        texts = pipeline_texts(files, embedder)
        print(f"{len(files)} documents, {len(texts)} chunks, model dtype {embedder.dtype_name}", flush=True)
        embedder.model.encode(texts[:64], batch_size=embedder.batch_size)  # warm-up

        raw1 = raw_encode(embedder, texts)
        print(f"raw encode #1: {len(texts) / raw1:.1f} chunks/s", flush=True)

        rt = Runtime(Settings(data_dir=Path(tmp) / "data", admin_token="bench"), embedder=embedder)  # type: ignore[arg-type]
        rt.start()
        t0 = time.perf_counter()
        outcomes = list(
            rt.ingestor.ingest_many(
                (lambda f=f: Upload(data=f.read_bytes(), source=str(f), filename=f.name)) for f in files
            )
        )
        pipeline = time.perf_counter() - t0
        n_chunks = sum(o.chunks for o in outcomes)
        rt.close()
        print(f"pipeline:      {n_chunks / pipeline:.1f} chunks/s", flush=True)

        raw2 = raw_encode(embedder, texts)
        print(f"raw encode #2: {len(texts) / raw2:.1f} chunks/s", flush=True)

    raw_rate = len(texts) / ((raw1 + raw2) / 2)
    pipe_rate = n_chunks / pipeline
    result = {
        "documents": len(files),
        "chunks": n_chunks,
        "raw_encode_chunks_per_s": round(raw_rate, 1),
        "pipeline_chunks_per_s": round(pipe_rate, 1),
        "pipeline_over_raw": round(pipe_rate / raw_rate, 3),
        "dtype": embedder.dtype_name,
    }
    print(json.dumps(result))
    if args.json:
        write_result(args.json, result)


if __name__ == "__main__":
    main()
