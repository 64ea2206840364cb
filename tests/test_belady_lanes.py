"""Event-atomic per-layer Belady on lanes of next uses (``replay/_kernels_belady_lanes.py``).

The loop is compared, counts and per-access hit flags, against the heap loop it stands in for
(``_kernels.replay_belady``, called directly with the same next uses) on random streams whose layers take every lane
width it has (16, 64 and 128 lanes, and several pairs of words past 128 experts), with Belady and Belady-forced, its
rounds from the far end, from the near end and by its rule, warm-up, capacities from 0 to beyond the layer, and
advice in place of true next uses; against counts derived by hand; and its vector reductions against numpy.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_refused, run_benchmark
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fast_lru_belady import random_stream

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, replay
from expertcache.replay import _kernels as K
from expertcache.replay import _kernels_belady_lanes as KBL
from expertcache.replay import engine as E

#: The ends a unit's rounds start from and the bracket: the rules, the far end always, the near end always (neither
#: bracketed), every overflow bracketed where the layer has a cut.
SIDES = [(KBL.KEEP_GROUP, KBL.KEEP_BOUND, KBL.BRACKET_ROUNDS), (0.0, 0, 1 << 30), (0.0, 1 << 30, 1 << 30),
         (KBL.KEEP_GROUP, KBL.KEEP_BOUND, 0)]


def heap_and_lanes(stream: EventStream, caps, forced: bool, warmup: int, tie_seed: int, nxt=None) -> None:
    """The lanes loop's counts and hit flags, from each end, equal the heap loop's on the same next uses."""
    L, N = stream.n_layers, stream.n_experts
    caps = np.asarray(caps, dtype=np.int64)
    tie = E._tie_ranks("random", tie_seed, L * N)
    _, tie_pos = E._tie_order(tie, L, N)
    if nxt is None:
        nxt = K.next_use(stream.offsets, stream.expert, stream.layer, N, L, True)
    want = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    K.replay_belady(stream.offsets, stream.expert, stream.layer, N, L, False, True, nxt, caps, tie, forced, warmup,
                    *want)
    for side in SIDES:
        got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
        KBL.replay_belady_lanes(stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos, nxt, forced, warmup,
                                *got, *side)
        for a, b in zip(want, got, strict=True):
            assert np.array_equal(a, b), (side, forced, caps.tolist())


@pytest.mark.parametrize("forced", [False, True])
@given(seed=st.integers(0, 2**32 - 1), N=st.sampled_from([1, 5, 16, 17, 63, 64, 65, 128, 129, 200, 256, 1024]),
       L=st.integers(1, 3), data=st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_lanes_equal_the_heap_loop_on_random_streams(forced, seed, N, L, data):
    stream, caps, warmup, tie_seed = random_case(seed, N, L, data)
    heap_and_lanes(stream, caps, forced, warmup, tie_seed)


def random_case(seed: int, N: int, L: int, data) -> tuple[EventStream, list[int], int, int]:
    """A random stream of ``L`` layers of ``N`` experts (events of up to 80 members, skewed or flat), a quota per
    layer from 0 to beyond the layer, the warm-up events and the tie order's seed, drawn from ``data``."""
    rng = np.random.default_rng(seed)
    max_size = data.draw(st.integers(1, min(N, 80)))
    stream = random_stream(rng, L, N, n_steps=data.draw(st.integers(1, 40)), max_size=max_size,
                           alpha=data.draw(st.sampled_from([0.0, 0.8, 1.5])))
    caps = [data.draw(st.sampled_from([0, 1, 2, max(1, max_size // 2), max_size, max_size + 1, N - 1, N, 10**9]))
            for _ in range(L)]
    return stream, [max(c, 0) for c in caps], data.draw(st.integers(0, stream.n_events)), data.draw(st.integers(0, 50))


@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize("N", [8, 64, 100, 300])
def test_lanes_equal_the_heap_loop_with_large_events_at_every_rho(forced, N):
    """Events of up to 60 members against quotas of 0 to the whole layer: groups that tie (same next event, or
    never again) split at every count."""
    rng = np.random.default_rng([N, 48])
    stream = random_stream(rng, 2, N, n_steps=150, max_size=min(N, 60), alpha=0.7, min_size=min(N, 4))
    for rho in (0.0, 0.05, 0.1, 0.25, 0.4, 0.75, 0.9, 1.0):
        heap_and_lanes(stream, E.capacities_for_rho(rho, 2, N), forced, 11, 5)


def test_advice_in_place_of_next_uses():
    """predicted-next-use replays per layer on the lanes loop: its counts equal the heap loop's on the advice."""
    from expertcache.events import build_events
    from expertcache.nextuse import LinearNextUse, access_features, advice_from_predictions
    from expertcache.trace import select_requests
    from expertcache.trace.examples import example_trace

    tr = example_trace()
    idx = np.arange(tr.n_requests)
    calib, held = build_events(select_requests(tr, idx[0::2]), 8), build_events(select_requests(tr, idx[1::2]), 8)
    fh = access_features(held)
    adv = advice_from_predictions(fh, LinearNextUse.fit(access_features(calib)).predict(fh.X), {"predictor": "linear"})
    nxt = np.asarray(adv.next_use)
    assert len(np.unique(nxt)) < len(nxt) // 2          # predictions tie often
    for rho in (0.1, 0.4):
        caps = E.capacities_for_rho(rho, held.n_layers, held.n_experts)
        heap_and_lanes(held, caps, False, 0, 0, nxt)
        res = replay(held, ReplayConfig("predicted-next-use", rho=rho), advice=adv)
        h = np.zeros(held.n_layers, np.int64)
        K.replay_belady(held.offsets, held.expert, held.layer, held.n_experts, held.n_layers, False, True, nxt,
                        caps, E._tie_ranks("random", 0, held.n_layers * held.n_experts), False, 0, h,
                        np.zeros(held.n_layers, np.int64), np.zeros(0, np.uint8))
        assert [x.hits for x in res.per_layer] == h.tolist()


def test_counts_by_hand():
    """One layer of 4 experts, quota 2, tie position = expert id (the lower leaves first among equal next uses):
    events {0,1,2} {1} {2} {0} {1,3} {2}.

    belady: e0 misses 3, keeps {1,2} (0's next use, e3, is the farthest); e1, e2 hit; e3: 0 (never again) leaves at
    once; e4: 1 hits, 3 misses, and of {1,3} (never again) and 2 (e5) the lower never-again, 1, leaves; e5 hits:
    4 hits, 5 misses. belady-forced: e3's miss stays and 2 (e5, farther than 1's e4) leaves; e4: 3 stays and of
    {0,1} (both never again) 0 leaves; e5 misses and 1 leaves: 3 hits, 6 misses."""
    rows = [[0, 1, 2], [1], [2], [0], [1, 3], [2]]
    s = EventStream.from_lists(1, 4, 4, steps=list(range(6)), layers=[0] * 6, experts=rows, active=[1] * 6)
    nxt = K.next_use(s.offsets, s.expert, s.layer, 4, 1, True)
    for forced, want_hits, want_flags in ((False, 4, [0, 0, 0, 1, 1, 0, 1, 0, 1]),
                                          (True, 3, [0, 0, 0, 1, 1, 0, 1, 0, 0])):
        for side in SIDES:
            h = np.zeros(1, np.int64)
            m = np.zeros(1, np.int64)
            f = np.zeros(s.union, np.uint8)
            KBL.replay_belady_lanes(s.offsets, s.expert, s.layer, 4, 1, np.array([2]), np.arange(4), nxt, forced, 0,
                                    h, m, f, *side)
            assert (h[0], m[0], f.tolist()) == (want_hits, 9 - want_hits, want_flags), (forced, side)


@pytest.mark.parametrize("n", [16, 64, 128])
def test_the_reductions_against_numpy(n):
    from numba import njit

    from expertcache.replay import _simd

    hi, lo = getattr(_simd, f"lanes_max{n}"), getattr(_simd, f"lanes_min{n}")

    @njit
    def both(buf, off, x0, x1):
        return hi(buf, off, x0, x1), lo(buf, off, x0, x1)

    rng = np.random.default_rng(n)
    for _ in range(200):
        buf = rng.integers(-(2**31), 2**31, size=300, dtype=np.int64).astype(np.int32)
        off = int(rng.integers(0, 300 - 128 + 1))
        x = [np.uint64(int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))) for _ in range(2)]
        if rng.random() < 0.2:
            x[int(rng.integers(0, 2))] = np.uint64(0)
        bits = np.array([(int(x[j // 64]) >> (j % 64)) & 1 for j in range(128)], bool)[:n]
        live = buf[off:off + n][bits]
        want = (int(live.max()), int(live.min())) if live.size else (-(2**31), 2**31 - 1)
        assert both(buf, off, x[0], x[1]) == want


def test_the_engine_chooses_the_walk_only_in_its_band():
    """lanes_pay: layers past 128 experts whose quota is 0.5-1.5 mean events and at most half the layer, with mean
    events of at most a third of it, take the walk; the rest, and advice, the lanes; other scopes and semantics
    neither."""
    from expertcache.replay.policies import get_policy

    offsets = np.arange(0, 2001, 20)                    # mean event 20
    cfg = ReplayConfig("belady")
    pick = E._belady_loop
    assert pick(cfg, get_policy("belady"), 128, np.full(4, 20), offsets) == "lanes"
    assert pick(cfg, get_policy("belady"), 256, np.full(4, 20), offsets) == "walk"
    assert pick(cfg, get_policy("belady-forced"), 256, np.full(4, 10), offsets) == "walk"      # 0.5 mean events
    assert pick(cfg, get_policy("belady"), 256, np.full(4, 29), offsets) == "walk"
    assert pick(cfg, get_policy("belady"), 256, np.full(4, 30), offsets) == "lanes"      # 1.5 mean events
    assert pick(cfg, get_policy("belady"), 256, np.full(4, 9), offsets) == "lanes"       # below 0.5
    assert pick(cfg, get_policy("belady"), 100, np.full(4, 20), offsets) == "lanes"
    assert pick(cfg, get_policy("belady"), 48, np.full(4, 20), np.arange(0, 2001, 40)) == "lanes"
    assert pick(cfg, get_policy("belady"), 140, np.full(4, 60), np.arange(0, 2001, 50)) == "lanes"   # events > N/3
    assert pick(cfg, get_policy("belady"), 300, np.full(4, 60), np.arange(0, 2001, 50)) == "walk"
    assert pick(cfg, get_policy("belady"), 200, np.full(4, 101), np.arange(0, 2001, 100)) == "lanes"   # c > N/2
    assert pick(ReplayConfig("belady", scope="global"), get_policy("belady"), 256, np.full(1, 20), offsets) == ""
    assert pick(ReplayConfig("belady", semantics="sequential-ascending"), get_policy("belady"), 256, np.full(4, 20),
                offsets) == ""
    assert pick(cfg, get_policy("predicted-next-use"), 256, np.full(4, 20), offsets) == "lanes"
    assert pick(cfg, get_policy("belady"), 2048, np.full(4, 20), offsets) == ""


def test_the_lanes_benchmark_times_both_loops_and_checks_them():
    """``benchmarks/belady_lanes.py`` runs, checks the counts it times (against the walk, and its ends against each
    other), prints min and median ratios, and refuses bad arguments in one line."""
    def run(*args):
        return run_benchmark("belady_lanes.py", *args)

    common = ["--shapes", "4x16x2,2x130x4", "--batches", "1,3", "--rhos", "0.1,0.9", "--accesses", "5000",
              "--pairs", "2", "--json"]
    r = run(*common)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["shape"], x["batch"], x["rho"]) for x in rows] == [
        (sh, b, rho) for sh in ("4x16x2", "2x130x4") for b in (1, 3) for rho in (0.1, 0.9)]
    assert all(x["hits_equal"] and x["lanes_ns"] > 0 and x["walk_ns"] > 0 and 0 < x["ratio_min"] <= x["ratio"]
               for x in rows)
    for x in rows:            # 2 x 130: the walk where the quota is 0.5-1.5 mean events, at most half the layer
        walk = (x["shape"] == "2x130x4" and 0.5 <= x["capacity"] / x["mean_event"] < 1.5 and x["capacity"] <= 65
                and x["mean_event"] <= 130 / 3)
        assert x["engine"] == ("walk" if walk else "lanes"), x
    assert {x["engine"] for x in rows} == {"walk", "lanes"}
    r = run(*common, "--sides")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert len(rows) == 8 and all(x["hits_equal"] and min(x["rule_ns"], x["plain_ns"], x["far_ns"], x["near_ns"]) > 0
                                  and min(x["rule_plain"], x["rule_far"], x["rule_near"]) > 0 for x in rows)
    assert_refused("belady_lanes.py")
