"""`moerag ray up|status|down`: expert shards on Ray Serve (app.shards.replicas; the `ray` extra).

`up` joins the Ray cluster at `--address`, or the local one, or starts a local one (`ray start
--head`, Ray's own command), and deploys one Serve deployment per shard of the map, as one Serve
application per map version; a map with `embedder:` also runs the model there, once for the
cluster (app.shards.embedder). `moerag serve` with MOERAG_SHARD_MAP (and MOERAG_RAY_ADDRESS) then
searches through them; a changed map file, once `up` runs it, is what the servers switch to
(app.shards.map_follow), and `up` deletes the other maps' shards `--retire-after` seconds later.
A map with `ingress:` runs moerag's app itself there too, behind Serve's HTTP proxy
(app.shards.ingress). `status` prints each shard: its replicas, the lists and vectors it holds and
the catalogue version it has reached. `down` deletes every map's shards, the ingress and the
embedder (and stops the local cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from app.cli.common import settings_from


def add_commands(sub: Any) -> None:
    ray = sub.add_parser("ray", help="expert shards on Ray Serve (pip install 'moerag[ray]')")
    actions = ray.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="start or join a Ray cluster and deploy the shards of a shard map")
    up.add_argument("--config", type=Path, required=True, help="the shard map (docs/shards.example.yaml)")
    up.add_argument("--address", help="a Ray cluster to join (auto, host:6379, ray://host:10001); default: a local one")
    up.add_argument(
        "--retire-after",
        type=float,
        default=30.0,
        help="seconds before the shards of any other map are deleted (servers switch within 2 s of the new "
        "map running; default 30)",
    )
    up.add_argument(
        "--redeploy", action="store_true", help="replace the replicas even when this map is deployed already"
    )
    up.set_defaults(func=cmd_up)
    status = actions.add_parser("status", help="shards, replicas, vectors and versions")
    status.add_argument("--config", type=Path, required=True, help="the shard map deployed")
    status.add_argument("--address", default="auto", help="the Ray cluster (default: the local one)")
    status.set_defaults(func=cmd_status)
    restart = actions.add_parser(
        "restart", help="replace one shard's replicas one at a time (a shard of two or more keeps answering)"
    )
    restart.add_argument("shard", help="the shard's name in the map")
    restart.add_argument("--config", type=Path, required=True, help="the shard map deployed")
    restart.add_argument("--address", default="auto", help="the Ray cluster (default: the local one)")
    restart.set_defaults(func=cmd_restart)
    down = actions.add_parser("down", help="delete moerag's applications (and stop a local cluster `up` started)")
    down.add_argument(
        "--address",
        help="the Ray cluster joined by `up --address`; default: the local one (stopped only if `up` started it)",
    )
    down.set_defaults(func=cmd_down)


def _ray_command(*args: str, token: bool = False) -> None:
    """Ray's own CLI, from this interpreter's environment; token: with Ray's token authentication on."""
    ray = Path(sys.executable).with_name("ray")
    env = os.environ | {"RAY_AUTH_MODE": "token"} if token else None
    subprocess.run([str(ray), *args], check=True, stdout=subprocess.DEVNULL, env=env)


RAY_TOKEN = Path.home() / ".ray" / "auth_token"  # where Ray reads its token (RAY_AUTH_TOKEN_PATH elsewhere)


