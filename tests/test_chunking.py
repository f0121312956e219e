import itertools
import pydoc

import pytest

from engine.chunking import ChunkingConfig, chunk_document
from engine.embedder import Embedder
from engine.parsing import parse, parse_markdown


def test_every_chunk_fits_the_model_window(embedder: Embedder) -> None:
    import json
    import pathlib

    docs = [parse(pydoc.render_doc(m, renderer=pydoc.plaintext).encode(), f"{m.__name__}.txt") for m in (json, pathlib)]
    # A paragraph far over the window, a single giant "word", and long headings.
    docs.append(parse_markdown("# " + "very long heading " * 40 + "\n\n" + "word " * 2000 + "\n\n" + "x" * 5000))
    cfg = ChunkingConfig(max_tokens=embedder.max_tokens)
    for doc in docs:
        chunks = chunk_document(doc, embedder.count_tokens, cfg)
        assert chunks
        real = embedder.count_tokens([c.embed_text for c in chunks])
        assert max(real) <= embedder.max_tokens
        for c, n in zip(chunks, real, strict=True):
            assert c.text == doc.text[c.start : c.end]
            assert n <= c.token_count + 2  # the recorded count is (almost) exact
        # Nothing is lost: every block's text is covered by some chunk span.
        for b in doc.blocks:
            assert (
                any(c.start <= b.start and b.end <= c.end for c in chunks)
                or sum(max(0, min(c.end, b.end) - max(c.start, b.start)) for c in chunks) >= (b.end - b.start) * 0.99
            )


def test_chunks_follow_sections_and_keep_heading_paths(embedder: Embedder) -> None:
    body = " ".join(f"Sentence {i} explains the install step in detail." for i in range(12))
    md = f"# Manual\n\n## Install\n\n{body}\n\n## Remove\n\n{body.replace('install', 'remove')}\n"
    chunks = chunk_document(parse_markdown(md), embedder.count_tokens, ChunkingConfig(target_tokens=120))
    headings = [c.headings for c in chunks]
    assert ("Manual", "Install") in headings and ("Manual", "Remove") in headings
    for c in chunks:  # no chunk mixes the two sections
        assert not ("install" in c.text and "remove" in c.text)
        assert c.embed_text.startswith(("Install\n", "Remove\n"))  # the section's own title


def test_long_sections_overlap_by_a_few_sentences(embedder: Embedder) -> None:
    body = " ".join(f"Fact number {i} is stated here." for i in range(120))
    chunks = chunk_document(parse_markdown(f"# T\n\n{body}"), embedder.count_tokens, ChunkingConfig())
    assert len(chunks) >= 3
    overlaps = [a.end - b.start for a, b in itertools.pairwise(chunks)]
    assert all(o > 0 for o in overlaps), overlaps
    for a, b in itertools.pairwise(chunks):
        assert embedder.count_tokens([a.text[b.start - a.start :]])[0] <= ChunkingConfig().overlap_tokens


def test_small_sections_merge_only_when_asked(embedder: Embedder) -> None:
    md = "# A\n\nshort.\n\n# B\n\nalso short.\n\n# C\n\n" + "filler words here " * 30
    merged = chunk_document(parse_markdown(md), embedder.count_tokens, ChunkingConfig(merge_small_sections=True))
    assert len(merged) == 1 and merged[0].headings == ()
    # The default keeps sections apart: merging small FAQ answers cost 3.5 points of hit@10 (docs/performance.md).
    apart = chunk_document(parse_markdown(md), embedder.count_tokens)
    assert [c.headings for c in apart] == [("A",), ("B",), ("C",)]


