"""The `moerag` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app.cli import ray_cluster
from app.cli.common import ingest_files, local_runtime, require_store, server_for, settings_from, token_for
from app.cli.experts import add_commands as add_expert_commands
from app.cli.sync import cmd_sync, every_seconds
from app.cli.tokens import add_commands as add_token_commands
from app.core.settings import Settings
from engine.parsing import SUPPORTED, folder_source, unsupported_reason, walk_documents

if TYPE_CHECKING:
    pass

log = logging.getLogger("moerag")


def collect_files(paths: Sequence[str]) -> list[Path]:
    """Files as named; folders walked for supported types (hidden entries skipped)."""
    return collect(paths)[0]


def collect(paths: Sequence[str]) -> tuple[list[Path], list[str], list[tuple[str, str]]]:
    """(files, their sources, the files left out with the reason): files as named (the source: the
    path as given), folders walked for the types moerag reads (the source: the folder's name and
    the path inside it, as a folder upload stores it; hidden entries and symbolic links skipped)."""
    found: list[Path] = []
    sources: list[str] = []
    skipped: list[tuple[str, str]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files, links, unsupported = walk_documents(p)
            found += files
            sources += [folder_source(f, p) for f in files]
            skipped += [(str(f), unsupported_reason(f)) for f in unsupported]
            skipped += [(str(f), "a symbolic link (never followed)") for f in links]
        elif p.is_file():
            found.append(p)
            sources.append(str(p))
        else:
            raise SystemExit(f"moerag: {raw}: no such file or folder")
    return found, sources, skipped


# ---- local commands (own the data directory) -----------------------------------------------------


def ingest_local(
    settings: Settings, files: list[Path], progress: bool = True, sources: list[str] | None = None
) -> dict[str, int]:
    with local_runtime(settings) as rt:
        return ingest_files(rt, files, progress, sources=sources)


def cmd_ingest(args: argparse.Namespace) -> None:
    settings = settings_from(args)
    files, sources, skipped = collect(args.paths)
    for path, reason in skipped:  # never dropped silently: each named, and counted below
        print(f"skipped {path}: {reason}", file=sys.stderr)
    if not files:
        raise SystemExit(f"moerag: no supported files found ({SUPPORTED})")
    if server := server_for(args, settings):
        from app.cli.remote import ingest_remote

        token = token_for(args, settings, admin=True)
        counts = ingest_remote(server, token, files, progress=not args.quiet, sources=sources)
    else:
        counts = ingest_local(settings, files, progress=not args.quiet, sources=sources)
    print(json.dumps(counts | {"skipped": len(skipped)}))
    if counts["failed"]:
        raise SystemExit(1)  # the counts are printed; the exit status says not everything went in


def cmd_recluster(args: argparse.Namespace) -> None:
    """Here, or as a job on a server (--server, or the live server holding the data dir)."""
    settings = settings_from(args)
    if server := server_for(args, settings):
        from tqdm import tqdm

        from app.cli.remote import Remote

        with (
            tqdm(total=4, desc="recluster", disable=args.quiet) as bar,
            Remote(server, token_for(args, settings, admin=True)) as api,
        ):

            def progress(done: int, total: int) -> None:
                bar.total, bar.n = max(total, 1), done
                bar.refresh()

            job = api.call("POST", "/admin/api/recluster", ok=(202,), json={"clusters": args.clusters or None})
            print(json.dumps(api.follow_job(job, progress)["result"]))
        return
    with local_runtime(settings) as rt:
        print(json.dumps(rt.indexes.recluster(clusters=args.clusters)))


def cmd_index_rebuild(args: argparse.Namespace) -> None:
    with local_runtime(settings_from(args), remote=False) as rt:
        idx = rt.indexes.rebuild()
        print(json.dumps({"version": idx.version, "clusters": idx.nlist, "vectors": idx.ntotal}))


def cmd_search(args: argparse.Namespace) -> None:
    from app.cli.remote import Remote, print_hits

    settings = settings_from(args)
    body = {"query": args.query, "k": args.k, "clusters": args.clusters}
    if server := server_for(args, settings):
        with Remote(server, token_for(args, settings, admin=False)) as api:
            print_hits(api.call("POST", "/search", json=body), args.json)
        return
    from app.schemas.api import SearchIn
    from app.services.search import run_search

    require_store(settings)
    with local_runtime(settings) as rt:
        print_hits(run_search(rt, SearchIn.model_validate(body)).model_dump(), args.json)


def cmd_ask(args: argparse.Namespace) -> None:
    from app.cli.remote import Remote, print_answer

    settings = settings_from(args)
    body = {"query": args.question, "k": args.k, "mode": args.mode, "expert": args.expert}
    body = {k: v for k, v in body.items() if v is not None}
    if server := server_for(args, settings):
        with Remote(server, token_for(args, settings, admin=False)) as api:
            print_answer(api.call("POST", "/ask", json=body), args.json)
        return
    from app.schemas.api import AskIn
    from app.services.answering import answer_json

    require_store(settings)
    with local_runtime(settings) as rt:  # the API's own answer: same checks, same log, same shape
        print_answer(json.loads(answer_json(rt, AskIn.model_validate(body))), args.json)


def cmd_router_train(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from engine.errors import NotTrainable

    settings = settings_from(args)
    with tqdm(total=100, unit="%", desc="train router", disable=args.quiet) as bar:

        def progress(done: int, total: int) -> None:
            bar.n = done * 100 // max(total, 1)
            bar.refresh()

        if server := server_for(args, settings):
            from app.cli.remote import Remote

            with Remote(server, token_for(args, settings, admin=True)) as api:
                job = api.call("POST", "/admin/api/router/train", ok=(202,), json={"activate": not args.no_activate})
                result = api.follow_job(job, progress)["result"]
        else:
            with local_runtime(settings) as rt:
                try:
                    result = rt.routers.train(progress, activate=not args.no_activate)
                except NotTrainable as exc:
                    raise SystemExit(f"moerag: {exc}") from None
    print(json.dumps(result))


def cmd_router_eval(args: argparse.Namespace) -> None:
    """Accuracy, ECE and coverage of the active router on labelled questions (JSONL: question, expert)."""
    import torch

    from app.services.routing import ONE_EXPERT
    from engine.router_training import evaluate

    with local_runtime(settings_from(args), remote=False) as rt:
        state = rt.state()
        router = state.router
        if router is None:
            raise SystemExit("moerag: no active router; run `moerag router train` first")
        if len(state.mapped) < 2:  # no figure over one class
            raise SystemExit(f"moerag: {ONE_EXPERT}")
        profiles = state.experts
        by_name = {p.name: p.id for p in profiles.values()}
        rows = [json.loads(line) for line in Path(args.file).read_text().splitlines() if line.strip()]
        position = {e: i for i, e in enumerate(router.expert_ids)}
        labels, texts = [], []
        for r in rows:
            expert = r.get("expert", r.get("expert_id"))
            eid = by_name.get(expert) if isinstance(expert, str) else expert
            if eid not in position:
                raise SystemExit(f"moerag: unknown expert {expert!r} in {args.file}")
            labels.append(position[eid])
            texts.append(r["question"])
        q = rt.embedder.encode(texts)  # [Q, D]
        bm25 = state.lexical
        queries = [bm25.terms(t) for t in texts] if bm25 is not None else None
        logits = router.served_logits(state.index, q, queries)  # [Q, E+1], BM25's vote included as served
        metrics = evaluate(logits, torch.tensor(labels), router.temperature, rt.settings.route_threshold)
        keep = ("accuracy", "ece_before", "ece_after", "coverage_at_threshold", "accuracy_at_threshold")
        print(json.dumps({"questions": len(rows), "router_version": router.version_id} | {k: metrics[k] for k in keep}))


def cmd_sample(args: argparse.Namespace) -> None:
    from app.cli.sample import build_sample_corpus

    paths = build_sample_corpus(Path(args.target))
    print(f"wrote {len(paths)} documents to {args.target}")


def _db(args: argparse.Namespace) -> None:
    from app.cli.db import cmd_db

    cmd_db(args)


def cmd_mcp(args: argparse.Namespace) -> None:
    """MCP over stdin/stdout for an agent that launches moerag itself (a server's agents use its /mcp)."""
    import anyio

    from app.api.mcp_server import build

    settings = settings_from(args)
    require_store(settings)
    with local_runtime(settings, busy="connect the agent to that server's /mcp (streamable HTTP) instead") as rt:
        anyio.run(build(rt).run_stdio_async)


def _serve(args: argparse.Namespace) -> None:
    from app.cli.serve import cmd_serve  # imports uvicorn: only when serving

    cmd_serve(args)


def _cluster_ids(text: str) -> list[int]:
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated cluster ids, e.g. 3,7") from None


def build_parser() -> argparse.ArgumentParser:  # noqa: PLR0915
    p = argparse.ArgumentParser(prog="moerag", description="Self-hosted RAG with expert-indexed retrieval")
    p.add_argument("--data-dir", help="data directory (default: $MOERAG_DATA_DIR or ./data)")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--sample", action="store_true", help="ingest the pydoc sample corpus if the store is empty")
    serve.add_argument(
        "--workers", type=int, default=1, help="worker processes on the port (more than 1 needs PostgreSQL)"
    )
    serve.set_defaults(func=_serve)

    # Commands that can run against a server: --server (default: the live server holding the data dir).
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument(
        "--server",
        help="a running server, e.g. http://127.0.0.1:8000 (default: the one "
        "serving --data-dir, if any; else the command runs here)",
    )
    remote.add_argument("--token", help="bearer token (default: $MOERAG_ADMIN_TOKEN, then the data dir's token)")
    remote.add_argument("--quiet", action="store_true", help="no progress bar")
    remote.add_argument("--json", action="store_true", help="print JSON (for scripts)")

    ingest = sub.add_parser("ingest", parents=[remote], help=f"ingest files and folders ({SUPPORTED})")
    ingest.add_argument("paths", nargs="+")
    ingest.set_defaults(func=cmd_ingest)

    recluster = sub.add_parser("recluster", parents=[remote], help="k-means the stored embeddings into new clusters")
    recluster.add_argument("--clusters", type=int, default=0, help="lists to make (default: automatic, from the size)")
    recluster.set_defaults(func=cmd_recluster)
    add_expert_commands(sub, remote)

    index = sub.add_parser("index", help="index maintenance")
    index_sub = index.add_subparsers(dest="action", required=True)
    index_sub.add_parser("rebuild", help="rebuild the FAISS index from stored embeddings").set_defaults(
        func=cmd_index_rebuild
    )

    db = sub.add_parser("db", help="database migrations; copy-to URL: the whole catalogue into an empty database")
    db.add_argument("action", choices=["upgrade", "downgrade", "copy-to"])
    db.add_argument("revision", nargs="?", help="a revision (upgrade, downgrade) or the target URL (copy-to)")
    db.set_defaults(func=_db)

    search = sub.add_parser("search", parents=[remote], help="dense search (debugging aid)")
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--clusters", type=_cluster_ids, help="comma-separated cluster ids to scope the search")
    search.set_defaults(func=cmd_search)

    ask = sub.add_parser("ask", parents=[remote], help="ask a question (route, retrieve, answer)")
    ask.add_argument("question")
    ask.add_argument("-k", type=int, default=None, help="passages to cite")
    ask.add_argument("--mode", choices=["auto", "expert", "fallback"], default="auto")
    ask.add_argument("--expert", type=int, help="expert id for --mode expert")
    ask.set_defaults(func=cmd_ask)

    router = sub.add_parser("router", help="train or evaluate the router")
    router_sub = router.add_subparsers(dest="action", required=True)
    train = router_sub.add_parser(
        "train", parents=[remote], help="train a new router version (activated unless --no-activate)"
    )
    train.add_argument("--no-activate", action="store_true")
    train.set_defaults(func=cmd_router_train)
    ev = router_sub.add_parser("eval", help="evaluate the active router on labelled questions")
    ev.add_argument("file", help='JSONL with {"question": ..., "expert": name or id}')
    ev.set_defaults(func=cmd_router_eval)

    sync = sub.add_parser(
        "sync", parents=[remote], help="mirror a folder, a git repository or a web site: changes in, removed ones out"
    )
    sync.add_argument("folder", nargs="?", help="a local folder (or give --git or --site)")
    sync.add_argument("--git", help="a git repository URL (cloned with the git command, then fetched)")
    sync.add_argument("--branch", help="--git: the branch (default: the repository's)")
    sync.add_argument(
        "--site", help="a web site's start page (its folder on that host is crawled) or its sitemap (.xml)"
    )
    sync.add_argument("--max-pages", type=int, default=200, help="--site: pages to crawl at most (default 200)")
    sync.add_argument("--max-depth", type=int, default=5, help="--site: links followed from the start (default 5)")
    sync.add_argument("--every", type=every_seconds, help="run again after this long (30s, 10m, 2h), until stopped")
    sync.set_defaults(func=cmd_sync)
    add_token_commands(sub, remote)
    ray_cluster.add_commands(sub)
    mcp = sub.add_parser("mcp", help="serve MCP over stdio (tools ask, search, list_experts, get_chunk)")
    mcp.set_defaults(func=cmd_mcp)
    sample = sub.add_parser("sample", help="write the pydoc sample corpus to a folder")
    sample.add_argument("target")
    sample.set_defaults(func=cmd_sample)
    _data_dir_everywhere(p)
    return p


def _data_dir_everywhere(parser: argparse.ArgumentParser) -> None:
    """`--data-dir` after the subcommand too (`moerag ask --data-dir d "…"`), as before it."""
    for action in parser._actions:  # argparse has no public walk of its subcommands
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                command.add_argument("--data-dir", default=argparse.SUPPRESS, help="data directory")
                _data_dir_everywhere(command)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    level = os.environ.get("MOERAG_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "sentence_transformers", "transformers", "faiss", "alembic", "bm25s"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from app.core.errors import ApiError
    from engine.errors import MoeragError

    try:
        args.func(args)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except ApiError as exc:  # the API's own checks, run locally (a question too long, an unknown expert)
        raise SystemExit(f"moerag: {exc.code}: {exc.message}") from None
    except MoeragError as exc:  # a setting that cannot work here (a shard map, a missing extra)
        raise SystemExit(f"moerag: {exc.code}: {exc}") from None
    except (OSError, ValueError, RuntimeError) as exc:
        if level == "DEBUG":
            raise
        raise SystemExit(f"moerag: {type(exc).__name__}: {exc} (MOERAG_LOG_LEVEL=DEBUG for the traceback)") from None
