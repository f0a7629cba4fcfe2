"""Docs that restate code stay true to it."""

from pathlib import Path

from udfs.media.reasons import REASONS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_inputs_doc_lists_every_quarantine_reason():
    text = (DOCS / "INPUTS.md").read_text(encoding="utf-8")
    rows = {
        line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and "|" in line[2:]
    }
    assert set(REASONS) <= rows


def test_architecture_doc_names_every_table():
    from schemas import TABLES

    text = (DOCS / "ARCHITECTURE.md").read_text(encoding="utf-8")
    for name in TABLES:
        assert f"| {name} |" in text, name


def test_test_files_named_in_the_docs_exist():
    """Tests move with the packages they mirror; the docs' pointers to them must follow."""
    import re

    repo = DOCS.parent
    named = {m for doc in DOCS.glob("*.md") for m in re.findall(r"tests/[\w/]+\.py", doc.read_text("utf-8"))}
    assert named and sorted(p for p in named if not (repo / p).is_file()) == []
