"""The bundled example prompt set and the trace recorded from the example model (docs/example_model.md)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np

from expertcache.collect.prompts import read_prompts
from expertcache.trace import DECODE, read_trace

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "expertcache" / "data"
TRACE = DATA / "example_model_trace"


def test_prompt_set_has_four_categories_and_unique_ids():
    prompts = read_prompts(DATA / "example_prompts.jsonl")
    assert len(prompts) == 56
    assert Counter(p.category for p in prompts) == {"explain": 14, "code": 14, "list": 14, "summarize": 14}
    assert all(p.request_id.startswith(p.category + "-") for p in prompts)


def test_shipped_trace_is_the_example_models_routing_and_small():
    tr = read_trace(TRACE)
    assert (tr.n_layers, tr.n_experts, tr.top_k) == (4, 32, 4)
    assert tr.provenance["model_type"] == "qwen3_moe" and tr.provenance["generator"] == "expertcache collect"
    prompts = read_prompts(DATA / "example_prompts.jsonl")
    assert tr.request_ids == tuple(p.request_id for p in prompts)
    decode = np.bincount(tr.request[tr.phase == DECODE], minlength=tr.n_requests)
    assert decode.max() <= 64 and decode.min() >= 1
    size = sum(f.stat().st_size for f in TRACE.rglob("*") if f.is_file())
    assert size < 2_000_000


def test_docs_quote_the_measured_locality_table():
    sys.path.insert(0, str(ROOT / "scripts" / "example_model"))
    try:
        import locality_report
    finally:
        sys.path.pop(0)
    table = locality_report.table(TRACE)
    assert table in (ROOT / "docs" / "example_model.md").read_text()
