"""``select_requests`` builds its trace from rows of a checked trace: the per-token checks run again, the passes
over every route (expert ranges and distinctness, finite gates) do not, and the result equals a trace built and
checked in full."""

from __future__ import annotations

import numpy as np
import pytest

from expertcache.errors import ValidationError
from expertcache.trace import RoutingTrace, select_requests
from expertcache.trace import model as trace_model
from expertcache.trace.synth import SynthConfig, synthesize_trace


def _trace() -> RoutingTrace:
    return synthesize_trace(SynthConfig(n_layers=3, n_experts=16, top_k=4, n_requests=6, decode_tokens=5, working_set=4,
                                    seed=3))


def _fields(t: RoutingTrace) -> dict:
    return {f: getattr(t, f) for f in t.__dataclass_fields__}


def test_selection_equals_a_trace_checked_in_full(monkeypatch):
    tr = _trace()
    sub = select_requests(tr, [4, 1, 2], note="three")
    full = RoutingTrace(**_fields(sub))                      # the same arrays through every check
    for name, value in _fields(full).items():
        got = getattr(sub, name)
        assert (np.array_equal(got, value) if isinstance(value, np.ndarray) else got == value), name
    assert sub.request_ids == tuple(tr.request_ids[i] for i in (4, 1, 2))
    assert sub.provenance["selection"] == "three"

    def refuse(*a, **k):
        raise AssertionError("the routes were checked again")

    monkeypatch.setattr(trace_model, "_validate_routes", refuse)
    select_requests(tr, [0, 5])                             # no pass over the routes
    with pytest.raises(AssertionError, match="checked again"):
        RoutingTrace(**_fields(sub))                        # a trace built from outside still gets them


def test_a_repeated_request_is_refused_by_the_per_token_checks():
    with pytest.raises(ValidationError, match="positions must strictly increase"):
        select_requests(_trace(), [2, 2])


def test_a_trace_from_outside_is_still_checked_route_by_route():
    f = _fields(select_requests(_trace(), [0, 1]))
    experts = f["experts"].copy()
    experts[0, 0, 1] = experts[0, 0, 0]
    with pytest.raises(ValidationError, match="distinct"):
        RoutingTrace(**{**f, "experts": experts})


def test_read_trace_reads_a_column_at_a_time_in_small_batches(tmp_path, monkeypatch):
    """``read_trace`` decodes one column at a time, batch by batch (never the whole table), and gives the trace
    it saved: with batches of 7 rows a token's rows and a request's id straddle batches (each batch with its own
    dictionary of request ids)."""
    import pyarrow.parquet as pq

    from expertcache.trace import read_trace

    tr = _trace()
    tr.save(tmp_path / "t")

    def refuse(*a, **k):
        raise AssertionError("the whole table was read")

    monkeypatch.setattr(pq, "read_table", refuse)
    monkeypatch.setattr(trace_model, "_READ_ROWS", 7)
    got = read_trace(tmp_path / "t")
    for name, value in _fields(tr).items():
        if name == "provenance":
            continue
        other = getattr(got, name)
        assert (np.array_equal(other, value) if isinstance(value, np.ndarray) else other == value), name
        if isinstance(other, np.ndarray):          # arrays of the trace's own, not read-only views of Arrow's
            assert other.flags.writeable, name
