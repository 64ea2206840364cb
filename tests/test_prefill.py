"""Prefill events: both orders count the same logical work; one chunk gives identical events."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.events.prefill import prefill_events, uniform_prefill_estimate
from expertcache.replay import ReplayConfig, replay
from expertcache.trace.synth import SynthConfig, synthesize_trace


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
                                    "--seed", "0,1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [r["rho"] for r in out["rows"]] == [0.2, 0.3, 0.4]
    for r in out["rows"]:
        assert r["miss_fraction"]["belady"] <= r["miss_fraction"][r["best_causal"]]


def _hand_trace():
    """One layer, 4 experts, k=2. r0: prefill {0,1},{1,2}; decode {0,1},{2,3}. r1: prefill {3,0}; decode {3,2}."""
    from expertcache.trace import RoutingTrace

    req = np.array([0, 0, 0, 0, 1, 1], dtype=np.int32)
    phase = np.array([0, 0, 1, 1, 0, 1], dtype=np.int8)
    pos = np.array([0, 1, 2, 3, 0, 1], dtype=np.int32)
    ex = np.array([[[0, 1]], [[1, 2]], [[0, 1]], [[2, 3]], [[3, 0]], [[3, 2]]], dtype=np.int16)
    return RoutingTrace(1, 4, 2, ("r0", "r1"), req, phase, pos, ex, None, np.full(6, -1, dtype=np.int64))


def test_prefill_initialised_hand_counts():
    from expertcache.events.prefill import prefill_initialised_events

    t = _hand_trace()
    # B=1: only r0 is active at the first decode step; warm-up = r0's prefill in one chunk: {0,1,2}
    s = prefill_initialised_events(t, batch=1, chunk=2)
    assert s.provenance["warmup_events"] == 1 and s.provenance["warmup"]["requests"] == ["r0"]
    cfg = ReplayConfig("lru", capacity=(3,), tie_break="id", warmup_events=1)
    r = replay(s, cfg)
    # decode: {0,1} 2 hits | {2,3}: 2 hits, 3 misses (evicts 1: 0 and 1 are equally old, id keeps 0)
    # | r1 {2,3}: 2 hits
    assert (r.hits, r.demand_misses, r.union, r.n_events, r.warmup_events) == (5, 1, 6, 3, 1)
    cold = replay(s, ReplayConfig("lru", capacity=(3,), tie_break="id"))
    # without the warm-up setting the prefill event is counted too: 3 cold misses, then the same decode
    assert (cold.union, cold.hits, cold.demand_misses) == (9, 5, 4)
    # decode-only stream: {0,1} 2 misses, {2,3} 2 misses (evict 0), {2,3} 2 hits
    d = replay(build_events_for(t, 1), ReplayConfig("lru", capacity=(3,), tie_break="id"))
    assert (d.hits, d.demand_misses) == (2, 4)
    # B=2: both requests start together; warm-up = r0's prefill then r1's
    s2 = prefill_initialised_events(t, batch=2, chunk=2)
    assert s2.provenance["warmup"]["requests"] == ["r0", "r1"] and s2.provenance["warmup_events"] == 2


def build_events_for(t, batch):
    from expertcache.events import build_events

    return build_events(t, batch)


def test_cli_prefill_init_stream_replays_decode_only(tmp_path):
    from importlib.resources import files

    out = tmp_path / "s"
    trace_dir = str(files("expertcache") / "data" / "example_trace")
    r = CliRunner().invoke(main, ["events", "build", trace_dir, "-B", "4", "--prefill-init", "--prefill-chunk", "8",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "warm-up events" in r.output
    auto = json.loads(CliRunner().invoke(main, ["replay", str(out), "--json"]).output)
    cold = json.loads(CliRunner().invoke(main, ["replay", str(out), "--json", "--warmup-events", "0"]).output)
    assert auto["warmup_events"] > 0 and cold["warmup_events"] == 0
    assert auto["n_events"] == cold["n_events"] - auto["warmup_events"]
    assert auto["logical"] < cold["logical"]
