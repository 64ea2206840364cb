"""The fast paths of lfu, lrfu, least-stale and lfru, the sequential-random shuffle and the curve choice.

Each kernel of ``replay/_kernels_ranked.py`` (and the bitset loops of lfu, lfru and lrfu in
``_kernels_bits``) is compared with the naive twin (tests/naive.py) and with the generic kernels it
replaces (``replay_heap``, ``replay_scan``) on seeded random streams, including capacity 0, capacities at
or beyond the universe, events larger than the cache, warm-up events, in-cache
LFU counters and per-access hit flags. The sequential-random order is compared
with the per-event Python loop it replaces.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from naive import naive_replay
from numba import njit
from test_twin_large import random_stream

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, curve_pays, engine, replay, replay_curve, replay_hits
from expertcache.replay import _kernels as K
from expertcache.replay import _kernels_bits as KB
from expertcache.replay import _kernels_lfru as KL
from expertcache.replay import _kernels_order as KO
from expertcache.replay import _kernels_ranked as KR
from expertcache.replay import _kernels_seq as KQ
from expertcache.replay import _simd as SIMD
from expertcache.replay.keys import KEY_LEAST_STALE, KEY_LFRU, KEY_LFU, KEY_LRFU

FAST = ("lfu", "lrfu", "least-stale", "lfru")
SEMANTICS = ("event-atomic", "sequential-ascending", "sequential-random")
CODES = {"lfu": KEY_LFU, "lrfu": KEY_LRFU, "least-stale": KEY_LEAST_STALE, "lfru": KEY_LFRU}


def small_stream(rng: np.random.Generator) -> EventStream:
    """Few layers and experts, missing (step, layer) events, events from 1 expert to all of them."""
    L = int(rng.integers(1, 4))
    N = int(rng.integers(1, 12))
    k = int(rng.integers(1, N + 1))
    steps = int(rng.integers(1, 15))
    rows = [(s, l) for s in range(steps) for l in range(L) if rng.random() < 0.7] or [(0, 0)]
    experts = [sorted(rng.choice(N, int(rng.integers(1, k + 1)), replace=False).tolist()) for _ in rows]
    return EventStream.from_lists(L, N, k, [r[0] for r in rows], [r[1] for r in rows], experts, [1] * len(rows))


def counts(r) -> tuple:
    return r.hits, r.demand_misses, tuple(x.hits for x in r.per_layer), tuple(x.demand_misses for x in r.per_layer)


def naive_counts(d: dict) -> tuple:
    return d["hits"], d["demand_misses"], tuple(d["per_layer_hits"]), tuple(d["per_layer_demand_misses"])


@pytest.mark.parametrize("seed", range(6))
def test_fast_policies_equal_the_naive_twin_on_random_streams(seed):
    rng = np.random.default_rng([seed, 19])
    for trial in range(25):
        stream = small_stream(rng)
        for policy in FAST:
            for semantics in SEMANTICS:
                for scope in ("per-layer", "global"):
                    kw = dict(rho=float(rng.choice([0.0, 0.2, 0.5, 0.8, 1.0])), scope=scope, semantics=semantics,
                              tie_break=str(rng.choice(["id", "random"])), seed=trial,
                              warmup_events=int(rng.integers(0, 3)) if stream.n_events > 3 else 0,
                              lfu_in_cache_counters=bool(rng.integers(0, 2)),
                              lrfu_lambda=float(rng.choice([0.0, 0.25, 0.5, 1.0])))
                    got = replay(stream, ReplayConfig(policy, **kw))
                    assert counts(got) == naive_counts(naive_replay(stream, policy, **kw)), (policy, kw)


@pytest.mark.parametrize("policy", FAST)
@pytest.mark.parametrize("semantics", SEMANTICS)
def test_explicit_capacities_zero_small_and_beyond_the_universe(policy, semantics):
    stream = random_stream(3, L=3, N=40, k=6, steps=14)   # events of up to 48 members: larger than the caches
    for scope, caps in (("per-layer", (0, 0, 0)), ("per-layer", (1, 5, 40)), ("per-layer", (3, 41, 500)),
                        ("global", 0), ("global", 7), ("global", 120), ("global", 10_000)):
        kw = dict(scope=scope, semantics=semantics, capacity=caps, seed=2)
        got = replay(stream, ReplayConfig(policy, **kw))
        assert counts(got) == naive_counts(naive_replay(stream, policy, **kw)), (scope, caps)


@pytest.mark.parametrize("policy", FAST)
@pytest.mark.parametrize("semantics", ("event-atomic", "sequential-ascending"))
@pytest.mark.parametrize("scope", ("per-layer", "global"))
def test_hit_flags_of_the_fast_paths_equal_the_twin(policy, semantics, scope):
    stream = random_stream(5)
    cfg = ReplayConfig(policy, rho=0.3, scope=scope, semantics=semantics, seed=5, warmup_events=3)
    result, hit = replay_hits(stream, cfg)
    want: list[set[int]] = []
    naive_replay(stream, policy, rho=0.3, scope=scope, semantics=semantics, seed=5, warmup_events=3, hit_sets=want)
    blocks = np.repeat(stream.layer.astype(np.int64), np.diff(stream.offsets)) * stream.n_experts + stream.expert
    if semantics == "event-atomic":
        got = [set(blocks[lo:hi][hit[lo:hi]].tolist()) for lo, hi in zip(stream.offsets[:-1], stream.offsets[1:],
                                                                          strict=True)]
    else:
        got = [{int(b)} if h else set() for b, h in zip(blocks, hit, strict=True)]
    assert got == want
    assert result == replay(stream, cfg)


def _generic(stream, cfg, atomic, global_scope, caps, tie, code, lam, in_cache):
    """Counts of the generic kernel (replay_heap, or replay_scan for lfru) the fast paths replace."""
    hits = np.zeros(stream.n_layers, dtype=np.int64)
    misses = np.zeros(stream.n_layers, dtype=np.int64)
    flags = np.zeros(stream.union, dtype=np.uint8)
    kernel = K.replay_scan if code == KEY_LFRU else K.replay_heap
    kernel(stream.offsets, stream.expert, stream.layer, stream.step, stream.n_experts, stream.n_layers, global_scope,
           atomic, np.empty(0, dtype=np.int32), caps, tie, code, in_cache, lam, cfg.warmup_events, hits, misses, flags)
    return hits, misses, flags


@pytest.mark.parametrize("seed", range(4))
def test_every_fast_kernel_equals_the_generic_kernels(seed):
    """replay_sorted, replay_ranked and replay_select called directly, whatever the engine picks."""
    for s in range(8):
        stream = random_stream(100 * seed + s, L=2, N=int(10 + 7 * s), k=4, steps=12)
        L, N = stream.n_layers, stream.n_experts
        tie = engine._tie_ranks("random", s, L * N)
        order, tie_pos = engine._tie_order(tie, L, N)
        for policy in ("lfu", "lrfu", "least-stale"):
            code = CODES[policy]
            for atomic in (True, False):
                for global_scope in (False, True):
                    caps = (np.array([int(0.35 * L * N)]) if global_scope
                            else np.array([s % (N + 2), int(0.3 * N)], dtype=np.int64))
                    in_cache = policy == "lfu" and s % 2 == 1
                    lam = 0.5 if policy == "lrfu" else -1.0
                    cfg = ReplayConfig(policy, warmup_events=s % 3)
                    want = _generic(stream, cfg, atomic, global_scope, caps, tie, code, lam, in_cache)
                    bits = engine._ranked_bits(code, stream.offsets, stream.step, L * N, atomic)
                    for kernel in ("sorted", "ranked"):
                        hits = np.zeros(L, dtype=np.int64)
                        misses = np.zeros(L, dtype=np.int64)
                        flags = np.zeros(stream.union, dtype=np.uint8)
                        head = (stream.offsets, stream.expert, stream.layer, stream.step, N, L, global_scope, atomic,
                                caps, tie)
                        tail = (code, *bits, in_cache, lam, cfg.warmup_events, hits, misses, flags)
                        if kernel == "sorted":
                            if global_scope:
                                continue   # per-layer only (tie positions are per layer)
                            KR.replay_sorted(*head, order, tie_pos, *tail)
                        else:
                            KR.replay_ranked(*head, *tail)
                        got = (hits, misses, flags)
                        assert all((a == b).all() for a, b in zip(got, want, strict=True)), (policy, kernel, atomic,
                                                                                             global_scope, s)
        for atomic in (True, False):
            for global_scope in (False, True):
                caps = np.array([int(0.4 * L * N)]) if global_scope else np.array([3, N], dtype=np.int64)
                cfg = ReplayConfig("lfru", warmup_events=1)
                want = _generic(stream, cfg, atomic, global_scope, caps, tie, KEY_LFRU, -1.0, False)
                hits = np.zeros(L, dtype=np.int64)
                misses = np.zeros(L, dtype=np.int64)
                flags = np.zeros(stream.union, dtype=np.uint8)
                KL.replay_select(stream.offsets, stream.expert, stream.layer, N, L, global_scope, atomic, caps, tie, 1,
                                 hits, misses, flags)
                assert all((a == b).all() for a, b in zip((hits, misses, flags), want, strict=True))


@pytest.mark.parametrize("N", (1, 7, 64, 65, 130, 256, 500, 1024))
@pytest.mark.parametrize("in_cache", (False, True))
def test_lfu_frequency_buckets_equal_the_generic_kernel(N, in_cache):
    """replay_lfu_bits called directly: capacities from 0 past N, multi-word bitsets (one or two words in registers,
    three or more than eight in loops, four to eight in registers: 256, 500), warm-up, hit flags."""
    L = 3
    stream = random_stream(N + 11 * in_cache, L=L, N=N, k=min(N, 9), steps=40 if N < 1024 else 12)
    tie = engine._tie_ranks("random", N, L * N)
    _, tie_pos = engine._tie_order(tie, L, N)
    for caps in ((0, 1, 2), (N // 3, N // 2, max(N - 1, 0)), (N, N + 1, 5 * N), (3, 9, 17)):
        caps = np.array(caps, dtype=np.int64)
        for warm in (0, 5):
            cfg = ReplayConfig("lfu", warmup_events=warm)
            want = _generic(stream, cfg, True, False, caps, tie, KEY_LFU, -1.0, in_cache)
            hits = np.zeros(L, dtype=np.int64)
            misses = np.zeros(L, dtype=np.int64)
            flags = np.zeros(stream.union, dtype=np.uint8)
            KB.replay_lfu_bits(stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos, in_cache, warm, hits,
                               misses, flags)
            assert all((a == b).all() for a, b in zip((hits, misses, flags), want, strict=True)), (caps, warm)


@pytest.mark.parametrize("N", (1, 7, 64, 65, 130, 1024))
@pytest.mark.parametrize("policy", ("lfru", "lrfu"))
def test_lfru_and_lrfu_bitset_loops_equal_the_generic_kernels(N, policy):
    """replay_lfru_bits / replay_lrfu_bits called directly: capacities from 0 past N, multi-word bitsets, warm-up,
    hit flags, every lrfu lambda the twin test draws (keys tie often on these small streams)."""
    L = 3
    stream = random_stream(N + 5, L=L, N=N, k=min(N, 9), steps=40 if N < 1024 else 12)
    tie = engine._tie_ranks("random", N, L * N)
    _, tie_pos = engine._tie_order(tie, L, N)
    for lam in (0.0, 0.25, 0.5, 1.0) if policy == "lrfu" else (-1.0,):
        for caps in ((0, 1, 2), (N // 3, N // 2, max(N - 1, 0)), (N, N + 1, 5 * N), (3, 9, 17)):
            caps = np.array(caps, dtype=np.int64)
            for warm in (0, 5):
                cfg = ReplayConfig(policy, warmup_events=warm)
                want = _generic(stream, cfg, True, False, caps, tie, CODES[policy], lam, False)
                hits = np.zeros(L, dtype=np.int64)
                misses = np.zeros(L, dtype=np.int64)
                flags = np.zeros(stream.union, dtype=np.uint8)
                head = (stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos)
                if policy == "lfru":
                    KB.replay_lfru_bits(*head, warm, hits, misses, flags)
                else:
                    KB.replay_lrfu_bits(*head, lam, warm, hits, misses, flags)
                assert all((a == b).all() for a, b in zip((hits, misses, flags), want, strict=True)), (caps, warm,
                                                                                                     lam)
                if policy == "lfru":       # one unit per access, members ascending and shuffled per event
                    for expert in (stream.expert, _shuffled(stream, N + warm)):
                        want = _scan_sequential(stream, expert, caps, tie, warm)
                        hits[:] = 0
                        misses[:] = 0
                        flags[:] = 0
                        KB.replay_lfru_bits(stream.offsets, expert, stream.layer, N, L, caps, tie_pos, warm, hits,
                                            misses, flags, sequential=True)
                        assert all((a == b).all() for a, b in zip((hits, misses, flags), want, strict=True)), (
                            caps, warm)


def _shuffled(stream, seed):
    """The stream's members shuffled within each event (an access order of sequential-random)."""
    rng = np.random.default_rng(seed)
    expert = stream.expert.copy()
    for i in range(stream.offsets.shape[0] - 1):
        lo, hi = stream.offsets[i], stream.offsets[i + 1]
        expert[lo:hi] = rng.permutation(expert[lo:hi])
    return expert


