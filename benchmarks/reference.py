"""The plain reference pipeline, and moerag's chunking scored beside it by flat search.

    python benchmarks/reference.py --corpus CORPUS --cache EMB_CACHE
    python benchmarks/reference.py ... --variant '{"target_tokens": 254}' --sample 0.2

Reference (the simplest pipeline a RAG tutorial builds): each heading starts a section (an
empty heading too); a section's words are cut into 200-word windows with a 40-word overlap;
each window is prefixed by its heading and embedded (the model truncates at its window);
search is an exact inner product over everything. moerag's chunks (engine.parsing +
engine.chunking, as ingested) are scored the same way, so a difference is the chunking's.
`--sample F` keeps every FAQ page and a seeded fraction F of the other pages: a quick, relative
comparison only. Every vector goes through the text-hash cache (benchmarks/embcache.py).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result
from benchmarks.evalcorpus import FAQ_PAGES, domain_of, html_files, load_questions
from benchmarks.retrieval_metrics import first_hits, metrics_for, paired_difference

WINDOW, OVERLAP = 200, 40
_CHROME = "script, style, nav, header, footer, div.toc, div.navheader, div.navfooter, div.sphinxsidebar, div.related"
_MARK = "\x00H\x00"


@dataclass
class Chunks:
    """A chunked corpus: what is embedded, what is stored (and scored), and where it came from."""

    embed: list[str]
    text: list[str]
    source: list[str]

    def __len__(self) -> int:
        return len(self.text)

    def extend(self, embed: list[str], text: list[str], source: str) -> None:
        self.embed += embed
        self.text += text
        self.source += [source] * len(text)


def reference_chunks(html: str) -> list[str]:
    """Heading sections -> 200-word windows (40-word overlap), each prefixed by its heading."""
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(html)
    for node in tree.css(_CHROME):
        node.decompose()
    for h in tree.css("h1, h2, h3, h4, h5, h6"):
        h.replace_with(f" {_MARK}{' '.join(h.text().split())}{_MARK} ")
    body = tree.body.text(separator=" ") if tree.body is not None else ""
    out = []
    parts = body.split(_MARK)  # text, heading, text, heading, text ...
    sections = [("", parts[0])] + [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    for heading, text in sections:
        words = text.split()
        for start in range(0, max(len(words) - OVERLAP, 1), WINDOW - OVERLAP):
            window = " ".join(words[start : start + WINDOW])
            if window:
                out.append(f"{heading}\n{window}" if heading else window)
    return out


def corpus_pages(corpus: Path, sample: float | None) -> list[tuple[Path, str]]:
    pages = [(p, p.relative_to(corpus).as_posix()) for p in html_files(corpus)]
    if sample is None:
        return pages
    rng = random.Random(20251130)
    return [(p, s) for p, s in pages if FAQ_PAGES.match(s) or rng.random() < sample]


def chunk_reference(pages: list[tuple[Path, str]]) -> Chunks:
    out = Chunks([], [], [])
    for path, source in pages:
        texts = reference_chunks(path.read_text(encoding="utf-8", errors="replace"))
        out.extend(texts, texts, source)
    return out


def chunk_moerag(pages: list[tuple[Path, str]], embedder: object, config: object = None) -> Chunks:
    """moerag's chunks as ingested (engine.parsing + engine.chunking with `config`)."""
    from engine.chunking import chunk_document
    from engine.errors import InputError
    from engine.parsing import parse

    out = Chunks([], [], [])
    for path, source in pages:
        try:
            doc = parse(path.read_bytes(), path.name)
        except InputError:
            continue  # an empty page is refused at ingest too
        chunks = chunk_document(doc, embedder.count_tokens, config)  # type: ignore[attr-defined]
        out.extend([c.embed_text for c in chunks], [c.text for c in chunks], source)
    return out


def search(vecs: np.ndarray, q_vecs: np.ndarray, chunks: Chunks, k: int = 10, mask: np.ndarray | None = None):
    """Exact inner-product top-k -> per question [(stored text, source)] best first."""
    scores = q_vecs @ vecs.T  # [Q, N]
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)  # [Q, N]
    top = np.argsort(-scores, axis=1)[:, :k]  # [Q, k]
    return [[(chunks.text[i], chunks.source[i]) for i in row] for row in top]


