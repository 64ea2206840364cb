"""The engine against the naive twin on larger seeded streams.

The hypothesis streams of ``test_twin.py`` keep N <= 6, so no unit there
evicts more than a handful of blocks; these streams (N = 40, events of up to
30 experts, heaps of hundreds of blocks under global scope) exercise the deep
heap paths and the full-sort branch of the scan loop.
"""

from __future__ import annotations

import naive
import numpy as np
import pytest

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, policy_names, replay


def random_stream(seed: int, L: int = 3, N: int = 40, k: int = 6, steps: int = 14) -> EventStream:
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, N + 1) ** 1.1
    w /= w.sum()
    rows = []
    for s in range(steps):
        for layer in range(L):
            if rng.random() < 0.15:
                continue  # missing (step, layer) events
            active = int(rng.integers(1, 9))
            picks = set()
            for _ in range(active):
                picks.update(rng.choice(N, size=k, replace=False, p=w).tolist())
            rows.append((s, layer, sorted(picks), active))
    return EventStream.from_lists(L, N, k, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                                  [r[3] for r in rows])


def counts(res) -> tuple:
    return (res.hits, res.demand_misses, res.initial_load, res.transferred,
            tuple(x.hits for x in res.per_layer), tuple(x.demand_misses for x in res.per_layer))


def twin_counts(d: dict) -> tuple:
    return (d["hits"], d["demand_misses"], d["initial_load"], d["transferred"],
            tuple(d["per_layer_hits"]), tuple(d["per_layer_demand_misses"]))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("scope", ["per-layer", "global"])
@pytest.mark.parametrize("semantics", ["event-atomic", "sequential-ascending", "sequential-random"])
def test_engine_matches_twin_on_larger_streams(seed, scope, semantics):
    stream = random_stream(seed)
    calib = random_stream(seed + 100)
    assert stream.event_size.max() > 20  # a unit can evict more than 8 blocks
    for rho in (0.05, 0.3, 0.7):
        for tie_break, tie_seed in (("id", 0), ("random", seed + 5)):
            for policy in policy_names(advice=False):
                kw = dict(rho=rho, scope=scope, semantics=semantics, tie_break=tie_break, seed=tie_seed)
                got = replay(stream, ReplayConfig(policy, **kw), calibration=calib)
                want = naive.naive_replay(stream, policy, calibration=calib, **kw)
                assert counts(got) == twin_counts(want), (policy, kw)


@pytest.mark.parametrize("policy", ["belady", "belady-forced", "lru", "demand"])
@pytest.mark.parametrize("scope", ["per-layer", "global"])
@pytest.mark.parametrize("semantics", ["event-atomic", "sequential-random"])
def test_dedicated_loops_equal_the_generic_heap(policy, scope, semantics):
    """lru and belady have dedicated loops; the generic key heap (used for huge universes) agrees."""
    from expertcache.replay import engine, get_policy

    stream = random_stream(7, N=40, steps=20)
    for rho in (0.0, 0.1, 0.5):
        cfg = ReplayConfig(policy, rho=rho, scope=scope, semantics=semantics, seed=3)
        pol = get_policy(policy)
        L = stream.n_layers
        caps = (np.array([engine.total_capacity(rho, L, stream.n_experts)]) if scope == "global"
                else engine.capacities_for_rho(rho, L, stream.n_experts))
        if policy == "demand":
            caps = np.zeros_like(caps)
        tie = engine._tie_ranks("random", 3, stream.n_blocks)
        hits, misses = np.zeros(L, dtype=np.int64), np.zeros(L, dtype=np.int64)
        engine._loop_generic(engine._kernel_inputs(stream, cfg, pol.needs_next_use), cfg, pol, caps, tie,
                             hits, misses)
        res = replay(stream, cfg)
        assert [x.hits for x in res.per_layer] == hits.tolist(), (policy, rho)
        assert [x.demand_misses for x in res.per_layer] == misses.tolist(), (policy, rho)
