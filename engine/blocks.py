"""A parsed document: its plain text and the blocks it is made of, each with its heading path and
its character span, so chunks can cite exact spans. Every parser (engine.parsing, engine.markdown)
builds one with `Builder`."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import EmptyDocument

MIME_BY_KIND = {
    "txt": "text/plain",
    "md": "text/markdown",
    "html": "text/html",
    "pdf": "application/pdf",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "odt": "application/vnd.oasis.opendocument.text",
}


@dataclass(frozen=True)
class Block:
    """A paragraph-like unit of text that chunking never splits unless it must."""

    text: str
    headings: tuple[str, ...]
    start: int  # char offset in ParsedDocument.text
    end: int
    section: int = 0  # structural section: chunks never span two (numbered in document order)
    title: str = ""  # the section's own heading ("" for an untitled one, e.g. after an empty heading)


@dataclass
class ParsedDocument:
    kind: str
    title: str
    text: str = ""
    blocks: list[Block] = field(default_factory=list)

    @property
    def mime(self) -> str:
        return MIME_BY_KIND[self.kind]


class Builder:
    """Accumulates blocks and the plain text they are slices of."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.blocks: list[Block] = []

    def add(self, text: str, headings: tuple[str, ...], section: int = 0, title: str | None = None) -> None:
        """A block; `title` defaults to the innermost heading of `headings`."""
        text = text.strip()
        if not text:
            return
        if self.parts:
            self.parts.append("\n\n")
            self.length += 2
        start = self.length
        self.parts.append(text)
        self.length += len(text)
        own = (headings[-1] if headings else "") if title is None else title
        self.blocks.append(Block(text, headings, start, self.length, section, own))

    def build(self, kind: str, title: str) -> ParsedDocument:
        doc = ParsedDocument(kind=kind, title=title, text="".join(self.parts), blocks=self.blocks)
        if not doc.blocks:
            raise EmptyDocument("the document contains no text")
        return doc


def first_line(builder: Builder) -> str:
    """The first line of its first block (a title for a document that states none)."""
    return builder.blocks[0].text.split("\n", 1)[0][:120] if builder.blocks else ""
