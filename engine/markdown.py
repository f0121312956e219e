"""Markdown -> blocks with heading paths, parsed by markdown-it (CommonMark + tables).

Raw HTML inside Markdown is reduced to its text (a `<script>` block contributes nothing), so
chunk text, citations and answers carry no markup from a Markdown source.
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from markdown_it.token import Token
from selectolax.lexbor import LexborHTMLParser

from engine.blocks import Builder, ParsedDocument, first_line

_MD = MarkdownIt("commonmark", {"html": True}).enable("table")


def _inline_text(token: Token) -> str:
    """The plain text of an inline token: words, code, link and image text; no inline HTML tags."""
    parts: list[str] = []
    for child in token.children or []:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append("\n")
        elif child.type == "image":
            parts.append(child.content)  # the alt text
    return "".join(parts)


def _html_text(fragment: str) -> str:
    tree = LexborHTMLParser(fragment)
    tree.strip_tags(["script", "style", "noscript", "template"])
    root = tree.body or tree.root
    return " ".join((root.text(separator=" ") if root is not None else "").split())


def parse_markdown(text: str, fallback_title: str = "") -> ParsedDocument:  # noqa: C901
    builder = Builder()
    headings: list[str] = []
    section = 0
    table: list[list[str]] | None = None  # rows of cells while inside a table
    tokens = _MD.parse(text)
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            level = int(tok.tag[1])
            title = " ".join(_inline_text(tokens[i + 1]).split())
            section += 1
            del headings[level - 1 :]
            headings.extend([""] * (level - 1 - len(headings)))
            headings.append(title)
        elif tok.type == "inline" and tokens[i - 1].type == "paragraph_open":
            builder.add(_inline_text(tok), tuple(headings), section)
        elif tok.type == "fence":
            builder.add(f"{tok.markup}{tok.info}\n{tok.content}{tok.markup}", tuple(headings), section)
        elif tok.type == "code_block":
            builder.add(tok.content, tuple(headings), section)
        elif tok.type == "html_block":
            builder.add(_html_text(tok.content), tuple(headings), section)
        elif tok.type == "table_open":
            table = []
        elif tok.type == "tr_open" and table is not None:
            table.append([])
        elif tok.type == "inline" and table is not None and table and tokens[i - 1].type in ("th_open", "td_open"):
            table[-1].append(" ".join(_inline_text(tok).split()))
        elif tok.type == "table_close" and table is not None:
            builder.add("\n".join(" | ".join(row) for row in table), tuple(headings), section)
            table = None
    first_heading = next((b.headings[0] for b in builder.blocks if b.headings and b.headings[0]), "")
    return builder.build("md", first_heading or fallback_title or first_line(builder))
