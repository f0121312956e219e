"""The evaluation corpus of ../shared/eval/corpus.md: which files, FAQ questions removed, scoring.

    python benchmarks/evalcorpus.py build --out /tmp/evalcorpus   # mirror with FAQ questions removed
    python benchmarks/evalcorpus.py ingest --corpus /tmp/evalcorpus --data-dir /tmp/evaldata

The mirror keeps each page's path relative to /usr/share/doc (spelled with the roots of
section 2), which is the `source` stored for each document and compared when scoring.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if TYPE_CHECKING:
    from app.services.documents import Upload

DOC_ROOT = Path("/usr/share/doc")
EVAL_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "eval"


@dataclass(frozen=True)
class Rule:
    domain: str
    root: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]


RULES = (
    Rule(
        "python",
        "python3.11-doc/html/",
        ("**/*.html",),
        ("_*/**", "genindex*.html", "search.html", "py-modindex.html", "contents.html"),
    ),
    Rule("postgresql", "postgresql-doc-15/html/", ("*.html",), ("release-*.html", "bookindex.html")),
    Rule(
        "sqlite",
        "sqlite3/",
        ("**/*.html",),
        ("releaselog/**", "changes.html", "chronology.html", "images/**", "search.d/**"),
    ),
    Rule("nodejs", "nodejs/api/", ("*.html",), ("all.html", "assets/**")),
    Rule("git", "git-doc/", ("**/*.html",), ()),
    Rule("debian", "debian-policy/", ("**/*.html",), ("**/_*/**", "menu-policy-1.html", "perl-policy-1.html")),
    Rule("debian", "debian-reference-en/docs/", ("*.en.html",), ("index.en.html",)),
    Rule("debian", "debian/FAQ/", ("*.en.html",), ("index.en.html",)),
)


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def corpus_files() -> Iterator[tuple[str, str, Path]]:
    """(domain, source relative to /usr/share/doc, real path) for every page to index."""
    seen: set[str] = set()
    for rule in RULES:
        root = DOC_ROOT / rule.root
        inc = [_glob_regex(p) for p in rule.include]
        exc = [_glob_regex(p) for p in rule.exclude]
        for dirpath, _dirs, names in os.walk(root, followlinks=True):
            for name in sorted(names):
                path = Path(dirpath) / name
                rel = path.relative_to(root).as_posix()
                if not any(r.match(rel) for r in inc) or any(r.match(rel) for r in exc):
                    continue
                real = os.path.realpath(path)
                if real in seen:  # a symlink to a page already indexed
                    continue
                seen.add(real)
                yield rule.domain, rule.root + rel, path


def domain_of(source: str) -> str:
    for rule in RULES:
        if source.startswith(rule.root):
            return rule.domain
    return ""


def strip_questions(source: str, html: str) -> str:
    """Section 3: replace each FAQ question by an empty heading (a section break), drop the TOCs."""
    from selectolax.lexbor import LexborHTMLParser as HTMLParser

    tree = HTMLParser(html)
    questions = []
    if source.startswith("python3.11-doc/html/faq/"):
        for node in tree.css("nav.contents"):
            node.decompose()
        for section in tree.css("section"):
            # lexbor's css() matches the node itself: a leaf section finds only itself.
            if len(section.css("section")) == 1:
                heading = section.css_first("h2, h3")
                if heading is not None and heading.parent == section:
                    questions.append(heading)
    elif source.startswith("debian/FAQ/"):
        for node in tree.css("div.toc"):
            node.decompose()
        questions = [
            h for h in tree.css("div.section h2.title, div.section h3.title, div.section h4.title") if "?" in h.text()
        ]
    elif source == "git-doc/gitfaq.html":
        questions = tree.css("#content dt.hdlist1")
    elif source == "sqlite3/faq.html":
        for node in tree.css("ol.nounderline"):
            node.decompose()
        for p in tree.css("p"):
            b = p.css_first("b")
            if b is not None and re.match(r"\s*\(\d+\)", b.text()) and p.text().strip() == b.text().strip():
                questions.append(p)
    else:
        return html
    for node in questions:
        # The recipe's section break: an empty heading element where the question was.
        node.replace_with(HTMLParser("<h6></h6>").css_first("h6"))
    return tree.html or ""


FAQ_PAGES = re.compile(r"^(python3\.11-doc/html/faq/|debian/FAQ/|git-doc/gitfaq\.html$|sqlite3/faq\.html$)")


def build(out: Path) -> dict[str, int]:
    """Mirror the corpus under `out`: FAQ pages rewritten, every other page a symlink."""
    counts: dict[str, int] = {}
    for domain, source, path in corpus_files():
        target = out / source
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            target.unlink()
        if FAQ_PAGES.match(source):
            target.write_text(strip_questions(source, path.read_text(encoding="utf-8", errors="replace")))
        else:
            target.symlink_to(os.path.realpath(path))
        counts[domain] = counts.get(domain, 0) + 1
    return counts


def html_files(corpus: Path) -> list[Path]:
    """The mirror's pages, in a stable order."""
    return sorted(p for p in corpus.rglob("*.html") if p.is_file())


def uploads(files: list[Path], corpus: Path) -> Iterator[Callable[[], Upload]]:
    """Lazy uploads for `Ingestor.ingest_many`, each named by its path under the corpus (the eval's page key)."""
    from app.services.documents import Upload

    for p in files:
        yield lambda p=p: Upload(data=p.read_bytes(), source=p.relative_to(corpus).as_posix(), filename=p.name)


def ingest_into(rt: Any, corpus: Path) -> dict[str, float]:
    """Every page of the mirror into a started Runtime, with progress; duplicates are skipped by hash."""
    files = html_files(corpus)
    t0, chunks = time.perf_counter(), 0
    for done, outcome in enumerate(rt.ingestor.ingest_many(uploads(files, corpus)), start=1):
        chunks += outcome.chunks
        if done % 250 == 0:
            rate = chunks / (time.perf_counter() - t0)
            print(f"ingest: {done}/{len(files)} pages, {chunks} chunks, {rate:.1f} chunks/s", flush=True)
    return {"documents": len(files), "chunks": chunks, "seconds": round(time.perf_counter() - t0, 1)}


def ingest(corpus: Path, data_dir: Path) -> dict[str, float]:
    from app.core.settings import Settings
    from app.runtime import Runtime

    rt = Runtime(Settings(data_dir=data_dir))
    rt.start()
    try:
        return ingest_into(rt, corpus)
    finally:
        rt.close()


def load_questions(path: Path | None = None) -> list[dict[str, str]]:
    with open(path or EVAL_DIR / "faq-dev.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


TOKEN = re.compile(r"[a-z0-9]+")


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    t = TOKEN.findall(text.lower())
    return {tuple(t[i : i + n]) for i in range(len(t) - n + 1)}


def is_hit(chunk_text: str, chunk_source: str, q: dict[str, str]) -> bool:
    """Section 5's rule, verbatim."""
    if chunk_source != q["source"]:
        return False
    c, a = shingles(chunk_text), shingles(q["answer"])
    shared = len(c & a)
    return shared >= 3 and shared / min(len(c), len(a)) >= 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, required=True)
    i = sub.add_parser("ingest")
    i.add_argument("--corpus", type=Path, required=True)
    i.add_argument("--data-dir", type=Path, required=True)
    args = ap.parse_args()
    if args.cmd == "build":
        print(json.dumps(build(args.out)))
    else:
        print(json.dumps(ingest(args.corpus, args.data_dir)))


if __name__ == "__main__":
    main()
