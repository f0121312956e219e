import io

import pytest

from engine.errors import CorruptDocument, EmptyDocument, UndecodableDocument, UnsupportedType
from engine.parsing import decode_text, parse, sniff


def make_pdf(pages: list[str]) -> bytes:
    from reportlab.pdfgen import canvas

    buf = io.BytesIO()
    c = canvas.Canvas(buf)
    for page in pages:
        y = 800
        for line in page.split("\n"):
            c.drawString(50, y, line)
            y -= 14
        c.showPage()
    c.save()
    return buf.getvalue()


def test_sniff_by_magic_name_and_type() -> None:
    assert sniff(b"%PDF-1.7 ...", "whatever.bin") == "pdf"
    assert sniff(b"# t", "notes.md") == "md"
    assert sniff(b"<p>x</p>", "page.HTM") == "html"
    assert sniff(b"<!DOCTYPE html><html></html>", None) == "html"
    assert sniff(b"plain words", None) == "txt"
    assert sniff(b"x", None, "text/markdown; charset=utf-8") == "md"
    with pytest.raises(UnsupportedType):
        sniff(b"PK\x03\x04", "report.key")  # a zip of a kind moerag does not read
    with pytest.raises(CorruptDocument):
        sniff(b"PK\x03\x04", "report.docx")  # named a Word file, not one
    with pytest.raises(UnsupportedType):
        sniff(b"\x89PNG\r\n\x1a\n\x00\x00", None)
    with pytest.raises(CorruptDocument):
        sniff(b"not a pdf at all", "fake.pdf")


def test_decode_text_accepts_utf8_bom_and_latin1_refuses_empty_and_binary() -> None:
    assert decode_text("héllo".encode()) == "héllo"
    assert decode_text(b"\xef\xbb\xbfhi") == "hi"
    assert "café" in decode_text("Le café est très bon, naïve façade à côté.".encode("latin-1"))
    with pytest.raises(EmptyDocument):
        decode_text(b"   \n ")
    with pytest.raises(UndecodableDocument):
        decode_text(b"\x00\xff\x00\xfe" * 50 + b"\xc3")


def test_markdown_keeps_heading_paths_and_code_fences() -> None:
    md = "# Guide\n\nIntro text.\n\n## Install\n\nRun it.\n\n```\n# not a heading\n```\n\n### Linux\n\nUse apt.\n"
    doc = parse(md.encode(), "guide.md")
    assert doc.kind == "md" and doc.title == "Guide"
    by_text = {b.text: b.headings for b in doc.blocks}
    assert by_text["Intro text."] == ("Guide",)
    assert by_text["Run it."] == ("Guide", "Install")
    assert by_text["```\n# not a heading\n```"] == ("Guide", "Install")
    assert by_text["Use apt."] == ("Guide", "Install", "Linux")
    for b in doc.blocks:  # spans index the plain text exactly
        assert doc.text[b.start : b.end] == b.text


def test_html_drops_chrome_and_tracks_headings() -> None:
    html = """<!doctype html><html><head><title>The Page</title><style>p{}</style></head><body>
    <nav><ul><li>Home<li>Other</ul></nav>
    <h1>Main</h1><p>First   paragraph
    text.</p><script>var x = 1;</script>
    <div class="toc"><ul><li>toc entry</li></ul></div>
    <h2>Sub &amp; more</h2><ul><li>item one</li><li>item two</li></ul>
    <footer>copyright</footer></body></html>"""
    doc = parse(html.encode(), "p.html")
    texts = [b.text for b in doc.blocks]
    assert doc.title == "The Page"
    assert texts == ["First paragraph text.", "item one", "item two"]
    assert doc.blocks[1].headings == ("Main", "Sub & more")
    joined = doc.text
    for junk in ("Home", "var x", "toc entry", "copyright"):
        assert junk not in joined


def test_pdf_pages_become_blocks_and_corrupt_pdf_is_refused() -> None:
    data = make_pdf(["Alpha page text here.", "Beta page text here."])
    doc = parse(data, "two.pdf")
    assert doc.kind == "pdf"
    assert [b.headings for b in doc.blocks] == [("page 1",), ("page 2",)]
    assert "Beta page" in doc.text
    with pytest.raises(CorruptDocument):
        parse(data[:200], "broken.pdf")
    with pytest.raises(EmptyDocument):
        parse(make_pdf([""]), "blank.pdf")


def test_text_paragraphs() -> None:
    doc = parse(b"para one\nstill one\n\n\npara two", "a.txt")
    assert [b.text for b in doc.blocks] == ["para one\nstill one", "para two"]
    with pytest.raises(EmptyDocument):
        parse(b"<html><script>x</script></html>", "empty.html")


def test_html_sections_are_structural() -> None:
    """Every heading (empty too) and sectioning element starts a new section; definition entries do not."""
    html = """<html><body><h1>FAQ</h1>
    <h6></h6><p>Answer one, first part.</p><p>Answer one, second part.</p>
    <h6></h6><p>Answer two.</p>
    <div class="section"><p>DocBook section.</p></div><p>After the section.</p>
    <section><p>Sphinx section.</p></section>
    <dl><dt>term one</dt><dd>definition one</dd><dt>term two</dt><dd>definition two
      <dl><dt>Parameters</dt><dd>a field of term two</dd></dl></dd></dl>
    </body></html>"""
    doc = parse(html.encode(), "faq.html")
    section = {b.text: b.section for b in doc.blocks}
    assert section["Answer one, first part."] == section["Answer one, second part."]
    assert section["Answer one, second part."] != section["Answer two."]
    assert len({section[t] for t in ("Answer two.", "DocBook section.", "After the section.", "Sphinx section.")}) == 4
    assert section["term one"] == section["definition two"] == section["a field of term two"]
    assert all(b.headings == ("FAQ",) for b in doc.blocks)  # an empty heading adds nothing to the path


def test_html_deep_nesting_does_not_recurse() -> None:
    html = "<div>" * 5000 + "<p>deep text</p>" + "</div>" * 5000
    assert [b.text for b in parse(html.encode(), "deep.html").blocks] == ["deep text"]


def test_html_pre_keeps_its_whitespace_and_prose_does_not() -> None:
    doc = parse(b"<h1>T</h1><pre>a  b\n  c</pre><p>x   y\n z</p>", "t.html")
    assert [b.text for b in doc.blocks] == ["a  b\n  c", "x y z"]


def test_markdown_raw_html_becomes_text_without_markup() -> None:
    """Issue 11 #10: /ask returned raw document HTML (<script>, <img onerror>) from Markdown sources."""
    md = (
        "# Notes\n\nSafe <img src=x onerror=alert(1)> text with <b>bold</b> words.\n\n"
        "<div><script>alert('x')</script><p>Inside a <em>block</em>.</p></div>\n\n"
        "| a | b |\n|---|---|\n| 1 | <i>2</i> |\n\n- item one\n- item two\n"
    )
    doc = parse(md.encode(), "n.md")
    texts = [b.text for b in doc.blocks]
    assert texts == ["Safe  text with bold words.", "Inside a block .", "a | b\n1 | 2", "item one", "item two"]
