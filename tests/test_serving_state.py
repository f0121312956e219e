"""One serving state per catalogue version: a question reads one version's router, mapping, index
and BM25, however the catalogue moves meanwhile, and never waits for the next state's build."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from app.runtime import Runtime
from app.services import experts as expert_service
from app.services.documents import Upload
from app.store.catalogue import read_version
from engine.pipeline import AskRequest
from tests.helpers import topic_doc


def _runtime(client: TestClient) -> Runtime:
    return client.app.state.runtime  # type: ignore[attr-defined,no-any-return]


def test_every_question_reads_one_versions_router_mapping_index_and_bm25(
    client: TestClient, routed: dict[str, Any]
) -> None:
    rt = _runtime(client)
    git, sqlite = routed["experts"]["git"], routed["experts"]["sqlite"]
    first = rt.state().router
    assert first is not None
    second = rt.routers.train(activate=False, force=True)["version"]
    moving = min(c for c, t in routed["topic_of"].items() if t == "git")  # the cluster that changes hands
    with rt.sessions() as s:
        truth = {read_version(s): (git, first.version_id)}  # catalogue version -> (moving's owner, router)
    documents: list[int] = []  # catalogue versions that changed chunks
    stop = threading.Event()
    answered: list[Any] = []
    errors: list[BaseException] = []

    def write() -> None:
        owner, router = git, first.version_id
        try:
            for i in range(24):
                if i % 3 == 0:
                    owner = sqlite if owner == git else git
                    expert_service.assign(rt.sessions, [moving], owner)
                elif i % 3 == 1:
                    router = second if router == first.version_id else first.version_id
                    rt.routers.activate(router)
                else:
                    upload = Upload(topic_doc("git", 100 + i, paragraphs=1).encode(), f"extra-{i}.md")
                    assert rt.ingestor.ingest(upload).status == "created"
                    rt.lexical.refresh(force=True)  # a BM25 rebuild publishes a state too
                with rt.sessions() as s:  # the only writer: the version its commit made
                    version = read_version(s)
                truth[version] = (owner, router)
                if i % 3 == 2:
                    documents.append(version)
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    def ask() -> None:
        try:
            while not stop.is_set():
                prepared = rt.pipeline.prepare(AskRequest("git rebase onto a branch", mode="expert", expert_id=git))
                answered.append(prepared.route)
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=ask) for _ in range(3)]
    for t in readers:
        t.start()
    write()
    for t in readers:
        t.join(30)
    assert not errors, errors
    assert len(answered) >= 20, len(answered)
    seen = set()
    for route in answered:
        v = route.catalogue_version
        owner, router = truth[max(k for k in truth if k <= v)]
        assert route.router_version == router, (v, route.router_version, router)
        # The forced expert's clusters are the mapping of the same version: `moving` is git's or not.
        assert (moving in route.expert.clusters) == (owner == git), (v, route.expert.clusters, owner)
        position, bm25 = route.versions["index_position"], route.versions["bm25_version"]
        assert position <= v and bm25 is not None and bm25 <= v
        assert position >= max([d for d in documents if d <= v], default=0)  # every chunk change up to v applied
        seen.add(v)
    assert len(seen) >= 4, seen  # the questions did run across several versions
    final = rt.state()
    assert final.version == rt.catalogue.version and final.router is not None


def test_a_question_never_waits_for_the_next_states_build(client: TestClient, routed: dict[str, Any]) -> None:
    """The follower builds the next state while questions keep reading the published one."""
    rt = _runtime(client)
    states = rt.services.states
    building = threading.Event()
    slow = states.load_router

    def slow_load() -> Any:
        building.set()
        time.sleep(1.5)  # a large router version being read
        return slow()

    target = rt.routers.train(activate=False, force=True)["version"]
    before = rt.state()
    states.load_router = slow_load
    writer = threading.Thread(target=rt.routers.activate, args=(target,))
    writer.start()
    assert building.wait(10)
    t0 = time.perf_counter()
    route = rt.pipeline.prepare(AskRequest("git rebase onto a branch")).route
    took = time.perf_counter() - t0
    writer.join(10)
    states.load_router = slow
    assert took < 1.0, took  # answered from the published state, not after the build
    assert route.catalogue_version == before.version and route.router_version == before.router.version_id
    assert rt.state().router is not None and rt.state().router.version_id == target


def test_a_bm25_rebuild_in_a_child_process_publishes_the_same_index(client: TestClient, routed: dict[str, Any]) -> None:
    from app.serving.lexical import build

    rt = _runtime(client)
    assert rt.settings.lexical_rebuild_in_child
    before = rt.state()
    rt.lexical.mark_dirty()
    rt.lexical._next_allowed = 0.0  # the spacing allows it now
    assert rt.lexical.refresh()  # not forced: the child process builds it
    assert rt.lexical._pool is not None  # it did run there
    state = rt.state()
    assert state.serial > before.serial and state.lexical is rt.lexical.current() is not before.lexical
    here, version = build(rt.sessions)
    assert state.lexical_version == version and np.array_equal(state.lexical.ids, here.ids)
    for text in ("git rebase onto a branch", "sqlite vacuum"):
        assert np.allclose(state.lexical.scores(text), here.scores(text))
