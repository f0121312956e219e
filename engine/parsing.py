"""Sniff a document's type and extract its text as structured blocks.

Every parser returns a `ParsedDocument`: the plain text plus a list of blocks (paragraphs,
list items, code) each carrying its heading path and its character span in that plain
text, so chunks can cite exact spans.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

import charset_normalizer

from engine.blocks import MIME_BY_KIND, Builder, ParsedDocument, first_line
from engine.errors import CorruptDocument, DocumentTooLarge, EmptyDocument, UndecodableDocument, UnsupportedType
from engine.ocr import MAX_PAGES as OCR_PAGES

OFFICE_KINDS = frozenset({"docx", "pptx", "xlsx", "odt"})  # read by engine.office

if TYPE_CHECKING:
    from selectolax.lexbor import LexborNode as Node


_EXTENSIONS = {
    ".txt": "txt",
    ".text": "txt",
    ".rst": "txt",
    ".md": "md",
    ".markdown": "md",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".pdf": "pdf",
    ".docx": "docx",
    ".pptx": "pptx",
    ".xlsx": "xlsx",
    ".odt": "odt",
}
SUPPORTED = "txt, md, html, pdf, docx, pptx, xlsx, odt"  # as errors name them
SUFFIXES = frozenset(_EXTENSIONS)  # the file types a folder walk takes (`moerag ingest`, `moerag sync`)


def walk_documents(folder: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """(every file under `folder` of a type moerag reads, every symbolic link skipped, every file
    of a type it does not read), in path order; hidden entries skipped. A link is never followed,
    to a file or a folder: what it points at may lie outside `folder` (a synced repository's
    `token.txt -> ../../admin_token`)."""
    files: list[Path] = []
    links: list[Path] = []
    unsupported: list[Path] = []
    for top, dirs, names in os.walk(folder, followlinks=False):
        here = Path(top)
        for name in sorted(dirs):
            if (here / name).is_symlink() and not name.startswith("."):
                links.append(here / name)  # os.walk lists a linked folder but does not enter it
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (here / d).is_symlink())
        for name in sorted(names):
            path = here / name
            if name.startswith("."):
                continue
            if path.is_symlink():
                links.append(path)
            elif not path.is_file():  # a FIFO or a device: reading one would block or never end
                continue
            elif path.suffix.lower() in SUFFIXES:
                files.append(path)
            else:
                unsupported.append(path)
    return sorted(files), sorted(links), sorted(unsupported)


def unsupported_reason(path: Path) -> str:
    """Why a folder walk leaves a file out (what `moerag ingest`, a folder upload and a sync report)."""
    kind = path.suffix.lower() or "no extension"
    return f"unsupported type ({kind}); moerag reads {SUPPORTED}"


def folder_source(path: Path, root: Path) -> str:
    """A document's source when its folder was given: the folder's name and the path inside it
    (`handbook/ops/backups.docx`), whichever way it was ingested (moerag.client.folder_source)."""
    return f"{root.resolve().name}/{path.relative_to(root).as_posix()}"


def document_files(folder: Path) -> list[Path]:
    """The files `walk_documents` takes under `folder`, in path order (symbolic links left out)."""
    return walk_documents(folder)[0]


_MIME_KINDS = {v: k for k, v in MIME_BY_KIND.items()} | {"application/xhtml+xml": "html"}


def sniff(data: bytes, filename: str | None = None, content_type: str | None = None) -> str:
    """Decide the document kind from magic bytes first, then the name, then the declared type."""
    head = data[:1024].lstrip()
    if data.startswith(b"%PDF-"):
        return "pdf"
    ext = PurePath(filename).suffix.lower() if filename else ""
    if data.startswith(b"PK\x03\x04"):  # a zip: an Office or OpenDocument file, told by what it holds
        kind = _zip_kind(data)
        if kind is not None:
            return kind
    if ext in _EXTENSIONS:
        return _named(ext)
    declared = (content_type or "").split(";")[0].strip().lower()
    if declared in _MIME_KINDS:
        return _MIME_KINDS[declared]
    if head[:15].lower().startswith((b"<!doctype html", b"<html")):
        return "html"
    if ext or (declared and declared not in ("application/octet-stream", "text/plain")):
        raise UnsupportedType(f"unsupported document type {ext or declared!r}; supported: {SUPPORTED}")
    if _looks_binary(data):
        raise UnsupportedType(f"binary content of an unsupported type; supported: {SUPPORTED}")
    return "txt"


def _named(ext: str) -> str:
    """The kind a file's name gives it, once its content said nothing (a PDF or Office file whose
    bytes are not one is corrupt, not text)."""
    kind = _EXTENSIONS[ext]
    if kind == "pdf":
        raise CorruptDocument("the file is named .pdf but does not start with a PDF header")
    if kind in OFFICE_KINDS:
        raise CorruptDocument(f"the file is named {ext} but is not a {kind} file (not a zip holding its parts)")
    return kind


def _zip_kind(data: bytes) -> str | None:
    """The Office kind of a zip file, from its parts: None for a zip of another kind."""
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = set(z.namelist())
            if "mimetype" in names and z.read("mimetype").strip() == b"application/vnd.oasis.opendocument.text":
                return "odt"
    except (zipfile.BadZipFile, KeyError, OSError):
        return None
    for part, kind in (("word/document.xml", "docx"), ("ppt/presentation.xml", "pptx"), ("xl/workbook.xml", "xlsx")):
        if part in names:
            return kind
    return None


def _looks_binary(data: bytes) -> bool:
    sample = data[:4096]
    return b"\x00" in sample and not sample.startswith((b"\xff\xfe", b"\xfe\xff"))


def decode_text(data: bytes) -> str:
    """UTF-8 first (the common case), then a detected charset; refuse what is not text."""
    if not data.strip():
        raise EmptyDocument("the document is empty")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if _looks_binary(data):
        raise UndecodableDocument("the document is binary, not text")
    best = charset_normalizer.from_bytes(data).best()
    if best is None or best.chaos > 0.3:
        raise UndecodableDocument("the document's text encoding could not be determined")
    return str(best)


def parse(
    data: bytes, filename: str | None = None, content_type: str | None = None, *, ocr_pages: int = OCR_PAGES
) -> ParsedDocument:
    """`ocr_pages`: the most pages of a scanned PDF read by OCR (engine.ocr, the `ocr` extra)."""
    kind = sniff(data, filename, content_type)
    fallback_title = PurePath(filename).stem if filename else ""
    if kind == "pdf":
        return parse_pdf(data, fallback_title, ocr_pages)
    if kind in OFFICE_KINDS:
        from engine.office import PARSERS

        return PARSERS[kind](data, fallback_title)
    text = decode_text(data)
    if kind == "html":
        return parse_html(text, fallback_title)
    if kind == "md":
        return parse_markdown(text, fallback_title)
    return parse_text(text, fallback_title)


_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def parse_text(text: str, fallback_title: str = "") -> ParsedDocument:
    builder = Builder()
    for para in _PARAGRAPH_BREAK.split(text.replace("\r\n", "\n")):
        builder.add(para, ())
    title = fallback_title or first_line(builder)
    return builder.build("txt", title)


def parse_markdown(text: str, fallback_title: str = "") -> ParsedDocument:
    """Markdown by markdown-it (engine/markdown.py), imported when used."""
    from engine.markdown import parse_markdown as parse_md

    return parse_md(text, fallback_title)


# Tags whose content is page chrome or code that is not prose.
_SKIP_TAGS = {"script", "style", "nav", "header", "footer", "aside", "noscript", "template", "svg", "form", "head"}
_HEADING_TAGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
# Elements that end the running paragraph (their text is a block of its own).
_BLOCK_TAGS = {
    "p",
    "div",
    "li",
    "ul",
    "ol",
    "pre",
    "blockquote",
    "table",
    "tr",
    "td",
    "th",
    "dt",
    "dd",
    "dl",
    "section",
    "article",
    "main",
    "body",
    "br",
    "hr",
    "figure",
    "figcaption",
    "caption",
    "address",
}
# Elements that start a new section: a chunk never spans two of them. Headings (with or
# without text) are boundaries too, and so is the end of a sectioning element. Definition-list
# entries are not: measured on the eval corpus (dev hit@10), one section per entry cost 3.5
# points and entries packed whole 1.8 (tens of thousands of one-line option chunks crowd the
# results); they pack like paragraphs.
_SECTION_TAGS = {"section", "article"}
_SECTION_CLASSES = {"section", "sect1", "sect2", "sect3", "sect4", "refsect1", "refsect2", "chapter", "appendix"}
# Navigation, menus and in-page tables of contents, by the class or id names that common
# generators (Sphinx, DocBook, Doxygen-like sites, Node's docs, SQLite's site) give them.
_CHROME_NAMES = {
    "nosearch",
    "menu",
    "mainmenu",
    "submenu",
    "searchmenu",
    "navheader",
    "navfooter",
    "navbar",
    "navigation",
    "sphinxsidebar",
    "sphinxsidebarwrapper",
    "related",
    "footer",
    "header",
    "header-container",
    "sidebar",
    "breadcrumb",
    "breadcrumbs",
    "skip-link",
    "tagline",
    "gtoc",
    "column2",
    "toc",
}
_SPACE = re.compile(r"\s+")


def _is_chrome(tag: str, attributes: dict[str, str | None]) -> bool:
    role = (attributes.get("role") or "").lower()
    names = (attributes.get("class") or "").lower().split() + (attributes.get("id") or "").lower().split()
    return (
        tag in _SKIP_TAGS
        or role in ("navigation", "banner", "contentinfo")
        or any(n in _CHROME_NAMES or n.startswith(("fancy-toc", "fancy_toc")) for n in names)
    )


def _starts_section(tag: str, attributes: dict[str, str | None]) -> bool:
    if tag in _SECTION_TAGS:
        return True
    return tag == "div" and bool(_SECTION_CLASSES.intersection((attributes.get("class") or "").lower().split()))


class _HtmlWalker:
    """Walks a parsed DOM in document order and cuts it into blocks and sections.

    Section identity is structural: a counter bumped at every heading and every sectioning
    element's start and end, so two FAQ answers under one (removed or empty) heading never
    become one section.
    """

    def __init__(self) -> None:
        self.builder = Builder()
        self.headings: list[str] = []
        self.buffer: list[str] = []
        self.pre_depth = 0
        self.section = 0

    def flush(self) -> None:
        raw = "".join(self.buffer)
        self.buffer.clear()
        text = raw if self.pre_depth else _SPACE.sub(" ", raw)
        title = self.headings[-1] if self.headings else ""  # "" when the innermost heading was empty
        self.builder.add(text, tuple(h for h in self.headings if h), self.section, title)

    def boundary(self) -> None:
        self.flush()
        self.section += 1

    def heading(self, level: int, title: str) -> None:
        self.boundary()
        del self.headings[level - 1 :]
        self.headings.extend([""] * (level - 1 - len(self.headings)))
        self.headings.append(title)

    def walk(self, root: Node) -> None:  # noqa: C901
        # An explicit stack (not recursion): real pages nest deeper than Python's stack allows.
        # Entries are (node, None) to enter it, or (node, starts_section) to leave it.
        stack: list[tuple[Node, bool | None]] = [(root, None)]
        while stack:
            node, leaving = stack.pop()
            tag = node.tag or ""
            if leaving is not None:
                if leaving:
                    self.boundary()  # what follows a closed section is not part of it
                elif tag in _BLOCK_TAGS:
                    self.flush()  # before leaving <pre>: its text keeps its whitespace
                if tag == "pre":
                    self.pre_depth -= 1
                continue
            if node.is_text_node:
                self.buffer.append(node.text_content or "")
                continue
            if not node.is_element_node:
                continue
            attributes = node.attributes
            if _is_chrome(tag, attributes):
                continue
            if tag in _HEADING_TAGS:
                title = _SPACE.sub(" ", node.text(deep=True)).strip().rstrip("¶#").strip()
                self.heading(_HEADING_TAGS[tag], title)
                continue
            section = _starts_section(tag, attributes)
            if section:
                self.boundary()
            elif tag in _BLOCK_TAGS:
                self.flush()
            if tag == "pre":
                self.pre_depth += 1
            stack.append((node, section))
            stack.extend((child, None) for child in reversed(list(node.iter(include_text=True))))


def parse_html(text: str, fallback_title: str = "") -> ParsedDocument:
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(text)
    walker = _HtmlWalker()
    root = tree.body or tree.root
    if root is not None:
        walker.walk(root)
    walker.flush()
    title_node = tree.css_first("title")
    title = _SPACE.sub(" ", title_node.text()).strip() if title_node is not None else ""
    if not title:
        title = next((b.headings[0] for b in walker.builder.blocks if b.headings), "")
    return walker.builder.build("html", title or fallback_title)


def parse_pdf(data: bytes, fallback_title: str = "", ocr_pages: int = OCR_PAGES) -> ParsedDocument:
    # pypdf is imported lazily: it is only needed for PDFs.
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise CorruptDocument("the PDF is encrypted; upload a decrypted copy")
        pages = [page.extract_text() or "" for page in reader.pages]
        meta_title = (reader.metadata.title if reader.metadata else None) or ""
        if not any(p.strip() for p in pages):  # a scan: every page an image, no text layer
            from engine import ocr

            scans = [[image.data for image in page.images] for page in reader.pages]
            if any(scans):
                pages = ocr.read_scanned(scans, ocr_pages)
    except (CorruptDocument, EmptyDocument, DocumentTooLarge):
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
        raise CorruptDocument(f"the PDF could not be read: {exc}") from exc
    builder = Builder()
    for number, page in enumerate(pages, start=1):
        for para in _PARAGRAPH_BREAK.split(page.replace("\r\n", "\n")):
            builder.add(para, (f"page {number}",), number)
    if not builder.blocks:
        raise EmptyDocument("the PDF has no extractable text: neither a text layer nor an image to read")
    return builder.build("pdf", str(meta_title).strip() or fallback_title or first_line(builder))