def _ensure_ray_token() -> None:
    """Ray's authentication token, written (owner-only) when this machine has none yet: a cluster
    `ray start` starts requires it only when the file exists."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or RAY_TOKEN.exists():
        return
    RAY_TOKEN.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(RAY_TOKEN, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    print(f"wrote Ray's authentication token to {RAY_TOKEN} (every process joining the cluster needs it)")


def cmd_up(args: argparse.Namespace) -> None:  # noqa: PLR0915
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from app.core.db import make_engine
    from app.core.models import IndexState
    from app.shards import client as ray_client
    from app.shards import map as shard_map
    from app.shards import replicas as ray_shards
    from app.store.profiles import profiles

    ray_shards.require()
    settings = settings_from(args)
    shards = shard_map.load(args.config)
    engine = make_engine(settings.db_url)
    try:
        dim = ray_shards.store_dim(engine)
        with Session(engine) as s:  # the map against the store's experts, before anything is deployed
            shards.lists_of_shards(profiles(s), s.scalar(select(IndexState.nlist)) or 1)
    finally:
        engine.dispose()
    import ray

    if args.address is None:
        try:  # a local cluster `up` started before (a changed map deployed beside the running one)
            ray.init(address="auto", log_to_driver=False)
        except ConnectionError:
            # Ray listens on every interface (it will not advertise a loopback address), so the
            # cluster this command starts requires Ray's token: nothing joins it without the file.
            _ensure_ray_token()
            _ray_command("start", "--head", "--disable-usage-stats", "--include-dashboard=false", token=True)
            _started_marker(settings).write_text("moerag ray up started this Ray cluster\n")
    if not ray.is_initialized():
        ray.init(address=args.address or "auto", log_to_driver=False)
    # Replicas boot from the snapshots (MOERAG_SNAPSHOT_URL; on one machine the data dir's index folder).
    snapshots = settings.snapshot_url or str(settings.index_dir)
    # A replica placed on another machine reads the same database and snapshots, or nothing at all.
    ray_shards.refuse_local_store(ray_shards.alive_nodes(), settings.db_url, snapshots)
    if shards.ingress is not None:  # Serve's HTTP proxy starts first or never (app.shards.ingress)
        from app.api.main import worker_app
        from app.shards import ingress as ray_ingress

        ray_ingress.start_http(shards.ingress)
    if ray_shards.deployed(shards) and not args.redeploy:  # the same map again: nothing to change
        print(f"shard map {shards.version} is deployed already: no replica changed (--redeploy replaces them)")
        handles = [ray_client.handle(shards, s.name) for s in shards.shards]
    else:
        handles = ray_shards.deploy(shards, settings.db_url, dim, snapshots, settings.index_codec)
    print(json.dumps({"shard_map": shards.version, "shards": ray_client.shard_stats(shards, handles)}, indent=2))
    if shards.embedder is not None:  # the model on Ray too: one application whatever the map's version
        from app.shards import embedder as ray_embedder

        spec = shards.embedder
        if not ray_embedder.running(spec.replicas, spec.max_batch):
            model = str(settings.model_path) if settings.model_path else None
            handle = ray_embedder.deploy(
                spec.replicas,
                spec.max_batch,
                model,
                settings.embed_dtype,
                settings.embed_batch_size,
                settings.question_runtime,
            )
            print(json.dumps({"embedder": handle.info.remote().result()}, indent=2))
    if shards.ingress is not None:  # the app itself, N servers on the map behind Serve's proxy
        from app.api.main import worker_app
        from app.core.auth import load_or_create_token
        from app.shards import ingress as ray_ingress

        token = load_or_create_token(
            settings.admin_token.get_secret_value() if settings.admin_token else None, settings.token_file
        )
        ray_ingress.deploy(shards.ingress, ray_ingress.ingress_env(settings, args.config, token), worker_app)
        where = f"http://{shards.ingress.host}:{shards.ingress.port}"
        print(json.dumps({"ingress": where, **ray_ingress.status()}, indent=2))
    from ray import serve

    from app.shards.map_follow import retire

    if any(name != shards.app_name for name in serve.status().applications if name.startswith(shard_map.APP)):
        print(
            f"other shard maps are retired in {args.retire_after:g} s (servers switch to {shards.version})", flush=True
        )
        time.sleep(args.retire_after)
        print(json.dumps({"retired": retire(keep=shards)}))


def cmd_status(args: argparse.Namespace) -> None:
    from app.shards import client as ray_client
    from app.shards import map as shard_map
    from engine.errors import NotConfigured

    wanted = shard_map.load(args.config)
    serve = ray_client.require()
    ray_client.join(args.address)
    if wanted.app_name not in serve.status().applications:  # one line, not a traceback from Serve
        deployed = sorted(a for a in serve.status().applications if a.startswith(shard_map.APP))
        raise NotConfigured(
            f"the shard map {args.config} (version {wanted.version}) is not deployed; deployed: {deployed or 'none'}; "
            f"deploy it with `moerag ray up --config {args.config}`"
        )
    shards = ray_client.RayShards(wanted, args.address)
    out: dict[str, Any] = {"shard_map": shards.shard_map.version, "shards": shards.stats()}
    if shards.shard_map.embedder is not None:
        from app.shards import embedder as ray_embedder

        out["embedder"] = ray_embedder.status()
    if shards.shard_map.ingress is not None:
        from app.shards import ingress as ray_ingress

        out["ingress"] = ray_ingress.status()
    print(json.dumps(out, indent=2))


def cmd_restart(args: argparse.Namespace) -> None:
    from app.shards import client as ray_client
    from app.shards import map as shard_map
    from app.shards import replicas as ray_shards

    wanted = shard_map.load(args.config)
    ray_client.require()
    ray_client.join(args.address)
    replaced = ray_shards.restart(wanted, args.shard, told=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps({"shard": args.shard, "replaced": replaced}, indent=2))


def cmd_down(args: argparse.Namespace) -> None:
    from app.shards import replicas as ray_shards
    from app.shards.map_follow import retire

    serve = ray_shards.require()
    import ray

    ray.init(address=args.address or "auto", log_to_driver=False)
    serve.start(proxy_location="Disabled")
    deleted = retire()
    from app.shards import embedder as ray_embedder
    from app.shards import ingress as ray_ingress

    for app in (ray_ingress.APP, ray_embedder.APP):  # the servers first: they call the embedder
        if app in serve.status().applications:
            serve.delete(app)
            deleted.append(app)
    ray.shutdown()
    marker = _started_marker(settings_from(args))
    stopped = args.address is None and marker.exists()
    if stopped:  # never a cluster `up` did not start: other Ray work on this machine keeps running
        _ray_command("stop")
        marker.unlink(missing_ok=True)
    print(json.dumps({"deleted": deleted, "ray_stopped": stopped}))


def _started_marker(settings: Any) -> Path:
    """The data dir's note that `ray up` started the local Ray cluster (so `ray down` may stop it)."""
    return Path(settings.resolved_data_dir) / "ray-started"
