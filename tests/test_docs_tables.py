"""The measured tables of docs/ are what their commands print now (scripts/docs_tables.py regenerates them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "scripts" / "docs_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", list(_script().TABLES))
def test_docs_table_matches_its_command(name):
    mod = _script()
    doc, command, _ = mod.TABLES[name]
    text = (ROOT / doc).read_text()
    assert command in text, f"{doc} must name the command of table {name}: {command}"
    assert mod.render([name])[doc] == text, f"{doc}: table {name} is stale; run python scripts/docs_tables.py"


def test_a_stale_table_is_caught(tmp_path, monkeypatch):
    mod = _script()
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    doc.write_text("intro\n<!-- table: t -->\n| a |\n|---|\n| 1 |\n<!-- /table -->\nend\n")
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    monkeypatch.setattr(mod, "TABLES", {"t": ("docs/x.md", "cmd", lambda: "| a |\n|---|\n| 2 |")})
    assert mod.main(["--check"]) == 1
    assert mod.main([]) == 0 and "| 2 |" in doc.read_text() and doc.read_text().endswith("end\n")
    assert mod.main(["--check"]) == 0
