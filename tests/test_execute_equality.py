"""Replay predicts execution, layer by layer (docs/execute.md, "Replay predicts execution").

The fast test runs the subset ``QUICK_SPEC`` (Qwen3-MoE, OLMoE, Mixtral; B = 4, the smallest capacity;
both contracts, every policy) and checks each case's transfers against the docs table cell. The slow
tests run the whole matrix (seven tiny architectures and the example model, B in {1, 4, 8}, three
capacities, both contracts, every policy) and regenerate the docs tables exactly.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from expertcache.execute.equality import (  # noqa: E402
    EXAMPLE_SPEC,
    QUICK_SPEC,
    TINY_SPEC,
    markdown_table,
    run_matrix,
)

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "execute.md"


def doc_table(name: str) -> str:
    text = DOC.read_text()
    m = re.search(rf"<!-- equality-table:{name} -->\n(.*?)\n<!-- /equality-table -->", text, flags=re.S)
    assert m, f"docs/execute.md has no equality-table:{name} block"
    return m.group(1).strip()


def cells(table: str) -> dict[tuple[str, str, str, str], str]:
    lines = [ln for ln in table.splitlines() if ln.startswith("|")]
    head = [h.strip() for h in lines[0].strip("|").split("|")]
    out = {}
    for ln in lines[2:]:
        vals = [v.strip() for v in ln.strip("|").split("|")]
        for h, v in zip(head[3:], vals[3:], strict=True):
            out[(vals[0], vals[1], vals[2], h)] = v
    return out


def test_quick_matrix_equal_layer_by_layer_and_as_documented():
    rows = run_matrix(QUICK_SPEC)
    assert len(rows) == 3 * (10 + 9)
    bad = [r.to_dict() for r in rows if not r.equal]
    assert not bad, bad
    assert all(r.tokens_equal_reference for r in rows)
    assert all(r.max_event > min(r.capacity) for r in rows)     # events exceed the quota here
    # the policies differ from each other: the equality is not a property of a degenerate workload
    assert len({sum(r.executed) for r in rows if r.model == "qwen3_moe" and r.contract == "fused"}) >= 6
    doc = cells(doc_table("tiny"))
    for r in rows:
        assert doc[(r.model, r.contract, r.policy, f"B={r.batch} ρ={r.rho:g}")] == str(sum(r.executed)), r


@pytest.mark.slow
@pytest.mark.matrix
def test_full_tiny_matrix_regenerates_docs_table():
    rows = run_matrix(TINY_SPEC)
    assert all(r.equal for r in rows)
    assert markdown_table(rows) == doc_table("tiny")


@pytest.mark.slow
@pytest.mark.matrix
def test_example_matrix_regenerates_docs_table():
    from expertcache.execute.example import example_model_dir

    try:
        d = example_model_dir()
    except Exception:
        pytest.skip("example model weights absent (python scripts/example_model/make_all.py)")
    sha = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
    want = re.search(r"example-model weights sha256 `([0-9a-f]{64})`", DOC.read_text()).group(1)
    if sha != want:
        pytest.skip(f"these example weights (sha256 {sha[:12]}) are not the ones the docs table was made with")
    rows = run_matrix(EXAMPLE_SPEC)
    assert all(r.equal for r in rows)
    assert markdown_table(rows) == doc_table("example")
