"""Analyses: the uniform null, the static identity, the gap decomposition and the permutation ablation."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from test_twin_large import random_stream

from expertcache.analysis import (
    access_histogram,
    access_share_table,
    concentration,
    expected_union_null,
    gap_decomposition,
    gate_mass_by_rank,
    permutation_ablation,
    permute_steps,
    regime_stats,
    static_misses_from_histogram,
    traffic_reading,
)
from expertcache.analysis.concentration import selection_counts
from expertcache.analysis.traffic import output_tokens
from expertcache.events import build_events
from expertcache.replay import ReplayConfig, capacities_for_rho, replay
from expertcache.trace import select_requests
from expertcache.trace.examples import example_trace


@pytest.fixture(scope="module")
def stream():
    return build_events(select_requests(example_trace(), range(0, 64, 4)), 8)


@pytest.mark.parametrize("N, k, B", [(128, 8, 8), (64, 8, 2), (40, 8, 16), (8, 2, 3)])
def test_uniform_null_matches_monte_carlo(N, k, B):
    rng = np.random.default_rng(N * 1000 + B)
    trials = 4000
    unions = [len({e for _ in range(B) for e in rng.choice(N, size=k, replace=False)}) for _ in range(trials)]
    mc = np.mean(unions)
    stderr = np.std(unions) / np.sqrt(trials)
    assert abs(expected_union_null(N, k, B) - mc) < 4 * stderr + 1e-9


def test_regime_ratio_and_capacity(stream):
    r = regime_stats(stream, 0.4)
    caps = capacities_for_rho(0.4, stream.n_layers, stream.n_experts)
    assert r.capacity_per_layer == tuple(caps.tolist())
    ratio = stream.event_size / caps[stream.layer]
    assert r.r_mean == pytest.approx(ratio.mean())
    assert r.r_fraction_over_1 == pytest.approx((ratio > 1).mean())
    assert r.union_mean == pytest.approx(stream.union / stream.n_events)
    assert 0 < r.reduction_vs_null < 1          # concurrent requests overlap more than independent ones


@pytest.mark.parametrize("rho", [0.1, 0.25, 0.4, 0.7])
def test_static_identity_holds_exactly(stream, rho):
    hist = access_histogram(stream)
    caps = capacities_for_rho(rho, stream.n_layers, stream.n_experts)
    predicted = static_misses_from_histogram(hist, caps)
    replayed = replay(stream, ReplayConfig("static-same-trace", rho=rho))
    assert predicted.tolist() == [x.demand_misses for x in replayed.per_layer]
    share = {r["fraction_of_blocks"]: r["share_of_accesses"] for r in access_share_table(hist, [rho])}[rho]
    assert replayed.union_miss_ratio == pytest.approx(1 - share, abs=1e-15)


def test_access_share_table_is_monotone(stream):
    rows = access_share_table(access_histogram(stream))
    shares = [r["share_of_accesses"] for r in rows]
    assert [r["fraction_of_blocks"] for r in rows] == [0.1, 0.2, 0.3, 0.4]
    assert shares == sorted(shares) and 0 < shares[0] < shares[-1] < 1


@pytest.mark.parametrize("rho", [0.2, 0.4])
def test_gap_shares_sum_to_one_and_match_replays(stream, rho):
    g = gap_decomposition(stream, rho, seeds=(0, 1, 2))
    assert g.admission_share + g.future_victim_share == pytest.approx(1.0, abs=1e-12)
    assert g.best_causal in ("lru", "lfu", "lfru", "least-stale")
    m = g.miss_fraction
    assert m["belady"] <= m["belady-forced"] <= max(m[p] for p in ("lru", "lfu", "lfru", "least-stale")) + 1e-12
    want = np.mean([replay(stream, ReplayConfig("belady", rho=rho, seed=s)).miss_fraction for s in (0, 1, 2)])
    assert m["belady"] == pytest.approx(want)
    assert g.gap == pytest.approx((m[g.best_causal] - m["belady"]) / m[g.best_causal])
    assert g.gap_spread is not None and g.gap_spread >= 0


def _event_multiset(s):
    return Counter((int(s.layer[i]), int(s.active[i]), tuple(s.members(i).tolist())) for i in range(s.n_events))


def test_permutation_preserves_the_event_multiset_and_r_bar(stream):
    rng = np.random.default_rng(5)
    perm = permute_steps(stream, rng)
    assert _event_multiset(perm) == _event_multiset(stream)
    assert regime_stats(perm, 0.4).r_mean == regime_stats(stream, 0.4).r_mean
    assert (perm.union, perm.logical, perm.n_events) == (stream.union, stream.logical, stream.n_events)
    assert not np.array_equal(perm.expert, stream.expert)     # the order did change
    # whole steps moved: within each new step, layers are still in order and complete
    assert np.all(np.diff(perm.step) >= 0)


def test_permutation_moves_every_array_by_whole_steps_as_a_plain_loop_does(stream):
    """The permuted stream's arrays against a loop over the steps in the drawn order, event by event (the members
    are moved a step's slice at a time)."""
    assert stream.gate_mass is not None
    perm = permute_steps(stream, np.random.default_rng(7))
    steps = np.unique(stream.step)
    order = np.random.default_rng(7).permutation(steps.shape[0])
    layer, active, expert, mult, gm, new_step = [], [], [], [], [], []
    for i, o in enumerate(order):
        for e in np.flatnonzero(stream.step == steps[o]):
            lo, hi = stream.offsets[e], stream.offsets[e + 1]
            layer.append(stream.layer[e])
            active.append(stream.active[e])
            new_step.append(i)
            expert += stream.expert[lo:hi].tolist()
            mult += stream.multiplicity[lo:hi].tolist()
            gm += stream.gate_mass[lo:hi].tolist()
    assert perm.step.tolist() == new_step and perm.layer.tolist() == layer and perm.active.tolist() == active
    assert perm.expert.tolist() == expert and perm.multiplicity.tolist() == mult
    assert perm.gate_mass.tolist() == gm
    assert (perm.expert.dtype, perm.multiplicity.dtype, perm.gate_mass.dtype) == (
        stream.expert.dtype, stream.multiplicity.dtype, stream.gate_mass.dtype)


