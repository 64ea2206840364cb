"""Event-atomic per-layer lru and lfu on lanes of unit keys and counts (``replay/_kernels_belady_lanes``'s
``replay_lru_lanes`` and ``replay_lfu_lanes``).

Each loop is compared, counts and per-access hit flags, against the generic loop of its policy (``_kernels.replay_lru``,
the list loop, and ``replay_heap`` with lfu's key, called directly) on random streams whose layers take every lane
width (16, 64 and 128 lanes), its rounds from the far end, the near end and by its rule, warm-up, events larger than
the quota, capacities from 0 to beyond the layer; against counts derived by hand; the engine's choice between it and
its other loop (the recency buckets, the bit-sliced counts); and the benchmark script.
"""

from __future__ import annotations

import json
from unittest import mock

import numpy as np
import pytest
from conftest import BAD_SHAPE_ARGS, assert_refused, run_benchmark
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_belady_lanes import random_case
from test_fast_lru_belady import old_kernel, random_stream
from test_fast_policies import _generic

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, replay_hits
from expertcache.replay import _kernels_belady_lanes as KBL
from expertcache.replay import engine as E
from expertcache.replay.keys import KEY_LFU

#: keep_ratio: the loop's own rule (None: its default, ``LRU_KEEP_RATIO`` / ``LFU_KEEP_RATIO``), the near end always
#: (0: the loop's test ``keep_group * k < e * E`` then holds whenever a block leaves), the far end always (1e12).
RATIOS = [None, 0.0, 1e12]


def reference(stream: EventStream, policy: str, caps: np.ndarray, tie_seed: int, warmup: int):
    """Counts and hit flags of the generic loop: replay_lru's list (lru), replay_heap with lfu's key (counts that
    persist)."""
    if policy == "lru":
        return old_kernel(stream, "lru", caps, "random", tie_seed, warmup)
    hits, misses, flags = _generic(stream, ReplayConfig("lfu", warmup_events=warmup), True, False, caps,
                                   E._tie_ranks("random", tie_seed, stream.n_layers * stream.n_experts), KEY_LFU, -1.0,
                                   False)
    return hits, misses, flags.astype(bool)


LANES = {"lru": KBL.replay_lru_lanes, "lfu": KBL.replay_lfu_lanes}


