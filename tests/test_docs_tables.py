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


def test_routers_prose_follows_its_data():
    """The claims docs/routers.md makes in words about the example-model tables hold on the stored results."""
    import json

    d = json.loads((ROOT / "docs" / "data" / "routers_example.json").read_text())

    def mean(b, method):
        evs = d["temporal"][str(b)]["evals"]
        return sum(next(r["hit"] for r in ev["table"] if r["method"] == method) for ev in evs) / len(evs)

    def spread(b, method):
        hits = [next(r["hit"] for r in ev["table"] if r["method"] == method) for ev in d["temporal"][str(b)]["evals"]]
        return max(hits) - min(hits)

    t = {b: mean(b, "Temporal Router") for b in d["capacities"]}
    assert all(t[b] > mean(b, "Native p^R (untrained)") for b in d["capacities"])   # training helps the router
    assert [t[b] > mean(b, "LRU") for b in d["capacities"]] == [True, True, True, False]
    best = {b: max(mean(b, m) for m in ("LRU", "LFU", "LRFU")) for b in d["capacities"]}
    assert all(max(("LRU", "LFU", "LRFU"), key=lambda m, b=b: mean(b, m)) == "LRFU" for b in d["capacities"])
    for b in (8, 12):                                                   # level: within LRU's tie-seed spread
        assert abs(t[b] - best[b]) <= spread(b, "LRU")
    for b in (6, 16):
        assert t[b] < best[b]
    full = d["full"]["eval"]["budget_sweep"]
    assert [r["budget"] for r in full] == d["budgets"]
    hits, adj = [r["hit"] for r in full], [r["adj_hit"] for r in full]
    assert hits == sorted(hits) and adj == sorted(adj, reverse=True)    # raw Hit rises, AdjHit falls with R
    t8 = next(r["hit"] for r in d["temporal"]["8"]["evals"][0]["table"] if r["method"] == "Temporal Router")
    assert full[0]["hit"] < t8                                          # the full mode's R = 0 row sits below
