"""How long an expert shard's replica takes to boot: from its own part (app.shards.parts), from the
newest whole-index snapshot (cut to its lists), and from SQL (its lists' embeddings read and
added), the index log replayed after either snapshot, each shard of the `ray_scale.py` map, the
three ways in a rotating order by round.

    python benchmarks/shard_boot.py --data-dir D [--shards 3 --rounds 3]
    # results: benchmarks/results/shard-boot.json

`ShardReplica` runs in this process (no Ray: the boot is what a Serve replica does before it
answers). The store's serving process checkpoints once first, so a snapshot exists.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.ray_scale import spread

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a store (SQLite), e.g. a copy of the held-known one")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="shard-boot")
    args = ap.parse_args()

    from app.core.settings import Settings
    from app.runtime import Runtime
    from app.shards.replicas import ShardReplica

    rt = Runtime(Settings(data_dir=args.data_dir))
    rt.start(run_jobs=False)
    whole_only = Path(tempfile.mkdtemp(prefix="shard-boot-"))  # the whole snapshot and no part
    with_parts = Path(tempfile.mkdtemp(prefix="shard-boot-"))
    try:
        rt.indexes.checkpoint()
        state = rt.state()
        sizes = state.index.list_sizes()
        shard_map = spread({p.name: int(sizes[list(p.clusters)].sum()) for p in state.experts.values()}, args.shards, 1)
        db, dim = rt.settings.db_url, rt.embedder.dim
        snapshot = next(iter(sorted(rt.settings.index_dir.glob("ivf-*.faiss"))))
        shutil.copy(snapshot, whole_only / snapshot.name)
        shutil.copy(snapshot, with_parts / snapshot.name)
        part_bytes: dict[str, int] = {}
        for n in range(len(shard_map.shards)):  # each shard's part written once, by a replica
            first = ShardReplica(db, shard_map, n, dim, 0, str(with_parts))
            assert first.write_part()
            first.close()
        for f in with_parts.glob("shard-*.faiss"):
            part_bytes[f.name] = f.stat().st_size
        ways = {"part": str(with_parts), "snapshot": str(whole_only), "sql": None}
        seconds: dict[str, dict[str, list[float]]] = {s.name: {w: [] for w in ways} for s in shard_map.shards}
        vectors: dict[str, int] = {}
        for r in range(args.rounds):
            order = list(ways)[r % 3 :] + list(ways)[: r % 3]
            for n, shard in enumerate(shard_map.shards):
                for way in order:
                    t = time.perf_counter()
                    replica = ShardReplica(db, shard_map, n, dim, 0, ways[way])
                    seconds[shard.name][way].append(time.perf_counter() - t)
                    assert replica.booted.split("@")[0] == way, (way, replica.booted)
                    vectors[shard.name] = replica.index.ntotal
                    replica.close()
        result: dict[str, Any] = {
            "command": "python benchmarks/shard_boot.py " + " ".join(sys.argv[1:]),
            "store_vectors": state.index.ntotal,
            "snapshot_bytes": snapshot.stat().st_size,
            "part_bytes": sorted(part_bytes.values()),
            "rounds": args.rounds,
            "shards": {
                shard.name: {
                    "experts": list(shard.experts),
                    "vectors": vectors[shard.name],
                    **{f"{w}_s_median": round(statistics.median(seconds[shard.name][w]), 3) for w in ways},
                }
                for shard in shard_map.shards
            },
        }
    finally:
        rt.close()
        for folder in (whole_only, with_parts):  # two copies of the snapshot
            shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
