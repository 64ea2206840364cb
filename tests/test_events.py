"""EventStream building under FCFS continuous batching, against hand-derived schedules."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from expertcache.errors import ValidationError
from expertcache.events import ArrivalOffsets, EventStream, build_events, fcfs_schedule
from expertcache.trace import DECODE, RoutingTrace


def _trace(lengths, L=1, N=8, k=2, experts=None, gates=True):
    """Request r's token t at layer l routes to experts[r][t][l] (default: {r, r+1} mod N)."""
    rows_req, rows_pos, ex = [], [], []
    for r, n in enumerate(lengths):
        for t in range(n):
            rows_req.append(r)
            rows_pos.append(t)
            ex.append(
                [experts[r][t][layer] if experts else [r % N, (r + 1) % N] for layer in range(L)]
            )
    n = len(rows_req)
    ex = np.array(ex, dtype=np.int16).reshape(n, L, k)
    g = np.full((n, L, k), 0.5, dtype=np.float32) if gates else None
    return RoutingTrace(
        L,
        N,
        k,
        tuple(f"r{i}" for i in range(len(lengths))),
        np.array(rows_req, dtype=np.int32),
        np.full(n, DECODE, dtype=np.int8),
        np.array(rows_pos, dtype=np.int32),
        ex,
        g,
        np.full(n, -1, dtype=np.int64),
    )


def test_fcfs_schedule_hand_derived():
    # lengths 3, 1, 2, 2 with B = 2, all arriving at 0:
    # step 0: r0 r1; step 1: r0 r2 (r1 left); step 2: r0 r2; step 3: r3; step 4: r3
    step, req, tok = fcfs_schedule(np.array([3, 1, 2, 2]), np.zeros(4, dtype=np.int64), 2)
    got = list(zip(step.tolist(), req.tolist(), tok.tolist(), strict=True))
    assert got == [
        (0, 0, 0),
        (0, 1, 0),
        (1, 0, 1),
        (1, 2, 0),
        (2, 0, 2),
        (2, 2, 1),
        (3, 3, 0),
        (4, 3, 1),
    ]


def test_fcfs_schedule_with_stagger_and_idle_gap():
    # lengths 2, 1 arriving at 0 and 5 with B = 4: steps 0,1 (r0), nothing at 2..4, step 5 (r1)
    step, req, tok = fcfs_schedule(np.array([2, 1]), np.array([0, 5]), 4)
    assert step.tolist() == [0, 1, 5]
    assert req.tolist() == [0, 0, 1]


def test_fcfs_orders_by_arrival_then_input_order():
    # r1 arrives first (step 0), r0 at step 1; B = 1: r1 runs steps 0..1, then r0 steps 2..3
    step, req, _ = fcfs_schedule(np.array([2, 2]), np.array([1, 0]), 1)
    assert list(zip(step.tolist(), req.tolist(), strict=True)) == [(0, 1), (1, 1), (2, 0), (3, 0)]


def test_build_events_union_multiplicity_gate_mass():
    # two requests, one token each, one layer: r0 -> {1, 2}, r1 -> {2, 5}
    tr = _trace([1, 1], experts=[[[[1, 2]]], [[[2, 5]]]])
    s = build_events(tr, batch=2)
    assert s.n_events == 1
    assert s.members(0).tolist() == [1, 2, 5]
    assert s.multiplicity.tolist() == [1, 2, 1]
    assert np.allclose(s.gate_mass, [0.5, 1.0, 0.5])
    assert s.active.tolist() == [2]
    assert (s.logical, s.union) == (4, 3)


def test_build_events_per_layer_and_totals():
    tr = _trace([3, 2, 2], L=2)
    s = build_events(tr, batch=2)
    # steps: 0 (r0, r1), 1 (r0, r1), 2 (r0, r2), 3 (r2) -> 4 steps x 2 layers
    assert s.step.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert s.layer.tolist() == [0, 1] * 4
    assert s.active.tolist() == [2, 2, 2, 2, 2, 2, 1, 1]
    assert s.logical == 2 * (2 + 2 + 2 + 1) * 2
    # r0 -> {0,1}, r1 -> {1,2}: union 3 at steps 0, 1; r0+r2 -> {0,1,2,3}: 4; r2 -> {2,3}: 2
    assert s.event_size.tolist() == [3, 3, 3, 3, 4, 4, 2, 2]


