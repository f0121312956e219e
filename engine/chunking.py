"""Structure-aware chunking within the embedding model's token window.

Chunks follow the document's structure: a chunk never spans two sections unless the first
is too small to stand alone, paragraphs are kept whole when they fit, and only paragraphs
larger than the window are cut (at sentences, then at words). Consecutive chunks of one
section overlap by a few trailing sentences. Every chunk's *embedded* text (heading path +
text) fits the window, so nothing is silently truncated by the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from engine.blocks import Block, ParsedDocument
from engine.document_budget import check_document
from engine.errors import DocumentTooLarge
from engine.ocr import MAX_PAGES as OCR_PAGES

TokenCounter = Callable[[Sequence[str]], list[int]]

HEADING_SEPARATOR = " > "


@dataclass(frozen=True)
class ChunkingConfig:
    max_tokens: int = 254  # the model's window less [CLS] and [SEP]
    target_tokens: int = 254  # fill the window: 254 beat 200 by 2.3 points of dev hit@10
    overlap_tokens: int = 32
    min_tokens: int = 48
    merge_small_sections: bool = False  # a section under min_tokens joins the next one
    # What is embedded before a chunk's text: its heading path, its section's own title (nothing
    # for an untitled section), or nothing. The stored heading is the path either way.
    heading_prefix: Literal["path", "title", "none"] = "title"
    # A token never stands for more than this many characters when sizing chunks: a run of one
    # character is one [UNK] token however long, and once made a 45 MB chunk. 16 x 254 caps a
    # chunk near 4,000 characters; ordinary prose (4-5 characters a token) never reaches it.
    max_chars_per_token: int = 16
    max_chunks: int = 20_000  # per document: more is refused (413) rather than half-ingested
    max_chars: int = 5_000_000  # per document's text: more is refused (413) before any work (engine.document_budget)
    max_ocr_pages: int = OCR_PAGES  # per scanned document: pages read by OCR (engine.ocr); more is refused (413)

    def __post_init__(self) -> None:
        if not 0 < self.min_tokens <= self.target_tokens <= self.max_tokens:
            raise ValueError("need 0 < min_tokens <= target_tokens <= max_tokens")
        if not 0 <= self.overlap_tokens < self.target_tokens:
            raise ValueError("need 0 <= overlap_tokens < target_tokens")
        if self.heading_prefix not in ("path", "title", "none"):
            raise ValueError("heading_prefix must be path, title or none")
        if self.max_chars_per_token < 1 or self.max_chunks < 1 or self.max_chars < 1:
            raise ValueError("need max_chars_per_token >= 1, max_chunks >= 1 and max_chars >= 1")


@dataclass(frozen=True)
class Chunk:
    ordinal: int
    text: str
    headings: tuple[str, ...]
    start: int  # char span in ParsedDocument.text
    end: int
    token_count: int  # tokens of embed_text (without special tokens)
    context: tuple[str, ...] = ()  # what is embedded before the text (ChunkingConfig.heading_prefix)

    @property
    def heading(self) -> str:
        return HEADING_SEPARATOR.join(self.headings)

    @property
    def embed_text(self) -> str:
        return embed_text(self.context, self.text)


def embed_text(headings: Sequence[str], text: str) -> str:
    """What the model sees: the heading path gives a short chunk the context it lacks."""
    return f"{HEADING_SEPARATOR.join(headings)}\n{text}" if headings else text


@dataclass(frozen=True)
class _Piece:
    start: int
    end: int
    tokens: int
    headings: tuple[str, ...]  # the embedded context (see ChunkingConfig.heading_prefix)
    section: int
    path: tuple[str, ...] = ()  # the heading path, stored for display


_SENTENCE_END = re.compile(r"(?<=[.!?:;])\s+|\n+")
_WORD = re.compile(r"\S+")


def _spans(text: str, offset: int, pattern: re.Pattern[str], keep_matches: bool) -> list[tuple[int, int]]:
    """Spans of `text` (shifted by offset): the matches themselves, or what lies between them."""
    if keep_matches:
        return [(offset + m.start(), offset + m.end()) for m in pattern.finditer(text)]
    spans, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            spans.append((offset + pos, offset + m.start()))
        pos = m.end()
    if pos < len(text):
        spans.append((offset + pos, offset + len(text)))
    return spans


def _pack(spans: list[tuple[int, int]], counts: list[int], budget: int) -> list[tuple[int, int, int]]:
    """Greedily merge consecutive spans into runs of at most `budget` tokens."""
    runs: list[tuple[int, int, int]] = []
    for (start, end), n in zip(spans, counts, strict=True):
        if runs and runs[-1][2] + n <= budget:
            runs[-1] = (runs[-1][0], end, runs[-1][2] + n)
        else:
            runs.append((start, end, n))
    return runs


def _split_oversized(
    text: str,
    block: Block,
    headings: tuple[str, ...],
    budget: int,
    soft_budget: int,
    count: TokenCounter,
    chars_per_token: int,
) -> list[_Piece]:
    """Cut a block that exceeds the window: at sentence ends, then at words.

    No piece exceeds `budget`; sentences are regrouped up to `soft_budget`, which leaves room
    for the overlap carried in front of the next piece.
    """
    start, section, path = block.start, block.section, block.headings
    sentence_spans = _spans(text[start : block.end], start, _SENTENCE_END, keep_matches=False)
    sentence_counts = count([text[a:b] for a, b in sentence_spans])
    pieces: list[_Piece] = []
    for (a, b), n in zip(sentence_spans, sentence_counts, strict=True):
        if n <= budget:
            pieces.append(_Piece(a, b, n, headings, section, path))
            continue
        word_spans = _spans(text[a:b], a, _WORD, keep_matches=True)
        word_counts = count([text[x:y] for x, y in word_spans])
        for x, y, m in _pack(word_spans, word_counts, budget):
            if m <= budget:
                pieces.append(_Piece(x, y, m, headings, section, path))
                continue
            # A single "word" longer than the window (a hash, a base64 blob) is cut by characters,
            # slice after slice to its end: nothing of it is dropped.
            while x < y:
                z = min(y, x + budget * chars_per_token)  # within the character cap at once
                n = count([text[x:z]])[0]
                while n > budget and z - x > 1:
                    z = x + (z - x) // 2
                    n = count([text[x:z]])[0]
                pieces.append(_Piece(x, z, n, headings, section, path))
                x = z
    # Re-merge sentences into paragraph-sized pieces so a cut paragraph stays as whole as it can.
    merged: list[_Piece] = []
    for p in pieces:
        if merged and merged[-1].tokens + p.tokens <= soft_budget:
            merged[-1] = _Piece(merged[-1].start, p.end, merged[-1].tokens + p.tokens, headings, section, path)
        else:
            merged.append(p)
    return merged


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def chunk_document(  # noqa: C901, PLR0915
    doc: ParsedDocument, count_tokens: TokenCounter, config: ChunkingConfig | None = None
) -> list[Chunk]:
    cfg = config or ChunkingConfig()
    text = doc.text
    check_document(text, cfg.max_chars)  # size and degenerate text: refused before any tokenizing

    def count(texts: Sequence[str]) -> list[int]:
        """Tokens, or characters / max_chars_per_token where that is more: the size a chunk is held to."""
        return [max(n, -(-len(t) // cfg.max_chars_per_token)) for t, n in zip(texts, count_tokens(texts), strict=True)]

    heading_paths = sorted({b.headings for b in doc.blocks})
    prefix_counts = count([HEADING_SEPARATOR.join(h) for h in heading_paths])
    prefix_tokens = {
        h: (n + 1 if h else 0) for h, n in zip(heading_paths, prefix_counts, strict=True)
    }  # +1: a heading path is never empty text once joined, and margin for the newline join

    def prefix(headings: tuple[str, ...]) -> int:
        if headings not in prefix_tokens:
            prefix_tokens[headings] = count([HEADING_SEPARATOR.join(headings)])[0] + 1 if headings else 0
        return prefix_tokens[headings]

    # Headings so long that they leave no room are shortened to their innermost parts.
    def fit_headings(headings: tuple[str, ...]) -> tuple[str, ...]:
        while headings and prefix(headings) > cfg.max_tokens // 4:
            headings = headings[1:]
        return headings

    def context(block: Block) -> tuple[str, ...]:
        if cfg.heading_prefix == "path":
            return fit_headings(block.headings)
        if cfg.heading_prefix == "title" and block.title:
            return fit_headings((block.title,))
        return ()

    block_counts = count([b.text for b in doc.blocks])
    pieces: list[_Piece] = []
    for block, n in zip(doc.blocks, block_counts, strict=True):
        headings = context(block)
        budget = cfg.max_tokens - prefix(headings)
        if n <= budget:
            pieces.append(_Piece(block.start, block.end, n, headings, block.section, block.headings))
        else:
            soft = max(1, min(budget, cfg.target_tokens - prefix(headings)) - cfg.overlap_tokens)
            pieces.extend(_split_oversized(text, block, headings, budget, soft, count, cfg.max_chars_per_token))

    chunks: list[Chunk] = []
    current: list[_Piece] = []
    headings = ()
    path: tuple[str, ...] = ()
    section = -1
    body = 0  # tokens of the pieces in `current`

    def emit() -> None:
        if current:
            if len(chunks) >= cfg.max_chunks:
                raise DocumentTooLarge(
                    f"the document makes more than {cfg.max_chunks} chunks; "
                    "split it, or raise MOERAG_MAX_CHUNKS_PER_DOCUMENT"
                )
            start, end = current[0].start, current[-1].end
            tokens = prefix(headings) + body
            chunks.append(Chunk(len(chunks), text[start:end], path, start, end, tokens, headings))

    for piece in pieces:
        if current:
            same_section = piece.section == section
            merged_headings = headings if same_section else _common_prefix(headings, piece.headings)
            fits_target = body + piece.tokens + prefix(merged_headings) <= cfg.target_tokens
            fits_max = body + piece.tokens + prefix(merged_headings) <= cfg.max_tokens
            small = body < cfg.min_tokens
            if same_section and (fits_target or (small and fits_max)):
                current.append(piece)
                body += piece.tokens
                continue
            if not same_section and small and fits_max and cfg.merge_small_sections:
                current.append(piece)
                body += piece.tokens
                headings, section = merged_headings, piece.section
                path = _common_prefix(path, piece.path)
                continue
            emit()
            carried = _overlap(text, current, piece, cfg, count) if same_section else []
            current = carried
            body = sum(p.tokens for p in carried)
        if not current:
            headings, section, path = piece.headings, piece.section, piece.path
        current.append(piece)
        body += piece.tokens
    emit()
    return chunks


def _overlap(text: str, previous: list[_Piece], nxt: _Piece, cfg: ChunkingConfig, count: TokenCounter) -> list[_Piece]:
    """The previous chunk's trailing sentences that fit the overlap budget and leave room."""
    last = previous[-1]
    if cfg.overlap_tokens == 0 or nxt.tokens + min(last.tokens, cfg.overlap_tokens) > cfg.target_tokens:
        return []
    if last.tokens <= cfg.overlap_tokens:
        return [last]
    sentences = _spans(text[last.start : last.end], last.start, _SENTENCE_END, keep_matches=False)
    if len(sentences) < 2:
        return []
    tail: _Piece | None = None
    for a, _ in reversed(sentences[1:]):
        n = count([text[a : last.end]])[0]
        if n > cfg.overlap_tokens:
            break
        tail = _Piece(a, last.end, n, last.headings, last.section, last.path)
    return [tail] if tail else []
