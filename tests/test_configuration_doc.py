"""The configuration documents itself: every setting in one section with a short description, and
the README's table is the one the settings generate."""

from pathlib import Path

from app.core.settings import INTERNAL, SECTIONS, Settings, configuration_table

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_setting_has_one_section() -> None:
    placed = [name for names in SECTIONS.values() for name in names]
    assert len(placed) == len(set(placed)), "a setting in two sections"
    assert set(placed) | INTERNAL == set(Settings.model_fields), "settings without a section (or gone)"
    assert not set(placed) & INTERNAL


def test_descriptions_are_short_rows() -> None:
    for name, field in Settings.model_fields.items():
        text = field.description or ""
        assert text, f"{name} has no description"
        assert len(text) <= 240, f"{name}: {len(text)} characters; measurements belong in docs/"
        assert "benchmarks/results" not in text, f"{name} cites a measurement; docs/ holds those"


def test_readme_table_is_generated() -> None:
    text = README.read_text()
    begin, end = "<!-- settings:begin -->\n", "<!-- settings:end -->"
    assert begin in text and end in text
    table = text[text.index(begin) + len(begin) : text.index(end)]
    assert table == configuration_table(), "README's table is stale: paste `python -m app.core.settings`"
