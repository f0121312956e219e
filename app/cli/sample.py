"""A sample corpus built at run time from the standard library's own documentation (pydoc)."""

from __future__ import annotations

import importlib
import logging
import pydoc
from pathlib import Path

from app.core.settings import Settings

log = logging.getLogger("moerag")

# Modules whose documentation is rich prose and API reference, spread over several topics
# so clustering has something to find: text, data formats, OS and files, concurrency, net.
# About 0.9 MB of text, ~1,000 chunks: a minute to embed on two cores.
SAMPLE_MODULES = (
    "json",
    "csv",
    "re",
    "string",
    "textwrap",
    "difflib",
    "unicodedata",
    "pathlib",
    "shutil",
    "tempfile",
    "glob",
    "fnmatch",
    "os.path",
    "zipfile",
    "tarfile",
    "gzip",
    "sqlite3",
    "pickle",
    "shelve",
    "datetime",
    "calendar",
    "time",
    "zoneinfo",
    "heapq",
    "bisect",
    "itertools",
    "functools",
    "operator",
    "dataclasses",
    "math",
    "statistics",
    "random",
    "fractions",
    "queue",
    "subprocess",
    "sched",
    "concurrent.futures",
    "hashlib",
    "hmac",
    "secrets",
    "base64",
    "argparse",
    "timeit",
    "contextlib",
)

# A few modules are written as HTML and Markdown so the sample exercises every text parser.
_HTML = {"json", "sqlite3", "hashlib"}
_MARKDOWN = {"csv", "heapq", "secrets"}


def _markdown(name: str, text: str) -> str:
    lines = [f"# {name}", ""]
    for para in text.split("\n\n"):
        stripped = para.strip()
        if stripped.isupper() and "\n" not in stripped:  # pydoc section titles: NAME, CLASSES, ...
            lines += [f"## {stripped.title()}", ""]
        else:
            lines += [para, ""]
    return "\n".join(lines)


def build_sample_corpus(target: Path, modules: tuple[str, ...] = SAMPLE_MODULES) -> list[Path]:
    """Write one document per module into `target` and return their paths."""
    target.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if name in _HTML:
            html = pydoc.HTMLDoc()
            body = html.page(f"module {name}", html.document(module, name))  # page() prefixes "Python: "
            path = target / f"{name}.html"
            path.write_text(body, encoding="utf-8")
        else:
            renderer = pydoc.plaintext  # type: ignore[attr-defined]
            text = pydoc.render_doc(module, title="Python Library Documentation: %s", renderer=renderer)
            if name in _MARKDOWN:
                path = target / f"{name}.md"
                path.write_text(_markdown(name, text), encoding="utf-8")
            else:
                path = target / f"{name}.txt"
                path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def ensure_sample(settings: Settings) -> None:
    """Ingest, cluster, propose experts and train a router on the pydoc sample when the store is empty."""
    from app.cli.common import ingest_files
    from app.runtime import Runtime

    if not store_is_empty(settings):
        return  # no runtime at all: nothing to prepare, and the server alone resumes jobs
    rt = Runtime(settings)
    rt.start(run_jobs=False)  # one start-up (one model load) for the whole preparation; jobs are the server's
    try:
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
        from app.services.experts import propose_and_apply

        propose_and_apply(rt.sessions, 5, rt.embedder.dim, apply=True, accepted=False)  # not the team's yet
        rt.indexes.realign()  # each document's chunks into its expert's lists
        log.warning("training the router on the sample corpus")
        rt.routers.train()
    finally:
        rt.close()


def store_is_empty(settings: Settings) -> bool:
    """No documents and no jobs in the store, read without starting a runtime (no model, no lock)."""
    from sqlalchemy import func, inspect, select
    from sqlalchemy.exc import OperationalError

    from app.core.db import make_engine
    from app.core.models import Document, Job

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