def _scan_sequential(stream, expert, caps, tie, warm):
    """Counts of replay_scan's lfru per layer, one unit per access in the order ``expert``."""
    hits = np.zeros(stream.n_layers, dtype=np.int64)
    misses = np.zeros(stream.n_layers, dtype=np.int64)
    flags = np.zeros(stream.union, dtype=np.uint8)
    K.replay_scan(stream.offsets, expert, stream.layer, stream.step, stream.n_experts, stream.n_layers, False, False,
                  np.empty(0, dtype=np.int32), caps, tie, KEY_LFRU, False, -1.0, warm, hits, misses, flags)
    return hits, misses, flags


def test_kth_lowest_on_repeated_and_distinct_values():
    """The branch-free quickselect against a sort: float and int keys, many repeats, every rank."""
    from numba import njit

    kth = njit(lambda a, b, n, m: KB._kth_lowest(a, b, n, m))
    rng = np.random.default_rng(3)
    for trial in range(400):
        n = int(rng.integers(1, 150))
        if trial % 3 == 0:
            a = rng.integers(0, int(rng.integers(1, 6)), n).astype(np.float64) / 7.0   # few distinct values
        elif trial % 3 == 1:
            a = rng.random(n)
        else:
            a = rng.permutation(n).astype(np.int64) * 3 + 1
        want = np.sort(a)
        for m in {x for x in (1, 2, n - 1, n, int(rng.integers(1, n + 1))) if 1 <= x <= n}:
            assert kth(a.copy(), np.empty_like(a), n, m) == want[m - 1], (a, m)


