"""Event-atomic per-layer lru on lanes of unit keys (``replay/_kernels_belady_lanes.replay_lru_lanes``).

The loop is compared, counts and per-access hit flags, against the list loop it stands in for (``_kernels.replay_lru``,
called directly) on random streams whose layers take every lane width (16, 64 and 128 lanes), its rounds from the far
end, the near end and by its rule, warm-up, events larger than the quota, capacities from 0 to beyond the layer;
against counts derived by hand; the engine's choice between it and the recency buckets; and its benchmark script.
"""

from __future__ import annotations

import json
from unittest import mock

import numpy as np
import pytest
from conftest import assert_refused, run_benchmark
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_belady_lanes import random_case
from test_fast_lru_belady import old_kernel, random_stream

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, replay_hits
from expertcache.replay import _kernels_belady_lanes as KBL
from expertcache.replay import engine as E

#: keep_ratio: the rule, the near end always (0: fewer stay than 0 x those that leave, never: so the near end's test
#: ``keep_group * k < e * E`` holds at 0), the far end always.
RATIOS = [KBL.LRU_KEEP_RATIO, 0.0, 1e12]


def list_and_lanes(stream: EventStream, caps, warmup: int, tie_seed: int) -> None:
    """The lanes loop's counts and hit flags, from each end, equal the list loop's."""
    L, N = stream.n_layers, stream.n_experts
    caps = np.asarray(caps, dtype=np.int64)
    hits, misses, flags = old_kernel(stream, "lru", caps, "random", tie_seed, warmup)
    _, tie_pos = E._tie_order(E._tie_ranks("random", tie_seed, L * N), L, N)
    for ratio in RATIOS:
        got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
        KBL.replay_lru_lanes(stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos, warmup, *got, ratio)
        assert got[0].tolist() == hits.tolist() and got[1].tolist() == misses.tolist(), (ratio, caps.tolist())
        assert np.array_equal(got[2].astype(bool), flags), (ratio, caps.tolist())


