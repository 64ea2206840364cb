"""The pinned-set and no-cache policies without per-access arrays: ``static`` / ``static-same-trace`` count and
replay in one pass each (``_kernels.block_counts``, ``_kernels.replay_static``), and ``demand`` misses every union
access without a replay loop. Counts by hand, against ``np.bincount`` over the stream's block ids, against the
naive twin in every semantics and scope, the hit flags, and the memory a replay takes."""

from __future__ import annotations

import tracemalloc

import naive
import numpy as np
import pytest

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, replay
from expertcache.replay import _kernels as K
from expertcache.replay import _kernels_order as KO
from expertcache.replay.engine import replay_hits, static_pinned_set


def _random_stream(rng, L, N, k, n_steps):
    steps, layers, exps = [], [], []
    for t in range(n_steps):
        for layer in range(L):
            steps.append(t)
            layers.append(layer)
            exps.append(sorted(rng.choice(N, int(rng.integers(1, k + 1)), replace=False).tolist()))
    return EventStream.from_lists(L, N, k, steps=steps, layers=layers, experts=exps, active=[1] * len(exps))


def test_block_counts_by_hand_and_against_bincount():
    s = EventStream.from_lists(2, 3, 2, steps=[0, 0, 1, 1], layers=[0, 1, 0, 1],
                               experts=[[0, 2], [1], [2], [1, 2]], active=[1, 1, 1, 1])
    # layer 0: expert 0 once, 2 twice; layer 1: expert 1 twice, 2 once
    assert K.block_counts(s.offsets, s.expert, s.layer, 3, 2).tolist() == [1, 0, 2, 0, 2, 1]
    rng = np.random.default_rng(3)
    for _ in range(20):
        L, N = int(rng.integers(1, 6)), int(rng.integers(1, 40))
        s = _random_stream(rng, L, N, int(rng.integers(1, N + 1)), int(rng.integers(1, 30)))
        want = np.bincount(s.block, minlength=s.n_blocks)
        assert np.array_equal(K.block_counts(s.offsets, s.expert, s.layer, N, L), want)


def test_static_by_hand_with_ties_warm_up_and_flags():
    # one layer of 4 experts; counts: e0 3, e1 1, e2 3, e3 0. A quota of 2 pins e0 and e2; a quota of 1 pins the
    # one of e0 / e2 with the larger tie rank: under tie_break "id" block b has rank n_blocks - b, so e0.
    s = EventStream.from_lists(1, 4, 3, steps=[0, 1, 2, 3], layers=[0, 0, 0, 0],
                               experts=[[0, 2], [0, 1, 2], [2], [0]], active=[1, 1, 1, 1])
    r, hit = replay_hits(s, ReplayConfig("static-same-trace", capacity=(2,), tie_break="id"))
    assert hit.astype(int).tolist() == [1, 1, 1, 0, 1, 1, 1]
    assert (r.hits, r.demand_misses, r.initial_load) == (6, 1, 2)
    r, hit = replay_hits(s, ReplayConfig("static-same-trace", capacity=(1,), tie_break="id"))
    assert hit.astype(int).tolist() == [1, 0, 1, 0, 0, 0, 1]
    assert (r.hits, r.demand_misses, r.initial_load) == (3, 4, 1)
    # warm-up: the first two events (5 accesses) are not counted, their flags still set
    r, hit = replay_hits(s, ReplayConfig("static-same-trace", capacity=(1,), tie_break="id", warmup_events=2))
    assert hit.astype(int).tolist() == [1, 0, 1, 0, 0, 0, 1]
    assert (r.hits, r.demand_misses) == (1, 1)


def test_static_pinned_set_is_each_partitions_most_accessed():
    rng = np.random.default_rng(11)
    for _ in range(30):
        L, N = int(rng.integers(1, 5)), int(rng.integers(1, 25))
        s = _random_stream(rng, L, N, int(rng.integers(1, N + 1)), int(rng.integers(1, 20)))
        tie = rng.permutation(L * N).astype(np.int64)
        counts = np.bincount(s.block, minlength=L * N)
        for scope in ("per-layer", "global"):
            parts = [range(L * N)] if scope == "global" else [range(l * N, (l + 1) * N) for l in range(L)]
            caps = rng.integers(0, L * N + 2 if scope == "global" else N + 2, size=len(parts))
            got = static_pinned_set(s, caps, scope, tie)
            want = np.zeros(L * N, bool)
            for p, blocks in enumerate(parts):       # a plain sort of (count, tie rank), largest first
                best = sorted(blocks, key=lambda b: (counts[b], tie[b]), reverse=True)
                want[best[:int(caps[p])]] = True
            assert np.array_equal(got, want), (scope, caps)