def test_lfu_on_a_skewed_stream_with_many_distinct_counts():
    """A few hot experts and a long cold tail: many distinct counts among the residents, long-lived hot blocks."""
    rng = np.random.default_rng(7)
    L, N, steps = 2, 96, 400
    weights = 1.0 / np.arange(1, N + 1) ** 1.2
    weights /= weights.sum()
    experts = [sorted(set(rng.choice(N, 12, p=weights).tolist())) for _ in range(steps * L)]
    stream = EventStream.from_lists(L, N, 12, [i // L for i in range(steps * L)], [i % L for i in range(steps * L)],
                                    experts, [1] * (steps * L))
    for rho in (0.1, 0.3, 0.6):
        for in_cache in (False, True):
            kw = dict(rho=rho, lfu_in_cache_counters=in_cache, seed=3)
            for policy in ("lfu", "lrfu", "lfru"):
                got = replay(stream, ReplayConfig(policy, **kw))
                assert counts(got) == naive_counts(naive_replay(stream, policy, **kw)), (policy, kw)


def _python_order(stream: EventStream, seed: int) -> np.ndarray:
    """The sequential-random order as the engine built it before: one numpy permutation per event."""
    rng = np.random.default_rng([seed, 1])
    expert = stream.expert.copy()
    off = stream.offsets
    for i in range(stream.n_events):
        seg = expert[off[i]:off[i + 1]]
        expert[off[i]:off[i + 1]] = seg[rng.permutation(seg.shape[0])]
    return expert


def _any_sizes_stream(rng, max_n, max_steps):
    """A stream of 1-3 layers and 1 to ``max_n - 1`` experts whose events hold from one member to every expert."""
    L = int(rng.integers(1, 4))
    N = int(rng.integers(1, max_n))
    rows = [(s, l) for s in range(int(rng.integers(1, max_steps))) for l in range(L) if rng.random() < 0.8] or [(0, 0)]
    experts = [sorted(rng.choice(N, int(rng.integers(1, N + 1)), replace=False).tolist()) for _ in rows]
    return EventStream.from_lists(L, N, N, [r[0] for r in rows], [r[1] for r in rows], experts, [1] * len(rows))


@pytest.mark.parametrize("seed", range(5))
def test_sequential_random_order_equals_the_python_loop(seed):
    rng = np.random.default_rng([seed, 7])
    for _ in range(30):
        stream = _any_sizes_stream(rng, 300, 25)
        s = int(rng.integers(0, 10_000))
        assert (engine._member_order(stream, "sequential-random", s) == _python_order(stream, s)).all()


def test_sequential_random_order_on_a_large_stream():
    stream = random_stream(9, L=4, N=128, k=8, steps=60)
    assert (engine._member_order(stream, "sequential-random", 3) == _python_order(stream, 3)).all()


@pytest.mark.parametrize("seed", range(4))
def test_random_lru_equals_the_shuffle_then_the_list_loop(seed):
    """shuffled_replay over lru_seq_ranges (the order shuffled beside the replay) against shuffle_events then
    replay_lru's sequential units: the same order returned, counts and hit flags; quotas 0, 1, small, past N, per
    layer and global, warm-up, events of one member (no draw) and of every expert."""
    rng = np.random.default_rng([seed, 35])
    for _ in range(12):
        stream = _any_sizes_stream(rng, 200, 30)
        L, N = stream.n_layers, stream.n_experts
        tie = engine._tie_ranks("random", seed, L * N)
        order, tie_pos = engine._tie_order(tie, L, N)
        warm = int(rng.integers(0, 3))
        words = engine._order_words(int(rng.integers(0, 1000)))
        for global_scope in (False, True):
            for c in (0, 1, max(N // 4, 1), N + 3):
                caps = np.full(1 if global_scope else L, c * (L if global_scope else 1), dtype=np.int64)
                want_order = stream.expert.copy()
                KO.shuffle_events(stream.offsets, want_order, words)
                want = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
                K.replay_lru(stream.offsets, want_order, stream.layer, N, L, global_scope, False, caps, order, tie_pos,
                             warm, *want)
                got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
                run = KQ.lru_seq_ranges(stream.offsets, stream.layer, N, L, caps, warm, *got, global_scope)
                got_order = KO.shuffled_replay(stream.offsets, stream.expert, words, run)
                assert (got_order == want_order).all()
                assert all((a == b).all() for a, b in zip(got, want, strict=True)), (N, c, global_scope)


@pytest.mark.parametrize("threads", [False, True])
def test_sequential_random_loops_shuffle_beside_their_replay(threads, monkeypatch):
    """The engine runs sequential-random per-layer lfu, lrfu and lfru, and lru and least-stale in either scope,
    through shuffled_replay with the stream's own member order, on one thread or with chunks of a few accesses
    shuffled on a second; the counts are the naive twin's (which shuffles each event itself), warm-up included;
    global lfu / lrfu / lfru and sequential-ascending do not go through it."""
    monkeypatch.setattr(KO, "CHUNK_ACCESSES", 7)
    monkeypatch.setattr(KO, "THREAD_MIN_ACCESSES", 1 if threads else 1 << 60)
    called = []
    real = KO.shuffled_replay
    monkeypatch.setattr(KO, "shuffled_replay", lambda o, e, *a: called.append(e.copy()) or real(o, e, *a))
    stream = random_stream(6, L=3, N=30, k=7, steps=14)
    for policy in ("lfu", "lrfu", "lfru", "lru", "least-stale"):
        for scope in ("per-layer", "global"):
            for semantics in ("sequential-random", "sequential-ascending"):
                kw = dict(rho=0.25, semantics=semantics, scope=scope, seed=5, warmup_events=3)
                got = replay(stream, ReplayConfig(policy, **kw))
                assert counts(got) == naive_counts(naive_replay(stream, policy, **kw)), (policy, scope, semantics)
    assert len(called) == 7 and all((x == stream.expert).all() for x in called)


def test_a_sweep_worker_keeps_its_reuse_scope_open(monkeypatch):
    """A sweep's worker initializer opens one reuse_belady_inputs scope that stays open after a garbage collection
    (a scope object left unreferenced would close at once), and a second initialisation opens no second scope."""
    import gc

    from expertcache.replay import sweeps

    monkeypatch.setattr(sweeps, "_WORKER_SCOPE", [])
    stream = random_stream(19, L=2, N=8, k=2, steps=3)
    try:
        sweeps._init_worker(stream, None)
        sweeps._init_worker(stream, None)
        gc.collect()
        assert engine._REUSE_DEPTH[0] == 1
        replay(stream, ReplayConfig("lru", rho=0.5, semantics="sequential-random"))
        assert len(engine._REUSED["order"]) == 1
    finally:
        for scope in sweeps._WORKER_SCOPE:
            scope.__exit__(None, None, None)
        sweeps._STATE.clear()
    assert engine._REUSE_DEPTH[0] == 0 and engine._REUSED["order"] == []


_RANDOM_POLICIES = ("lru", "lfu", "lfru", "lrfu", "least-stale", "belady", "belady-forced")


def _count_shuffles(monkeypatch) -> list:
    """Every shuffle the engine makes (``shuffled_replay`` beside a replay, ``shuffle_events`` for a loop given the
    shuffled order), recorded as the seed words it starts from."""
    made = []
    real_beside, real_events = KO.shuffled_replay, KO.shuffle_events
    monkeypatch.setattr(KO, "shuffled_replay", lambda o, e, w, *a: made.append(w.copy()) or real_beside(o, e, w, *a))
    monkeypatch.setattr(KO, "shuffle_events", lambda o, e, w: made.append(w.copy()) or real_events(o, e, w))
    return made


def test_a_reuse_scope_keeps_each_streams_shuffled_order_per_seed(monkeypatch):
    """Inside engine.reuse_belady_inputs, sequential-random replays of two streams at two seeds, interleaved, give
    the naive twin's counts (which shuffles each event itself): a kept order never serves another stream or seed.
    Replays of one stream and seed in a row shuffle once, both for the loops that shuffle beside their replay and
    for those given the order (belady); the kept order is numpy's permutation loop's; the scope leaves nothing."""
    made = _count_shuffles(monkeypatch)
    a = random_stream(16, L=3, N=24, k=6, steps=12)
    b = random_stream(17, L=3, N=24, k=6, steps=12)
    want = {}
    for name, st in (("a", a), ("b", b)):
        for seed in (0, 5):
            for p in _RANDOM_POLICIES:
                kw = dict(rho=0.3, semantics="sequential-random", seed=seed)
                want[(name, seed, p)] = naive_counts(naive_replay(st, p, **kw))
    made.clear()
    with engine.reuse_belady_inputs():
        for name, seed in (("a", 0), ("a", 0), ("b", 0), ("a", 5), ("b", 0), ("b", 5), ("a", 5), ("a", 0)):
            st = a if name == "a" else b
            for p in _RANDOM_POLICIES:
                got = replay(st, ReplayConfig(p, rho=0.3, semantics="sequential-random", seed=seed))
                assert counts(got) == want[(name, seed, p)], (name, seed, p)
        kept = engine._REUSED["order"]
        assert len(kept) == 2 and (kept[0][2] == _python_order(a, 0)).all()
    # the last two orders made are kept: a0, b0, a5, b5 and a0 again (evicted by b5) are made; b0, a5 are found
    assert len(made) == 5
    assert engine._REUSED == {"bitsets": [], "next": [], "order": []}
    made.clear()
    for p in _RANDOM_POLICIES:                      # outside a scope every replay shuffles
        replay(a, ReplayConfig(p, rho=0.3, semantics="sequential-random", seed=0))
    assert len(made) == len(_RANDOM_POLICIES)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_sweep_shuffles_once_per_seed_in_a_process(jobs, monkeypatch):
    """An in-process sweep of sequential-random curves of several policies (separate replays) shuffles once per
    seed, and its results equal replays outside any scope; with worker processes too (their counts uncounted here)."""
    from expertcache.replay import sweep

    made = _count_shuffles(monkeypatch)
    stream = random_stream(18, L=3, N=24, k=6, steps=12)
    configs = [ReplayConfig(p, rho=r, semantics="sequential-random", seed=s)
               for s in (1, 2) for p in ("lru", "lfu", "lrfu", "belady") for r in (0.2, 0.5)]
    want = [replay(stream, c) for c in configs]
    made.clear()
    assert sweep(stream, configs, jobs=jobs) == want
    assert len(made) == (2 if jobs == 1 else 0)
    assert engine._REUSED == {"bitsets": [], "next": [], "order": []}


def _lru_cases(rng, stream):
    """Per-layer quotas for the sequential lru tests: 0, 1, small, past N, and one drawn per layer."""
    L, N = stream.n_layers, stream.n_experts
    for c in (0, 1, max(N // 4, 1), N + 3):
        yield np.full(L, c, dtype=np.int64)
    yield rng.integers(0, N + 2, L).astype(np.int64)


def _lru_streams(rng, seed, max_n, n):
    """``n`` streams for the sequential lru tests (``_any_sizes_stream``), each with its tie order, a warm-up and its
    members ascending and shuffled."""
    for _ in range(n):
        stream = _any_sizes_stream(rng, max_n, 30)
        L, N = stream.n_layers, stream.n_experts
        order, tie_pos = engine._tie_order(engine._tie_ranks("random", seed, L * N), L, N)
        shuffled = stream.expert.copy()
        KO.shuffle_events(stream.offsets, shuffled, engine._order_words(seed))
        yield stream, order, tie_pos, int(rng.integers(0, 3)), (stream.expert, shuffled)


def _lru_seq_equals_the_list_loop(stream, expert, caps, glob, order, tie_pos, warm):
    """replay_lru_seq against replay_lru's sequential units: counts and hit flags."""
    L, N = stream.n_layers, stream.n_experts
    want = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    K.replay_lru(stream.offsets, expert, stream.layer, N, L, glob, False, caps, order, tie_pos, warm, *want)
    got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    KQ.replay_lru_seq(stream.offsets, expert, stream.layer, N, L, caps, warm, *got, glob)
    assert all((a == b).all() for a, b in zip(got, want, strict=True)), (N, caps.tolist(), glob)


@pytest.mark.parametrize("seed", range(4))
def test_sequential_lru_loop_equals_the_list_loop(seed):
    """replay_lru_seq (its loop chosen by lru_on_ranks) against replay_lru's sequential
    units: counts and hit flags, in the stream's order and in a shuffled one; per-layer quotas 0, 1, small, past N
    and one a layer, global quotas 0, 1, a third, past L N; warm-up, events of one member and of every expert."""
    rng = np.random.default_rng([seed, 41])
    for stream, order, tie_pos, warm, orders in _lru_streams(rng, seed, 200, 12):
        L, N = stream.n_layers, stream.n_experts
        for expert in orders:
            for caps, glob in [(c, False) for c in _lru_cases(rng, stream)] + [
                    (np.array([c], dtype=np.int64), True) for c in (0, 1, L * N // 3, L * N + 2)]:
                _lru_seq_equals_the_list_loop(stream, expert, caps, glob, order, tie_pos, warm)


@pytest.mark.parametrize("on_ranks", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_sequential_lru_on_ranks_and_on_lists_equal_the_list_loop(seed, on_ranks, monkeypatch):
    """Per-layer sequential lru on each of its two loops (the choice forced): on ranks (quotas up to 64, whatever
    the events' sizes) and on int32 lists, against replay_lru's sequential units: counts and hit flags, members
    ascending and shuffled, quotas 0, 1, 2, a quarter of N, 63, 64 (and past N on lists) and one a layer; warm-up;
    events of one member to every expert, N from 1 to past 64."""
    monkeypatch.setattr(KQ, "lru_on_ranks", lambda *a: on_ranks)
    rng = np.random.default_rng([seed, 53])
    for stream, order, tie_pos, warm, orders in _lru_streams(rng, seed, 150, 10):
        L, N = stream.n_layers, stream.n_experts
        top = 64 if on_ranks else N + 3
        quotas = [np.full(L, c, dtype=np.int64) for c in (0, 1, 2, max(N // 4, 1), 63, 64, N + 3) if c <= top]
        quotas.append(rng.integers(0, min(top, N + 2) + 1, L).astype(np.int64))
        for expert in orders:
            for caps in quotas:
                _lru_seq_equals_the_list_loop(stream, expert, caps, False, order, tie_pos, warm)


def test_sequential_lru_on_ranks_by_hand():
    """A quota of 3 over one layer, each access's outcome derived by hand: events [0 1 2 3] (four misses; the list
    newest first is then 3 2 1), [1 3 4] (1 and 3 hit, 4 takes 2's place: 4 3 1), [3] (hit: 3 4 1), [1 5] (1 hits:
    1 3 4; 5 takes 4's: 5 1 3), [4] (a miss); then the same stream with the first two events' members in the order
    [3 2 1 0] and [4 1 3]: 3 2 1 0 leaves 0 1 2; 4 takes 2's place (4 0 1), 1 hits (1 4 0), 3 takes 0's (3 1 4);
    [3] hits (3 1 4); 1 hits (1 3 4), 5 takes 4's (5 1 3); [4] misses."""
    assert KQ.lru_on_ranks(np.array([0, 4, 7, 8, 10, 11]), 6, np.array([3]))
    stream = EventStream.from_lists(1, 6, 6, [0, 1, 2, 3, 4], [0] * 5, [[0, 1, 2, 3], [1, 3, 4], [3], [1, 5], [4]],
                                    [1] * 5)
    for expert, flags in ((stream.expert, [0, 0, 0, 0, 1, 1, 0, 1, 1, 0, 0]),
                          (np.array([3, 2, 1, 0, 4, 1, 3, 3, 1, 5, 4], np.int16), [0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 0])):
        got = [np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(stream.union, np.uint8)]
        KQ.replay_lru_seq(stream.offsets, expert, stream.layer, 6, 1, np.array([3]), 0, *got)
        assert got[2].tolist() == flags and got[0].tolist() == [sum(flags)] and got[1].tolist() == [11 - sum(flags)]


def test_sequential_lru_runs_on_ranks_where_quotas_are_small_beside_its_events():
    """lru_on_ranks: every quota (at most N) up to 64 and up to 4 times the mean event; the other per-layer streams
    and global scope keep the lists."""
    offsets = np.array([0, 10, 20, 30])                    # a mean event of 10 members
    assert KQ.lru_on_ranks(offsets, 128, np.array([40, 12]))
    assert not KQ.lru_on_ranks(offsets, 128, np.array([41, 12]))
    assert KQ.lru_on_ranks(offsets, 30, np.array([200]))    # (a quota past N holds N)
    big = np.array([0, 100, 200])
    assert KQ.lru_on_ranks(big, 128, np.array([64])) and not KQ.lru_on_ranks(big, 128, np.array([65]))
    assert not KQ.lru_on_ranks(big, 1024, np.array([65]))


@pytest.mark.parametrize("policy", ["lru", "lfu", "lrfu", "lfru"])
def test_sequential_loops_by_ranges_carry_on_from_one_another(policy):
    """Each sequential per-layer loop run by ranges of events on one state (``*_seq_ranges``) gives one call's
    counts and flags, whatever the cuts (a cut between two events the loop would run side by side, a range of one
    event)."""
    rng = np.random.default_rng(43)
    stream = random_stream(8, L=3, N=40, k=8, steps=30)
    L, N = stream.n_layers, stream.n_experts
    _, tie_pos = engine._tie_order(engine._tie_ranks("random", 2, L * N), L, N)
    caps = np.array([5, 11, 0], dtype=np.int64)

    def ranges(*out):
        head = (stream.offsets, stream.layer, N, L, caps)
        if policy == "lru":
            return KQ.lru_seq_ranges(*head, 4, *out)
        if policy == "lfu":
            return KQ.lfu_seq_ranges(*head, tie_pos, False, 4, *out)
        if policy == "lrfu":
            return KQ.lrfu_seq_ranges(*head, tie_pos, 0.5, 4, *out)
        return KQ.lfru_seq_ranges(*head, tie_pos, 4, *out)

    want = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    ranges(*want)(stream.expert, 0, stream.n_events)
    for _ in range(5):
        cuts = [0, *sorted(rng.choice(np.arange(1, stream.n_events), 6, replace=False).tolist()), stream.n_events]
        got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
        run = ranges(*got)
        for e0, e1 in zip(cuts[:-1], cuts[1:], strict=True):
            run(stream.expert, e0, e1)
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), cuts


@pytest.mark.parametrize("threads", [False, True])
def test_per_layer_random_lru_with_and_without_a_shuffling_thread(threads, monkeypatch):
    """shuffled_replay over lru_seq_ranges, on one thread or with the next chunk shuffled on a second (chunks of a
    few accesses here, so that a stream makes many), against shuffle_events then replay_lru's sequential per-layer
    units: the same order returned (the given one untouched), counts and hit flags."""
    monkeypatch.setattr(KO, "CHUNK_ACCESSES", 7)
    rng = np.random.default_rng([int(threads), 47])
    for _ in range(10):
        stream = _any_sizes_stream(rng, 120, 30)
        L, N = stream.n_layers, stream.n_experts
        order, tie_pos = engine._tie_order(engine._tie_ranks("random", 1, L * N), L, N)
        warm = int(rng.integers(0, 3))
        words = engine._order_words(int(rng.integers(0, 1000)))
        for caps in _lru_cases(rng, stream):
            want_order = stream.expert.copy()
            KO.shuffle_events(stream.offsets, want_order, words)
            want = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
            K.replay_lru(stream.offsets, want_order, stream.layer, N, L, False, False, caps, order, tie_pos, warm,
                         *want)
            given = stream.expert.copy()
            got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
            out = KO.shuffled_replay(stream.offsets, given, words,
                                     KQ.lru_seq_ranges(stream.offsets, stream.layer, N, L, caps, warm, *got), threads)
            assert (out == want_order).all() and (given == stream.expert).all()
            assert all((a == b).all() for a, b in zip(got, want, strict=True)), (N, caps.tolist())


def test_a_shuffle_that_fails_midway_raises_in_the_replay_and_replays_no_unshuffled_chunk(monkeypatch):
    """The shuffling thread runs ahead over the whole stream; where it fails at its third chunk, the replay raises
    its error once it reaches that chunk (it does not wait for ever, nor replay a chunk left unshuffled)."""
    monkeypatch.setattr(KO, "CHUNK_ACCESSES", 16)
    real = KO.shuffle_range
    calls = []

    def failing(offsets, expert, st, e0, e1):
        calls.append(e0)
        if len(calls) == 3:
            raise MemoryError("no room")
        real(offsets, expert, st, e0, e1)

    monkeypatch.setattr(KO, "shuffle_range", failing)
    stream = _skewed_stream(2, 16, 40, 4, 5)
    ranges = []
    with pytest.raises(MemoryError, match="no room"):
        KO.shuffled_replay(stream.offsets, stream.expert, engine._order_words(3),
                           lambda o, e0, e1: ranges.append((e0, e1)), threads=True)
    assert len(calls) == 3 and [r[0] for r in ranges] == calls[:2]


def test_a_replay_that_fails_stops_the_shuffle_ahead_of_it(monkeypatch):
    """Where the replay of a chunk raises, its error comes back and the shuffling thread stops at its next chunk
    rather than shuffling the rest of the stream."""
    monkeypatch.setattr(KO, "CHUNK_ACCESSES", 16)
    real = KO.shuffle_range
    calls = []

    def slow(offsets, expert, st, e0, e1):
        calls.append(e0)
        time.sleep(0.005)
        real(offsets, expert, st, e0, e1)

    def run(order, e0, e1):
        raise ValueError("replay failed")

    monkeypatch.setattr(KO, "shuffle_range", slow)
    stream = _skewed_stream(2, 16, 200, 4, 5)
    n_chunks = (stream.union + 15) // 16
    with pytest.raises(ValueError, match="replay failed"):
        KO.shuffled_replay(stream.offsets, stream.expert, engine._order_words(3), run, threads=True)
    assert n_chunks > 60 and 1 <= len(calls) < n_chunks // 2     # (without the stop: every chunk, ~0.6 s later)


@pytest.mark.parametrize("threads", [False, True])
def test_shuffled_replay_of_no_events(threads):
    """A stream with no events: an empty order back, and no range replayed but the empty one."""
    ranges = []
    order = KO.shuffled_replay(np.zeros(1, np.int64), np.zeros(0, np.int16), engine._order_words(1),
                               lambda o, e0, e1: ranges.append((e0, e1)), threads=threads)
    assert order.shape == (0,) and ranges in ([], [(0, 0)])


def test_shuffled_replay_takes_a_thread_only_with_a_second_cpu(monkeypatch):
    """Past THREAD_MIN_ACCESSES, shuffled_replay shuffles on a second thread only where the process may run on
    more than one CPU (its affinity): with one, no thread pool is made."""
    import concurrent.futures

    stream = random_stream(3, L=2, N=16, k=4, steps=6)
    monkeypatch.setattr(KO, "THREAD_MIN_ACCESSES", 1)
    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", None)     # any pool made fails
    words = engine._order_words(2)
    monkeypatch.setattr(KO, "_usable_cpus", lambda: 1)
    KO.shuffled_replay(stream.offsets, stream.expert, words, lambda o, e0, e1: None)
    monkeypatch.setattr(KO, "_usable_cpus", lambda: 2)
    with pytest.raises(TypeError):
        KO.shuffled_replay(stream.offsets, stream.expert, words, lambda o, e0, e1: None)


def test_shuffle_in_ranges_draws_as_one_call():
    """shuffle_range over consecutive ranges, its state carried, equals shuffle_events over all the events."""
    rng = np.random.default_rng(53)
    stream = _any_sizes_stream(rng, 90, 40)
    words = engine._order_words(9)
    want = stream.expert.copy()
    KO.shuffle_events(stream.offsets, want, words)
    got = stream.expert.copy()
    st = np.zeros(6, dtype=np.uint64)
    st[:4] = words
    cuts = [0, *sorted(set(rng.integers(0, stream.n_events + 1, 5).tolist())), stream.n_events]
    for e0, e1 in zip(cuts[:-1], cuts[1:], strict=True):
        KO.shuffle_range(stream.offsets, got, st, e0, e1)
    assert (got == want).all()


STACK = ("lru", "least-stale", "lfu", "lfru", "lrfu", "belady")


@pytest.mark.parametrize("policy", STACK)
@pytest.mark.parametrize("semantics", SEMANTICS)
def test_forced_one_pass_equals_separate_replays(policy, semantics):
    """The curve pass stays tested wherever the cost model would pick separate replays."""
    for seed in range(3):
        stream = random_stream(seed, N=48, steps=16)
        cfg = ReplayConfig(policy, semantics=semantics, seed=seed)
        rhos = [0.0, 0.1, 0.3, 0.55, 1.0]
        forced = replay_curve(stream, cfg, rhos, one_pass=True)
        separate = replay_curve(stream, cfg, rhos, one_pass=False)
        assert forced == separate == replay_curve(stream, cfg, rhos)
        assert list(separate) == [replay(stream, ReplayConfig(policy, semantics=semantics, seed=seed, rho=r))
                                  for r in rhos]


def test_the_curve_choice_follows_the_measured_costs():
    """Decisions worked by hand from the tables: the pass's cost in replays at the largest rho (linear in rho
    between 0.1, 0.4 and 0.95) against CURVE_MARGIN (0.75) times the number of points."""
    assert engine.CURVE_MARGIN == 0.75
    grid = [round(0.05 * i, 2) for i in range(1, 20)]
    lru8 = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    big = 10_035_555
    assert curve_pays(ReplayConfig("lru"), grid)             # small streams: 7.2 replays at 0.95 < 14.25
    assert not curve_pays(ReplayConfig("lru"), lru8)         # 6.65 at 0.8 > 6
    assert curve_pays(ReplayConfig("lru"), lru8 + [0.9, 1.0])    # 7.2 at 1.0 (the table's end) < 7.5
    assert not curve_pays(ReplayConfig("lru"), lru8[:6])     # 5.93 at 0.6 > 4.5
    assert not curve_pays(ReplayConfig("lru"), lru8[:5])     # 5.56 at 0.5 > 3.75
    assert not curve_pays(ReplayConfig("lru"), lru8, big)    # 10 M: 8.11 at 0.8 > 6
    assert curve_pays(ReplayConfig("lru"), grid, big)        # 8.9 < 14.25
    assert not curve_pays(ReplayConfig("lru"), [0.1, 0.2])             # two fast replays beat one pass
    assert not curve_pays(ReplayConfig("belady"), [0.2, 0.3, 0.4])      # a 3-point Belady curve: 3 replays
    assert not curve_pays(ReplayConfig("belady"), grid)                # the bitset walk replays beat the pass
    assert not curve_pays(ReplayConfig("belady"), grid, big)
    assert not curve_pays(ReplayConfig("lfu"), lru8)          # the rank pass on small streams: 8.93 replays
    assert curve_pays(ReplayConfig("lfu"), lru8, big)         # on 10 M: 3.91 at 0.8 < 6
    assert curve_pays(ReplayConfig("lfu"), lru8[:6], big)     # 4.45 at 0.6 < 4.5
    assert not curve_pays(ReplayConfig("lfu"), lru8[:5], big)  # 4.73 at 0.5 > 3.75
    assert curve_pays(ReplayConfig("lfu"), grid) and curve_pays(ReplayConfig("lfu"), grid, big)
    seq = "sequential-ascending"        # the sequential loops of session 34: a pass costs many of their replays
    assert not curve_pays(ReplayConfig("lfu", semantics=seq), [0.1, 0.2])     # 7.73 replays at 0.2 > 1.5
    assert not curve_pays(ReplayConfig("lfu", semantics=seq), lru8)           # (session 44's loop) 7.31 at 0.8 > 6
    assert curve_pays(ReplayConfig("lfu", semantics=seq), grid)               # 7.2 at 0.95 < 14.25
    assert not curve_pays(ReplayConfig("lfru", semantics=seq), grid)          # 65.5 at 0.95 > 14.25
    assert not curve_pays(ReplayConfig("lrfu", semantics=seq), grid)          # 51.2 > 14.25
    assert not curve_pays(ReplayConfig("lru", semantics=seq), grid)           # on ranks: 21.2 > 14.25
    assert not curve_pays(ReplayConfig("lru"), [0.4, 0.4])               # one distinct rho: one replay
    assert not curve_pays(ReplayConfig("belady-forced"), [0.1, 0.2, 0.3])
    assert engine.CURVE_COST.keys() == engine.CURVE_COST_LARGE.keys()
    for table in (engine.CURVE_COST, engine.CURVE_COST_LARGE):
        for key, cost in table.items():
            assert len(cost) == 3 and all(c > 0 for c in cost), key


def test_the_curve_cost_moves_with_the_stream_length():
    """Geometric between the two tables in log(accesses), clamped: halfway (in log) the geometric mean; the
    small table below its streams' length and without a length, the large one from 10 M on."""
    cfg = ReplayConfig("lfu")
    lo, hi = engine.CURVE_COST_ACCESSES
    assert engine.curve_cost(cfg, 0.4) == engine.curve_cost(cfg, 0.4, lo / 10) == 9.8
    assert engine.curve_cost(cfg, 0.4, hi) == engine.curve_cost(cfg, 0.4, hi * 10) == 5.0
    assert abs(engine.curve_cost(cfg, 0.4, (lo * hi) ** 0.5) - (9.8 * 5.0) ** 0.5) < 1e-9
    assert abs(engine.curve_cost(cfg, 0.25, hi) - (4.7 + 5.0) / 2) < 1e-9
    assert engine.curve_cost(ReplayConfig("least-stale"), 0.4, hi) == 6.0      # lru's kernels
    assert engine.curve_cost(ReplayConfig("belady-forced"), 0.4) is None


def test_replay_curve_asks_with_the_stream_length(monkeypatch):
    """replay_curve's choice is made for the stream at hand: curve_pays gets its union accesses."""
    seen = []
    real = engine.curve_pays

    def spy(config, rhos, accesses=None):
        seen.append(accesses)
        return real(config, rhos, accesses)

    monkeypatch.setattr(engine, "curve_pays", spy)
    stream = _skewed_stream(2, 16, 20, 2, 1)
    replay_curve(stream, ReplayConfig("lfu"), [0.1, 0.2, 0.3])
    assert seen == [stream.union]


def _skewed_stream(L: int, N: int, steps: int, B: int, seed: int, top_k: int = 4) -> EventStream:
    """Zipf-like popularity that drifts: long runs of one layer's counts and ages, bands of near-equal keys."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, N + 1) ** 0.9
    rows, exps = [], []
    for s in range(steps):
        if s % 50 == 0:
            perm = [rng.permutation(N) for _ in range(L)]
        for layer in range(L):
            k = min(N, top_k)
            picks = {int(perm[layer][x]) for _ in range(B) for x in rng.choice(N, k, replace=False, p=w / w.sum())}
            rows.append((s, layer))
            exps.append(sorted(picks))
    return EventStream.from_lists(L, N, min(N, top_k), [r[0] for r in rows], [r[1] for r in rows], exps,
                                  [B] * len(rows))


def _bits_and_generic(policy, stream, caps, tie, tie_pos, warm, lam=-1.0, **kw):
    """Per-layer, event-atomic: the bitset loop's (``replay_lfru_bits`` / ``replay_lrfu_bits``, ``kw`` passed on)
    hits, misses and hit flags, and the generic kernel's, with ``warm`` warm-up events."""
    L, N = stream.n_layers, stream.n_experts
    want = _generic(stream, ReplayConfig(policy, warmup_events=warm), True, False, caps, tie, CODES[policy], lam,
                    False)
    got = [np.zeros(L, dtype=np.int64), np.zeros(L, dtype=np.int64), np.zeros(stream.union, np.uint8)]
    head = (stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos)
    if policy == "lfru":
        KB.replay_lfru_bits(*head, warm, *got, **kw)
    else:
        KB.replay_lrfu_bits(*head, lam, warm, *got, **kw)
    return got, want


def _skewed_cases(N, steps, tie_seed):
    """A two-layer skewed stream of ``N`` experts (``steps`` steps of B = 6, seeded by ``N``), random tie ranks
    (``tie_seed``) and their tie positions, with the two layers' quotas at 0.1 / 0.4 / 0.75 of ``N`` (the second
    3 larger): ``(frac, stream, caps, tie, tie_pos)`` per fraction."""
    stream = _skewed_stream(2, N, steps, 6, N)
    tie = engine._tie_ranks("random", tie_seed, 2 * N)
    _, tie_pos = engine._tie_order(tie, 2, N)
    for frac in (0.1, 0.4, 0.75):
        yield frac, stream, np.array([max(1, int(frac * N)), max(1, int(frac * N) + 3)], dtype=np.int64), tie, tie_pos


@pytest.mark.parametrize("N", (16, 128, 200))
def test_lfru_and_lrfu_bitset_loops_on_long_skewed_streams(N):
    """replay_lfru_bits / replay_lrfu_bits against replay_select / replay_heap on streams long enough for their
    cuts to adapt (1,600 events per layer, ages in the thousands, bands of near-equal keys), at several
    capacities, with hit flags; lrfu at four lambdas."""
    for frac, stream, caps, tie, tie_pos in _skewed_cases(N, 800, 1):
        for policy, lams in (("lfru", (-1.0,)), ("lrfu", (0.0, 0.1, 0.5, 1.0))):
            for lam in lams:
                got, want = _bits_and_generic(policy, stream, caps, tie, tie_pos, 7, lam)
                assert all((a == b).all() for a, b in zip(got, want, strict=True)), (policy, frac, lam)


@pytest.mark.parametrize("max_moves", [0, 1])
def test_lfru_bitset_loop_ranks_every_block_after_its_move_bound(max_moves):
    """replay_lfru_bits with its bound on a cut's moves at 0 (1): every overflow whose first cuts do not enclose
    the m-th key (that needs a second move) ranks every block of C ∪ U instead, the path that bounds the loop
    where counts could disagree with the bitsets: the counts and hit flags of the generic kernel, on long skewed
    streams (where cuts move often) at several capacities."""
    for N in (16, 128, 200):
        for frac, stream, caps, tie, tie_pos in _skewed_cases(N, 400, 2):
            got, want = _bits_and_generic("lfru", stream, caps, tie, tie_pos, 7, max_moves=max_moves)
            assert all((a == b).all() for a, b in zip(got, want, strict=True)), (N, frac, max_moves)


@pytest.mark.parametrize("old_age", [1.0, 3.0, 40.0])
def test_lfru_bitset_loop_decides_old_lanes_in_float64(old_age):
    """replay_lfru_bits with a low age bound, so that its float32 pass leaves many lanes (every lane at
    ``old_age`` 1) to the float64 test, in the first pass and in a moved cut's: the counts and hit flags of the
    generic kernel, on small random streams and on a long skewed one."""
    rng = np.random.default_rng([int(old_age), 13])
    cases = [(random_stream(int(rng.integers(0, 10**6)), L=3, N=N, k=min(N, 7), steps=30), N) for N in (9, 64, 70)]
    cases.append((_skewed_stream(2, 128, 400, 6, 128), 128))
    for stream, N in cases:
        L = stream.n_layers
        tie = engine._tie_ranks("random", N, L * N)
        _, tie_pos = engine._tie_order(tie, L, N)
        for frac in (0.1, 0.4, 0.75):
            caps = np.full(L, max(1, int(frac * N)), dtype=np.int64)
            got, want = _bits_and_generic("lfru", stream, caps, tie, tie_pos, 3, old_age=old_age)
            assert all((a == b).all() for a, b in zip(got, want, strict=True)), (N, frac, old_age)


def test_lrfu_bitset_loop_with_lanes_past_int16():
    """260 layers of 128 experts: the per-layer lrfu loop's lanes (layer * 128 + tie position) pass 32,767, so
    its lane table is int32, and the last layers decide as the generic kernel does."""
    L, N = 260, 128
    stream = _skewed_stream(L, N, 12, 4, 8)
    tie = engine._tie_ranks("random", 4, L * N)
    _, tie_pos = engine._tie_order(tie, L, N)
    assert KB.lrfu_lanes(tie_pos, L, N).max() > 2**15
    caps = np.full(L, 20, dtype=np.int64)
    want = _generic(stream, ReplayConfig("lrfu"), True, False, caps, tie, KEY_LRFU, 0.5, False)
    assert want[0][256:].sum() > 0 and want[1][256:].sum() > 0
    got = [np.zeros(L, dtype=np.int64), np.zeros(L, dtype=np.int64), np.zeros(stream.union, np.uint8)]
    KB.replay_lrfu_bits(stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos, 0.5, 0, *got)
    assert all((a == b).all() for a, b in zip(got, want, strict=True))


def test_lrfu_bitset_loop_past_its_decay_table():
    """One layer with more units than the decay table holds (65,536): gaps beyond it take the scalar update."""
    N = 6
    rng = np.random.default_rng(5)
    n = 70_000
    exps = [sorted(rng.choice(4, 2, replace=False).tolist()) for i in range(n)]
    exps[0] = [4, 5]
    exps[n - 1] = [0, 4, 5]                       # blocks idle since the first unit come back
    stream = EventStream.from_lists(1, N, 5, list(range(n)), [0] * n, exps, [1] * n)
    tie = engine._tie_ranks("random", 2, N)
    _, tie_pos = engine._tie_order(tie, 1, N)
    caps = np.array([3], dtype=np.int64)
    for lam in (0.0001, 0.5):
        want = _generic(stream, ReplayConfig("lrfu"), True, False, caps, tie, KEY_LRFU, lam, False)
        got = [np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(stream.union, np.uint8)]
        KB.replay_lrfu_bits(stream.offsets, stream.expert, stream.layer, N, 1, caps, tie_pos, lam, 0, *got)
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), lam


def _phased_stream(rng, L: int) -> EventStream:
    """2-6 blocks made resident, then left idle for 1,300-4,000 units while two others alternate (their lrfu
    values shrink at every move of the base until they become 0), then random units that evict them."""
    N = 16
    n1 = int(rng.integers(2, 7))
    units = [np.unique(rng.integers(0, n1, int(rng.integers(1, 3)))) for _ in range(int(rng.integers(20, 120)))]
    units += [np.array([n1 + int(rng.integers(0, 2))]) for _ in range(int(rng.integers(1300, 4000)))]
    units += [np.unique(rng.integers(0, N, int(rng.integers(1, 4)))) for _ in range(int(rng.integers(5, 60)))]
    exps = [e.tolist() for e in units for _ in range(L)]
    steps = [u for u in range(len(units)) for _ in range(L)]
    return EventStream.from_lists(L, N, 3, steps, list(range(L)) * len(units), exps, [1] * len(exps))


def _phased_cases(seed: int, n: int):
    """``n`` phased streams of 1-2 layers (:func:`_phased_stream`) with random or id tie ranks and quotas of 3-9,
    drawn from one generator seeded ``seed``: ``(L, stream, tie, tie_pos, caps)`` each."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        L = int(rng.integers(1, 3))
        stream = _phased_stream(rng, L)
        tie = engine._tie_ranks(str(rng.choice(["id", "random"])), int(rng.integers(0, 100)), L * 16)
        _, tie_pos = engine._tie_order(tie, L, 16)
        yield L, stream, tie, tie_pos, rng.integers(3, 10, L).astype(np.int64)


def test_lrfu_bitset_loop_across_moves_of_its_base():
    """The values scaled down when a layer's base moves (every 600 / lambda units), blocks idle so long that
    their values become 0 and only their exact keys rank them, and lambdas whose per-unit scale lands a cut on
    a value (0.08 and 0.25, the cuts' factors): against the generic kernel."""
    for L, stream, tie, tie_pos, caps in _phased_cases(20261203, 30):
        for lam in (0.08, 0.25, 0.5, 1.0):
            want = _generic(stream, ReplayConfig("lrfu"), True, False, caps, tie, KEY_LRFU, lam, False)
            got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
            KB.replay_lrfu_bits(stream.offsets, stream.expert, stream.layer, 16, L, caps, tie_pos, lam, 0, *got)
            assert all((a == b).all() for a, b in zip(got, want, strict=True)), (lam, caps)


@njit(cache=False)
def _lrfu_cut_pass(V, S, PL, lam, lam_r, cu, th, thv, qa, qb):
    msk = np.zeros((4, cu.shape[0]), dtype=np.uint64)
    cnt = np.zeros(4, dtype=np.int64)
    KB._lrfu_cut_pass(V, S, PL, 0, lam, lam_r, cu, cu.shape[0], th, thv, np.zeros(4, np.uint64), msk, qa, qb, cnt)
    keys = np.array([K.crf_key(S[j], float(PL[j]), lam) for j in range(S.shape[0])])
    return msk, cnt, keys, np.log2(th) + lam_r


def test_lrfu_cut_pass_places_every_block_as_its_exact_key():
    """Float32 values off by up to a quarter of the margin (what rounding may leave), equal keys, and cuts on a value,
    within the margin of one and past it: each cut holds exactly the blocks whose exact key is at most the
    cut's key ``log2(cut) + lam * base``."""
    rng = np.random.default_rng(11)
    delta = 1e-6
    for _ in range(300):
        lam = float(rng.choice([0.0, 0.25, 0.5, 1.0]))
        base = int(rng.integers(0, 1000))
        PL = base + rng.integers(0, 12, 128)
        S = rng.choice([1.0, 1.5, 1.7071067811865475, 2.25], 128)
        V = (S * 2.0 ** (lam * (PL - base)) * (1.0 + rng.uniform(-delta / 4, delta / 4, 128))).astype(np.float32)
        th = np.array([V[rng.integers(0, 128)] * rng.choice([1.0, 1.0 + delta / 2, 1.0 - delta / 2, 1.0 + 3 * delta])
                       for _ in range(4)])
        thv = np.stack([th * (1.0 - delta), th * (1.0 + delta)], axis=1).ravel().astype(np.float32)
        cu = rng.integers(0, 2**63, 2, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
        qa, qb = (int(q) for q in rng.integers(0, 4, 2))
        msk, cnt, keys, kth = _lrfu_cut_pass(V, S, PL, lam, lam * base, cu, th, thv, qa, qb)
        for q in {qa, qb}:
            want = [sum(1 << j for j in range(64) if (int(cu[w]) >> j) & 1 and keys[64 * w + j] <= kth[q])
                    for w in range(2)]
            assert [int(x) for x in msk[q]] == want and cnt[q] == sum(bin(x).count("1") for x in want), q


@njit(cache=False)
def _lrfu_cuts_at_margin(V, S, PL, lam, lam_r, cu, t, u):
    th = np.empty(4)
    thv = np.empty(8, dtype=np.float32)
    for q in range(4):
        KB._lrfu_set_cut(th, thv, q, t[q], KB._lrfu_margin(u, lam))
    return _lrfu_cut_pass(V, S, PL, lam, lam_r, cu, th, thv, 0, 1) + (th,)


def test_lrfu_cuts_within_float32_rounding_of_a_value_place_blocks_by_exact_keys():
    """The loop's own values (float64 products rounded to float32, as the member loop and a move of the base
    write them) and its own margin and bounds (``_lrfu_margin``, ``_lrfu_set_cut``), with cuts closer to a value
    than float32 resolves (``2**-30`` .. ``2**-23`` relative) on either side, and blocks whose exact keys differ
    by less than that: each cut holds exactly the blocks whose exact key is at most the cut's key. Without the
    float32 term of the margin a sure bound rounds onto the value and the cut takes blocks above it."""
    rng = np.random.default_rng(20261204)
    for _ in range(400):
        lam = float(rng.choice([0.25, 0.5, 1.0]))
        base = int(rng.integers(0, 3000))
        u = base + 40
        PL = (base + rng.integers(0, 40, 128)).astype(np.int32)
        S = rng.choice([1.0, 1.0 + 2.0 ** -28, 1.0 + 2.0 ** -26, 1.0 + 2.0 ** -24, 1.5, 1.5 + 2.0 ** -27], 128)
        real = S * 2.0 ** (lam * (PL - base).astype(np.float64))
        V = real.astype(np.float32)
        t = np.array([real[rng.integers(0, 128)] * (1.0 + float(rng.choice([-1.0, 1.0])) * 2.0 ** -float(
            rng.integers(23, 31))) for _ in range(4)])
        cu = rng.integers(0, 2**63, 2, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
        msk, cnt, keys, kth, th = _lrfu_cuts_at_margin(V, S, PL, lam, lam * base, cu, t, u)
        for q in (0, 1):
            want = [sum(1 << j for j in range(64) if (int(cu[w]) >> j) & 1 and keys[64 * w + j] <= kth[q])
                    for w in range(2)]
            assert [int(x) for x in msk[q]] == want and cnt[q] == sum(bin(x).count("1") for x in want), q


@pytest.mark.parametrize(("policy", "bound"), [("lfru", "MAX_LFRU_EVENTS"), ("lrfu", "MAX_LRFU_EVENTS")])
def test_past_the_bitset_loops_event_bound(monkeypatch, policy, bound):
    """Streams longer than a bitset loop takes (lfru's exact cuts, lrfu's int32 last units) go to the generic
    loops (same counts)."""
    rng = np.random.default_rng(3)
    stream = small_stream(rng)
    want = replay(stream, ReplayConfig(policy, rho=0.4))
    monkeypatch.setattr(KB, bound, 1)
    got = replay(stream, ReplayConfig(policy, rho=0.4))
    assert counts(got) == counts(want)


def test_lrfu_bitset_loop_refuses_streams_past_its_bound(monkeypatch):
    """The lrfu bitset loop itself refuses a stream longer than its int32 last units allow, with a message."""
    stream = small_stream(np.random.default_rng(4))
    monkeypatch.setattr(KB, "MAX_LRFU_EVENTS", 1)
    L, N = stream.n_layers, stream.n_experts
    _, tie_pos = engine._tie_order(engine._tie_ranks("random", 0, L * N), L, N)
    with pytest.raises(ValueError, match="int32"):
        KB.replay_lrfu_bits(stream.offsets, stream.expert, stream.layer, N, L, np.full(L, 2, dtype=np.int64),
                            tie_pos, 0.5, 0, np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(0, np.uint8))


def test_lfru_bitset_loop_with_units_larger_than_the_quota():
    """Units of ~40 members against quotas of 13-51 (the benchmark's shape at rho 0.1-0.4): most of ``C ∪ U``
    leaves at every unit, and bands of 33-64 blocks (sorted by the 64-lane network) occur; against
    replay_select with hit flags."""
    L, N = 2, 128
    stream = _skewed_stream(L, N, 500, 8, 11, top_k=8)
    tie = engine._tie_ranks("random", 3, L * N)
    _, tie_pos = engine._tie_order(tie, L, N)
    for frac in (0.1, 0.2, 0.4):
        caps = np.full(L, int(frac * N), dtype=np.int64)
        want = _generic(stream, ReplayConfig("lfru", warmup_events=5), True, False, caps, tie, CODES["lfru"], -1.0,
                        False)
        got = [np.zeros(L, dtype=np.int64), np.zeros(L, dtype=np.int64), np.zeros(stream.union, np.uint8)]
        KB.replay_lfru_bits(stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos, 5, *got)
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), frac


@pytest.mark.parametrize(("policy", "lams"), [("lfru", (-1.0,)), ("lrfu", (0.1, 0.5, 1.0))])
def test_lfru_and_lrfu_bitset_loops_narrow_wide_bands_at_large_batches(policy, lams):
    """Units of 64 requests x top-8 (most of a layer's 128 experts) against quotas of 6-96: many keys lie near the
    ``need``-th (lfru: members' counts over an age of 1; lrfu: members' CRFs near their common limit), so the cuts
    hold bands of 65-115 blocks, which the loops narrow with cuts between the two (``_narrow`` with ``dyadic8_mid``,
    ``_lrfu_narrow``) before ranking the band; the counts and hit flags of replay_select / replay_heap, with warm-up,
    under both tie breaks."""
    L, N = 2, 128
    stream = _skewed_stream(L, N, 300, 64, 17, top_k=8)
    assert stream.union / stream.n_events > 100
    for tie_break in ("id", "random"):
        tie = engine._tie_ranks(tie_break, 4, L * N)
        _, tie_pos = engine._tie_order(tie, L, N)
        for frac in (0.05, 0.2, 0.4, 0.75):
            caps = np.array([int(frac * N), int(frac * N) + 5], dtype=np.int64)
            for lam in lams:
                got, want = _bits_and_generic(policy, stream, caps, tie, tie_pos, 9, lam)
                assert all((a == b).all() for a, b in zip(got, want, strict=True)), (tie_break, frac, lam)


def test_dyadic8_mid_lies_strictly_between_or_says_none_does():
    """dyadic8_mid against a count of the values of 8 significant bits between two such values: one strictly
    between them where any is, ``a`` where none is."""
    rng = np.random.default_rng(8)
    for _ in range(2000):
        a = SIMD.dyadic8_down(float(rng.uniform(1e-6, 1e6)))
        b = SIMD.dyadic8_up(a * float(rng.choice([1.0 + 2.0 ** -7, 1.0 + 2.0 ** -6, 1.5, 3.0, 1e3])))
        x = SIMD.dyadic8_mid(a, b)
        between = SIMD.dyadic8_up(np.nextafter(a, np.inf)) < b
        assert (a < x < b and SIMD.dyadic8_down(x) == x) if between else x == a, (a, b, x)


def test_lfru_bitset_loop_band_of_64_equal_keys_all_leaving():
    """A band of exactly 64 blocks with one key, all of which leave (``need == nb == 64``): a tie count of 64,
    where a shift by the lane count would keep them all. Three units of 64 new blocks against a quota of 64:
    the second unit's blocks form the third unit's band."""
    L, N = 1, 192
    a, b, c = list(range(0, 64)), list(range(64, 128)), list(range(128, 192))
    exps = [a, b, c, a, c, b, a]             # after the third unit only c stays; the rest show it in their hits
    stream = EventStream.from_lists(L, N, 64, list(range(7)), [0] * 7, exps, [64] * 7)
    for tie_break in ("id", "random"):
        tie = engine._tie_ranks(tie_break, 5, L * N)
        _, tie_pos = engine._tie_order(tie, L, N)
        caps = np.array([64], dtype=np.int64)
        want = _generic(stream, ReplayConfig("lfru"), True, False, caps, tie, CODES["lfru"], -1.0, False)
        got = [np.zeros(L, dtype=np.int64), np.zeros(L, dtype=np.int64), np.zeros(stream.union, np.uint8)]
        KB.replay_lfru_bits(stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos, 0, *got)
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), tie_break


def _lockstep_stream(rng, L: int, N: int, n_events: int) -> EventStream:
    """Experts in groups that are accessed together (so their keys stay equal), a few strays, one layer per
    step; a unit may hold every expert of its layer."""
    size = int(rng.choice([8, 16, 32, 64, 65]))
    groups = [list(range(a, min(N, a + size))) for a in range(0, N, size)]
    exps = []
    for _ in range(n_events):
        chosen = rng.choice(len(groups), int(rng.integers(1, len(groups) + 1)), replace=False)
        members = {x for c in chosen for x in groups[c]}
        if rng.random() < 0.3:
            members |= {int(x) for x in rng.choice(N, int(rng.integers(1, 5)), replace=False)}
        exps.append(sorted(members))
    layers = [int(x) for x in rng.integers(0, L, n_events)]
    return EventStream.from_lists(L, N, N, list(range(n_events)), layers, exps, [1] * n_events)


def test_lfru_and_lrfu_bitset_loops_on_lockstep_groups():
    """Many equal keys and bands of every size up to the universe (groups of 8-65 experts moving together,
    quotas of 1 to N): replay_lfru_bits / replay_lrfu_bits against the generic kernels, 1,500 random cases.
    A band of 64 equal keys that all leave is among them (a tie count of 64 once kept them all)."""
    rng = np.random.default_rng(20261202)
    for _ in range(1500):
        L, N = int(rng.integers(1, 3)), int(rng.choice([64, 100, 128, 192, 256]))
        stream = _lockstep_stream(rng, L, N, int(rng.integers(5, 60)))
        tie = engine._tie_ranks(str(rng.choice(["id", "random"])), int(rng.integers(0, 100)), L * N)
        _, tie_pos = engine._tie_order(tie, L, N)
        caps = np.full(L, int(rng.integers(1, N + 1)), dtype=np.int64)
        for policy, lam in (("lfru", -1.0), ("lrfu", float(rng.choice([0.0, 0.01, 0.08, 0.25, 0.5, 1.0])))):
            want = _generic(stream, ReplayConfig(policy), True, False, caps, tie, CODES[policy], lam, False)
            got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
            head = (stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos)
            if policy == "lfru":
                KB.replay_lfru_bits(*head, 0, *got)
            else:
                KB.replay_lrfu_bits(*head, lam, 0, *got)
            assert all((a == b).all() for a, b in zip(got, want, strict=True)), (policy, lam, L, N, caps[0])


@pytest.mark.skipif(not KB.HAS_BITALG, reason="the unit's bits by vpshufbitqmb need AVX-512 BITALG")
def test_tie_bits_move_an_expert_bitset_to_tie_positions():
    """``_simd.tie_bits1`` / ``tie_bits2`` with ``tie_order_bytes``: bit ``t`` of the result is set where the expert
    at tie position ``t`` is in the set, for 1-128 experts (positions past them clear), against a loop."""
    rng = np.random.default_rng(7)
    for N in (1, 5, 63, 64, 65, 100, 127, 128):
        L = 3
        tie_pos = np.concatenate([rng.permutation(N) for _ in range(L)])
        order = KB.tie_order_bytes(tie_pos, L, N)
        n_words = (N + 63) // 64
        for _ in range(20):
            layer = int(rng.integers(L))
            members = rng.choice(N, size=int(rng.integers(0, N + 1)), replace=False)
            e = [0, 0]
            want = [0] * n_words
            for m in members:
                e[m >> 6] |= 1 << (m & 63)
                t = int(tie_pos[layer * N + m])
                want[t >> 6] |= 1 << (t & 63)
            ev = np.zeros(n_words, np.uint64)
            (_tie_bits2 if n_words == 2 else _tie_bits1)(np.uint64(e[0]), np.uint64(e[1]), order, layer * 128, ev)
            assert ev.tolist() == want, (N, layer)


@njit(cache=False)
def _tie_bits1(e0, e1, order, off, ev):
    KB.tie_bits1(e0, e1, order, off, ev)


@njit(cache=False)
def _tie_bits2(e0, e1, order, off, ev):
    KB.tie_bits2(e0, e1, order, off, ev)


def _no_bitalg_cases():
    """(key, stream, capacities, tie ranks, tie positions, policy, code, lambda) of the check compiled for CPUs
    without BITALG."""
    for N in (64, 128):
        stream = _skewed_stream(2, N, 120, 6, 8)
        tie = engine._tie_ranks("random", N, 2 * N)
        _, tie_pos = engine._tie_order(tie, 2, N)
        for frac in (0.1, 0.4):
            caps = np.full(2, max(1, int(frac * N)), dtype=np.int64)
            for policy, code, lam in (("lfru", KEY_LFRU, -1.0), ("lrfu", KEY_LRFU, 0.5)):
                yield f"{N}-{frac}-{policy}", stream, caps, tie, tie_pos, policy, code, lam


_NO_BITALG_CHECK = """
import numpy as np
import test_fast_policies as T
from test_lfru_slots import load_wants
from expertcache.replay import _kernels_bits as KB
from expertcache.replay import _simd as S
assert not KB.HAS_BITALG and KB._unit_bits_ordered is KB._unit_bits_no_order
import sys
form = sys.argv[1]             # the band's lists without VBMI2: compressed stores (AVX-512), else sixteen steps
assert not S.HAS_VBMI2 and S.band16_2 is getattr(S, "_band16_2_" + form) and S.band16v_2 is S._band16v_2_loop
assert S.band16_1 is getattr(S, "_band16_1_" + form)
wants = load_wants(sys.argv[2])
for key, stream, caps, tie, tie_pos, policy, code, lam in T._no_bitalg_cases():
    want = wants.pop(key)
    got = [np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(stream.union, np.uint8)]
    head = (stream.offsets, stream.expert, stream.layer, stream.n_experts, 2, caps, tie_pos)
    if policy == "lfru":
        KB.replay_lfru_bits(*head, 0, *got)
    else:
        KB.replay_lrfu_bits(*head, lam, 0, *got)
    assert all((a == b).all() for a, b in zip(got, want, strict=True)), key
assert not wants
print("ok")
"""


@pytest.mark.parametrize("cpu", ["skylake-avx512", "haswell"])
def test_lfru_bitset_loop_without_bitalg(tmp_path, cpu):
    """Compiled for Skylake-X (AVX-512 without BITALG and VBMI2; the kernels afresh in a subprocess), the per-layer
    lfru loop builds its unit's bits by a gather of tie positions and its band by compressed stores, and the lrfu
    loop its band by compressed stores; compiled for Haswell (AVX2, no AVX-512), the lfru loop builds its band in
    sixteen steps with no branch (``_simd._band16_2_fixed``), the lrfu loop by a loop over the bits (skipped on a
    machine without AVX-512, whose own kernels are those forms); each with the generic kernel's counts and flags."""
    import subprocess
    import sys

    from test_lfru_slots import named_cpu_env, save_wants, skip_where_host_runs_the_haswell_forms

    env = named_cpu_env(tmp_path, cpu)
    if cpu == "haswell":
        skip_where_host_runs_the_haswell_forms(need_fma=False)
    form = "loop" if cpu == "skylake-avx512" else "fixed"
    wants = save_wants(tmp_path / "wants.npz",
                       {key: _generic(stream, ReplayConfig(policy), True, False, caps, tie, code, lam, False)
                        for key, stream, caps, tie, _, policy, code, lam in _no_bitalg_cases()})
    proc = subprocess.run([sys.executable, "-c", _NO_BITALG_CHECK, form, wants], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def _seq_generic(stream, expert, caps, tie, code, lam, reset, warm):
    """Counts and hit flags of replay_heap, sequential per layer, one unit per access in the order ``expert``."""
    L = stream.n_layers
    got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    K.replay_heap(stream.offsets, expert, stream.layer, stream.step, stream.n_experts, L, False, False,
                  np.empty(0, np.int32), caps, tie, code, reset, lam, warm, *got)
    return got


def _seq_packed(stream, expert, caps, tie_pos, code, lam, reset, warm):
    """The same from the packed-key loops of _kernels_seq."""
    L = stream.n_layers
    got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    head = (stream.offsets, expert, stream.layer, stream.n_experts, L, caps, tie_pos)
    if code == KEY_LFU:
        KQ.replay_lfu_seq(*head, reset, warm, *got)
    else:
        KQ.replay_lrfu_seq(*head, lam, warm, *got)
    return got


def _seq_cases(stream, tie, tie_pos, caps, warm, lams=(0.0, 1e-6, 0.25, 0.5, 1.0), orders=None):
    """Every (order, policy, lambda, in-cache counters) of a stream: the generic and the packed loops' results."""
    for expert in orders or (stream.expert, _shuffled(stream, stream.n_experts + warm)):
        want = _scan_sequential(stream, expert, caps, tie, warm)
        got = [np.zeros(stream.n_layers, np.int64), np.zeros(stream.n_layers, np.int64),
               np.zeros(stream.union, np.uint8)]
        KQ.replay_lfru_seq(stream.offsets, expert, stream.layer, stream.n_experts, stream.n_layers, caps, tie_pos,
                           warm, *got)
        yield got, want, (KEY_LFRU, -1.0, False)
        for code, lam_set in ((KEY_LFU, (-1.0,)), (KEY_LRFU, lams)):
            for lam in lam_set:
                for reset in (False, True) if code == KEY_LFU else (False,):
                    want = _seq_generic(stream, expert, caps, tie, code, lam, reset, warm)
                    got = _seq_packed(stream, expert, caps, tie_pos, code, lam, reset, warm)
                    yield got, want, (code, lam, reset)


@pytest.mark.parametrize("N", (1, 7, 64, 65, 130, 1024))
def test_sequential_lfu_and_lrfu_loops_equal_the_generic_kernel(N):
    """replay_lfu_seq / replay_lrfu_seq / replay_lfru_seq called directly, ascending and shuffled members:
    capacities from 0 past N, multi-word layers, warm-up, hit flags, in-cache counters, every lrfu lambda the twin
    test draws (lambda 0 ties every block seen once, so the exact keys decide; lfru's small counts over small ages
    tie often)."""
    L = 3
    stream = random_stream(N + 5, L=L, N=N, k=min(N, 9), steps=40 if N < 1024 else 12)
    tie = engine._tie_ranks("random", N, L * N)
    _, tie_pos = engine._tie_order(tie, L, N)
    for caps in ((0, 1, 2), (N // 3, N // 2, max(N - 1, 0)), (N, N + 1, 5 * N), (3, 9, 17)):
        caps = np.array(caps, dtype=np.int64)
        for warm in (0, 5):
            for got, want, case in _seq_cases(stream, tie, tie_pos, caps, warm):
                assert all((a == b).all() for a, b in zip(got, want, strict=True)), (caps, warm, case)


def test_sequential_lfu_by_hand_misses_below_the_bound():
    """Per-layer sequential lfu, a quota of 2 over one layer of 4 (tie positions = ids), accesses 0 1 0 0 2 1 2 0.
    Counts kept: 0 and 1 fill the layer (the bound: count 1, tie 0); 0 hits twice (count 3: the bound still holds);
    2 (count 1, tie 2) is at the bound's count: the pass finds 1 (count 1, tie 1) lowest, and 1 leaves;
    1 (count 2) evicts 2 (count 1); 2 (count 2) evicts 1 (count 2, tie 1 < 2); 0 hits. In-cache counters: as far as
    2's arrival, which evicts 1 (its count forgotten); 1 comes back with count 1 and tie 1, below 2 (count 1, tie 2):
    it leaves at once; 2 and 0 hit. Both equal the heap loop."""
    stream = EventStream.from_lists(1, 4, 4, list(range(8)), [0] * 8, [[0], [1], [0], [0], [2], [1], [2], [0]],
                                    [1] * 8)
    ident = np.arange(4, dtype=np.int64)
    caps = np.array([2], np.int64)
    for reset, flags in ((False, [0, 0, 1, 1, 0, 0, 0, 1]), (True, [0, 0, 1, 1, 0, 0, 1, 1])):
        got = _seq_packed(stream, stream.expert, caps, ident, KEY_LFU, -1.0, reset, 0)
        assert got[2].tolist() == flags and got[0].tolist() == [sum(flags)], reset
        want = _seq_generic(stream, stream.expert, caps, ident, KEY_LFU, -1.0, reset, 0)
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), reset


@pytest.mark.parametrize("N", (16, 128, 200))
def test_sequential_lfu_and_lrfu_loops_on_long_skewed_streams(N):
    """The packed-key loops against replay_heap on long skewed streams (1,600 events a layer, counts and CRFs far
    apart and close together), at three quotas, ascending and shuffled, lrfu at four lambdas."""
    for _, stream, caps, tie, tie_pos in _skewed_cases(N, 800, 1):
        for got, want, case in _seq_cases(stream, tie, tie_pos, caps, 7, lams=(0.0, 1e-6, 0.1, 0.5, 1.0)):
            assert all((a == b).all() for a, b in zip(got, want, strict=True)), (caps, case)


def test_sequential_lrfu_loop_across_moves_of_its_base():
    """Blocks idle for thousands of units (their values scaled down at every move of the base until they are 0,
    where only exact keys rank them), then evicted: the packed-key loop against replay_heap."""
    for _, stream, tie, tie_pos, caps in _phased_cases(20261205, 12):
        for got, want, case in _seq_cases(stream, tie, tie_pos, caps, 0, lams=(0.08, 0.25, 0.5, 1.0),
                                          orders=(stream.expert,)):
            assert all((a == b).all() for a, b in zip(got, want, strict=True)), (caps, case)


def test_sequential_lrfu_loop_past_its_decay_table():
    """One layer of 70,000 accesses (units past the 65,536 of the decay table): blocks idle since the first
    accesses come back, their gap decayed by the scalar expression."""
    N = 6
    rng = np.random.default_rng(6)
    n = 35_000
    exps = [sorted(rng.choice(4, 2, replace=False).tolist()) for i in range(n)]
    exps[0] = [4, 5]
    exps[n - 1] = [0, 4, 5]
    stream = EventStream.from_lists(1, N, 5, list(range(n)), [0] * n, exps, [1] * n)
    tie = engine._tie_ranks("random", 2, N)
    _, tie_pos = engine._tie_order(tie, 1, N)
    for got, want, case in _seq_cases(stream, tie, tie_pos, np.array([3], np.int64), 0, lams=(0.0001, 0.5),
                                      orders=(stream.expert,)):
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), case


@pytest.mark.parametrize(("quota", "lam", "bound", "width"),
                         [(3, 0.5, None, 16), (3, 0.0001, None, 16), (3, 0.0001, 1000, None), (20, 0.25, None, 32),
                          (40, 0.0, None, 64), (64, 1.0, None, 64), (65, 0.5, None, None)])
def test_sequential_lrfu_slot_loop_where_its_table_holds_every_decay(monkeypatch, quota, lam, bound, width):
    """Quotas up to 64 take the slot loop (packed keys in registers, 16 / 32 / 64 lanes; tie positions too for 16,
    and 32 with AVX-512, an array of each block's slot for more) where its decay table holds every gap the stream has
    or every gap before the decay is 0 (here 70,000 units a layer: lambda 0.5 needs 2,154 decays, 0.0001 all 70,001;
    lambda 0 decays nothing); past the table's bound (forced to 1,000 here) and for larger quotas the tie-position
    loop runs. Either equals replay_heap, blocks idle since the first accesses coming back last."""
    seen = []
    for name in ("_replay_lrfu_seq_v", "_replay_lrfu_seq"):
        real = getattr(KQ, name)
        monkeypatch.setattr(KQ, name, lambda *a, _r=real, _n=name: seen.append(a[-1].n if _n.endswith("_v") else None)
                            or _r(*a))
    if bound is not None:
        monkeypatch.setattr(KQ, "_LRFU_SLOT_DECAYS", bound)
    N = 70
    rng = np.random.default_rng(quota)
    n = 35_000
    exps = [sorted(rng.choice(quota + 2, 2, replace=False).tolist()) for _ in range(n)]
    exps[0] = [68, 69]
    exps[n - 1] = [0, 68, 69]
    stream = EventStream.from_lists(1, N, 5, list(range(n)), [0] * n, exps, [1] * n)
    tie = engine._tie_ranks("random", 2, N)
    _, tie_pos = engine._tie_order(tie, 1, N)
    caps = np.array([quota], np.int64)
    want = _seq_generic(stream, stream.expert, caps, tie, KEY_LRFU, lam, False, 0)
    got = _seq_packed(stream, stream.expert, caps, tie_pos, KEY_LRFU, lam, False, 0)
    assert all((a == b).all() for a, b in zip(got, want, strict=True))
    assert seen == [width]


def test_sequential_lfu_loop_with_int64_counts(monkeypatch):
    """Layers whose accesses could pass int32 counts take int64 counts (forced here by a bound of 12 accesses): the
    same counts and flags, in both loops."""
    monkeypatch.setattr(KQ, "LFU_COUNT32_MAX", 12)
    seen = []
    for name in ("_replay_lfu_seq", "_replay_lfu_seq_reset"):
        real = getattr(KQ, name)
        monkeypatch.setattr(KQ, name, lambda *a, _r=real, _n=name: seen.append((_n, a[-4].dtype.name)) or _r(*a))
    for N in (7, 130):
        stream = random_stream(N, L=2, N=N, k=min(N, 9), steps=60)
        tie = engine._tie_ranks("random", N, 2 * N)
        _, tie_pos = engine._tie_order(tie, 2, N)
        caps = np.array([max(N // 3, 1), N // 2], dtype=np.int64)
        for reset in (False, True):
            want = _seq_generic(stream, stream.expert, caps, tie, KEY_LFU, -1.0, reset, 3)
            got = _seq_packed(stream, stream.expert, caps, tie_pos, KEY_LFU, -1.0, reset, 3)
            assert all((a == b).all() for a, b in zip(got, want, strict=True)), (N, reset)
    assert sorted(set(seen)) == [("_replay_lfu_seq", "int64"), ("_replay_lfu_seq_reset", "int64")]


@pytest.mark.parametrize("semantics", ("sequential-ascending", "sequential-random"))
def test_sequential_per_layer_lfu_lrfu_lfru_take_the_packed_key_loops(monkeypatch, semantics):
    """The engine sends sequential per-layer lfu, lrfu and lfru to _kernels_seq's loops by ranges (which the twin
    tests above cover through replay_*_seq, their one range), and global scope elsewhere."""
    called = []
    for name in ("lfu_seq_ranges", "lrfu_seq_ranges", "lfru_seq_ranges"):
        real = getattr(KQ, name)
        monkeypatch.setattr(KQ, name, lambda *a, _r=real, _n=name: called.append(_n) or _r(*a))
    stream = random_stream(4, L=2, N=20, k=5, steps=10)
    for policy in ("lfu", "lrfu", "lfru"):
        replay(stream, ReplayConfig(policy, rho=0.3, semantics=semantics))
        replay(stream, ReplayConfig(policy, rho=0.3, semantics=semantics, scope="global"))
    assert called == ["lfu_seq_ranges", "lrfu_seq_ranges", "lfru_seq_ranges"]


@pytest.mark.parametrize("counts", [(109, 85, 299), (799, 400, 399), (498, 288, 393)])
def test_sequential_lfru_loop_on_keys_closer_than_its_packing(counts):
    """Two residents whose lfru keys differ by 3e-6 to 3e-5 of their value (``cA / (cB + k + 2)`` and ``cB / (k +
    2)``: A accessed cA times, then B cB times, then a third block k times), closer than what packing the tie
    position takes off a float32 key at N = 1,024 (2**-13): a new block then evicts the lower exact key, whichever
    tie position it has (the margin check and the float64 keys decide; the packed keys alone order them by tie
    position)."""
    cA, cB, k = counts
    N = 1024
    for a, b in ((5, 9), (9, 5)):
        exps = [[a]] * cA + [[b]] * cB + [[700]] * k + [[3]]
        n = len(exps)
        stream = EventStream.from_lists(1, N, 1, list(range(n)), [0] * n, exps, [1] * n)
        tie = engine._tie_ranks("id", 0, N)
        _, tie_pos = engine._tie_order(tie, 1, N)
        caps = np.array([3], dtype=np.int64)
        want = _scan_sequential(stream, stream.expert, caps, tie, 0)
        got = [np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(n, np.uint8)]
        KQ.replay_lfru_seq(stream.offsets, stream.expert, stream.layer, N, 1, caps, tie_pos, 0, *got)
        assert all((x == y).all() for x, y in zip(got, want, strict=True)), (counts, a, b)
        stream2 = EventStream.from_lists(1, N, 1, list(range(n + 1)), [0] * (n + 1), exps + [[a]], [1] * (n + 1))
        want = _scan_sequential(stream2, stream2.expert, caps, tie, 0)     # is A still resident: the decision
        got = [np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(n + 1, np.uint8)]
        KQ.replay_lfru_seq(stream2.offsets, stream2.expert, stream2.layer, N, 1, caps, tie_pos, 0, *got)
        assert all((x == y).all() for x, y in zip(got, want, strict=True)), (counts, a, b)


@pytest.mark.parametrize(("quota", "width"), [(5, 16), (16, 16), (17, 32), (40, 64), (64, 64), (65, None)])
def test_sequential_lfru_loop_in_registers_at_each_width(monkeypatch, quota, width):
    """Quotas up to 64 run the loop that holds a layer's slots as vectors of 16, 32 or 64 lanes (48 taken as 64),
    larger ones the loop over slots in memory; each equals replay_scan on long skewed streams (counts far apart and
    close together, evictions that the margins send to the exact keys), ascending and shuffled, with warm-up."""
    seen = []
    for name in ("_replay_lfru_seq_v", "_replay_lfru_seq"):
        real = getattr(KQ, name)
        monkeypatch.setattr(KQ, name, lambda *a, _r=real, _n=name: seen.append(a[-1].n if _n.endswith("_v") else None)
                            or _r(*a))
    N = 96
    stream = _skewed_stream(2, N, 600, 6, quota)
    tie = engine._tie_ranks("random", 11, 2 * N)
    _, tie_pos = engine._tie_order(tie, 2, N)
    caps = np.array([max(quota - 3, 0), quota], dtype=np.int64)
    for expert in (stream.expert, _shuffled(stream, 5)):
        want = _scan_sequential(stream, expert, caps, tie, 4)
        got = [np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(stream.union, np.uint8)]
        KQ.replay_lfru_seq(stream.offsets, expert, stream.layer, N, 2, caps, tie_pos, 4, *got)
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), (quota, width)
    assert seen == [width, width]


@pytest.mark.parametrize("max_moves", [0, 1])
def test_lrfu_bitset_loop_ranks_every_block_after_its_move_bound(max_moves):
    """replay_lrfu_bits with its bound on an outer cut's moves at 0 (1): every overflow whose inner cuts do not
    enclose the m-th value (that needs a second move) ranks every block of C ∪ U by exact keys instead, the path
    that keeps the loop's time bounded whatever its state: the counts and hit flags of the generic kernel, on long
    skewed streams (where outer cuts move often) at several capacities and lambdas."""
    for N in (16, 128, 200):
        for frac, stream, caps, tie, tie_pos in _skewed_cases(N, 400, 3):
            for lam in (0.1, 0.5):
                got, want = _bits_and_generic("lrfu", stream, caps, tie, tie_pos, 7, lam, max_moves=max_moves)
                assert all((a == b).all() for a, b in zip(got, want, strict=True)), (N, frac, lam, max_moves)


_NAN_VALUES = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_fast_policies import _skewed_cases
from expertcache.replay import _kernels_bits as KB

class NanValues:
    '''The allocator of replay_lrfu_bits' state: every block of every layer resident from the start (its bitsets,
    uint64, all ones, and the int64 counts of residents 16, where 0 was asked) with a NaN value (float32).'''
    def __call__(self, shape, dtype, fill=None):
        a = np.empty(shape, dtype)
        if fill is not None:
            kind = np.dtype(dtype)
            a[...] = {np.dtype(np.float32): np.nan, np.dtype(np.uint64): ~np.uint64(0),
                      np.dtype(np.int64): 16}.get(kind, fill) if fill == 0 else fill
        return a
    def copy(self, x):
        return np.array(x)

for frac, stream, caps, tie, tie_pos in _skewed_cases(16, 200, 3):
    got = [np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(stream.union, np.uint8)]
    KB.replay_lrfu_bits(stream.offsets, stream.expert, stream.layer, 16, 2, caps, tie_pos, 0.5, 0, *got,
                        pages=NanValues())
print("done")
"""


def test_lrfu_bitset_loop_ends_on_values_that_disagree_with_their_keys():
    """State no stream makes (every block resident from the start with a NaN value, which no cut ever holds): the
    outer cuts' bound ends each overflow (without it the loop runs without end, as a placement test's wrong fill
    showed), in a subprocess with a time limit."""
    r = subprocess.run([sys.executable, "-c", _NAN_VALUES, str(Path(__file__).parent)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr


def test_lrfu_cut_spread_narrows_one_layer_and_widens_back_to_one():
    """_lrfu_spread: a layer's cut factors are _LRFU_CUT_FACTORS to the power of its spread; narrowing one layer
    (by 0.25) leaves the others, and widening caps the spread at 1 (the factors themselves)."""
    factors = np.array(KB._LRFU_CUT_FACTORS)
    fac = np.tile(factors, (2, 1))
    spread = np.ones(2)
    KB._lrfu_spread(fac, spread, 1, 0.25)
    assert spread.tolist() == [1.0, 0.25]
    assert np.array_equal(fac[0], factors) and np.allclose(fac[1], factors ** 0.25, rtol=1e-15)
    assert fac[1, 0] < fac[1, 1] < 1.0 < fac[1, 2] < fac[1, 3]
    KB._lrfu_spread(fac, spread, 1, 8.0)
    assert spread.tolist() == [1.0, 1.0] and np.array_equal(fac[1], factors)
