"""A sample corpus built at run time from the standard library's own documentation (pydoc)."""

from __future__ import annotations

import importlib
import pydoc
from pathlib import Path

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