def reference_and_lanes(policy: str, stream: EventStream, caps, warmup: int, tie_seed: int) -> None:
    """The lanes loop's counts and hit flags, from each end, equal the generic loop's."""
    L, N = stream.n_layers, stream.n_experts
    caps = np.asarray(caps, dtype=np.int64)
    hits, misses, flags = reference(stream, policy, caps, tie_seed, warmup)
    _, tie_pos = E._tie_order(E._tie_ranks("random", tie_seed, L * N), L, N)
    for ratio in RATIOS:
        got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
        LANES[policy](stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos, warmup, *got,
                      *(() if ratio is None else (ratio,)))
        assert got[0].tolist() == hits.tolist() and got[1].tolist() == misses.tolist(), (ratio, caps.tolist())
        assert np.array_equal(got[2].astype(bool), flags), (ratio, caps.tolist())


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@given(seed=st.integers(0, 2**32 - 1), N=st.sampled_from([1, 5, 16, 17, 63, 64, 65, 100, 128]),
       L=st.integers(1, 3), data=st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_lanes_equal_the_generic_loop_on_random_streams(policy, seed, N, L, data):
    reference_and_lanes(policy, *random_case(seed, N, L, data))


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("N", [8, 16, 40, 64, 128])
@pytest.mark.parametrize("max_size", [1, 8, 60])
def test_lanes_equal_the_generic_loop_at_every_rho(policy, N, max_size):
    """Events of one block, of up to 8 and of up to 60 members against quotas from 0 to the whole layer: groups (a
    unit's blocks, blocks of one count) split at every count, from either end."""
    rng = np.random.default_rng([N, max_size, 49])
    stream = random_stream(rng, 2, N, n_steps=150, max_size=min(N, max_size), alpha=0.7)
    for rho in (0.0, 0.05, 0.1, 0.25, 0.4, 0.75, 0.9, 1.0):
        reference_and_lanes(policy, stream, E.capacities_for_rho(rho, 2, N), 11, 5)


def test_counts_by_hand():
    """One layer of 4 experts, quota 2, tie position = expert id (the lower leaves first among equal keys): events
    {0,1,2} {1} {3} {0} {1,2} {3}.

    lru: e0 misses 3 and keeps {1,2} (0 leaves: the lowest of the unit); e1: 1 hits; e2: 3 misses, and of {1 (e1),
    2 (e0)} 2 leaves: {1,3}; e3: 0 misses, 1 (e1) leaves: {0,3}; e4: 1 and 2 miss, and 0 and 3 leave: {1,2};
    e5: 3 misses, and 1 and 2 (both e4) leave the lower, 1: {2,3}. 1 hit, 8 misses.
    lfu (counts after the unit's accesses): e0 as lru; e1: 1 hits (count 2); e2: 3 misses (1), and of 2 and 3 (1
    each) 2 leaves: {1,3}; e3: 0 misses (2), 3 (1) leaves: {0,1}; e4: 1 hits (3), 2 misses (2), and of 0 and 2 (2
    each) 0 leaves: {1,2}; e5: 3 misses (2), and of 2 and 3 (2 each) 2 leaves. 2 hits, 7 misses."""
    rows = [[0, 1, 2], [1], [3], [0], [1, 2], [3]]
    s = EventStream.from_lists(1, 4, 4, steps=list(range(6)), layers=[0] * 6, experts=rows, active=[1] * 6)
    for policy, want in (("lru", (1, 8, [0, 0, 0, 1, 0, 0, 0, 0, 0])), ("lfu", (2, 7, [0, 0, 0, 1, 0, 0, 1, 0, 0]))):
        for ratio in RATIOS:
            h, m, f = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(s.union, np.uint8)
            LANES[policy](s.offsets, s.expert, s.layer, 4, 1, np.array([2]), np.arange(4), 0, h, m, f,
                          *(() if ratio is None else (ratio,)))
            assert (h[0], m[0], f.tolist()) == want, (policy, ratio)
    # the engine (quota 3 = 2 mean events: the lanes), tie_break="id" (lower ids rank higher: the higher id of a unit
    # leaves first): e0 fills the quota; e1: 1 hits; e2: 3 misses, and of e0's {0,2} 2 leaves; e3: 0 hits; e4: 1 hits,
    # 2 misses and 3 (e2) leaves; e5: 3 misses and 0 (e3) leaves. 3 hits.
    assert KBL.lru_lanes_pay(4, [3], s.union / s.n_events)
    result, flags = replay_hits(s, ReplayConfig("lru", capacity=(3,), tie_break="id"))
    assert result.hits == 3 and flags.tolist() == [0, 0, 0, 1, 0, 1, 1, 0, 0]


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_the_lanes_refuse_layers_past_128(policy):
    s = EventStream.from_lists(1, 129, 129, steps=[0], layers=[0], experts=[[0]], active=[1])
    with pytest.raises(ValueError, match=f"the {policy} lanes take at most 128"):
        LANES[policy](s.offsets, s.expert, s.layer, 129, 1, np.array([2]), np.arange(129), 0, np.zeros(1, np.int64),
                      np.zeros(1, np.int64), np.zeros(0, np.uint8))


@pytest.mark.parametrize("wide", [True, False])
def test_the_rules_quotas_follow_the_vector_width(wide):
    """With 512-bit vectors the lanes take lru from 1.58 mean events and lfu from 3 (64 experts) or 5 (128); without,
    lru past 16 experts from 2.6, lfu from 4.5 and 8: the reductions over 64 or 128 lanes cost twice the
    instructions. Layers of 16 experts or fewer the same on both."""
    with mock.patch.object(KBL, "WIDE_VECTORS", wide):
        assert KBL.lru_lanes_pay(128, [16], 8.0) is wide and KBL.lru_lanes_pay(32, [16], 8.0) is wide    # 2.0
        assert KBL.lru_lanes_pay(128, [21], 8.0) and KBL.lru_lanes_pay(16, [13], 8.0)   # 2.6; 16 experts at 1.6
        assert not KBL.lru_lanes_pay(16, [12], 8.0)                                     # 1.5
        assert KBL.lfu_lanes_pay(64, [32], 8.0) is wide and KBL.lfu_lanes_pay(128, [56], 8.0) is wide   # 4.0, 7.0
        assert KBL.lfu_lanes_pay(64, [36], 8.0) and KBL.lfu_lanes_pay(128, [64], 8.0)   # 4.5, 8.0
        assert not KBL.lfu_lanes_pay(64, [23], 8.0) and not KBL.lfu_lanes_pay(128, [39], 8.0)   # 2.9, 4.9
        assert KBL.lfu_lanes_pay(32, [16], 8.0) and not KBL.lfu_lanes_pay(32, [15], 8.0)        # 2.0, 1.9


#: Per policy: the engine's rule, its other loop (the name it is imported under in _kernels_belady_lanes), the rows
#: of the mocked test below in which the rule takes the lanes (N, rho).
ENGINE = {"lru": ("lru_lanes_pay", "replay_lru_bits", {(16, 0.5), (64, 0.5), (128, 0.5)}),
          "lfu": ("lfu_lanes_pay", "replay_lfu_bits", {(8, 0.05), (8, 0.5), (16, 0.05), (16, 0.5), (64, 0.5),
                                                       (128, 0.5)})}


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("N", [8, 16, 64, 128, 130])
def test_the_engine_takes_the_lanes_where_they_pay(policy, N):
    """lru / lfu per layer, event-atomic: the lanes where lru_lanes_pay / lfu_lanes_pay holds (at most 128 experts,
    quotas of enough mean events for the layer's size), else the recency buckets / the bit-sliced counts; the same
    counts either way, and prefetch's demand replay (no budget) takes the same loop. lfu with in-cache counters never
    takes the lanes."""
    from expertcache.replay import _kernels_bits as KB
    from expertcache.replay.proactive import ProactiveConfig, replay_proactive

    rule, other_loop, lanes_rows = ENGINE[policy]
    rng = np.random.default_rng(N)
    stream = random_stream(rng, 2, N, n_steps=60, max_size=min(N, 8), alpha=0.9)
    mean_event = stream.union / stream.n_events
    for rho in (0.05, 0.5):
        cfg = ReplayConfig(policy, rho=rho)
        want = getattr(KBL, rule)(N, E.capacities_for_rho(rho, 2, N), mean_event)
        assert want == ((N, rho) in lanes_rows), (N, rho, mean_event)
        with mock.patch.object(KBL, f"replay_{policy}_lanes", wraps=LANES[policy]) as lanes, \
                mock.patch.object(KBL, other_loop, wraps=getattr(KB, other_loop)) as other:
            result, flags = replay_hits(stream, cfg)
            pro = replay_proactive(stream, ProactiveConfig(rho=rho, priority=policy, prefetch_budget=0))
            if policy == "lfu":
                replay_hits(stream, ReplayConfig(policy, rho=rho, lfu_in_cache_counters=True))
        # (lfu's in-cache counters on the bit-sliced counts, always)
        assert (lanes.call_count, other.call_count) == (2 * want, 2 * (not want) + (policy == "lfu"))
        assert pro.hits == result.hits
        if N <= 128:                   # the other loop, forced: the same counts and flags
            with mock.patch.object(KBL, rule, lambda *a, other=not want: other):
                forced, forced_flags = replay_hits(stream, cfg)
            assert forced == result and np.array_equal(forced_flags, flags)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_the_lanes_benchmark_times_both_loops_and_checks_them(policy):
    """``benchmarks/layer_lanes.py`` runs, checks the counts it times, names the engine's loop per row (as
    ``lru_lanes_pay`` / ``lfu_lanes_pay`` decides it), prints min and median ratios, and refuses bad arguments (and
    layers past 128 experts) in one line."""
    r = run_benchmark("layer_lanes.py", "--policy", policy, "--shapes", "4x16x2,2x100x4", "--batches", "1,3",
                      "--rhos", "0.1,0.9", "--accesses", "5000", "--pairs", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = out["rows"]
    assert out["policy"] == policy
    assert [(x["shape"], x["batch"], x["rho"]) for x in rows] == [
        (sh, b, rho) for sh in ("4x16x2", "2x100x4") for b in (1, 3) for rho in (0.1, 0.9)]
    assert all(x["hits_equal"] and x["lanes_ns"] > 0 and x["other_ns"] > 0 and 0 < x["ratio_min"] <= x["ratio"]
               for x in rows)
    rule = getattr(KBL, ENGINE[policy][0])
    for x in rows:
        L, N, _ = (int(v) for v in x["shape"].split("x"))
        assert x["engine_lanes"] == rule(N, E.capacities_for_rho(x["rho"], L, N), x["mean_event"]), x
    assert any(x["engine_lanes"] for x in rows) and not all(x["engine_lanes"] for x in rows)
    if policy == "lru":
        assert_refused("layer_lanes.py", [*BAD_SHAPE_ARGS, ["--policy", "lrfu"]])
        r = run_benchmark("layer_lanes.py", "--shapes", "2x256x8")
        assert r.returncode == 2 and "at most 128" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("loop", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_either_loop_equals_the_naive_twin(policy, loop, seed):
    """The engine's per-layer replay with the lanes (``loop``) or the other loop forced: counts and hit sets equal the
    naive twin's (tests/naive.py), quotas from 0 past the layer, warm-up."""
    import naive

    rng = np.random.default_rng([seed, 49])
    N = [6, 13, 64, 100][seed % 4]
    L = 1 + seed % 3
    stream = random_stream(rng, L, N, n_steps=25, max_size=min(N, 12), alpha=1.0)
    rule = ENGINE[policy][0]
    for caps in ([0] * L, [1] * L, [3] * L, [7] * L, [N] * L, [N + 3] * L, list(range(2, 2 + L))):
        for warmup in (0, 5):
            cfg = ReplayConfig(policy, capacity=tuple(caps), tie_break="random", seed=seed, warmup_events=warmup)
            want_sets: list[set[int]] = []
            want = naive.naive_replay(stream, policy, capacity=caps, seed=seed, warmup_events=warmup,
                                      hit_sets=want_sets)
            with mock.patch.object(KBL, rule, lambda *a: loop):
                result, flags = replay_hits(stream, cfg)
            assert result.hits == want["hits"] and result.demand_misses == want["demand_misses"]
            got_sets = [set(stream.block[lo:hi][flags[lo:hi]].tolist())
                        for lo, hi in zip(stream.offsets[:-1], stream.offsets[1:], strict=True)]
            assert got_sets == want_sets
