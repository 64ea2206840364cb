"""Probe-set builder and prompt-side diagnostics: constraints checked by independent naive code."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.probes import (
    BuildConfig,
    PromptRecord,
    build_probe_set,
    example_sources_dir,
    load_wrappers,
    prompt_diagnostics,
    write_probe_set,
)


def naive_grams(text: str) -> set:
    words = re.findall(r"\w+", text.lower())
    if len(words) < 5:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + 5]) for i in range(len(words) - 4)}


def naive_jaccard(a: str, b: str) -> float:
    x, y = naive_grams(a), naive_grams(b)
    return len(x & y) / len(x | y) if x | y else 0.0


def source_texts() -> dict[tuple[str, str], tuple[str, str]]:
    """(archetype, id) -> (group, payload as text) read straight from the shipped files."""
    out = {}
    for path in sorted(example_sources_dir().glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            p = rec["payload"]
            text = "\n".join(f"{k}: {v}" for k, v in p.items()) if isinstance(p, dict) else p
            out[(path.stem, str(rec["id"]))] = (str(rec["group"]), text)
    return out


@pytest.fixture(scope="module")
def built():
    return build_probe_set(None, None, BuildConfig(per_cell=12, n_matched=4, threshold=0.30, seed=0))


def test_builder_constraints_on_shipped_examples(built):
    texts = source_texts()
    diverse = [r for r in built.records if r.arm == "diverse"]
    fixed = [r for r in built.records if r.arm == "fixed"]
    cells: dict[tuple[str, str], list] = {}
    for r in diverse:
        cells.setdefault((r.category, r.split), []).append(r)
    archetypes = {a for a, _ in texts}
    assert set(cells) == {(a, s) for a in archetypes for s in ("discovery", "confirmatory")}
    for cell, rs in cells.items():
        assert len(rs) == 12, cell
        pairs = [(r.form, r.language) for r in rs]
        assert len(set(pairs)) == len(pairs), f"form-language pair repeated in {cell}"
        # the stored group is the source file's group
        assert all(texts[(r.category, r.source_id)][0] == r.source_group for r in rs)
    for a in archetypes:
        g = {s: {texts[(a, r.source_id)][0] for r in cells[(a, s)]} for s in ("discovery", "confirmatory")}
        assert not g["discovery"] & g["confirmatory"], f"{a}: a source group is on both sides"
    payloads = [texts[(r.category, r.source_id)][1] for r in diverse]
    assert len({(r.category, r.source_id) for r in diverse}) == len(diverse)
    worst = max(naive_jaccard(x, y) for x, y in itertools.combinations(payloads, 2))
    assert worst <= 0.30
    # matched arm: 4 per cell, one template, paired with a diverse rendering of the same source in the same cell
    assert len(fixed) == 4 * len(cells)
    assert {r.template for r in fixed} == {"fixed"}
    for r in fixed:
        assert r.source_id in {d.source_id for d in cells[(r.category, r.split)]}
        assert r.prompt.rstrip().endswith("Analyze the input above and provide a detailed answer.")


def test_threshold_is_enforced_when_sources_repeat(tmp_path):
    # three near-copies and three distinct texts per group: only one near-copy may be selected
    base = "the quick brown fox jumps over the lazy dog near the river bank today"
    recs = [{"id": f"dup{i}", "group": f"g{i}", "payload": base + f" variant {i}"} for i in range(3)]
    recs += [{"id": f"u{i}", "group": f"h{i}", "payload": f"completely different words number {i} " * 2
              + " ".join(f"w{i}x{j}" for j in range(8))} for i in range(5)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    ps = build_probe_set(tmp_path, None, BuildConfig(per_cell=2, n_matched=0, seed=1))
    chosen = [r.source_id for r in ps.records]
    assert sum(c.startswith("dup") for c in chosen) <= 1
    with pytest.raises(ValidationError, match=r"archetype 'a', split '\w+': \d of 4 payloads, \d missing"):
        build_probe_set(tmp_path, None, BuildConfig(per_cell=4, n_matched=0, seed=1))


def test_byte_identical_across_runs(tmp_path):
    cfg = BuildConfig(per_cell=6, n_matched=2, seed=7)
    write_probe_set(build_probe_set(None, None, cfg), tmp_path / "a")
    write_probe_set(build_probe_set(None, None, cfg), tmp_path / "b")
    for name in ("probes.jsonl", "prompts.jsonl", "labels.csv", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    write_probe_set(build_probe_set(None, None, BuildConfig(per_cell=6, n_matched=2, seed=8)), tmp_path / "c")
    assert (tmp_path / "a" / "probes.jsonl").read_bytes() != (tmp_path / "c" / "probes.jsonl").read_bytes()
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["config"]["seed"] == 7 and len(manifest["files"]["probes.jsonl"]["sha256"]) == 64


def test_prompts_file_is_collect_input_and_labels_match(tmp_path):
    from expertcache.collect.prompts import read_prompts as collect_prompts
    from expertcache.trace.labels import read_labels

    write_probe_set(build_probe_set(None, None, BuildConfig(per_cell=4, n_matched=2)), tmp_path / "ps")
    prompts = collect_prompts(tmp_path / "ps" / "prompts.jsonl")
    labels = read_labels(tmp_path / "ps" / "labels.csv")
    assert len(prompts) == 4 * 2 * 6 and {p.request_id for p in prompts} == set(labels)
    assert all(labels[p.request_id] == p.category for p in prompts)


def _cli(args):
    return CliRunner().invoke(main, args)


def test_bad_sources_give_clear_errors(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "rag.jsonl").write_text(json.dumps({"id": 1, "payload": "text without a group"}) + "\n")
    res = _cli(["probe", "build", "--sources", str(src), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert "rag.jsonl: record 1: field 'group'" in res.output and "archetype 'rag'" in res.output
    assert not (tmp_path / "out").exists()

    (src / "rag.jsonl").write_text("")
    res = _cli(["probe", "build", "--sources", str(src), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "archetype 'rag' has no payload records" in res.output

    rows = "".join(json.dumps({"id": i, "group": f"g{i}", "payload": f"unique payload number {i} " + "x" * i})
                   + "\n" for i in range(5))
    (src / "rag.jsonl").write_text(rows)
    res = _cli(["probe", "build", "--sources", str(src), "--per-cell", "4", "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    # 5 records over two splits: one side has 3 (1 missing), the other 2 (2 missing)
    assert "archetype 'rag', split 'discovery': 3 of 4 payloads, 1 missing" in res.output
    assert "archetype 'rag', split 'confirmatory': 2 of 4 payloads, 2 missing" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "out").exists()

    (src / "rag.csv").write_text("id,payload\n1,x\n")
    res = _cli(["probe", "build", "--sources", str(src), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "two files for archetype 'rag'" in res.output


def test_bad_wrappers(tmp_path):
    raw = json.loads(Path(load_wrappers().source).read_text())
    raw["forms"][1]["final_kind"] = raw["forms"][0]["final_kind"]
    (tmp_path / "w.json").write_text(json.dumps(raw))
    with pytest.raises(ValidationError, match="duplicate form final_kind"):
        load_wrappers(tmp_path / "w.json")
    raw = json.loads(Path(load_wrappers().source).read_text())
    raw["forms"][0]["templates"]["de"] = "{instruction} ohne Nutzlast"
    (tmp_path / "w.json").write_text(json.dumps(raw))
    with pytest.raises(ValidationError, match=r"forms\[0\].templates.*de template must use exactly"):
        load_wrappers(tmp_path / "w.json")
    with pytest.raises(ValidationError, match="per_cell=25 exceeds the 12 forms x 2 languages"):
        build_probe_set(None, None, BuildConfig(per_cell=25, n_matched=0))


def test_prompt_diagnostics_golden():
    t = "Summarise this.\n{}\nAnswer:"
    recs = [PromptRecord("a1", "A", t.format("one two three four five six"), "t1"),
            PromptRecord("a2", "A", t.format("one two three four five seven"), "t1"),
            PromptRecord("b1", "B", "x " * 40 + "\nfinal one", None),
            PromptRecord("b2", "B", "y " * 40 + "\nfinal two", None)]
    a, b = prompt_diagnostics(recs)
    assert (a.category, a.n_records, a.n_templates, a.n_heads, a.n_finals) == ("A", 2, 1, 2, 1)
    # 9 words each -> 5 grams each; the first three (up to "one two three four five") are shared: 3 / 7
    assert a.mean_jaccard == pytest.approx(3 / 7)
    assert (b.n_templates, b.n_heads, b.n_finals) == (None, 2, 2)
    assert b.mean_jaccard == pytest.approx(0.0)


def test_cli_build_and_prompt_audit(tmp_path):
    out = tmp_path / "ps"
    res = _cli(["probe", "build", "--per-cell", "4", "--matched", "2", "--seed", "1", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["n_records"] == 4 * 2 * 6 and info["n_fixed"] == 4 * 2 * 2
    res = _cli(["probe", "build", "-o", str(out)])
    assert res.exit_code == 2 and "already exists" in res.output
    res = _cli(["probe", "audit", str(out), "--json"])
    rows = [json.loads(x) for x in res.output.splitlines()]
    diverse = [r for r in rows if r["arm"] == "diverse"]
    # 8 records per category (two cells of 4, distinct form-language pairs within a cell)
    assert len(diverse) == 4 and all(r["n_records"] == 8 and 4 <= r["n_templates"] <= 8 for r in diverse)
    assert all(r["n_templates"] == 1 and r["n_finals"] == 1 for r in rows if r["arm"] == "fixed")
    res = _cli(["probe", "audit", str(out), "--by-split", "--json"])
    cells = [json.loads(x) for x in res.output.splitlines()]
    assert len(cells) == 4 * 2 * 2
    # within a cell every diverse record has its own form-language template
    assert all(r["n_templates"] == r["n_records"] == 4 for r in cells if r["arm"] == "diverse")
    res = _cli(["audit", str(out), "--json"])
    assert res.exit_code == 0, res.output
    block = json.loads(res.output)["workload_block"]
    assert "matched control arm" in block["templates_per_category"]
