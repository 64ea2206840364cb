"""One-pass miss-ratio curves equal separate replays at every capacity.

The one-pass path (Mattson stack depths) must agree exactly with independent
``replay`` calls — and, through test_twin, with the naive twin — for every
stack policy, semantics and tie order; non-stack configurations loop.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_twin import streams
from test_twin_large import random_stream

from expertcache.replay import ReplayConfig, one_pass_supported, policy_names, replay, replay_curve

STACK = ["lru", "least-stale", "lfu", "lfru", "lrfu", "belady"]
SEMANTICS = ["event-atomic", "sequential-ascending", "sequential-random"]


def key(r):
    return (r.rho, r.hits, r.demand_misses, r.transferred, r.capacity_total,
            tuple((x.capacity, x.hits, x.demand_misses) for x in r.per_layer))


def check_curve(stream, cfg, rhos):
    got = replay_curve(stream, cfg, rhos)
    want = [replay(stream, ReplayConfig(**{**cfg.__dict__, "rho": r})) for r in rhos]
    assert [key(r) for r in got] == [key(r) for r in want], cfg


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.sampled_from(STACK), st.sampled_from(SEMANTICS), st.sampled_from(["id", "random"]),
       st.integers(0, 50), st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=6))
def test_one_pass_equals_separate_replays_on_random_streams(stream, policy, semantics, tie_break, seed, rhos):
    cfg = ReplayConfig(policy, semantics=semantics, tie_break=tie_break, seed=seed)
    assert one_pass_supported(cfg)
    check_curve(stream, cfg, rhos)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", STACK)
def test_one_pass_on_larger_streams(seed, policy):
    stream = random_stream(seed, N=64, steps=20)
    grid = np.round(np.arange(0.0, 1.0001, 0.05), 4).tolist()
    for semantics in SEMANTICS:
        check_curve(stream, ReplayConfig(policy, semantics=semantics, seed=seed), grid)


@pytest.mark.parametrize("cfg", [
    ReplayConfig("belady-forced"), ReplayConfig("lfu", lfu_in_cache_counters=True),
    ReplayConfig("lru", scope="global"), ReplayConfig("demand"), ReplayConfig("static-same-trace"),
])
def test_non_stack_configurations_fall_back_to_a_loop(cfg):
    assert not one_pass_supported(cfg)
    check_curve(random_stream(1), cfg, [0.1, 0.3, 0.5])


def test_registry_marks_exactly_the_stack_policies():
    from expertcache.replay import get_policy

    assert sorted(p for p in policy_names() if get_policy(p).stack) == sorted(STACK)