@pytest.mark.parametrize("policy", ["static", "static-same-trace", "demand"])
def test_engine_equals_the_twin_in_every_semantics_and_scope(policy):
    rng = np.random.default_rng({"static": 1, "static-same-trace": 2, "demand": 3}[policy])
    for _ in range(6):
        L, N = int(rng.integers(1, 4)), int(rng.integers(2, 16))
        k = int(rng.integers(1, N + 1))
        s = _random_stream(rng, L, N, k, int(rng.integers(2, 25)))
        cal = _random_stream(rng, L, N, k, int(rng.integers(1, 10)))
        for scope in ("per-layer", "global"):
            for semantics in ("event-atomic", "sequential-ascending", "sequential-random"):
                kw = dict(scope=scope, semantics=semantics, rho=float(rng.choice([0.0, 0.25, 0.5, 1.0])),
                          tie_break=str(rng.choice(["random", "id"])), seed=int(rng.integers(0, 5)),
                          warmup_events=int(rng.integers(0, 3)))
                calibration = cal if policy == "static" else None
                got = replay(s, ReplayConfig(policy, **kw), calibration=calibration)
                want = naive.naive_replay(s, policy, calibration=calibration, **kw)
                assert (got.hits, got.demand_misses, got.initial_load) == (
                    want["hits"], want["demand_misses"], want["initial_load"]), (policy, kw)
                if semantics != "sequential-random":
                    _, hit = replay_hits(s, ReplayConfig(policy, **kw), calibration=calibration)
                    if policy == "demand":
                        assert not hit.any()
                    else:
                        assert int(hit[np.repeat(np.arange(s.n_events), s.event_size)
                                       >= kw["warmup_events"]].sum()) == got.hits


def test_demand_does_not_shuffle(monkeypatch):
    """demand misses every access in any order: sequential-random neither shuffles nor replays."""
    def refuse(*a, **k):
        raise AssertionError("demand shuffled the stream")

    monkeypatch.setattr(KO, "shuffled_replay", refuse)
    monkeypatch.setattr(KO, "shuffle_events", refuse)
    s = _random_stream(np.random.default_rng(4), 2, 8, 3, 20)
    r = replay(s, ReplayConfig("demand", rho=0.5, semantics="sequential-random"))
    assert (r.hits, r.demand_misses) == (0, s.union)


@pytest.mark.parametrize("policy", ["static-same-trace", "demand"])
def test_replay_allocates_no_per_access_arrays(policy):
    """The replay's own allocations stay below one byte per access (the pinned set's replay built the stream's
    block ids, a layer per access and a weight per access: 22 bytes per access)."""
    s = _random_stream(np.random.default_rng(9), 4, 64, 8, 2000)
    cfg = ReplayConfig(policy, rho=0.25)
    replay(s, cfg)                                           # compile / load the kernels first
    tracemalloc.start()
    try:
        replay(s, cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert s.union > 30_000 and peak < s.union, (peak, s.union)


def test_selection_counts_equal_bincounts_of_every_route():
    """``analysis.concentration.selection_counts`` (a layer at a time for a trace, ``block_weights`` for a stream)
    against ``np.bincount`` over every decode route's global block id, and over the stream's block ids weighted by
    multiplicity."""
    from expertcache.analysis.concentration import selection_counts
    from expertcache.events import build_events
    from expertcache.trace import DECODE
    from expertcache.trace.synth import SynthConfig, synthesize_trace

    tr = synthesize_trace(SynthConfig(n_layers=3, n_experts=16, top_k=4, n_requests=5, decode_tokens=7,
                                      prefill_tokens=3, working_set=5, seed=2))
    L, N = tr.n_layers, tr.n_experts
    ex = tr.experts[tr.phase == DECODE].astype(np.int64)
    want = np.bincount((np.arange(L)[None, :, None] * N + ex).ravel(), minlength=L * N).reshape(L, N)
    assert np.array_equal(selection_counts(tr), want)
    s = build_events(tr, 3)
    want = np.bincount(s.block, weights=s.multiplicity, minlength=L * N).astype(np.int64).reshape(L, N)
    got = selection_counts(s)
    assert got.dtype == np.int64 and np.array_equal(got, want)
