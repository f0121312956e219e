"""Office documents as structured blocks: Word (.docx), PowerPoint (.pptx), Excel (.xlsx) and
OpenDocument text (.odt), each read by its well-kept parser (python-docx, python-pptx, openpyxl,
odfpy), each imported when a file of its kind first arrives.

The structure is kept as the chunker reads it (engine.blocks): a Word heading opens a section
under its level, list items and paragraphs are blocks, a table is a block a row ("header: cell"
pairs, so a row is found by its column's name); a slide is a section titled by its title, with its
text frames, tables and speaker notes; a sheet is a section, a row a block with its header cells.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

from engine.blocks import Builder, ParsedDocument, first_line
from engine.errors import CorruptDocument, NotConfigured

_HEADING = re.compile(r"^(?:heading|título|titre|überschrift)\s*(\d)$", re.IGNORECASE)
MAX_SHEET_ROWS = 100_000  # rows read a sheet; the document's character budget bounds the rest


def _need(module: str, package: str) -> Any:
    """Import an Office parser, or NotConfigured naming the extra that brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise NotConfigured(
            f"reading this file needs {package}, one of moerag's dependencies: pip install {package}"
        ) from None


def _opened(open_: Callable[[io.BytesIO], Any], data: bytes, what: str) -> Any:
    """`open_` over the file's bytes; CorruptDocument (422) when its parser cannot read it."""
    try:
        return open_(io.BytesIO(data))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        raise CorruptDocument(f"{what} could not be read: {exc}") from exc


def _row_text(header: Sequence[str], cells: Sequence[str]) -> str:
    """A table row as "header: cell" pairs (the cell alone where its column has no header)."""
    parts = []
    for n, cell in enumerate(cells):
        if not cell:
            continue
        name = header[n] if n < len(header) else ""
        parts.append(f"{name}: {cell}" if name and name != cell else cell)
    return "; ".join(parts)


def _table_rows(rows: Iterable[Sequence[str]]) -> Iterator[str]:
    """A table's rows as blocks: the first non-empty row is the header of the ones after it."""
    header: list[str] | None = None
    for cells in rows:
        cells = [" ".join(c.split()) for c in cells]
        if not any(cells):
            continue
        if header is None:
            header = list(cells)
            yield " | ".join(c for c in cells if c)
            continue
        yield _row_text(header, cells)


class _Sections:
    """Heading levels to a heading path; each heading opens a new section."""

    def __init__(self) -> None:
        self.path: list[tuple[int, str]] = []
        self.section = 0

    def heading(self, level: int, text: str) -> None:
        self.path = [(lv, t) for lv, t in self.path if lv < level] + [(level, text)]
        self.section += 1

    @property
    def headings(self) -> tuple[str, ...]:
        return tuple(t for _, t in self.path)


def parse_docx(data: bytes, fallback_title: str = "") -> ParsedDocument:
    docx = _need("docx", "python-docx")
    document = _opened(docx.Document, data, "the Word document")
    builder, sections, title = Builder(), _Sections(), ""
    body = document.element.body
    for child in body.iterchildren():
        tag = child.tag.rsplit("}", 1)[-1]
        if tag == "p":
            paragraph = docx.text.paragraph.Paragraph(child, document)
            text = paragraph.text.strip()
            if not text:
                continue
            style = (paragraph.style.name if paragraph.style is not None else "") or ""
            level = _HEADING.match(style.strip())
            if style == "Title":
                title = title or text
                sections.heading(1, text)
            elif level:
                sections.heading(int(level.group(1)), text)
            elif style.startswith("List"):
                builder.add(f"- {text}", sections.headings, sections.section)
            else:
                builder.add(text, sections.headings, sections.section)
        elif tag == "tbl":
            table = docx.table.Table(child, document)
            rows = ([cell.text for cell in row.cells] for row in table.rows)
            for line in _table_rows(rows):
                builder.add(line, sections.headings, sections.section)
    core_title = (document.core_properties.title or "").strip()
    return builder.build("docx", core_title or title or fallback_title or first_line(builder))


