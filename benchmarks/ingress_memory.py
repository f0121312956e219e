"""What the serving process (the ingress of expert shards) still holds for every chunk when the
vectors live on shards: its own replica of the index (the configured codec: it places and fits
new documents, and follows the log), the BM25 index (bm25s, as pickled to and from its build
child), the id -> list map `ShardedIndex` keeps, and the centroids; per chunk on the evaluation
store, then projected linearly to 50M and 1B chunks.

    python benchmarks/ingress_memory.py --data-dir D    # results: benchmarks/results/ingress-memory.json
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
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

    from app.runtime import Runtime
    from app.settings import Settings

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
            "id_to_list_bytes": int(ids.nbytes + lists.nbytes),
        }
        centroids = int(index.centroids().nbytes)
    finally:
        rt.close()
    per_chunk = {k.replace("_bytes", "_bytes_a_chunk"): round(v / chunks, 1) for k, v in held.items()}
    result: dict[str, Any] = {
        "command": "python benchmarks/ingress_memory.py " + " ".join(sys.argv[1:]),
        "chunks": chunks,
        **held,
        "centroid_bytes": centroids,
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
