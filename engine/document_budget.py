"""The work one document may cause, bounded before any of it is done.

The chunk cap (`ChunkingConfig.max_chunks`) bounds chunks, not work: 5 MB of `a a a …` made
~10,300 junk chunks and held a core for minutes, and a 12 MB one was refused only after 206 s
of chunking. Two checks run on the parsed text before it is tokenized:

- **size**: more than `max_chars` characters is refused (413 `document_too_large`, naming
  MOERAG_MAX_DOCUMENT_CHARS);
- **degenerate text**: a stretch of `WORD_WINDOW` words with fewer than `MIN_DISTINCT_WORDS`
  distinct ones, or of `CHAR_WINDOW` characters with fewer than `MIN_DISTINCT_CHARS` distinct
  visible ones (one token repeated, or one character run with no spaces), is refused (422
  `degenerate_document`). Prose and code have thousands of distinct words in 10,000 (2,121 at
  the fewest over the 10k-word windows of the Python 3.11 standard library's modules); a table of
  digits has dozens of distinct characters; word salad drawn from a small vocabulary (1 MB of 50
  words made 2,381 junk chunks) has no more distinct words than its vocabulary. What such a
  stretch makes is the same few chunks again and again.

Both are linear in the text: the 5 MB case is refused in well under a second.
"""

from __future__ import annotations

import re

from engine.errors import DegenerateDocument, DocumentTooLarge

WORD_WINDOW = 10_000
MIN_DISTINCT_WORDS = 300  # an order of magnitude under prose's fewest
CHAR_WINDOW = 65_536
MIN_DISTINCT_CHARS = 8
_WORD = re.compile(r"\S+")


def check_document(text: str, max_chars: int) -> None:
    """Raise DocumentTooLarge or DegenerateDocument before `text` costs any tokenizing or embedding."""
    if len(text) > max_chars:
        raise DocumentTooLarge(
            f"the document's text is {len(text):,} characters; the limit is {max_chars:,} "
            "(split it, or raise MOERAG_MAX_DOCUMENT_CHARS)"
        )
    for start in range(0, len(text), CHAR_WINDOW):
        window = text[start : start + CHAR_WINDOW]
        visible = set(window) - set(" \t\r\n\f\v")
        if len(window) == CHAR_WINDOW and len(visible) < MIN_DISTINCT_CHARS:
            raise DegenerateDocument(
                f"characters {start:,}-{start + CHAR_WINDOW:,} use only {len(visible)} distinct characters: "
                "the text would make the same junk chunk over and over; clean it and upload again"
            )
    words = _WORD.findall(text)
    for start in range(0, len(words) - WORD_WINDOW + 1, WORD_WINDOW // 2):  # windows overlapping by half
        distinct = len(set(words[start : start + WORD_WINDOW]))
        if distinct < MIN_DISTINCT_WORDS:
            sample = " ".join(words[start : start + 5])
            raise DegenerateDocument(
                f"words {start:,}-{start + WORD_WINDOW:,} hold only {distinct} distinct words ({sample!r} …): "
                "the text would make the same junk chunk over and over; clean it and upload again"
            )
