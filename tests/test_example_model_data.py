"""The bundled example prompt set and the trace recorded from the example model (docs/example_model.md)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

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


MODEL = ROOT / "models" / "example-moe"

#: The pinned rebuild (scripts/example_model/portable.py; docs/example_model.md): its weights, the content of
#: the trace recorded from them (experts, token ids, gates, probabilities) and the shipped file's sha256 (its
#: bytes also hold the writing tool's version).
REBUILT_WEIGHTS_SHA256 = "f49cf6a5e1db4d5f4dabc5e13d5ec2155bf6174c19ac475163af15c7155e8fb0"
REBUILT_ROUTES_CONTENT_SHA256 = "c24d07b7e138399c7defe5a8093d9ffa5c965c78c752fd13b01c1b84a973aaff"
SHIPPED_ROUTES_SHA256 = "eb5e5fd4979cf1c28d73d2fb9b9da40f82576ef5ecf615beaa4307adcef8c28c"


def routes_content_sha256(trace_dir: Path) -> str:
    """sha256 over the recorded experts, token ids, gates and probabilities, in row order."""
    import hashlib

    tr = read_trace(trace_dir)
    h = hashlib.sha256()
    for a in (tr.experts, tr.token_id, tr.gates, tr.probs):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _rebuilt_weights() -> bool:
    from expertcache.storage import sha256_file

    path = MODEL / "model.safetensors"
    return path.is_file() and sha256_file(path) == REBUILT_WEIGHTS_SHA256


def test_the_shipped_trace_is_the_documented_recording_of_the_pinned_rebuild():
    """The shipped routes are the ones docs/example_model.md documents for the recipe's weights."""
    from expertcache.storage import sha256_file

    assert routes_content_sha256(TRACE) == REBUILT_ROUTES_CONTENT_SHA256
    assert sha256_file(TRACE / "routes.parquet") == SHIPPED_ROUTES_SHA256
    doc = (ROOT / "docs" / "example_model.md").read_text()
    for h in (REBUILT_WEIGHTS_SHA256, REBUILT_ROUTES_CONTENT_SHA256, SHIPPED_ROUTES_SHA256):
        assert h in doc, h
    assert json.loads((TRACE / "collection.json").read_text())["identity"]["model"] == "models/example-moe"


@pytest.mark.slow
@pytest.mark.skipif(not _rebuilt_weights(), reason="models/example-moe (git-ignored) absent or not the pinned "
                    "rebuild; python scripts/example_model/make_all.py --skip-record builds it")
def test_recording_the_rebuilt_model_reproduces_the_shipped_trace(tmp_path):
    """The documented recording command (scripts/example_model/record.py) on the documented weights gives the
    shipped routes.parquet byte for byte, and the same collection identity."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "scripts" / "example_model"))
    try:
        import record
    finally:
        sys.path.pop(0)
    out = tmp_path / "trace"
    assert record.record(MODEL, out) == 0
    shipped = read_trace(TRACE)
    again = read_trace(out)
    # the routes first (readable failure), then the bytes
    np.testing.assert_array_equal(again.experts, shipped.experts)
    np.testing.assert_array_equal(again.token_id, shipped.token_id)
    np.testing.assert_allclose(again.gates, shipped.gates, atol=1e-5)
    assert routes_content_sha256(out) == REBUILT_ROUTES_CONTENT_SHA256
    # the files' bytes also record the writing tool's version (docs/design.md §3): compare what they hold
    import pyarrow.parquet as pq

    assert pq.read_table(out / "routes.parquet").equals(pq.read_table(TRACE / "routes.parquet"))

    def unversioned(path: Path) -> dict:
        return {k: v for k, v in json.loads(path.read_text()).items() if k not in ("schema_version", "tool_version")}

    ident = unversioned(out / "collection.json")
    assert ident["identity"]["model"] == "models/example-moe"
    assert ident == unversioned(TRACE / "collection.json")
