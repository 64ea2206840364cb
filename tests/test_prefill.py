"""Prefill events: both orders count the same logical work; one chunk gives identical events."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.prefill import prefill_events, uniform_prefill_estimate
from expertcache.replay import ReplayConfig, replay
from expertcache.synth import SynthConfig, synthesize_trace


@pytest.fixture(scope="module")
def trace():
    return synthesize_trace(SynthConfig(n_layers=4, n_experts=32, top_k=4, n_requests=5, decode_tokens=3,
                                        prefill_tokens=40, working_set=6, seed=4))


@pytest.mark.parametrize("chunk", [1, 7, 16, 40])
def test_orders_have_the_same_logical_work_and_union(trace, chunk):
    a = prefill_events(trace, chunk, "chunk-major")
    b = prefill_events(trace, chunk, "layer-major")
    assert a.logical == b.logical == 5 * 40 * 4 * 4
    assert a.union == b.union and a.n_events == b.n_events
    # per-layer caches see the same sequence in both orders
    for policy in ("lru", "belady"):
        assert (replay(a, ReplayConfig(policy)).transferred == replay(b, ReplayConfig(policy)).transferred)


def test_one_chunk_gives_identical_events(trace):
    a = prefill_events(trace, 40, "chunk-major")
    b = prefill_events(trace, 40, "layer-major")
    for name in ("layer", "active", "offsets", "expert", "multiplicity", "logical_per_event"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_layer_major_saves_traffic_under_a_shared_pool(trace):
    a = prefill_events(trace, 4, "chunk-major")
    b = prefill_events(trace, 4, "layer-major")
    cfg = ReplayConfig("lru", scope="global")
    assert replay(b, cfg).transferred < replay(a, cfg).transferred
    est = uniform_prefill_estimate(4, 32, 4, 40, 4, 0.4)
    assert est["chunk_major"] > est["layer_major"]


def test_prefill_input_errors(trace):
    with pytest.raises(ValidationError):
        prefill_events(trace, 0)
    decode_only = synthesize_trace(SynthConfig(n_layers=1, n_experts=8, top_k=2, n_requests=2, decode_tokens=2,
                                               working_set=4))
    with pytest.raises(ValidationError, match="no prefill tokens"):
        prefill_events(decode_only, 4)


def test_prefill_order_command(trace, tmp_path):
    trace.save(tmp_path / "t")
    res = CliRunner().invoke(main, ["experiment", "prefill-order", str(tmp_path / "t"), "--chunk", "8", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert {r["order"] for r in out["rows"]} == {"chunk-major", "layer-major"}
    assert out["scope"]["lossless"] is True


def test_prefill_gap_command(trace, tmp_path):
    trace.save(tmp_path / "t2")
    res = CliRunner().invoke(main, ["experiment", "prefill-gap", str(tmp_path / "t2"), "--chunk", "8",
                                    "--seeds", "0,1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [r["rho"] for r in out["rows"]] == [0.2, 0.3, 0.4]
    for r in out["rows"]:
        assert r["miss_fraction"]["belady"] <= r["miss_fraction"][r["best_causal"]]
