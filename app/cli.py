"""The `moerag` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from app.settings import Settings

if TYPE_CHECKING:
    from app.runtime import Runtime

SUPPORTED_SUFFIXES = {".txt", ".text", ".md", ".markdown", ".html", ".htm", ".xhtml", ".pdf", ".rst"}
log = logging.getLogger("moerag")


def _settings(args: argparse.Namespace) -> Settings:
    if getattr(args, "data_dir", None):
        return Settings(data_dir=Path(args.data_dir))
    return Settings()


def collect_files(paths: Sequence[str]) -> list[Path]:
    """Files as named; folders walked for supported types (hidden entries skipped)."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                rel = f.relative_to(p)
                if (
                    f.is_file()
                    and f.suffix.lower() in SUPPORTED_SUFFIXES
                    and not any(part.startswith(".") for part in rel.parts)
                ):
                    found.append(f)
        elif p.is_file():
            found.append(p)
        else:
            raise SystemExit(f"moerag: {raw}: no such file or folder")
    return found


# ---- local commands (own the data directory) -----------------------------------------------------


@contextmanager
def _runtime(settings: Settings) -> Iterator[Runtime]:
    """A started runtime for one command, closed when it ends (a busy data dir is a clear exit)."""
    from app.locking import DataDirBusy
    from app.runtime import Runtime

    rt = Runtime(settings)
    try:
        rt.start(run_jobs=False)  # jobs are the server's: a one-shot command neither resumes nor abandons them
    except DataDirBusy as exc:
        raise SystemExit(f"moerag: {exc}") from None
    try:
        yield rt
    finally:
        rt.close()


def ingest_local(settings: Settings, files: list[Path], progress: bool = True) -> dict[str, int]:
    with _runtime(settings) as rt:
        return ingest_files(rt, files, progress)


def ingest_files(rt: Runtime, files: list[Path], progress: bool = True, root: Path | None = None) -> dict[str, int]:
    """Ingest local files through a started runtime, with a progress bar; failures are listed, not fatal.

    A document's source is its path as given, or relative to `root` (files the server placed
    itself, like the sample corpus: no server path reaches the API).
    """
    from tqdm import tqdm

    from app.services.documents import Upload

    counts = {"created": 0, "duplicate": 0, "failed": 0, "chunks": 0}

    def read(f: Path) -> Upload:
        return Upload(data=f.read_bytes(), source=str(f.relative_to(root) if root else f), filename=f.name)

    def thunks() -> Iterator[Callable[[], Upload]]:
        for f in files:
            yield partial(read, f)

    bar = tqdm(total=len(files), unit="doc", disable=not progress, desc="ingest")
    for f, outcome in zip(files, rt.ingestor.ingest_many(thunks()), strict=True):
        counts[outcome.status] += 1
        counts["chunks"] += outcome.chunks
        if outcome.error is not None:
            tqdm.write(f"skipped {f}: {outcome.error.message}", file=sys.stderr)
        bar.update(1)
        bar.set_postfix(chunks=counts["chunks"])
    bar.close()
    return counts


def ingest_remote(server: str, token: str, files: list[Path], batch: int = 50) -> dict[str, int]:
    """Upload through a running server's bulk endpoint and follow its job."""
    import httpx
    from tqdm import tqdm

    totals = {"created": 0, "duplicate": 0, "failed": 0, "chunks": 0}
    headers = {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=server, headers=headers, timeout=300) as client,
        tqdm(total=len(files), unit="doc", desc="ingest") as bar,
    ):
        for start in range(0, len(files), batch):
            part = files[start : start + batch]
            multipart = [("files", (str(f), f.read_bytes())) for f in part]
            r = client.post("/documents/bulk", files=multipart)
            if r.status_code != 202:
                raise SystemExit(f"moerag: server refused the upload ({r.status_code}): {r.text}")
            job_id, seen = r.json()["id"], 0
            while True:
                job = client.get(f"/jobs/{job_id}").json()
                bar.update(job["done"] - seen)
                seen = job["done"]
                if job["status"] in ("done", "failed"):
                    break
                time.sleep(0.5)
            if job["status"] == "failed":
                raise SystemExit(f"moerag: ingest job {job_id} failed: {job['error']}")
            for key in totals:
                totals[key] += job["result"].get(key, 0)
            for failure in job["result"].get("failures", []):
                tqdm.write(f"skipped {failure['source']}: {failure['error']}", file=sys.stderr)
    return totals


def cmd_ingest(args: argparse.Namespace) -> None:
    settings = _settings(args)
    files = collect_files(args.paths)
    if not files:
        raise SystemExit("moerag: no supported files found (txt, md, html, pdf)")
    if args.server:
        token = args.token or os.environ.get("MOERAG_ADMIN_TOKEN") or _read_token(settings)
        counts = ingest_remote(args.server, token, files)
    else:
        counts = ingest_local(settings, files, progress=not args.quiet)
    print(json.dumps(counts))


