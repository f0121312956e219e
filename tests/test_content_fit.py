"""Issue 40: content fit (index.fit), the open-set verdict, the re-fit's grouping and names."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
from sqlalchemy import select, update

from app.clustering.proposals import labels, name_groups
from app.core.models import Chunk, Cluster, Document, IndexState
from engine.embedder import Embedder
from engine.route_check import no_expert_fits
from engine.topics import MAX_NAME, document_vectors, slug, topic_names, topics
from index import ClusteredIndex, kmeans
from index.fit import document_fit, document_fits_within, document_floors, fits, floors


def test_fit_is_the_cosine_to_the_own_list_and_unknown_for_the_single_zero_list() -> None:
    x = np.array([[1, 0], [0, 1], [0.6, 0.8]], dtype=np.float32)
    centroids = np.array([[1, 0], [0, 1]], dtype=np.float32)
    got = fits(x, centroids, np.array([0, 1, 0]))
    assert got is not None and np.allclose(got, [1.0, 1.0, 0.6])
    assert fits(x, np.zeros((1, 2), dtype=np.float32), np.zeros(3, dtype=np.int64)) is None


def test_a_lists_floor_is_its_lowest_member_never_above_the_tail_over_all() -> None:
    rng = np.random.default_rng(0)
    tight = rng.uniform(0.8, 0.9, 200).astype(np.float32)  # a tight list
    loose = rng.uniform(0.3, 0.9, 200).astype(np.float32)
    fit = np.concatenate([tight, loose])
    lists = np.array([0] * 200 + [1] * 200)
    floor = floors(fit, lists, 3)  # list 2 has no members
    overall = np.quantile(fit, 0.02)
    assert floor[0] <= overall + 1e-6  # the tight list does not reject its neighbours
    assert abs(floor[1] - loose.min()) < 1e-6  # no member is below its list's floor
    assert (fit >= floor[lists]).all()
    assert abs(floor[2] - overall) < 1e-6
    assert np.isneginf(floors(np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64), 2)).all()


def test_no_expert_fits_when_most_of_the_best_passages_fit_below_their_floor() -> None:
    assert no_expert_fits([-0.1, -0.2, 0.05], "calendar") is not None
    assert "2 of the best 3" in (no_expert_fits([-0.1, -0.2, 0.05], "calendar") or "")
    assert no_expert_fits([-0.1, 0.2, 0.05], "calendar") is None  # one of three: the expert fits
    assert no_expert_fits([None, None, -0.3], "calendar") is None  # unknown fits count as fitting
    assert no_expert_fits([], "calendar") is None


def test_documents_group_into_topics_and_small_topics_stay_unassigned() -> None:
    rng = np.random.default_rng(0)
    axes = np.eye(8, dtype=np.float32)
    # three topics of 4, 3 and 2 documents (two chunks each) around three directions
    centres = [0] * 4 + [1] * 3 + [2] * 2
    x = np.stack([axes[c] + 0.15 * rng.standard_normal(8) for c in centres for _ in range(2)]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    documents = np.repeat(np.arange(10, 19), 2)
    ids, vectors = document_vectors(x, documents)
    assert ids.tolist() == list(range(10, 19)) and np.allclose(np.linalg.norm(vectors, axis=1), 1)
    found = topics(vectors)
    assert found.tolist() == [0, 0, 0, 0, 1, 1, 1, -1, -1]  # 2 documents: under MIN_TOPIC_DOCUMENTS
    assert topics(vectors, 2, min_size=1).max() == 1  # asked for two: two
    assert topics(vectors[:1]).tolist() == [-1] and topics(vectors[:0]).tolist() == []


def test_topic_names_are_short_distinct_words_of_the_topic() -> None:
    docs = [
        ("Varroa mites", ["Counting mites"], "bees hive varroa mites colony treatment"),
        ("Honey harvest", ["Extracting"], "bees honey hive frames extractor colony"),
        ("Sourdough starter", ["Feeding"], "sourdough starter flour water levain"),
        ("Sourdough bread", ["Proofing"], "sourdough dough proof loaf bake levain"),
        ("json", ["Encoders"], "json encoder decoder python object"),
    ]
    names = topic_names(docs, [0, 0, 1, 1, 9], [0, 1], taken=["Sourdough · Levain · Starter"])
    assert all(len(n) <= MAX_NAME and 2 <= len(n.split(" · ")) <= 3 for n in names.values()), names
    assert any(w in names[0].lower() for w in ("bees", "hive", "honey", "varroa"))
    assert "sourdough" in names[1].lower() and names[1] != "Sourdough · Levain · Starter"
    assert slug("Sourdough · Starter") == "sourdough-starter" and slug("  ") == "expert"


def test_names_never_come_from_folders_and_never_repeat() -> None:
    assert labels("Kubernetes Services", "Kubernetes Services > Headless Services") == {"Kubernetes Services"}
    same = [Counter({"Python docs": 10}), Counter({"Python docs": 10})]
    titles = [Counter({"Python docs": 10}), Counter({"Python docs": 10})]
    names = name_groups(same, [10, 10], titles, [["json", "csv"], ["sqlite3", "json"]])
    assert names == ["Python docs · json", "Python docs · sqlite3"]
    assert name_groups([Counter()], [3], [Counter({"": 3})], [["starter", "levain"]]) == ["starter · levain"]


def test_a_store_clustered_before_fit_existed_is_filled_in_at_start(tmp_path: Path, embedder: Embedder) -> None:
    from app.core.settings import Settings
    from app.runtime import Runtime
    from app.services.documents import Upload
    from tests.helpers import TOPICS, topic_doc

    settings = Settings(data_dir=tmp_path / "data", clusters=4)  # type: ignore[call-arg]
    rt = Runtime(settings, embedder=embedder)
    rt.start(run_jobs=False)
    try:
        for i, t in enumerate(TOPICS):
            rt.ingestor.ingest(Upload(data=topic_doc(t, i, 6).encode(), source=f"{t}.md"))
        rt.indexes.recluster()
        with rt.sessions.begin() as s:
            assert None not in s.scalars(select(Chunk.fit)).all()
            assert None not in s.scalars(select(Cluster.fit_floor)).all()
            state = s.get(IndexState, 1)
            assert state is not None and state.fitted_through == max(s.scalars(select(Chunk.id)))
            assert None not in s.scalars(select(Document.fit)).all()
            s.execute(update(Chunk).values(fit=None))
            s.execute(update(Cluster).values(fit_floor=None))
            s.execute(update(Document).values(fit=None))
            state.fitted_through = None
    finally:
        rt.close()
    rt = Runtime(settings, embedder=embedder)
    rt.start(run_jobs=False)
    try:
        with rt.sessions() as s:
            assert None not in s.scalars(select(Chunk.fit)).all()
            assert None not in s.scalars(select(Cluster.fit_floor)).all()
            assert None not in s.scalars(select(Document.fit)).all()
            assert s.scalar(select(IndexState.fitted_through)) == max(s.scalars(select(Chunk.id)))
        assert rt.routers.staleness()["drift"]["summary"] == "no experts yet"
    finally:
        rt.close()


def _documents(rng: np.random.Generator, center: np.ndarray, n: int, spread: float) -> np.ndarray:
    """n documents of 4 chunks each around `center`: [n * 4, D] unit vectors."""
    out = []
    for _ in range(n):
        doc = center + spread * rng.standard_normal(center.shape)
        out.append(doc + 0.05 * rng.standard_normal((4, len(center))))
    x = np.concatenate(out).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_sibling_topic_falls_below_its_experts_document_floor_and_a_known_one_does_not() -> None:
    """The document fit (index.fit): leave-one-document-out on the fitted content, a new document
    against ids up to the watermark only, and floors per expert."""
    rng = np.random.default_rng(3)
    d = 32
    a, b = rng.standard_normal(d), rng.standard_normal(d)
    sibling = a + 0.9 * rng.standard_normal(d)  # near expert a, not of it
    x = np.concatenate([_documents(rng, a, 30, 0.3), _documents(rng, b, 30, 0.3)])  # [240, D]
    ids, documents = np.arange(len(x)), np.arange(len(x)) // 4
    index = ClusteredIndex.create(kmeans(x, 4, seed=0), "v")
    index.add(x, ids, index.assign(x))
    fitted = document_fits_within(index, x, ids, documents)
    assert len(fitted) == 60 and all(0 < f <= 1 for f in fitted.values())
    floor = document_floors(fitted, {doc: 0 if doc < 30 else 1 for doc in fitted})
    assert set(floor) == {0, 1}
    through = int(ids.max())
    new = {"known": _documents(rng, a, 1, 0.3), "sibling": _documents(rng, sibling, 1, 0.3)}
    for i, part in enumerate(new.values()):  # stored after the fitting, each with the other's neighbours
        index.add(part, np.arange(len(part)) + through + 1 + 4 * i, index.assign(part))
    got = {k: document_fit(index, v, through) for k, v in new.items()}
    assert got["known"] is not None and got["known"] > floor[0]
    assert got["sibling"] is not None and got["sibling"] < floor[0]
    assert document_fit(index, new["sibling"], -1) is None  # nothing fitted to compare with
    few = document_floors({1: 0.2, 2: 0.9, 3: 0.5}, {1: 0, 2: 0, 3: 1})
    assert few[0] == few[1] == float(np.quantile([0.2, 0.9, 0.5], 0.1))  # too few: the floor over all