def test_batch_one_has_no_deduplication():
    s = build_events(_trace([2, 3], L=3), batch=1)
    assert s.union == s.logical


def test_offsets_parse_and_arrivals():
    assert ArrivalOffsets.parse("zero").arrivals(3).tolist() == [0, 0, 0]
    assert ArrivalOffsets.parse("stagger:3").arrivals(3).tolist() == [0, 3, 6]
    a = ArrivalOffsets.parse("random:2:9", seed=4).arrivals(50)
    assert a.min() >= 2 and a.max() <= 9
    assert np.array_equal(a, ArrivalOffsets.parse("random:2:9", seed=4).arrivals(50))
    for bad in ("stagger", "random:5", "random:9:2", "stagger:-1", "nope"):
        with pytest.raises(ValidationError):
            ArrivalOffsets.parse(bad)


def test_stagger_changes_the_stream():
    tr = _trace([4, 4, 4], L=1)
    a = build_events(tr, batch=3)
    b = build_events(tr, batch=3, offsets=ArrivalOffsets.parse("stagger:2"))
    assert a.n_events == 4 and b.n_events == 8
    assert a.logical == b.logical


def test_from_lists_sorts_members_and_rejects_duplicates():
    s = EventStream.from_lists(1, 4, 1, [0], [0], [[3, 1]], [2], multiplicity=[[1, 1]])
    assert s.members(0).tolist() == [1, 3]
    with pytest.raises(ValidationError, match="distinct"):
        EventStream.from_lists(1, 4, 1, [0], [0], [[1, 1]], [2])
    with pytest.raises(ValidationError, match="duplicate"):
        EventStream.from_lists(1, 4, 1, [0, 0], [0, 0], [[1], [2]], [1, 1])


def test_a_built_stream_holds_its_members_once():
    """The member arrays of a step-sorted schedule are allocated for every (token, layer, slot) entry and shrunk in
    place to the union: each owns exactly its data (no larger buffer kept alive behind a view), and the stream equals
    the one the sorting build gives."""
    import expertcache.events.fcfs as ev
    from expertcache.trace.examples import example_model_trace

    tr = example_model_trace()
    s = ev.build_events(tr, 3)
    assert s.expert.shape[0] < tr.n_tokens * tr.n_layers * tr.top_k          # a union smaller than the entries
    for name in ("expert", "multiplicity", "gate_mass", "offsets"):
        a = getattr(s, name)
        assert a.base is None and a.flags.owndata, name
    step, req, tok, prov = ev.fcfs_decode_schedule(tr, 3)
    sorted_build = ev.events_from_schedule(tr, step, req, tok, prov)
    _, first = ev.decode_rows(tr)
    generic = ev._schedule_events(tr, np.asarray(step, dtype=np.int64), first[req] + tok)
    assert np.array_equal(sorted_build.expert, generic[2]) and np.array_equal(sorted_build.offsets, generic[1])
    assert np.array_equal(sorted_build.multiplicity, generic[3]) and np.allclose(sorted_build.gate_mass, generic[4])


def test_read_events_can_leave_gate_mass_unread(tmp_path, monkeypatch):
    """``gate_mass=False`` (what ``replay`` reads) gives the same stream less its gate mass, without decoding it;
    the replay's counts are the same."""
    from expertcache.events import read_events
    from expertcache.events import stream as stream_module
    from expertcache.replay import ReplayConfig, replay

    s = build_events(_trace([3, 2, 4], L=2), batch=2)
    s.save(tmp_path / "s")
    full = read_events(tmp_path / "s")
    assert full.gate_mass is not None and np.allclose(full.gate_mass, s.gate_mass)
    decode = stream_module._member_column

    def no_gate_mass(pf, name, offsets, src):
        assert name != "gate_mass", "gate mass decoded"
        return decode(pf, name, offsets, src)

    monkeypatch.setattr(stream_module, "_member_column", no_gate_mass)
    lean = read_events(tmp_path / "s", gate_mass=False)
    assert lean.gate_mass is None
    for name in ("step", "layer", "active", "logical_per_event", "offsets", "expert", "multiplicity"):
        assert np.array_equal(getattr(lean, name), getattr(full, name)), name
    cfg = ReplayConfig("lru", capacity=(2, 2), tie_break="id")
    assert replay(lean, cfg) == replay(full, cfg)


