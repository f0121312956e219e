import faiss
import numpy as np
import pytest

from index import ClusteredIndex, IndexCorrupt, auto_cluster_count, kmeans


def unit(rng: np.random.Generator, n: int, d: int = 32) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def populated() -> tuple[ClusteredIndex, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = unit(rng, 3000)
    idx = ClusteredIndex.create(kmeans(x, 24), "v1")
    ids = np.arange(3000, dtype=np.int64) * 3 + 5  # ids unrelated to positions
    clusters = idx.assign(x)
    idx.add(x, ids, clusters)
    return idx, x, ids, clusters


def flat_search(x: np.ndarray, ids: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    flat = faiss.IndexFlatIP(x.shape[1])
    flat.add(x)
    _, pos = flat.search(q, k)
    return ids[pos]


def test_global_and_all_clusters_search_equal_flat_search(populated) -> None:  # type: ignore[no-untyped-def]
    idx, x, ids, _ = populated
    q = unit(np.random.default_rng(1), 50)
    expected = flat_search(x, ids, q, 10)
    _, got = idx.search(q, 10)
    assert np.array_equal(got, expected)
    _, got_all = idx.search(q, 10, clusters=range(idx.nlist))
    assert np.array_equal(got_all, expected)


def test_scoped_search_returns_only_chosen_clusters(populated) -> None:  # type: ignore[no-untyped-def]
    idx, x, ids, clusters = populated
    chosen = {3, 11, 17}
    q = unit(np.random.default_rng(2), 20)
    scores, got = idx.search(q, 25, clusters=chosen)
    cluster_of = dict(zip(ids.tolist(), clusters.tolist(), strict=True))
    assert all(cluster_of[i] in chosen for i in got[got >= 0].tolist())
    # ... and they are exactly the best of those clusters.
    mask = np.isin(clusters, list(chosen))
    assert np.array_equal(got, flat_search(x[mask], ids[mask], q, 25))
    assert np.all(np.diff(scores, axis=1) <= 1e-6)


def test_recall_never_drops_as_more_clusters_are_searched(populated) -> None:  # type: ignore[no-untyped-def]
    idx, x, ids, _ = populated
    q = unit(np.random.default_rng(3), 30)
    truth = flat_search(x, ids, q, 10)
    order = np.argsort(-(q @ idx.centroids().T), axis=1)  # [Q, C] clusters by closeness
    previous = -1.0
    for nprobe in (1, 2, 4, 8, 16, 24):
        hits = 0
        for qi in range(len(q)):
            _, got = idx.search(q[qi : qi + 1], 10, clusters=order[qi, :nprobe])
            hits += len(set(got[0].tolist()) & set(truth[qi].tolist()))
        recall = hits / truth.size
        assert recall >= previous
        previous = recall
    assert previous == 1.0


def test_empty_scope_and_padding(populated) -> None:  # type: ignore[no-untyped-def]
    idx, *_ = populated
    q = unit(np.random.default_rng(4), 2)
    _scores, got = idx.search(q, 5, clusters=[])
    assert (got == -1).all()
    _, got = idx.search(q, 5, clusters=[-1, 999])
    assert (got == -1).all()
    small = ClusteredIndex.single(32, "s")
    small.add(q, np.array([1, 2]), np.array([0, 0]))
    _, got = small.search(q, 5)
    assert sorted(got[0][got[0] >= 0].tolist()) == [1, 2]


def test_remove_takes_ids_out_of_every_search(populated) -> None:  # type: ignore[no-untyped-def]
    idx, x, ids, _ = populated
    gone = ids[:100]
    assert idx.remove(gone.tolist()) == 100
    _, got = idx.search(x[:100], 5)
    assert not set(got.ravel().tolist()) & set(gone.tolist())
    assert idx.ntotal == 2900


def test_roundtrip_and_assignments(populated, tmp_path) -> None:  # type: ignore[no-untyped-def]
    idx, _x, ids, clusters = populated
    path = tmp_path / "i.faiss"
    idx.save(path)
    loaded = ClusteredIndex.load(path, "v1")
    got_ids, got_clusters = loaded.assignments()
    order = np.argsort(ids)
    assert np.array_equal(got_ids, ids[order]) and np.array_equal(got_clusters, clusters[order])
    assert np.allclose(loaded.centroids(), idx.centroids())
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(IndexCorrupt):
        ClusteredIndex.load(path, "v1")
    with pytest.raises(IndexCorrupt):
        ClusteredIndex.load(tmp_path / "missing.faiss", "v1")


def test_real_embeddings_scoped_equals_filtered_flat(embedder) -> None:  # type: ignore[no-untyped-def]
    topics = ["sqlite", "git branches", "python lists", "debian packages"]
    texts = [f"{t} note {i}: how {t} behave in case {i}" for t in topics for i in range(40)]
    x = embedder.encode(texts)
    idx = ClusteredIndex.create(kmeans(x, 4), "real")
    ids = np.arange(len(texts), dtype=np.int64)
    clusters = idx.assign(x)
    idx.add(x, ids, clusters)
    q = embedder.encode(["how do git branches work", "sqlite journal"])
    _, got = idx.search(q, 8)
    assert np.array_equal(got, flat_search(x, ids, q, 8))
    target = int(clusters[0])
    _, scoped = idx.search(q, 8, clusters=[target])
    assert set(clusters[scoped[scoped >= 0]].tolist()) == {target}


def test_auto_cluster_count() -> None:
    assert auto_cluster_count(10) == 1
    assert auto_cluster_count(28) == 3  # a team's first documents already split into topics (issue 40)
    assert auto_cluster_count(63) == 7  # at least 8 chunks a list on average
    assert auto_cluster_count(511) == 23  # sqrt(N) from 64 chunks on
    assert auto_cluster_count(34_367) == 185
    assert auto_cluster_count(1000) == 32
    assert auto_cluster_count(1000, requested=40) == 40
    assert auto_cluster_count(2, requested=3) == 2
    assert auto_cluster_count(0, requested=3) == 1


def test_nearest_lists_probes_inside_a_scope(populated) -> None:  # type: ignore[no-untyped-def]
    idx, *_ = populated
    q = unit(np.random.default_rng(5), 1)[0]
    scope = [2, 5, 9, 13, 21]
    scores = idx.centroids()[scope] @ q  # [5]
    got = idx.nearest_lists(q, scope, 2)
    assert sorted(got.tolist()) == sorted(np.array(scope)[np.argsort(-scores)[:2]].tolist())
    # 0 (no cap) or a cap at least the scope's size: the whole scope; lists outside the index dropped.
    assert idx.nearest_lists(q, [*scope, -1, idx.nlist], 0).tolist() == scope
    assert idx.nearest_lists(q, scope, 10).tolist() == scope


def test_scan_size_counts_only_the_scanned_lists(populated) -> None:  # type: ignore[no-untyped-def]
    idx, _, _, clusters = populated
    assert idx.scan_size() == (idx.nlist, 3000)
    scope = [3, 11, 11, 17, -1, idx.nlist]  # duplicates and lists outside the index count once / not at all
    assert idx.scan_size(scope) == (3, int(np.isin(clusters, [3, 11, 17]).sum()))
    assert idx.scan_size([]) == (0, 0)


def test_clusters_of_follows_writes(populated) -> None:  # type: ignore[no-untyped-def]
    idx, x, ids, clusters = populated
    assert np.array_equal(idx.clusters_of(ids[:100]), clusters[:100])
    assert idx.clusters_of(np.array([-7, 4])).tolist() == [-1, -1]  # never added
    idx.remove(ids[:10].tolist())
    assert (idx.clusters_of(ids[:10]) == -1).all()
    moved = (clusters[10:20] + 1) % idx.nlist
    idx.remove(ids[10:20].tolist())
    idx.add(x[10:20], ids[10:20], moved)
    assert np.array_equal(idx.clusters_of(ids[10:20]), moved)


def test_search_nearest_probes_each_questions_own_lists(populated) -> None:  # type: ignore[no-untyped-def]
    idx, x, _, _ = populated
    q = x[[0, 500, 2999]] + 0.01  # [3, D]
    scores, found, scanned = idx.search_nearest(q, 5, 3)
    sizes = idx.list_sizes()
    expected_scanned = 0
    for row in range(3):
        lists = np.argsort(-(idx.centroids() @ q[row]))[:3]  # this question's 3 nearest lists
        want_scores, want_ids = idx.search(q[row : row + 1], 5, lists)
        assert found[row].tolist() == want_ids[0].tolist()
        assert np.allclose(scores[row], want_scores[0])
        expected_scanned += int(sizes[lists].sum())
    assert scanned == expected_scanned
    assert set(idx.clusters_of(found).ravel().tolist()) <= set(range(idx.nlist))


def test_kmeans_is_seeded() -> None:
    """The same vectors and seed give the same lists (a rebuild reproduces); another seed draws others."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 16)).astype(np.float32)  # no clear clusters: the seed decides
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    a, b, c = kmeans(x, 12, seed=1), kmeans(x, 12, seed=1), kmeans(x, 12, seed=2)
    assert np.array_equal(a, b)
    assert not np.allclose(np.sort(a, axis=0), np.sort(c, axis=0))


def test_recluster_draws_its_lists_with_the_configured_seed(tmp_path, embedder, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`MOERAG_CLUSTER_SEED` reaches k-means; its default is the index's own seed."""
    from app.clustering import reclustering
    from app.core.settings import Settings
    from app.runtime import Runtime
    from app.services.documents import Upload
    from index.clustering import KMEANS_SEED
    from tests.helpers import TOPICS, topic_doc

    assert Settings(data_dir=tmp_path / "default").cluster_seed == KMEANS_SEED
    seeds: list[int] = []
    real = reclustering.kmeans
    monkeypatch.setattr(reclustering, "kmeans", lambda x, k, **kw: seeds.append(kw["seed"]) or real(x, k, **kw))
    rt = Runtime(Settings(data_dir=tmp_path / "data", clusters=4, cluster_seed=7), embedder=embedder)
    rt.start(run_jobs=False)
    try:
        for t in TOPICS:
            rt.ingestor.ingest(Upload(data=topic_doc(t, 0, 4).encode(), source=f"{t}.md"))
        rt.indexes.recluster()
    finally:
        rt.close()
    assert seeds == [7]


def test_kmeans_of_a_small_store_prints_no_faiss_warning(capfd) -> None:  # type: ignore[no-untyped-def]
    """Issue 40 #6: "WARNING clustering 28 points to 2 centroids: please provide at least 78 training
    points" on stderr read as an error to users; the clustering is the same without it."""
    import numpy as np

    from index.clustering import kmeans

    x = np.random.default_rng(0).standard_normal((28, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    assert kmeans(x, 2).shape == (2, 384)
    assert "WARNING" not in capfd.readouterr().err


def test_search_rows_gives_each_row_its_own_scoped_search(populated) -> None:  # type: ignore[no-untyped-def]
    idx, x, ids, clusters = populated
    q = x[:4]
    lists = [[0, 1, 2], [5], [], [3, 9]]
    scores, found = idx.search_rows(q, 7, lists)
    for i, scope in enumerate(lists):
        inside = np.isin(clusters, scope)  # brute force over the vectors of this row's lists
        if not inside.any():
            assert (found[i] == -1).all() and np.isneginf(scores[i]).all()
            continue
        sims = x[inside] @ q[i]
        best = np.argsort(-sims)[:7]
        assert found[i].tolist() == ids[inside][best].tolist()
        assert np.allclose(scores[i], sims[best], atol=1e-5)


def test_sq8_codes_search_as_flat_does_in_a_quarter_of_the_bytes(populated) -> None:  # type: ignore[no-untyped-def]
    idx, x, ids, clusters = populated
    sq8 = ClusteredIndex.create(idx.centroids(), "v1", "sq8")
    sq8.add(x, ids, clusters)
    assert (idx.codec, sq8.codec) == ("flat", "sq8")
    q = x[:200] + np.float32(0.05) * unit(np.random.default_rng(3), 200)
    exact = flat_search(x, ids, q, 10)
    _, got = sq8.search(q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got.tolist(), exact.tolist(), strict=True)])
    assert recall >= 0.95, recall
    _, scoped = sq8.search(q, 5, clusters=[3, 7])
    cluster_of = dict(zip(ids.tolist(), clusters.tolist(), strict=True))
    assert {cluster_of[i] for i in scoped[scoped >= 0].tolist()} <= {3, 7}
    back = ClusteredIndex.from_bytes(sq8.to_bytes(), "v1")
    assert back.codec == "sq8" and np.array_equal(back.search(q, 10)[1], got)
    assert len(sq8.to_bytes()) * 2 < len(idx.to_bytes())  # codes of 32 bytes against 128, beside ids and centroids
    part = sq8.subset([3, 7], "v1")
    assert part.codec == "sq8" and np.array_equal(part.search(q, 5, [3, 7])[1], scoped)
    assert sq8.remove(ids[:10]) == 10 and not set(ids[:10].tolist()) & set(sq8.search(q, 10)[1].ravel().tolist())
    with pytest.raises(ValueError, match="codec"):
        ClusteredIndex.create(idx.centroids(), "v1", "pq")


def test_the_configured_codec_rebuilds_a_store_and_follows_its_writes(settings, embedder, routed_store) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from app.runtime import Runtime
    from app.services.documents import Upload
    from tests.helpers import topic_doc

    shutil.copytree(routed_store.data, settings.resolved_data_dir)
    q = embedder.encode(["git rebase onto a branch", "sqlite write-ahead log"])
    flat = Runtime(settings, embedder=embedder)
    flat.start(run_jobs=False)
    try:
        expect = flat.state().index.search(q, 5)[1]
    finally:
        flat.close()
    settings.index_codec = "sq8"
    rt = Runtime(settings, embedder=embedder)
    rt.start(run_jobs=False)
    try:
        assert rt.index_status.startswith("rebuilt") and "sq8" in rt.index_status, rt.index_status
        assert rt.state().index.codec == "sq8"
        got = rt.state().index.search(q, 5)[1]
        assert all(len(set(a) & set(b)) >= 4 for a, b in zip(got.tolist(), expect.tolist(), strict=True)), (got, expect)
        from sqlalchemy import select

        from app.core.models import Chunk

        added = rt.ingestor.ingest(Upload(topic_doc("git", 700, 2).encode(), "late-git.md"))
        with rt.sessions() as s:
            new = set(s.scalars(select(Chunk.id).where(Chunk.document_id == added.document_id)))
        mine = rt.embedder.encode([topic_doc("git", 700, 2)])
        assert set(rt.state().index.search(mine, 3)[1][0].tolist()) & new
    finally:
        rt.close()
    again = Runtime(settings, embedder=embedder)  # its own snapshot, stored as sq8, is trusted
    again.start(run_jobs=False)
    try:
        assert again.index_status == "loaded" and again.state().index.codec == "sq8"
    finally:
        again.close()
