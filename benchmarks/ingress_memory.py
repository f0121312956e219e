"""What the serving process (the ingress of expert shards) holds for every chunk when the vectors
live on shards: the id -> list map (index.list_map.ListMap, which `ShardedIndex` reads without a
copy), the centroids, and BM25's statistics (its postings on the shards); against what it held
before: a replica of the index (the configured codec) and the whole BM25 index (bm25s, as pickled
to and from its build child). Per chunk on the evaluation store, then projected linearly to 50M
and 1B chunks; beside them, what the shards hold for BM25 (engine.postings), and the time the
server takes to open its index either way (a snapshot and the log, or the lists from SQL).

    python benchmarks/ingress_memory.py --data-dir D    # results: benchmarks/results/ingress-memory.json
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 1024**3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a store (SQLite), e.g. a copy of the evaluation one")
    ap.add_argument("--name", default="ingress-memory")
    args = ap.parse_args()

    from app.core.settings import Settings
    from app.runtime import Runtime
    from app.services.indexing import IndexManager
    from benchmarks.evalcorpus import load_questions
    from engine.postings import Postings

    rt = Runtime(Settings(data_dir=args.data_dir))
    rt.start(run_jobs=False)
    try:
        lexical = rt.lexical.current()
        assert lexical is not None, "the store has no BM25 index"
        index = rt.indexes.index  # the ClusteredIndex whose skeleton a ShardedIndex keeps
        ids, lists = index.assignments()
        chunks = len(ids)
        held = {
            f"replica_{index.codec}_bytes": len(index.to_bytes()),
            "bm25_bytes": len(pickle.dumps(lexical, protocol=pickle.HIGHEST_PROTOCOL)),
            # Over shards the ingress keeps only BM25's statistics (a vocabulary: sublinear in the
            # chunks, so the linear projection below is an upper bound); the postings live on the shards.
            "bm25_statistics_bytes": len(pickle.dumps(lexical.stats, protocol=pickle.HIGHEST_PROTOCOL)),
            "id_to_list_bytes": int(ids.nbytes + lists.nbytes),
        }
        centroids = int(index.centroids().nbytes)
        records = rt.pipeline.store.fetch(ids.tolist())
        postings = Postings(ids.tolist(), [f"{records[i].heading}\n{records[i].text}" for i in ids.tolist()])
        shard_postings = len(pickle.dumps(postings, protocol=pickle.HIGHEST_PROTOCOL))  # every shard's, together
        questions = [q["question"] for q in load_questions()]
        weights = [lexical.stats.weights(q) for q in questions]
        opened = {}
        for vectors in (True, False):  # what a server's start reads: the replica, or the lists alone
            manager = IndexManager(rt.settings, rt.sessions, rt.embedder.dim, rt.embedder.name, vectors=vectors)
            manager.snapshot_writer = lambda: False
            t = time.perf_counter()
            how = manager.open()
            opened["replica" if vectors else "lists_only"] = {"seconds": round(time.perf_counter() - t, 3), "how": how}
        t = time.perf_counter()
        for q in questions:
            lexical.scores(q)
        whole_ms = (time.perf_counter() - t) * 1000 / len(questions)
        t = time.perf_counter()
        for w in weights:
            if w is not None:
                postings.scores(w)
        postings_ms = (time.perf_counter() - t) * 1000 / len(questions)
    finally:
        rt.close()
    per_chunk = {k.replace("_bytes", "_bytes_a_chunk"): round(v / chunks, 1) for k, v in held.items()}
    result: dict[str, Any] = {
        "command": "python benchmarks/ingress_memory.py " + " ".join(sys.argv[1:]),
        "chunks": chunks,
        **held,
        "centroid_bytes": centroids,
        "ingress_bytes_a_chunk": round((held["id_to_list_bytes"] + held["bm25_statistics_bytes"]) / chunks, 1),
        "ingress_open": opened,
        "shard_postings_bytes_all_shards": shard_postings,
        "shard_postings_bytes_a_chunk": round(shard_postings / chunks, 1),
        "bm25_ms_a_dev_question_every_chunk": {"bm25s": round(whole_ms, 3), "postings": round(postings_ms, 3)},
        **per_chunk,
        "projected_gib": {
            str(n): {k: round(v * n / chunks / GIB, 1) for k, v in held.items()} for n in (50_000_000, 1_000_000_000)
        },
    }
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