def _read_token(settings: Settings) -> str:
    try:
        return settings.token_file.read_text(encoding="ascii").strip()
    except OSError:
        raise SystemExit("moerag: no admin token: pass --token or set MOERAG_ADMIN_TOKEN") from None


def cmd_recluster(args: argparse.Namespace) -> None:
    with _runtime(_settings(args)) as rt:
        print(json.dumps(rt.indexes.recluster()))


def cmd_index_rebuild(args: argparse.Namespace) -> None:
    with _runtime(_settings(args)) as rt:
        idx = rt.indexes.rebuild()
        print(json.dumps({"version": idx.version, "clusters": idx.nlist, "vectors": idx.ntotal}))


def cmd_db(args: argparse.Namespace) -> None:
    from app.db import make_engine
    from app.migrate import downgrade, upgrade

    settings = _settings(args)
    settings.resolved_data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url)
    if args.action == "upgrade":
        upgrade(engine, args.revision or "head")
    else:
        downgrade(engine, args.revision or "-1")
    engine.dispose()
    print(f"database {args.action}d to {args.revision or ('head' if args.action == 'upgrade' else '-1')}")


def cmd_search(args: argparse.Namespace) -> None:
    from app.services.search import search

    with _runtime(_settings(args)) as rt, rt.sessions() as s:
        clusters = [int(c) for c in args.clusters.split(",")] if args.clusters else None
        result = search(s, rt.embedder, rt.indexes, args.query, args.k, clusters)
        for h in result.hits:
            print(f"{h.score:.3f}  [{h.chunk.id}] {h.chunk.document.source} :: {h.chunk.heading}")


def cmd_ask(args: argparse.Namespace) -> None:
    from app.services.ask import route_json
    from engine.pipeline import AskRequest

    with _runtime(_settings(args)) as rt:
        p = rt.pipeline.prepare(AskRequest(args.question, args.k, args.mode, args.expert))
        answer = "".join(p.answer_stream())
        if args.json:
            cites = [
                {"n": c.n, "chunk_id": c.chunk.id, "source": c.chunk.source, "score": c.score} for c in p.citations
            ]
            print(json.dumps({"answer": answer, "route": route_json(p.route), "citations": cites}))
            return
        r = p.route
        who = f"expert {r.expert.name!r}" if r.path == "expert" and r.expert else "fallback"
        print(f"{answer}\n\n[{who}: {r.detail}]")
        for c in p.citations:
            print(f"  [{c.n}] {c.score:.3f} {c.chunk.source} :: {c.chunk.heading}")