@given(seed=st.integers(0, 2**32 - 1), N=st.sampled_from([1, 5, 16, 17, 63, 64, 65, 100, 128]),
       L=st.integers(1, 3), data=st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_lanes_equal_the_list_loop_on_random_streams(seed, N, L, data):
    list_and_lanes(*random_case(seed, N, L, data))


@pytest.mark.parametrize("N", [8, 16, 40, 64, 128])
@pytest.mark.parametrize("max_size", [1, 8, 60])
def test_lanes_equal_the_list_loop_at_every_rho(N, max_size):
    """Events of one block (a unit a group), of up to 8 and of up to 60 members against quotas from 0 to the whole
    layer: groups of one unit split at every count, from either end."""
    rng = np.random.default_rng([N, max_size, 49])
    stream = random_stream(rng, 2, N, n_steps=150, max_size=min(N, max_size), alpha=0.7)
    for rho in (0.0, 0.05, 0.1, 0.25, 0.4, 0.75, 0.9, 1.0):
        list_and_lanes(stream, E.capacities_for_rho(rho, 2, N), 11, 5)


def test_counts_by_hand():
    """One layer of 4 experts, quota 2, tie position = expert id (the lower leaves first among blocks of one unit):
    events {0,1,2} {1} {3} {0} {1,2} {3}.

    e0 misses 3 and keeps {1,2} (0 leaves: the lowest of the unit); e1: 1 hits; e2: 3 misses, and of {1 (e1),
    2 (e0)} 2 leaves: {1,3}; e3: 0 misses, 1 (e1) leaves: {0,3}; e4: 1 and 2 miss, and 0 and 3 leave: {1,2};
    e5: 3 misses, and 1 and 2 (both e4) leave the lower, 1: {2,3}. 1 hit, 8 misses."""
    rows = [[0, 1, 2], [1], [3], [0], [1, 2], [3]]
    s = EventStream.from_lists(1, 4, 4, steps=list(range(6)), layers=[0] * 6, experts=rows, active=[1] * 6)
    for ratio in RATIOS:
        h, m, f = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(s.union, np.uint8)
        KBL.replay_lru_lanes(s.offsets, s.expert, s.layer, 4, 1, np.array([2]), np.arange(4), 0, h, m, f, ratio)
        assert (h[0], m[0], f.tolist()) == (1, 8, [0, 0, 0, 1, 0, 0, 0, 0, 0]), ratio
    # the engine (quota 3 = 2 mean events: the lanes), tie_break="id" (lower ids rank higher: the higher id of a unit
    # leaves first): e0 fills the quota; e1: 1 hits; e2: 3 misses, and of e0's {0,2} 2 leaves; e3: 0 hits; e4: 1 hits,
    # 2 misses and 3 (e2) leaves; e5: 3 misses and 0 (e3) leaves. 3 hits.
    assert KBL.lru_lanes_pay(4, [3], s.union / s.n_events)
    result, flags = replay_hits(s, ReplayConfig("lru", capacity=(3,), tie_break="id"))
    assert result.hits == 3 and flags.tolist() == [0, 0, 0, 1, 0, 1, 1, 0, 0]


def test_the_lanes_refuse_layers_past_128():
    s = EventStream.from_lists(1, 129, 129, steps=[0], layers=[0], experts=[[0]], active=[1])
    with pytest.raises(ValueError, match="at most 128"):
        KBL.replay_lru_lanes(s.offsets, s.expert, s.layer, 129, 1, np.array([2]), np.arange(129), 0,
                             np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(0, np.uint8))


@pytest.mark.parametrize("N", [64, 128, 130])
def test_the_engine_takes_the_lanes_where_they_pay(N):
    """lru per layer, event-atomic: the lanes where lru_lanes_pay holds (quotas of at least LRU_LANES_QUOTA mean
    events, at most 128 experts), else the recency buckets; the same counts either way, and prefetch's demand replay
    (no budget) takes the same loop."""
    from expertcache.replay import _kernels_bits as KB
    from expertcache.replay.proactive import ProactiveConfig, replay_proactive

    rng = np.random.default_rng(N)
    stream = random_stream(rng, 2, N, n_steps=60, max_size=8, alpha=0.9)
    mean_event = stream.union / stream.n_events
    for rho in (0.05, 0.5):
        cfg = ReplayConfig("lru", rho=rho)
        want = KBL.lru_lanes_pay(N, E.capacities_for_rho(rho, 2, N), mean_event)
        assert want == (N <= 128 and rho == 0.5), (N, rho, mean_event)
        with mock.patch.object(KBL, "replay_lru_lanes", wraps=KBL.replay_lru_lanes) as lanes, \
                mock.patch.object(KBL, "replay_lru_bits", wraps=KB.replay_lru_bits) as buckets:
            result, flags = replay_hits(stream, cfg)
            pro = replay_proactive(stream, ProactiveConfig(rho=rho, priority="lru", prefetch_budget=0))
        assert (lanes.call_count, buckets.call_count) == ((2, 0) if want else (0, 2))
        assert pro.hits == result.hits
        if N <= 128:                   # the other loop, forced: the same counts and flags
            with mock.patch.object(KBL, "lru_lanes_pay", lambda *a, other=not want: other):
                other, other_flags = replay_hits(stream, cfg)
            assert other == result and np.array_equal(other_flags, flags)


def test_the_lru_lanes_benchmark_times_both_loops_and_checks_them():
    """``benchmarks/lru_lanes.py`` runs, checks the counts it times, names the engine's loop per row (as
    ``lru_lanes_pay`` decides it), prints min and median ratios, and refuses bad arguments (and layers past 128
    experts) in one line."""
    r = run_benchmark("lru_lanes.py", "--shapes", "4x16x2,2x100x4", "--batches", "1,3", "--rhos", "0.1,0.9",
                      "--accesses", "5000", "--pairs", "2", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["shape"], x["batch"], x["rho"]) for x in rows] == [
        (sh, b, rho) for sh in ("4x16x2", "2x100x4") for b in (1, 3) for rho in (0.1, 0.9)]
    assert all(x["hits_equal"] and x["lanes_ns"] > 0 and x["buckets_ns"] > 0 and 0 < x["ratio_min"] <= x["ratio"]
               for x in rows)
    for x in rows:
        assert x["engine_lanes"] == (x["quota_events"] >= KBL.LRU_LANES_QUOTA), x
    assert any(x["engine_lanes"] for x in rows) and not all(x["engine_lanes"] for x in rows)
    assert_refused("lru_lanes.py")
    r = run_benchmark("lru_lanes.py", "--shapes", "2x256x8")
    assert r.returncode == 2 and "at most 128" in r.stderr and "Traceback" not in r.stderr