def test_permutation_ablation_runs(stream):
    res = permutation_ablation(stream, n_permutations=3, seed=1, rho=0.4)
    assert len(res.permuted_gaps) == 3 and len(res.permuted_best_causal) == 3
    assert res.original_gap == gap_decomposition(stream, 0.4, seeds=(0,)).gap


def test_concentration_uniform_and_point_mass():
    uni = concentration(np.full((2, 8), 5), top_k=2)
    assert uni.overall_effective_experts == pytest.approx(8.0)
    assert uni.overall_topk_mass == pytest.approx(0.25)
    point = concentration(np.array([[10, 0, 0, 0]]), top_k=1)
    assert point.overall_max_frequency == 1.0 and point.overall_effective_experts == pytest.approx(1.0)


def test_concentration_from_trace_and_stream_agree():
    tr = select_requests(example_trace(), range(8))
    s = build_events(tr, 4)
    assert np.array_equal(selection_counts(tr), selection_counts(s))


def test_gate_mass_by_rank_is_a_descending_distribution():
    shares = gate_mass_by_rank(example_trace())
    assert shares.shape == (8,)
    assert shares.sum() == pytest.approx(1.0)
    assert np.all(np.diff(shares) <= 1e-12)


def test_gate_mass_by_rank_equals_its_plain_expression_on_ties_zeros_and_negatives():
    """The decode rows' gates sorted in place as float32 (in a copy) give the plain expression's shares exactly (the
    sort of the float64 copy, negated twice), with ties, zeros of either sign and negative gates, and prefill rows
    left out."""
    from types import SimpleNamespace

    from expertcache.trace import DECODE, PREFILL

    rng = np.random.default_rng(3)
    g = np.round(rng.normal(0.2, 0.3, size=(3000, 5, 8)), 2).astype(np.float32)
    g[::7, :, :3] = 0.0
    g[::11, :, 5:] = -0.0
    phase = np.where(rng.random(3000) < 0.8, DECODE, PREFILL).astype(np.int8)
    before = g.copy()
    got = gate_mass_by_rank(SimpleNamespace(gates=g, phase=phase))
    assert np.array_equal(g, before)                       # the trace's gates left as they were
    d = g[phase == DECODE].astype(np.float64)
    mass = (-np.sort(-d, axis=2)).sum(axis=(0, 1))
    assert got.tolist() == (mass / mass.sum()).tolist()
    assert gate_mass_by_rank(SimpleNamespace(gates=None, phase=phase)) is None


def test_traffic_reading_cells(stream):
    t = output_tokens(stream)
    assert t == stream.logical // (stream.top_k * stream.n_layers)
    r = traffic_reading(stream, causal_transferred=2 * t, offline_transferred=t, block_bytes=1e6, gap=0.5,
                        target_tokens_per_s=10, bandwidth_budget=2e7)
    assert r.offline_bytes_per_token == pytest.approx(1e6)
    assert r.offline_bandwidth_needed == pytest.approx(1e7)
    assert r.cell.startswith("large gap, offline within budget")
    r = traffic_reading(stream, 2 * t, t, 1e6, gap=0.05, target_tokens_per_s=10, bandwidth_budget=5e6)
    assert r.cell.startswith("small gap, offline over budget")
    assert "no budget" in traffic_reading(stream, 2 * t, t, 1e6, gap=0.05).cell


def test_random_stream_regime_handles_zero_capacity():
    s = random_stream(2)
    r = regime_stats(s, 0.0)
    assert r.r_fraction_over_1 == 1.0