def cmd_router_train(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from app.services.routing import NotTrainable

    with _runtime(_settings(args)) as rt:
        with tqdm(total=100, unit="%", desc="train router") as bar:

            def progress(done: int, total: int) -> None:
                bar.n = done * 100 // max(total, 1)
                bar.refresh()

            try:
                result = rt.routers.train(progress, activate=not args.no_activate)
            except NotTrainable as exc:
                raise SystemExit(f"moerag: {exc}") from None
        print(json.dumps(result))


def cmd_router_eval(args: argparse.Namespace) -> None:
    """Accuracy, ECE and coverage of the active router on labelled questions (JSONL: question, expert)."""
    import torch

    from engine.router import evaluate

    with _runtime(_settings(args)) as rt:
        router = rt.routers.current()
        if router is None:
            raise SystemExit("moerag: no active router; run `moerag router train` first")
        profiles = rt.experts.profiles()
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
        neighbours, _ = router.probe(rt.indexes.index, q)
        logits = router.logits(q, neighbours)  # [Q, E+1]
        metrics = evaluate(logits, torch.tensor(labels), router.temperature, rt.settings.route_threshold)
        keep = ("accuracy", "ece_before", "ece_after", "coverage_at_threshold", "accuracy_at_threshold")
        print(json.dumps({"questions": len(rows), "router_version": router.version_id} | {k: metrics[k] for k in keep}))


def cmd_sample(args: argparse.Namespace) -> None:
    from app.sample import build_sample_corpus

    paths = build_sample_corpus(Path(args.target))
    print(f"wrote {len(paths)} documents to {args.target}")


def ensure_sample(settings: Settings) -> None:
    """Ingest, cluster, propose experts and train a router on the pydoc sample when the store is empty."""
    from app.sample import build_sample_corpus

    if not store_is_empty(settings):
        return  # no runtime at all: nothing to prepare, and the server alone resumes jobs
    with _runtime(settings) as rt:  # one start-up (one model load) for the whole preparation
        if rt.stats()["documents"] > 0:
            return
        folder = settings.resolved_data_dir / "sample-corpus"
        files = build_sample_corpus(folder)
        log.warning(
            "ingesting the sample corpus (%d documents from pydoc) into %s",
            len(files),
            settings.resolved_data_dir,
        )
        ingest_files(rt, files, root=folder)
        rt.indexes.recluster()
        # Experts proposed from the clusters and a trained router, so the first question can
        # already take the expert path.
        from app.services.experts import assign_clusters, create_expert, propose

        with rt.sessions.begin() as s:
            for p in propose(s, 5, rt.embedder.dim):
                expert = create_expert(s, {"name": p["name"], "description": ", ".join(p["keywords"])})
                assign_clusters(s, p["cluster_ids"], expert.id)
        rt.indexes.realign()  # each document's chunks into its expert's lists
        log.warning("training the router on the sample corpus")
        rt.routers.train()


def store_is_empty(settings: Settings) -> bool:
    """No documents and no jobs in the store, read without starting a runtime (no model, no lock)."""
    from sqlalchemy import func, inspect, select
    from sqlalchemy.exc import OperationalError

    from app.db import make_engine
    from app.models import Document, Job

    if settings.db_url.startswith("sqlite") and not settings.resolved_data_dir.exists():
        return True
    engine = make_engine(settings.db_url)
    try:
        with engine.connect() as c:
            if not inspect(c).has_table("document"):
                return True
            documents = c.scalar(select(func.count()).select_from(Document)) or 0
            jobs = c.scalar(select(func.count()).select_from(Job)) or 0
            return documents == 0 and jobs == 0
    except OperationalError:  # no database yet: the runtime's start-up will create (or report) it
        return True
    finally:
        engine.dispose()


def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

    from app.main import create_app

    settings = _settings(args)
    # The sample is prepared behind an open port: /readyz says "preparing", then "starting".
    prepare = (lambda: ensure_sample(settings)) if args.sample else None
    uvicorn.run(
        create_app(settings, prepare=prepare),
        host=args.host,
        port=args.port,
        log_level=settings.log_level.lower(),
        access_log=settings.access_log,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moerag", description="Self-hosted RAG with expert-indexed retrieval")
    p.add_argument("--data-dir", help="data directory (default: $MOERAG_DATA_DIR or ./data)")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--sample", action="store_true", help="ingest the pydoc sample corpus if the store is empty")
    serve.set_defaults(func=cmd_serve)

    ingest = sub.add_parser("ingest", help="ingest files and folders (txt, md, html, pdf)")
    ingest.add_argument("paths", nargs="+")
    ingest.add_argument("--server", help="send to a running server (e.g. http://127.0.0.1:8000)")
    ingest.add_argument("--token", help="admin token for --server (default: $MOERAG_ADMIN_TOKEN)")
    ingest.add_argument("--quiet", action="store_true", help="no progress bar")
    ingest.set_defaults(func=cmd_ingest)

    sub.add_parser("recluster", help="k-means the stored embeddings into new clusters").set_defaults(func=cmd_recluster)

    index = sub.add_parser("index", help="index maintenance")
    index_sub = index.add_subparsers(dest="action", required=True)
    index_sub.add_parser("rebuild", help="rebuild the FAISS index from stored embeddings").set_defaults(
        func=cmd_index_rebuild
    )

    db = sub.add_parser("db", help="database migrations")
    db.add_argument("action", choices=["upgrade", "downgrade"])
    db.add_argument("revision", nargs="?")
    db.set_defaults(func=cmd_db)

    search = sub.add_parser("search", help="dense search (debugging aid)")
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--clusters", help="comma-separated cluster ids to scope the search")
    search.set_defaults(func=cmd_search)

    ask = sub.add_parser("ask", help="ask a question (route, retrieve, answer)")
    ask.add_argument("question")
    ask.add_argument("-k", type=int, default=None, help="passages to cite")
    ask.add_argument("--mode", choices=["auto", "expert", "fallback"], default="auto")
    ask.add_argument("--expert", type=int, help="expert id for --mode expert")
    ask.add_argument("--json", action="store_true")
    ask.set_defaults(func=cmd_ask)

    router = sub.add_parser("router", help="train or evaluate the router")
    router_sub = router.add_subparsers(dest="action", required=True)
    train = router_sub.add_parser("train", help="train a new router version (activated unless --no-activate)")
    train.add_argument("--no-activate", action="store_true")
    train.set_defaults(func=cmd_router_train)
    ev = router_sub.add_parser("eval", help="evaluate the active router on labelled questions")
    ev.add_argument("file", help='JSONL with {"question": ..., "expert": name or id}')
    ev.set_defaults(func=cmd_router_eval)

    sample = sub.add_parser("sample", help="write the pydoc sample corpus to a folder")
    sample.add_argument("target")
    sample.set_defaults(func=cmd_sample)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    level = os.environ.get("MOERAG_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "sentence_transformers", "transformers", "faiss", "alembic", "bm25s"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args.func(args)


if __name__ == "__main__":
    main()
