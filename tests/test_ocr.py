"""A scanned PDF (text rendered to an image, no text layer) is read by the OCR extra and found by a
sentence on it; without the extra the refusal names it."""

from __future__ import annotations

import io

import pytest
from fastapi.testclient import TestClient

from engine import ocr
from engine.errors import EmptyDocument
from engine.parsing import parse
from tests.conftest import AUTH

LINES = [
    "Quarterly audit memo",
    "The quokka ledger is reconciled every Friday at noon.",
    "Escalate any mismatch to the finance desk within one day.",
]


def scanned_pdf(lines: list[str] = LINES) -> bytes:
    """A one-page PDF holding only an image of `lines` (as a scanner makes it)."""
    from PIL import Image, ImageDraw, ImageFont

    page = Image.new("RGB", (1700, 600), "white")
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=44)
    for n, line in enumerate(lines):
        draw.text((80, 80 + n * 120), line, fill="black", font=font)
    out = io.BytesIO()
    page.save(out, "PDF", resolution=150)
    return out.getvalue()


def test_without_the_extra_a_scan_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ocr, "available", lambda: False)
    with pytest.raises(EmptyDocument, match=r"moerag\[ocr\]"):
        parse(scanned_pdf(), "memo.pdf")


@pytest.mark.skipif(not ocr.available(), reason="the ocr extra is not installed")
def test_a_scanned_pdf_is_read_and_found_by_a_sentence_on_it(client: TestClient) -> None:
    doc = parse(scanned_pdf(), "memo.pdf")
    words = doc.text.lower()
    assert "quokka ledger" in words and "friday" in words, doc.text
    r = client.post("/documents", files={"file": ("memo.pdf", scanned_pdf(), "application/pdf")}, headers=AUTH)
    assert r.status_code == 201, r.text
    body = client.post("/ask", json={"query": "When is the quokka ledger reconciled?", "generate": False}).json()
    assert body["citations"] and body["citations"][0]["source"] == "memo.pdf"
    assert "friday" in body["citations"][0]["text"].lower()


@pytest.mark.skipif(not ocr.available(), reason="the ocr extra is not installed")
def test_a_scan_over_the_ocr_budget_is_refused_whole() -> None:
    from engine.errors import DocumentTooLarge

    with pytest.raises(DocumentTooLarge, match="MOERAG_MAX_OCR_PAGES"):
        parse(scanned_pdf(), "memo.pdf", ocr_pages=0)
