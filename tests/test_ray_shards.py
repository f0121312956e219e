"""Expert shards on a real local Ray cluster (the `ray` extra; skipped without it), PostgreSQL
the truth when the run has one (MOERAG_TEST_PG_URL, as CI does), else SQLite: three shard
deployments from a shard map, the hottest with two replicas, answer the ask flow exactly as the
single process does; the model run as an embedder deployment gives the same vectors and answers,
a caller's batch in one model call; a document just uploaded is found at once; killing one replica of the
two-replica shard under load fails no question; a shard that does not answer in time leaves the
answer partial, and one whose only replica is killed is replaced by Serve without a failed question;
four concurrent writers' chunks are on their shards within a bound, each shard holding exactly SQL's
chunks of its lists; a list moved to another shard under load loses nothing; a router roll-out under
load never pairs a router with another version's catalogue; a shard map changed while serving
switches only once its shards run, losing nothing; the cluster stopped and started again gives the
same answers."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.api.main import create_app
from app.core.db import make_engine
from app.core.migrate import downgrade
from app.core.models import Chunk
from app.core.settings import Settings
from app.runtime import Runtime
from app.services.dbcopy import copy_database
from engine.embedder import Embedder
from engine.pipeline import AskRequest
from index.shards import ShardedIndex
from tests.conftest import AUTH, ROUTED_SETTINGS, RoutedStore
from tests.helpers import wait_job
from tests.test_shards import _questions

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture
def truth(settings: Settings, embedder: Embedder, routed_store: RoutedStore) -> Iterator[TestClient]:
    """The routed store served with PostgreSQL as the truth when the run has one (its catalogue
    copied there, as `moerag db copy-to` does), else on its SQLite file; the shards read the same."""
    shutil.copytree(routed_store.data, settings.resolved_data_dir)
    for name, value in ROUTED_SETTINGS.items():
        setattr(settings, name, value)
    # The central sample in this one process too (a server over shards has one by default): the
    # answers over the shards are then compared with the same routes (the small store is sampled whole).
    settings.routing_sample = 0.05
    url = os.environ.get("MOERAG_TEST_PG_URL")
    if url:
        source, target = make_engine(settings.db_url), make_engine(url)
        downgrade(target, "base")
        copy_database(source, target)
        source.dispose()
        target.dispose()
        settings.database_url = url
    with TestClient(create_app(settings, runtime=Runtime(settings, embedder=embedder), start_in_background=False)) as c:
        yield c


class Asker:
    """A client asking `bodies` in turn on a thread while the block runs: each answer's (status,
    route)."""

    def __init__(self, client: TestClient, bodies: list[dict[str, Any]]) -> None:
        self.client, self.bodies = client, bodies
        self.answers: list[tuple[int, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ask)

    def _ask(self) -> None:
        for body in itertools.cycle(self.bodies):
            if self._stop.is_set():
                return
            r = self.client.post("/ask", json=body)
            self.answers.append((r.status_code, r.json()["route"] if r.status_code == 200 else {}))

    def __enter__(self) -> Asker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def more(self, count: int, within: float = 60.0) -> None:
        """Wait for `count` more answers (the client still asking, within `within` seconds)."""
        target, deadline = len(self.answers) + count, time.monotonic() + within
        while len(self.answers) < target:
            assert self._thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.02)

    def assert_whole(self) -> None:
        """Every answer a 200, none partial."""
        assert self.answers and all(code == 200 and not route["partial"] for code, route in self.answers), self.answers


def test_three_shard_deployments_answer_as_one_process(
    truth: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = truth
    from ray import serve

    from app.cli.main import main
    from app.shards.client import RayShards, searches
    from app.shards.map import IngressSpec, parse
    from app.shards.replicas import deploy

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    assert rt.engine.dialect.name == ("postgresql" if os.environ.get("MOERAG_TEST_PG_URL") else "sqlite")
    state = rt.state()
    raw_map: dict[str, Any] = {
        "shards": [
            {"name": "git", "experts": ["git"], "replicas": 2},
            {"name": "sqlite", "experts": ["sqlite"]},
            # Autoscaled (a target no test load reaches: it stays at one replica).
            {
                "name": "rest",
                "experts": ["debian"],
                "default": True,
                "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1000},
            },
        ]
    }
    shard_map = parse(raw_map)
    lists = shard_map.lists_of_shards(state.experts, state.index.nlist)
    on_postgres = rt.engine.dialect.name == "postgresql"  # an ingress on Ray runs several servers: PostgreSQL
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    http_port = _free_port()
    try:
        if on_postgres:  # Serve's HTTP proxy starts first or never (app.shards.ingress)
            from app.shards.ingress import start_http

            start_http(IngressSpec(port=http_port))
        handles = deploy(shard_map, rt.settings.db_url, rt.embedder.dim)
        stats = [h.stats.remote().result() for h in handles]
        # `ray up` again with the same map changes no replica: it is deployed already.
        from app.shards.replicas import deployed

        assert deployed(shard_map) and not deployed(parse(raw_map | {"shards": raw_map["shards"][2:]}))
        # `ray status` on a map that is not deployed: one line saying so, not Serve's traceback.
        other = tmp_path / "other.yaml"
        other.write_text(json.dumps({"shards": [{"name": "all", "experts": ["git"], "default": True}]}))
        with pytest.raises(SystemExit, match="is not deployed; deployed: "):
            main(["--data-dir", str(rt.settings.resolved_data_dir), "ray", "status", "--config", str(other)])
        assert sum(s["vectors"] for s in stats) == state.index.ntotal  # every vector on exactly one shard
        sharded = ShardedIndex(state.index, lists, searches(handles))
        # BM25 too: each replica scores its chunks' postings with the whole store's statistics.
        lexical = RayShards(shard_map).lexical_over(state.lexical.stats, sharded)
        over_shards = dataclasses.replace(state, index=sharded, lexical=lexical)
        pipeline = rt.pipeline
        compared = 0
        # Hybrid (BM25 on the shards too), then dense alone (no BM25 either side) on every other question.
        dense = (dataclasses.replace(state, lexical=None), dataclasses.replace(over_shards, lexical=None))
        for mode, (whole_state, sharded_state), questions in [
            ("auto", (state, over_shards), _questions()),
            ("fallback", (state, over_shards), _questions()),
            ("auto", dense, _questions()[::2]),
            ("fallback", dense, _questions()[::2]),
        ]:
            for question in questions:
                pipeline.state = lambda s=whole_state: s  # type: ignore[misc]
                expect = pipeline.prepare(AskRequest(question, mode=mode))
                pipeline.state = lambda s=sharded_state: s  # type: ignore[misc]
                got = pipeline.prepare(AskRequest(question, mode=mode))
                assert (got.route.path, got.route.reason) == (expect.route.path, expect.route.reason)
                assert [c.chunk.id for c in got.citations] == [c.chunk.id for c in expect.citations]
                assert np.allclose([c.score for c in got.citations], [c.score for c in expect.citations], atol=1e-6)
                compared += 1
        pipeline.state = rt.services.states.current
        assert compared >= 190

        # Served: the runtime's serving state spreads its index over the shards (MOERAG_SHARD_MAP).
        questions = _questions()[::8]
        before = [client.post("/ask", json={"query": q}).json() for q in questions]
        states = rt.services.states
        tier = states.shards = RayShards(shard_map)
        states.changed(rt.catalogue.version, frozenset({"index"}))  # republished over the shards
        assert isinstance(rt.state().index, ShardedIndex) and rt.state().sample is not None
        after, touched = [], []
        for q in questions:  # the shards each question called (the breakers count every call let through)
            calls = list(tier.breakers.calls)
            after.append(client.post("/ask", json={"query": q}).json())
            touched.append([b - a for a, b in zip(calls, tier.breakers.calls, strict=True)])
        for b, a, t in zip(before, after, touched, strict=True):
            assert [c["chunk_id"] for c in a["citations"]] == [c["chunk_id"] for c in b["citations"]]
            assert a["route"]["path"] == b["route"]["path"] and a["route"]["shard_map"] == shard_map.version
            # The route read the central sample: a confident question called one shard once, a
            # fallback each shard once (one round; after an expert's search the route's check
            # overruled, that search's call too).
            if a["route"]["path"] == "expert":
                assert sorted(t) == [0, 0, 1], (a["route"], t)
            elif a["route"]["reason"] in ("low_confidence", "none_class", "forced"):
                assert t == [1, 1, 1], (a["route"], t)
            else:
                assert min(t) == 1 and sum(t) == 4, (a["route"], t)
        assert any(a["route"]["path"] == "expert" for a in after)
        assert client.get("/readyz").json()["serving"]["shard_map"] == shard_map.version
        status = RayShards(shard_map).stats()  # what `moerag ray status` prints
        assert [s["vectors"] for s in status] == [s["vectors"] for s in stats]
        assert all(s["round_trip_ms"] > 0 for s in status)
        assert [s["running_replicas"] for s in status] == [2, 1, 1] and status[2]["autoscaling"] == [1, 2]
        # The console's shard page: each shard's experts, vectors, and the searches sent to it.
        page = client.get("/admin/api/shards", headers=AUTH).json()
        assert page["shard_map"] == shard_map.version
        assert [(r["shard"], r["vectors"], r["reachable"]) for r in page["shards"]] == [
            (name, s["vectors"], True) for name, s in zip(["git", "sqlite", "rest"], stats, strict=True)
        ]
        assert page["shards"][2]["experts"] == ["debian", "(unmapped lists)"] and sum(
            r["searches"] for r in page["shards"]
        )
        # A search asked again for one cut (a later version named, as ShardedIndex sends it) is
        # counted on its shard's row.
        served = rt.state().index
        assert isinstance(served, ShardedIndex)
        # Many rows at once (a router's probe, a new document's fit): one call a shard, as the whole index.
        x, whole_index = rt.embedder.encode(questions), rt.indexes.index
        got_nearest, want_nearest = served.search_nearest(x, 6, 8), whole_index.search_nearest(x, 6, 8)
        assert np.array_equal(got_nearest[1], want_nearest[1]) and got_nearest[2] == want_nearest[2]
        through = int(np.median(whole_index.assignments()[0]))
        assert np.array_equal(served.neighbours(x, 3, 8, through)[1], whole_index.neighbours(x, 3, 8, through)[1])
        served.searches[0](rt.embedder.encode(["git rebase"]), 3, lists[0], rt.catalogue.version).result()
        again = client.get("/admin/api/shards", headers=AUTH).json()["shards"]
        assert [r["reasked"] for r in again] == [r["reasked"] + (n == 0) for n, r in enumerate(page["shards"])]
        _embedder_on_ray(client, questions, after)
        if on_postgres:
            _ingress_on_ray(client, raw_map, tmp_path, http_port, questions, after)
        # Read your writes: a document just uploaded is found at once (a shard behind the state's
        # index position follows the log before it searches).
        text = "# Zanzibar quokka ledger\n\nThe zanzibar quokka ledger reconciles every quokka entry nightly."
        r = client.post("/documents", files={"file": ("quokka.md", text.encode(), "text/markdown")}, headers=AUTH)
        assert r.status_code == 201, r.text
        found = client.post("/ask", json={"query": "zanzibar quokka ledger", "mode": "fallback"}).json()
        assert found["citations"][0]["document_id"] == r.json()["id"] and not found["route"]["partial"]

        # Under load, one replica of the two-replica git shard is killed: no question fails and
        # none is partial (a search its replica dies with is asked again on the other one).
        git = [{"query": q, "mode": "fallback"} for q in _questions() if "commit" in q or "branch" in q]
        with Asker(client, git) as asker:
            asker.more(20, within=30)
            first = next(a for a in ray.util.list_named_actors(all_namespaces=True) if "shard-git" in a["name"])
            ray.kill(ray.get_actor(first["name"], namespace=first["namespace"]))
            asker.more(40, within=60)
        asker.assert_whole()

        # `moerag ray restart git` under load: its two replicas are replaced one at a time, and no
        # question fails or is partial meanwhile.
        map_file = tmp_path / "map.yaml"
        map_file.write_text(json.dumps(raw_map, sort_keys=True))  # the bytes parse() hashed: the same version
        from app.shards.map import load

        assert load(map_file).version == shard_map.version
        old = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "shard-git" in a["name"]}
        answers = rt.services.answers
        cached, answers.size = answers.size, 0  # every question searches the shards (none answered from the cache)
        with Asker(client, git) as asker:
            asker.more(10, within=30)
            capsys.readouterr()
            main(["--data-dir", str(rt.settings.resolved_data_dir), "ray", "restart", "git", "--config", str(map_file)])
            asker.more(10, within=30)
        answers.size = cached
        asker.assert_whole()
        # The first replica's successor answered the server's searches before the second was ended.
        said = capsys.readouterr()
        replaced = json.loads(said.out)["replaced"]
        assert len(replaced) == 2 and replaced[0]["searched_after_s"] is not None, (replaced, said.err[-3000:])
        new = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "shard-git" in a["name"]}
        assert len(new) == 2 and not new & old, (old, new)
        with pytest.raises(SystemExit, match="has no shard 'nope'"):
            main(
                ["--data-dir", str(rt.settings.resolved_data_dir), "ray", "restart", "nope", "--config", str(map_file)]
            )

        # A shard that cannot answer in time is left out: partial, never an error (a timeout of
        # 0.1 ms, which no shard meets), and the answer is not cached.
        sqlite_question = {"query": "SQLite write-ahead log checkpoint", "mode": "fallback"}
        whole = client.post("/ask", json=sqlite_question).json()
        states.shards = RayShards(shard_map, timeout_seconds=1e-4)
        states.changed(rt.catalogue.version, frozenset({"index"}))
        r = client.post("/ask", json=sqlite_question)
        assert r.status_code == 200 and r.json()["route"]["partial"] is True
        assert set(r.json()["route"]["missing_shards"]) <= {"git", "sqlite", "rest"}
        # The only replica of the sqlite shard is killed: no question fails; Serve replaces it
        # (it boots from SQL) and the answers are whole and the same again.
        states.shards = RayShards(shard_map, timeout_seconds=2)
        states.changed(rt.catalogue.version, frozenset({"index"}))
        [replica] = [a for a in ray.util.list_named_actors(all_namespaces=True) if "shard-sqlite" in a["name"]]
        ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]))
        deadline = time.monotonic() + 120
        while True:
            r = client.post("/ask", json=sqlite_question)
            assert r.status_code == 200 and set(r.json()["route"]["missing_shards"]) <= {"sqlite"}
            if not r.json()["route"]["partial"]:
                break
            assert time.monotonic() < deadline, "the shard did not come back"
            time.sleep(0.5)
        assert [c["chunk_id"] for c in r.json()["citations"]] == [c["chunk_id"] for c in whole["citations"]]

        # Its replica frozen (SIGSTOP): the first question waits one deadline (2 s) for all its
        # shard calls, not one a stage; the questions after it skip the shard at once (its breaker
        # is open), partial; /readyz says degraded and /metrics counts it. Serve's health check
        # replaces the frozen replica, a probe finds the shard back, and the answers are whole again.
        healthy = _timed(client, sqlite_question, 5, "healthy")
        pid = handles[1].stats.remote().result()["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            frozen = _timed(client, sqlite_question, 10, "frozen")
        finally:
            os.kill(pid, signal.SIGCONT)  # harmless once Serve has replaced it
        assert all(partial for _, partial in frozen), (frozen, healthy)
        assert max(t for t, _ in frozen) <= 2 + 0.5, frozen  # the first, and any probe: one deadline
        skipping = sorted(t for t, _ in frozen[1:])[len(frozen) // 2]  # the median after the first
        assert skipping <= 2 * max(t for t, _ in healthy) + 0.05, (frozen, healthy)
        ready = client.get("/readyz", headers=AUTH).json()
        assert ready["status"] == "degraded" and client.get("/readyz").json()["status"] == "degraded"
        assert {row["shard"] for row in ready["shards"]} == {"git", "sqlite", "rest"}
        assert 'moerag_shard_errors_total{shard="sqlite"}' in client.get("/metrics", headers=AUTH).text
        deadline = time.monotonic() + 60
        while _timed(client, sqlite_question, 1, f"back {time.monotonic()}")[0][1]:  # each asked anew
            assert time.monotonic() < deadline, "the frozen replica was not replaced"
            time.sleep(0.5)
        assert client.get("/readyz", headers=AUTH).json()["status"] == "ready"

        # Four writers at once: every committed chunk is on its shard within 5 s by the replicas'
        # own following (no question asks them to catch up), each shard holding exactly SQL's
        # chunks of its lists, and their sum SQL's row count.
        codes: list[int] = []

        def write(w: int) -> None:
            for i in range(3):
                body = f"# Writer {w} note {i}\n\nWriter {w} records note {i}: branch merges, commit hooks, vacuum."
                files = {"file": (f"writer-{w}-{i}.md", body.encode(), "text/markdown")}
                codes.append(client.post("/documents", files=files, headers=AUTH).status_code)

        writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join(60)
        committed = time.monotonic()
        assert codes == [201] * 12
        with rt.sessions() as s:
            per_list = dict(s.execute(select(Chunk.cluster_id, func.count()).group_by(Chunk.cluster_id)).all())
            rows = s.scalar(select(func.count()).select_from(Chunk))
        expected = [sum(per_list.get(int(c), 0) for c in shard_lists) for shard_lists in lists]
        assert sum(expected) == rows
        while [s["vectors"] for s in RayShards(shard_map).stats()] != expected:
            assert time.monotonic() < committed + 5, (RayShards(shard_map).stats(), expected)
            time.sleep(0.05)
        # /stats asks any replica of a shard (the git shard has two, each following on its own).
        while True:
            counted = client.get("/stats", headers=AUTH).json()  # vectors per shard, summing to SQL's rows
            if [r["vectors"] for r in counted["shards"]] == expected:
                break
            assert time.monotonic() < committed + 5, (counted["shards"], expected)
            time.sleep(0.05)
        assert counted["chunks"] == rows

        # A git list mapped to the sqlite expert (another shard) while a client asks: no question
        # fails or is partial (the sqlite shard, asked at the new state's position, reads its new
        # list before it answers), the vectors move and none is lost, and the fallback answers are
        # the same before and after (the same vectors, now on another shard).
        asked_fallback = [{"query": q, "mode": "fallback"} for q in questions]
        before_move = [client.post("/ask", json=body).json() for body in asked_fallback]
        experts = {p.name: p.id for p in rt.state().experts.values()}
        moving = int(lists[0][0])
        with Asker(client, git) as asker:
            asker.more(5)
            moved = client.post(
                "/admin/api/clusters/assign",
                json={"cluster_ids": [moving], "expert_id": experts["sqlite"]},
                headers=AUTH,
            )
            assert moved.status_code == 200, moved.text
            at_once = [client.post("/ask", json=body).json() for body in asked_fallback]  # before the poll
            if moved.json()["realign_job"] is not None:
                assert wait_job(client, moved.json()["realign_job"], AUTH)["status"] == "done"
            asker.more(10)
        asker.assert_whole()
        after_move = [client.post("/ask", json=body).json() for body in asked_fallback]
        for b, a in itertools.chain(zip(before_move, at_once, strict=True), zip(before_move, after_move, strict=True)):
            assert [(c["chunk_id"], c["score"]) for c in a["citations"]] == [
                (c["chunk_id"], c["score"]) for c in b["citations"]
            ]
        page = client.get("/admin/api/shards", headers=AUTH).json()["shards"]
        with rt.sessions() as s:
            assert sum(r["vectors"] for r in page) == s.scalar(select(func.count()).select_from(Chunk))
        assert page[1]["lists"] == len(lists[1]) + 1 and page[0]["lists"] == len(lists[0]) - 1

        # A router roll-out under load: two router versions activated in turn while a client asks
        # routed questions through the shards; every answer pairs its catalogue version with the
        # router that version activated (never the old router with the new version's catalogue),
        # and none fails or is partial.
        from app.store.catalogue import read_version

        first_router = rt.state().router.version_id
        second_router = rt.routers.train(activate=False, force=True)["version"]
        with rt.sessions() as s:
            rollout = {read_version(s): first_router}  # catalogue version -> its active router
        with Asker(client, [{"query": q} for q in questions]) as asker:
            for i in range(6):
                asker.more(3)
                active = second_router if i % 2 == 0 else first_router
                rt.routers.activate(active)
                with rt.sessions() as s:
                    rollout[read_version(s)] = active
        asker.assert_whole()
        seen_routers = set()
        for _, route in asker.answers:
            v = int(route["catalogue_version"])  # type: ignore[call-overload]
            assert route["router_version"] == rollout[max(k for k in rollout if k <= v)], (route, rollout)
            seen_routers.add(route["router_version"])
        assert seen_routers == {first_router, second_router}, seen_routers

        # The shard map changed while serving (the sqlite expert joins the rest shard): the new
        # map's application is deployed beside the old one; the follower switches only once it
        # runs; a client asking meanwhile sees no failure and no partial answer; the answers are
        # the same on the new map, and still after the old map's shards are retired.
        import yaml

        from app.shards.map import load as load_map
        from app.shards.map_follow import ShardMapFollower, retire
        from app.shards.replicas import deployed

        map_file = tmp_path / "shards.yaml"
        merged = {
            "shards": [
                {"name": "git", "experts": ["git"], "replicas": 2},
                {"name": "rest", "experts": ["sqlite", "debian"], "default": True},
            ]
        }
        map_file.write_text(yaml.safe_dump(merged))
        follower = ShardMapFollower(map_file, states, shard_map.version, timeout_seconds=5)
        new_map = load_map(map_file)
        assert not deployed(new_map) and not follower.check()  # not running yet: the old map serves
        assert rt.state().shard_map == shard_map.version
        before_map = [client.post("/ask", json=body).json() for body in asked_fallback]
        with Asker(client, git) as asker:
            deploy(new_map, rt.settings.db_url, rt.embedder.dim, str(rt.settings.index_dir))
            assert follower.check() and rt.state().shard_map == new_map.version
            asker.more(10)
            assert retire(keep=new_map) == [f"moerag-shards-{shard_map.version}"]
            asker.more(10)
        asker.assert_whole()
        on_new_map = [client.post("/ask", json=body).json() for body in asked_fallback]
        for b, a in zip(before_map, on_new_map, strict=True):
            assert a["route"]["shard_map"] == new_map.version
            assert [(c["chunk_id"], c["score"]) for c in a["citations"]] == [
                (c["chunk_id"], c["score"]) for c in b["citations"]
            ]
        with rt.sessions() as s:
            rows = s.scalar(select(func.count()).select_from(Chunk))
        assert sum(r["vectors"] for r in RayShards(new_map).stats()) == rows

        # The cluster stopped and started again (replicas boot from the newest snapshot and the log
        # after it): the same answers, ids and scores, routed and fallback.
        asked = [{"query": q, "mode": m} for q in questions for m in ("auto", "fallback")]
        before = [client.post("/ask", json=body).json() for body in asked]
        rt.indexes.checkpoint()  # the replicas boot from the newest snapshot, cut to their lists
        serve.shutdown()
        ray.shutdown()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        handles = deploy(shard_map, rt.settings.db_url, rt.embedder.dim, str(rt.settings.index_dir))
        rebooted = [h.stats.remote().result() for h in handles]
        assert all(r["booted"].split("@")[0] in ("part", "snapshot") for r in rebooted), rebooted
        with rt.sessions() as s:
            assert sum(r["vectors"] for r in rebooted) == s.scalar(select(func.count()).select_from(Chunk))
        states.shards = RayShards(shard_map)
        states.changed(rt.catalogue.version, frozenset({"index"}))
        after = [client.post("/ask", json=body).json() for body in asked]
        for b, a in zip(before, after, strict=True):
            assert not a["route"]["partial"] and a["route"]["path"] == b["route"]["path"]
            assert [(c["chunk_id"], c["score"]) for c in a["citations"]] == [
                (c["chunk_id"], c["score"]) for c in b["citations"]
            ]
    finally:
        serve.shutdown()
        ray.shutdown()


def _embedder_on_ray(client: TestClient, questions: list[str], expected: list[dict[str, Any]]) -> None:
    """A map's `embedder:`: the model runs as a Serve deployment (app.shards.embedder) and the server
        embeds through it: the same vectors and token counts as the model in process, a caller's batch
        of questions one model call, and the served answers unchanged, every question embedded there (in bfloat16,
    whose sums on other threads differ by ~1e-3, the same route and first citation)."""
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    from app.runtime import load_embedder
    from app.shards import embedder as ray_embedder
    from engine.question_encoder import QuestionEncoder

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    s = rt.settings
    model = ray_embedder.deploy(1, 16, None, s.embed_dtype, s.embed_batch_size, s.question_runtime)
    try:
        assert ray_embedder.running(1, 16) and not ray_embedder.running(2, 16) and not ray_embedder.running(1, 8)
        assert ray_embedder.status()["replicas"] == {"RUNNING": 1}  # what `moerag ray status` adds
        remote = load_embedder(s, on_ray=True)  # what a server whose map has `embedder:` holds
        assert isinstance(remote, ray_embedder.RemoteEmbedder)
        assert (remote.dim, remote.name, remote.max_tokens) == (
            rt.embedder.dim,
            rt.embedder.name,
            rt.embedder.max_tokens,
        )
        # Within what the model's own compiled-versus-eager check allows for its dtype (a replica's
        # matrix products run on other threads than the server's: bfloat16 sums differ in order).
        atol = 1e-2 if remote.dtype_name == "bfloat16" else 1e-5
        assert np.allclose(remote.encode_questions(questions), rt.embedder.encode_questions(questions), atol=atol)
        before = model.recent_batches.remote().result()
        assert before[-1] == len(questions) <= 16  # the caller's batch went through the model in one call
        assert np.allclose(remote.encode(questions[:4]), rt.embedder.encode(questions[:4]), atol=atol)
        assert remote.count_tokens(questions) == rt.embedder.count_tokens(questions)
        pipeline, own, answers = rt.pipeline, rt.pipeline.submit_question, rt.services.answers
        pipeline.submit_question = QuestionEncoder(remote.encode_questions, max_batch=16, workers=4).submit
        cached, answers.size = answers.size, 0  # every question embedded again, not answered from the cache
        try:
            with ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda q: client.post("/ask", json={"query": q}).json(), questions))
        finally:
            pipeline.submit_question, answers.size = own, cached
        for a, b in zip(got, expected, strict=True):  # bfloat16: 1.1e-3 apart at most here; the same answers
            ids, want = [c["chunk_id"] for c in a["citations"]], [c["chunk_id"] for c in b["citations"]]
            assert a["route"]["path"] == b["route"]["path"] and (ids == want if atol < 1e-3 else ids[0] == want[0])
        batches = model.recent_batches.remote().result()
        assert sum(batches) - sum(before) >= len(questions)  # every /ask embedded its question there
    finally:
        serve.delete(ray_embedder.APP)  # its memory back for the rest of the module


def _timed(client: TestClient, body: dict[str, Any], n: int, tag: str) -> list[tuple[float, bool]]:
    """`n` answers to `body` (its question numbered) in turn: each one's seconds and whether it was partial."""
    out = []
    for i in range(n):  # each asked anew (an answer cached whole would not ask the shards)
        t = time.monotonic()
        r = client.post("/ask", json=body | {"query": f"{body['query']} ({tag} {i})"})
        assert r.status_code == 200, r.text
        out.append((time.monotonic() - t, bool(r.json()["route"]["partial"])))
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ingress_on_ray(
    client: TestClient,
    raw_map: dict[str, Any],
    tmp_path: Path,
    port: int,
    questions: list[str],
    expected: list[dict[str, Any]],
) -> None:
    """A map's `ingress:`: moerag's app as a Serve deployment of two replicas behind Serve's HTTP
    proxy (app.shards.ingress), each a server on the map built from the environment `ray up` gives
    it (its own data dir here: the server in process holds this one): both replicas answer, with
    the in-process server's routes and first citations (bfloat16 questions, as in the embedder's
    check), holding the index's lists without its vectors; a document uploaded through the proxy
    (its fit searched on the shards) is found through it, whichever replica answers, within 5 s,
    and by the server in process."""
    import json

    import httpx
    from ray import serve

    from app.api.main import worker_app
    from app.shards import ingress as ray_ingress
    from app.shards.map import IngressSpec, load

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    map_file = tmp_path / "ingress-shards.yaml"
    map_file.write_text(json.dumps(raw_map, sort_keys=True))  # JSON is YAML: the same version as the map served
    assert load(map_file).version == rt.state().shard_map
    token = rt.settings.admin_token.get_secret_value()
    own = Settings(data_dir=tmp_path / "ingress-data", database_url=rt.settings.database_url, admin_token=token)
    ray_ingress.deploy(IngressSpec(replicas=2, port=port), ray_ingress.ingress_env(own, map_file, token), worker_app)
    try:
        assert ray_ingress.status() == {"running": True, "replicas": {"RUNNING": 2}, "proxies": 1}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            # Both replicas ready: each has had every shard answer (a shard that did not answer
            # a replica's first call is "degraded" there until its breaker's probe answers).
            deadline = time.monotonic() + 60
            ready = [http.get("/readyz").json() for _ in range(20)]
            while {r["status"] for r in ready} != {"ready"}:
                assert time.monotonic() < deadline, ready
                time.sleep(0.2)
                ready = [http.get("/readyz").json() for _ in range(20)]
            assert {r["serving"]["shard_map"] for r in ready} == {rt.state().shard_map}
            assert {r["database"] for r in ready} == {"postgresql"} and len({r["pid"] for r in ready}) == 2
            # Each replica keeps the index's lists, not its vectors: those are on the shards. Ready
            # is not caught up: each follows the index log on its own, so both hold SQL's chunks
            # within a bound (a write in process meanwhile is followed too).
            with rt.sessions() as s:
                rows = s.scalar(select(func.count()).select_from(Chunk))
            deadline = time.monotonic() + 10
            while {(r["index"]["codec"], r["index"]["vectors"]) for r in ready} != {("none", rows)}:
                assert time.monotonic() < deadline, ([r["index"] for r in ready], rows)
                time.sleep(0.1)
                ready = [http.get("/readyz").json() for _ in range(20)]
            assert rt.indexes.index.ntotal == rows
            for q, want in zip(questions, expected, strict=True):
                got = http.post("/ask", json={"query": q}).json()
                assert got["route"]["path"] == want["route"]["path"], (q, got["route"], want["route"])
                assert not got["route"]["partial"], (q, got["route"])
                assert got["citations"][0]["chunk_id"] == want["citations"][0]["chunk_id"]
            text = "# Okapi ferry timetable\n\nThe okapi ferry timetable lists every crossing of the okapi ferry."
            files = {"file": ("okapi.md", text.encode(), "text/markdown")}
            r = http.post("/documents", files=files, headers={"authorization": f"Bearer {token}"})
            assert r.status_code == 201, r.text
            body, doc = {"query": "okapi ferry timetable", "mode": "fallback"}, r.json()["id"]
            deadline = time.monotonic() + 5
            while http.post("/ask", json=body).json()["citations"][0]["document_id"] != doc:
                assert time.monotonic() < deadline, "an ingress replica did not see the upload within 5 s"
                time.sleep(0.05)
            assert all(http.post("/ask", json=body).json()["citations"][0]["document_id"] == doc for _ in range(10))
        assert client.post("/ask", json=body).json()["citations"][0]["document_id"] == doc
    finally:
        serve.delete(ray_ingress.APP)  # its memory back for the rest of the module