def test_heading_prefix_choices(embedder: Embedder) -> None:
    doc = parse(b"<h1>Guide</h1><h2>Install</h2><p>Run the installer.</p><h6></h6><p>An untitled answer.</p>", "g.html")
    for prefix, expected in (
        ("path", [("Guide", "Install"), ("Guide", "Install")]),  # an empty h6 nests under Install
        ("title", [("Install",), ()]),
        ("none", [(), ()]),
    ):
        chunks = chunk_document(doc, embedder.count_tokens, ChunkingConfig(heading_prefix=prefix))  # type: ignore[arg-type]
        assert [c.context for c in chunks] == expected, prefix
        assert [c.headings for c in chunks] == [("Guide", "Install")] * 2  # stored: the path
        untitled = "An untitled answer."
        assert chunks[1].embed_text == (f"Guide > Install\n{untitled}" if prefix == "path" else untitled)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        ChunkingConfig(max_tokens=100, target_tokens=200)
    with pytest.raises(ValueError):
        ChunkingConfig(overlap_tokens=500)


def test_a_chunk_never_spans_two_sections_with_enough_text(embedder: Embedder) -> None:
    """Two FAQ answers under one heading path stay apart when an (empty) heading separates them."""
    one = " ".join(f"Autoincrement detail {i} about rowid columns." for i in range(8))
    two = " ".join(f"Dynamic typing detail {i} about stored values." for i in range(8))
    doc = parse(f"<h1>FAQ</h1><h6></h6><p>{one}</p><h6></h6><p>{two}</p>".encode(), "faq.html")
    chunks = chunk_document(doc, embedder.count_tokens, ChunkingConfig(min_tokens=16))
    assert [c.text for c in chunks] == [one, two]
    assert all(c.headings == ("FAQ",) for c in chunks)
    # Small sections may merge forward when asked to (min_tokens above their size), never otherwise.
    merged = chunk_document(doc, embedder.count_tokens, ChunkingConfig(min_tokens=200, merge_small_sections=True))
    assert len(merged) == 1
    apart = chunk_document(doc, embedder.count_tokens, ChunkingConfig(min_tokens=200))
    assert len(apart) == 2


def test_a_run_of_one_character_is_cut_into_bounded_chunks_and_nothing_is_lost(embedder) -> None:  # type: ignore[no-untyped-def]
    """Issue 11 #4: 45 MB of one character was one chunk (one [UNK] token) of 45 MB. A run that long
    is now refused as degenerate before any work (issue 41); a shorter one is still cut."""
    import itertools
    import time

    import pytest

    from engine.chunking import ChunkingConfig, chunk_document
    from engine.document_budget import CHAR_WINDOW
    from engine.errors import DegenerateDocument
    from engine.parsing import parse

    with pytest.raises(DegenerateDocument):
        chunk_document(parse(("x" * 2_000_000).encode(), "run.txt"), embedder.count_tokens)
    text = "intro words here. " + "x" * (CHAR_WINDOW - 1000) + " and the end."
    t = time.perf_counter()
    chunks = chunk_document(parse(text.encode(), "run.txt"), embedder.count_tokens)
    assert time.perf_counter() - t < 30 and len(chunks) > 10
    cfg = ChunkingConfig()
    assert max(len(c.text) for c in chunks) <= cfg.max_tokens * cfg.max_chars_per_token
    covered = sorted((c.start, c.end) for c in chunks)
    assert covered[0][0] == 0 and covered[-1][1] == len(text.strip())
    doc_text = parse(text.encode(), "run.txt").text
    gaps = [doc_text[a[1] : b[0]] for a, b in itertools.pairwise(covered) if b[0] > a[1]]
    assert all(not g.strip() for g in gaps)  # only whitespace between chunks: nothing dropped


def test_too_many_chunks_is_refused_whole() -> None:
    import pytest

    from engine.chunking import ChunkingConfig, chunk_document
    from engine.errors import DocumentTooLarge
    from engine.parsing import parse

    doc = parse(("# H\n\nparagraph\n\n" * 50).encode(), "many.md")
    with pytest.raises(DocumentTooLarge) as err:
        chunk_document(doc, lambda texts: [len(t.split()) for t in texts], ChunkingConfig(max_chunks=10))
    from app.core.errors import STATUS

    assert err.value.code == "document_too_large" and STATUS[err.value.code] == 413
