"""The measured tables of docs/ are what their commands print now (scripts/docs_tables.py regenerates them)."""

from __future__ import annotations

import pytest
from conftest import ROOT, load_script


def _script():
    return load_script("scripts/docs_tables.py", "docs_tables")


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

    t = {b: mean(b, "Temporal Router") for b in d["capacities"]}
    assert all(t[b] > mean(b, "Native p^R (untrained)") for b in d["capacities"])   # training helps the router
    assert [t[b] > mean(b, "LRU") for b in d["capacities"]] == [True, True, False, False]
    classic = ("LRU", "LFU", "LRFU")
    assert [max(classic, key=lambda m, b=b: mean(b, m)) for b in d["capacities"]] == ["LFU", "LFU", "LRFU", "LRFU"]
    gaps = [max(mean(b, m) for m in classic) - t[b] for b in d["capacities"]]
    assert min(gaps) > 0                                                # behind the best classic row at every B
    doc = (ROOT / "docs" / "routers.md").read_text()
    assert f"at every `B`, by {100 * min(gaps):.1f} to {100 * max(gaps):.1f} points" in doc
    full = d["full"]["eval"]["budget_sweep"]
    assert [r["budget"] for r in full] == d["budgets"]
    hits, adj = [r["hit"] for r in full], [r["adj_hit"] for r in full]
    assert hits == sorted(hits) and adj == sorted(adj, reverse=True)    # raw Hit rises, AdjHit falls with R
    t8 = next(r["hit"] for r in d["temporal"]["8"]["evals"][0]["table"] if r["method"] == "Temporal Router")
    assert full[0]["hit"] < t8                                          # the full mode's R = 0 row sits below


def _cli_json(args: list[str]) -> dict:
    import json

    from click.testing import CliRunner

    from expertcache.cli import main

    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


def test_probes_prose_follows_the_example_model_audit():
    """The words of docs/probes.md's example-model audit hold on what the audit prints now."""
    import numpy as np

    from expertcache.trace import DECODE, read_trace

    mod = _script()
    doc = (ROOT / "docs" / "probes.md").read_text()
    rep = _cli_json(["audit", mod.EXAMPLE_MODEL, "--prompts", mod.EXAMPLE_PROMPTS, "--control", "16"])
    route, loc = rep["route"], rep["locality"]
    cat = {c["category"]: c for c in route["categories"]}
    lo = {c["category"]: c for c in loc["categories"]}
    assert not route["shared_prefix"] and not route["flagged_categories"]
    assert all(c["band_agreement"][0] < route["config"]["prefix_agreement"] for c in cat.values())
    code = cat["code"]
    assert code["jaccard_low"] < route["baseline_low"] and code["residual"] < 0
    assert (f"({code['jaccard_all']:.3f} → {code['jaccard_low']:.3f}, below the {route['baseline_low']:.3f} baseline: "
            f"residual −{-code['residual']:.3f})") in doc
    others = [cat[c]["residual"] for c in ("explain", "list", "summarize")]
    assert min(others) > 0 and f"+{min(others):.2f} to +{max(others):.2f}" in doc
    assert all(c["band_reduction"][0] > c["band_reduction"][1] and c["stable"] for c in cat.values())
    li = cat["list"]["band_reduction"]
    assert f"`list` {100 * li[0]:.1f}% at t 0–16\n  against {100 * li[1]:.1f}% at t 16–64" in doc
    assert loc["separated"] == ["code", "explain", "list"] and loc["indistinguishable"] == ["summarize"]
    assert f"(p = {lo['code']['p_value']:.3f}, {lo['explain']['p_value']:.3f}, {lo['list']['p_value']:.3f})" in doc
    assert (f"`summarize`'s {100 * lo['summarize']['improvement']:.1f}% improvement is not\n  distinguishable from "
            f"zero (p = {lo['summarize']['p_value']:.3f})") in doc
    best = max(lo.values(), key=lambda c: c["improvement"])
    assert best["category"] == "list" and f"largest improvement ({100 * best['improvement']:.1f}%)" in doc
    tr = read_trace(ROOT / mod.EXAMPLE_MODEL)
    steps = np.bincount(tr.request[tr.phase == DECODE], minlength=tr.n_requests)
    cats = tr.provenance["categories"]
    per = {c: steps[[i for i, r in enumerate(tr.request_ids) if cats[r] == c]] for c in cat}
    assert steps.max() == 64
    rest = [per[c].mean() for c in ("code", "explain", "summarize")]
    assert (f"12 of its 14 run to the 64-token cap, mean {per['list'].mean():.1f} decode tokens\n  against "
            f"{min(rest):.1f}–{max(rest):.1f} for the others") in doc and int((per["list"] == 64).sum()) == 12
    wb = rep["workload_block"]
    assert wb["unique_generated_sequences"] in doc.replace("\n", " ")
    agr = wb["positional_token_agreement"].split(" mean")[0].replace("-", "–")
    assert f"agreement {agr} mean per category" in doc.replace("\n", " ")
    assert wb["expert_jaccard_low_text_overlap"].split(" ")[0].replace("-", "–") in doc


def test_prefetch_prose_follows_the_example_model_table():
    """docs/prefetch.md's sentence on the example-model comparison: LFU is the best causal row, FineMoE's hit
    rate and bytes as quoted."""
    mod = _script()
    rows = {r["name"]: r for r in _cli_json(["prefetch", "compare", mod.EXAMPLE_MODEL, "-C", "8"])["rows"]
            if "hit" in r}
    lfu, fine = rows["lfu"], rows["finemoe"]
    causal = [r for r in rows.values() if r["family"] != "reference"]
    assert max(causal, key=lambda r: r["adj_hit"])["name"] == "lfu"
    assert min(causal, key=lambda r: r["load_per_token"])["name"] == "lfu"
    doc = (ROOT / "docs" / "prefetch.md").read_text()
    assert (f"raises the hard hit rate to {100 * fine['hit']:.0f}% while moving about "
            f"{fine['load_per_token'] / lfu['load_per_token']:.1f} times\nLFU's bytes per token") in doc