def parse_pptx(data: bytes, fallback_title: str = "") -> ParsedDocument:
    pptx = _need("pptx", "python-pptx")
    deck = _opened(pptx.Presentation, data, "the presentation")
    builder, first_title = Builder(), ""
    for number, slide in enumerate(deck.slides, start=1):
        title_shape = slide.shapes.title
        title = (title_shape.text_frame.text.strip() if title_shape is not None else "") or f"slide {number}"
        first_title = first_title or (title if title_shape is not None else "")
        for text in _slide_texts(slide, title_shape):
            builder.add(text, (title,), number)
        if not any(b.section == number for b in builder.blocks):  # a slide of a title alone
            builder.add(title, (title,), number)
    core_title = (deck.core_properties.title or "").strip()
    return builder.build("pptx", core_title or first_title or fallback_title or first_line(builder))


def _slide_texts(slide: Any, title_shape: Any) -> Iterator[str]:
    """A slide's blocks in shape order: text frames' paragraphs (indented ones as list items),
    tables a row a block, then its speaker notes."""
    for shape in slide.shapes:
        if title_shape is not None and shape.shape_id == title_shape.shape_id:
            continue
        if getattr(shape, "has_table", False):
            yield from _table_rows([cell.text for cell in row.cells] for row in shape.table.rows)
        elif getattr(shape, "has_text_frame", False):
            for paragraph in shape.text_frame.paragraphs:
                text = "".join(run.text for run in paragraph.runs).strip()
                yield f"- {text}" if paragraph.level and text else text
    frame = slide.notes_slide.notes_text_frame if slide.has_notes_slide else None
    notes = frame.text.strip() if frame is not None else ""
    if notes:
        yield f"Notes: {notes}"


def parse_xlsx(data: bytes, fallback_title: str = "") -> ParsedDocument:
    openpyxl = _need("openpyxl", "openpyxl")
    book = _opened(partial(openpyxl.load_workbook, read_only=True, data_only=True), data, "the workbook")
    builder = Builder()
    try:
        for number, sheet in enumerate(book.worksheets, start=1):
            rows = (
                ["" if v is None else str(v) for v in row]
                for row in sheet.iter_rows(max_row=MAX_SHEET_ROWS, values_only=True)
            )
            for line in _table_rows(rows):
                builder.add(line, (sheet.title,), number)
        core_title = (book.properties.title or "").strip() if book.properties is not None else ""
    finally:
        book.close()
    return builder.build("xlsx", core_title or fallback_title or first_line(builder))


def parse_odt(data: bytes, fallback_title: str = "") -> ParsedDocument:
    _need("odf", "odfpy")
    from odf import teletype
    from odf.namespaces import TABLENS, TEXTNS
    from odf.opendocument import load

    document = _opened(load, data, "the OpenDocument file")
    builder, sections = Builder(), _Sections()
    for node in document.text.childNodes:
        if node.qname == (TEXTNS, "h"):
            level = int(node.getAttrNS(TEXTNS, "outline-level") or 1)
            sections.heading(level, teletype.extractText(node).strip())
        elif node.qname == (TEXTNS, "p"):
            builder.add(teletype.extractText(node), sections.headings, sections.section)
        elif node.qname == (TEXTNS, "list"):
            for item in _descendants(node, (TEXTNS, "list-item")):
                builder.add(f"- {teletype.extractText(item).strip()}", sections.headings, sections.section)
        elif node.qname == (TABLENS, "table"):
            rows = (
                [teletype.extractText(c) for c in _descendants(row, (TABLENS, "table-cell"))]
                for row in _descendants(node, (TABLENS, "table-row"))
            )
            for line in _table_rows(rows):
                builder.add(line, sections.headings, sections.section)
    return builder.build("odt", fallback_title or first_line(builder))


def _descendants(node: Any, qname: tuple[str, str]) -> Iterator[Any]:
    for child in node.childNodes:
        if getattr(child, "qname", None) == qname:
            yield child
        else:
            yield from _descendants(child, qname)


PARSERS = {"docx": parse_docx, "pptx": parse_pptx, "xlsx": parse_xlsx, "odt": parse_odt}