def reference_ranked(corpus: Path, cache: Any, q_vecs: np.ndarray) -> tuple[list[list[tuple[str, str]]], dict]:
    """The reference pipeline over the whole mirror: top 10 per question, and its chunk count."""
    chunks = chunk_reference(corpus_pages(corpus, None))
    vecs = cache.encode(chunks.embed, progress=True)  # [N, D]
    return search(vecs, q_vecs, chunks), {"chunks": len(chunks)}


def domain_mask(chunks: Chunks, questions: list[dict[str, str]]) -> np.ndarray:
    """[Q, N] True where the chunk is of the question's domain (the oracle route)."""
    domains = np.array([domain_of(s) for s in chunks.source])
    return np.stack([domains == q["domain"] for q in questions])


def question_diff(a: list, b: list, questions: list[dict[str, str]], names: tuple[str, str]) -> list[dict]:
    """Questions one system finds (hit@10) and the other misses, with both top chunks."""
    out = []
    for q, fa, fb, ra, rb in zip(questions, first_hits(a, questions), first_hits(b, questions), a, b, strict=True):
        if (fa is None) != (fb is None):
            out.append(
                {
                    "id": q["id"],
                    "question": q["question"],
                    "found_by": names[0] if fa is not None else names[1],
                    f"{names[0]}_top": f"{ra[0][1]}: {ra[0][0][:160]}" if ra else "",
                    f"{names[1]}_top": f"{rb[0][1]}: {rb[0][0][:160]}" if rb else "",
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--questions", type=Path)
    ap.add_argument("--sample", type=float, help="fraction of non-FAQ pages kept (quick relative runs)")
    ap.add_argument("--variant", action="append", default=[], help="ChunkingConfig fields as JSON; repeatable")
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--out", type=Path, help="write the results JSON here")
    args = ap.parse_args()

    from benchmarks.embcache import EmbeddingCache
    from engine.chunking import ChunkingConfig
    from engine.embedder import Embedder

    questions = load_questions(args.questions)
    embedder = Embedder()
    cache = EmbeddingCache(args.cache, embedder)
    pages = corpus_pages(args.corpus, args.sample)
    q_vecs = embedder.encode([q["question"] for q in questions])  # [Q, D]
    systems: dict[str, Chunks] = {}
    if not args.skip_reference:
        systems["reference"] = chunk_reference(pages)
    for v in args.variant or ["{}"]:
        systems[f"moerag {v}"] = chunk_moerag(pages, embedder, ChunkingConfig(**json.loads(v)))
    result: dict[str, object] = {"pages": len(pages), "sample": args.sample, "systems": {}}
    ranked = {}
    for name, chunks in systems.items():
        t0 = time.perf_counter()
        vecs = cache.encode(chunks.embed, progress=True)  # [N, D]
        took = time.perf_counter() - t0
        tokens = embedder.count_tokens(chunks.embed[:: max(1, len(chunks) // 2000)])
        ranked[name] = search(vecs, q_vecs, chunks)
        oracle = search(vecs, q_vecs, chunks, mask=domain_mask(chunks, questions))
        result["systems"][name] = {  # type: ignore[index]
            "chunks": len(chunks),
            "mean_tokens": round(float(np.mean(tokens)), 1),
            "embed_seconds": round(took, 1),
            "global": metrics_for(ranked[name], questions),
            "oracle": metrics_for(oracle, questions),
        }
        print(name, json.dumps(result["systems"][name]), flush=True)  # type: ignore[index]
    names = list(ranked)
    if len(names) > 1:
        base = names[0]
        result["against_" + base] = {
            n: paired_difference(first_hits(ranked[n], questions), first_hits(ranked[base], questions))
            for n in names[1:]
        }
        result["diff"] = {n: question_diff(ranked[n], ranked[base], questions, (n, base)) for n in names[1:]}
        print(json.dumps(result["against_" + base], indent=1))
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
