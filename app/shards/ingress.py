"""The ingress as a Ray Serve deployment (the `ray` extra): moerag's FastAPI app behind Serve's HTTP
proxy, N replicas.

A shard map with an `ingress:` section (`replicas`, `host`, `port`) makes `moerag ray up` run the
app itself on Ray (`serve.ingress`, application `moerag-ingress`, one for the cluster whatever the
map's version): every replica is a moerag server on the map (its searches go to the shards, its
questions to the embedder deployment when the map has one) built from the environment `ray up`
hands it (`ingress_env`: the MOERAG_* settings, the map's path, the database, the admin token).
Serve's proxy listens on `host:port` and balances the replicas; Ray places, health-checks and
restarts them. The replicas are workers of one server, as `moerag serve --workers N` runs them:
PostgreSQL is the truth (they commit under its writer lock and follow its catalogue), the data
dir is shared (its lock held shared, uploads spooled there for whichever replica runs the job).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core.settings import Settings
from app.shards.map import IngressSpec
from app.shards.replicas import replica_states, require
from engine.errors import NotConfigured

APP = "moerag-ingress"  # its Serve application: one for the cluster, whatever the shard map's version
DEPLOYMENT = "ingress"


def ingress_env(settings: Settings, shard_map: Path, admin_token: str) -> dict[str, str]:
    """The environment of the ingress replicas: every MOERAG_* variable of this process, then what
    makes them one server on the map: the database, the shared data dir, the map file, the token."""
    if settings.db_url.startswith("sqlite"):
        raise NotConfigured(
            "an ingress on Ray runs several servers: set MOERAG_DATABASE_URL=postgresql+psycopg://USER:PASS@HOST/DB "
            "(SQLite serves from one process)"
        )
    env = {k: v for k, v in os.environ.items() if k.startswith("MOERAG_")}
    return env | {
        "MOERAG_DATABASE_URL": settings.db_url,
        "MOERAG_DATA_DIR": str(settings.resolved_data_dir),
        "MOERAG_SHARD_MAP": str(shard_map.resolve()),
        "MOERAG_ADMIN_TOKEN": admin_token,
        # Workers of one server: the data dir's lock is held shared (app.core.locking), the spool kept.
        "MOERAG_WORKER_OF": str(os.getpid()),
    }


def start_http(spec: IngressSpec) -> None:
    """Start Serve in this cluster with its HTTP proxy on the ingress's address, before anything
    else is deployed: Serve keeps what it first started with (the shards alone start it without a
    proxy), so an ingress added to a running cluster needs `moerag ray down` first, as
    NotConfigured says."""
    serve = require()
    serve.start(proxy_location="HeadOnly", http_options={"host": spec.host, "port": spec.port})
    if not serve.status().proxies:
        raise NotConfigured(
            "Serve runs in this cluster without its HTTP proxy (started for shards only): "
            "`moerag ray down`, then `moerag ray up` with the ingress in the map"
        )


def deploy(spec: IngressSpec, env: dict[str, str], build_app: Callable[[], Any]) -> None:
    """Run (or update) the ingress application: `spec.replicas` replicas of the app `build_app`
    makes (app.api.main.worker_app: settings from the environment `ingress_env` gave it, the
    runtime started in the lifespan Serve runs, so a replica takes requests once it is ready), on `/`."""
    serve = require()
    start_http(spec)
    deployment = serve.deployment(
        serve.ingress(build_app)(),
        name=DEPLOYMENT,
        num_replicas=spec.replicas,
        # A replica is a whole server (model, state, follower): a core while it answers; half lets
        # Ray place it beside the shards on a small machine.
        ray_actor_options={"num_cpus": 0.5, "runtime_env": {"env_vars": env}},
        max_ongoing_requests=64,
        health_check_period_s=5,
    )
    serve.run(deployment.bind(), name=APP, route_prefix="/")


def status() -> dict[str, Any]:
    """The ingress application for `moerag ray status`: its replicas by state and where it listens."""
    states = replica_states(APP)
    if states is None:
        return {"running": False}
    http = require().status().proxies
    return {"running": True, "replicas": states.get(DEPLOYMENT, {}), "proxies": len(http)}
