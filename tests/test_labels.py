"""Per-request labels: both file forms, the trace's own categories, and the errors users meet."""

from __future__ import annotations

import json

import numpy as np
import pytest

from expertcache.errors import ValidationError
from expertcache.trace.labels import read_labels, request_categories
from expertcache.trace.synth import SynthConfig, synthesize_trace


@pytest.fixture(scope="module")
def trace():
    return synthesize_trace(SynthConfig(n_layers=1, n_experts=8, top_k=2, n_requests=4, decode_tokens=2,
                                        working_set=3, n_categories=2, seed=0))


def test_csv_and_jsonl_forms_read_the_same(tmp_path):
    (tmp_path / "l.csv").write_text("request_id,category,arm\nr0,math,diverse\nr1,code,fixed\n")
    (tmp_path / "l.jsonl").write_text(json.dumps({"request_id": "r0", "category": "math"}) + "\n\n"
                                      + json.dumps({"request_id": "r1", "category": "code"}) + "\n")
    assert read_labels(tmp_path / "l.csv") == read_labels(tmp_path / "l.jsonl") == {"r0": "math", "r1": "code"}


def test_trace_categories_codes_are_sorted_names(trace):
    codes, names = request_categories(trace)
    assert names == ("category-0", "category-1")
    # synth puts request r in category r % 2
    assert codes.tolist() == [0, 1, 0, 1]
    relabel = {rid: ("b" if i < 2 else "a") for i, rid in enumerate(trace.request_ids)}
    codes, names = request_categories(trace, relabel)
    assert names == ("a", "b") and np.array_equal(codes, [1, 1, 0, 0])


@pytest.mark.parametrize("text, message", [
    ("request,cat\nr0,math\n", "expected a header with 'request_id' and 'category'"),
    ("request_id,category\nr0,\n", "record 2: field 'category': expected a non-empty category string"),
    ("request_id,category\nr0,math\nr0,code\n", "request 'r0' labelled twice"),
    ("request_id,category\n", "no labels in the file"),
])
def test_bad_label_files(tmp_path, text, message):
    (tmp_path / "l.csv").write_text(text)
    with pytest.raises(ValidationError, match=message):
        read_labels(tmp_path / "l.csv")


def test_missing_file_and_unlabelled_requests(tmp_path, trace):
    with pytest.raises(ValidationError, match="labels file not found"):
        read_labels(tmp_path / "nope.csv")
    with pytest.raises(ValidationError, match="3 of 4 requests have no category"):
        request_categories(trace, {trace.request_ids[0]: "x"})
    bare = synthesize_trace(SynthConfig(n_layers=1, n_experts=8, top_k=2, n_requests=2, decode_tokens=2,
                                        working_set=3, seed=0))
    with pytest.raises(ValidationError, match="carries no request categories; pass a labels file"):
        request_categories(bare)
