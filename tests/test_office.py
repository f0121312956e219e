"""Office documents read with their structure: Word headings open sections and a table is read a
row at a time with its header; a slide is a section titled by its title, with its notes; a sheet
is a section of rows. Generated here with the parsers' own writers, then uploaded and asked."""

from __future__ import annotations

import io

import pytest
from fastapi.testclient import TestClient

from engine.parsing import parse
from tests.conftest import AUTH


def make_docx() -> bytes:
    from docx import Document

    d = Document()
    d.core_properties.title = "Operations handbook"
    d.add_heading("Backups", 1)
    d.add_paragraph("Nightly backups of the billing database run at 02:00 UTC from the standby.")
    d.add_paragraph("Check the restore log every Monday", style="List Bullet")
    d.add_heading("Retention tiers", 2)
    table = d.add_table(rows=3, cols=2)
    for r, (tier, days) in enumerate([("Tier", "Days kept"), ("platinum", "400"), ("bronze", "7")]):
        table.cell(r, 0).text, table.cell(r, 1).text = tier, days
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def make_pptx() -> bytes:
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Quarterly goals"
    slide.placeholders[1].text = "Ship the quokka ledger to every regional office"
    slide.notes_slide.notes_text_frame.text = "Mention the zanzibar audit findings"
    budget = deck.slides.add_slide(deck.slide_layouts[5])
    budget.shapes.title.text = "Budget"
    table = budget.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(6), Inches(1)).table
    for c, (head, value) in enumerate([("Team", "infrastructure"), ("Euros", "1200")]):
        table.cell(0, c).text, table.cell(1, c).text = head, value
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def make_xlsx() -> bytes:
    import openpyxl

    book = openpyxl.Workbook()
    hosts = book.active
    hosts.title = "Hosts"
    for row in (["host", "role", "port"], ["db-kestrel", "postgres primary", 5432], ["web-osprey", "nginx", 443]):
        hosts.append(row)
    owners = book.create_sheet("Owners")
    owners.append(["service", "owner"])
    owners.append(["billing", "team heron"])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def test_word_headings_sections_lists_and_table_rows() -> None:
    doc = parse(make_docx(), "handbook.docx")
    assert (doc.kind, doc.title) == ("docx", "Operations handbook")
    by_text = {b.text: b for b in doc.blocks}
    assert by_text["- Check the restore log every Monday"].headings == ("Backups",)
    row = by_text["Tier: platinum; Days kept: 400"]
    assert (
        row.headings == ("Backups", "Retention tiers")
        and row.section > by_text["- Check the restore log every Monday"].section
    )


def test_slides_and_sheets_are_sections() -> None:
    deck = parse(make_pptx(), "goals.pptx")
    assert deck.kind == "pptx" and deck.title == "Quarterly goals"
    assert [(b.headings, b.text) for b in deck.blocks] == [
        (("Quarterly goals",), "Ship the quokka ledger to every regional office"),
        (("Quarterly goals",), "Notes: Mention the zanzibar audit findings"),
        (("Budget",), "Team | Euros"),
        (("Budget",), "Team: infrastructure; Euros: 1200"),
    ]
    book = parse(make_xlsx(), "hosts.xlsx")
    assert book.kind == "xlsx" and {b.section for b in book.blocks} == {1, 2}
    assert next(b.headings for b in book.blocks if "db-kestrel" in b.text) == ("Hosts",)
    assert "host: db-kestrel; role: postgres primary; port: 5432" in [b.text for b in book.blocks]


@pytest.mark.parametrize("name", ["notes.docx", "notes.pptx", "notes.xlsx"])
def test_a_file_named_office_that_is_not_one_is_corrupt(name: str) -> None:
    from engine.errors import CorruptDocument

    with pytest.raises(CorruptDocument, match="not a zip"):
        parse(b"just some text", name)


def test_office_uploads_answer_from_a_table_cell_and_a_slide(client: TestClient) -> None:
    files = {
        "handbook.docx": make_docx(),
        "goals.pptx": make_pptx(),
        "hosts.xlsx": make_xlsx(),
    }
    for name, data in files.items():
        r = client.post("/documents", files={"file": (name, data, "application/octet-stream")}, headers=AUTH)
        assert r.status_code == 201, r.text
        assert r.json()["chunks"] >= 1 and r.json()["source"] == name
    for question, source, words in [
        ("How many days are platinum backups kept?", "handbook.docx", "platinum; Days kept: 400"),
        ("Which port does db-kestrel listen on?", "hosts.xlsx", "port: 5432"),
        ("What do the notes say about the zanzibar audit?", "goals.pptx", "zanzibar audit"),
    ]:
        body = client.post("/ask", json={"query": question, "k": 3, "generate": False}).json()
        top = body["citations"]
        assert top, body
        assert top[0]["source"] == source and words in top[0]["text"], (question, top[0])