@pytest.mark.parametrize("kernel", ["step_layer_events", "_step_layer_events_any"])
@pytest.mark.parametrize("n_experts", [1, 8, 64, 65, 128, 129, 200, 1024, 1025, 4096])
def test_step_layer_events_equal_the_sorting_build(n_experts, kernel, monkeypatch):
    """The per-step kernel (up to N = 1,024 with no branch per entry, members read from the event's bits: two words
    in registers up to 128, words in memory past it; past 1,024, and at any N as ``_step_layer_events_any``, which
    ``benchmarks/event_build.py`` times, members read from bits where they span few words, else sorted by insertion)
    against the build that sorts every (token, layer, slot) entry: the same events, members, multiplicities and gate
    sums, bit for bit (zeros of either sign among the gates), on random schedules (N = 4096 with k = 2 takes the
    insertion sort)."""
    from expertcache.events import _kernels as K
    from expertcache.events.fcfs import _schedule_events, _sorted_schedule_events

    monkeypatch.setattr(K, "step_layer_events", getattr(K, kernel))

    rng = np.random.default_rng(n_experts)
    k = 2 if n_experts == 4096 else min(4, n_experts)
    L = 3
    lengths = rng.integers(1, 9, size=7).tolist()
    experts = [[[rng.choice(n_experts, size=k, replace=False).tolist() for _ in range(L)] for _ in range(n)]
               for n in lengths]
    tr = _trace(lengths, L=L, N=n_experts, k=k, experts=experts)
    gates = rng.random(tr.gates.shape).astype(np.float32)            # sums that depend on their order
    gates[rng.random(gates.shape) < 0.5] = -0.0
    gates[rng.random(gates.shape) < 0.1] = 0.0
    tr = replace(tr, gates=gates)
    rows = np.arange(tr.n_tokens)
    negative_zero_sums = 0
    for _ in range(5):
        step = np.sort(rng.integers(0, 6, size=rows.shape[0]))
        pick = rng.permutation(rows)                         # tokens of a step in any order
        a = _sorted_schedule_events(tr, step, pick)
        b = _schedule_events(tr, step, pick)
        for x, y, name in zip(a, b, ("ev_ids", "csr", "expert", "mult", "gm", "active"), strict=True):
            x, y = np.asarray(x), np.asarray(y)
            assert x.dtype == y.dtype and np.array_equal(x.view(np.uint8), y.view(np.uint8)), name
        negative_zero_sums += int((np.signbit(a[4]) & (a[4] == 0)).sum())
    assert negative_zero_sums, "no sum of -0.0 gates"


def test_the_event_build_benchmark_times_both_kernels_and_checks_them():
    """``benchmarks/event_build.py`` runs both per-step kernels on one schedule per batch, checks their outputs equal,
    prints ns per entry and the min and median ratios, and refuses bad arguments (and layers past 128 experts) in
    one line."""
    from conftest import assert_refused, run_benchmark

    for n_experts in (70, 300):                          # two words of bits in registers; words in memory
        r = run_benchmark("event_build.py", "--batches", "1,5", "--requests", "3", "--tokens", "20", "--experts",
                          str(n_experts), "--pairs", "2", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert (out["experts"], out["top_k"], out["pairs"]) == (n_experts, 8, 2)
        assert [x["batch"] for x in out["rows"]] == [1, 5]
        assert all(x["outputs_equal"] and x["entries"] == 3 * 20 * 48 * 8 and x["ours_ns"] > 0 and x["any_ns"] > 0
                   and 0 < x["ratio_min"] <= x["ratio"] for x in out["rows"])
    assert_refused("event_build.py", [["--experts", "1025"], ["--batches", "0"], ["--pairs", "x"]])
