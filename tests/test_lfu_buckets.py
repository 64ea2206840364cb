"""Global-scope ``lfu`` on count buckets (``replay/_kernels_lfu_buckets.py``): the heap loop's decision, counts and
hit flags, by hand and on random streams; the engine runs it where its bitsets fit."""

from __future__ import annotations

import numpy as np
import pytest
from naive import naive_replay
from test_fast_policies import _any_sizes_stream, counts, naive_counts

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, engine, replay
from expertcache.replay import _kernels as K
from expertcache.replay import _kernels_lfu_buckets as KLB
from expertcache.replay.keys import KEY_LFU


def _buckets(stream, atomic, cap, tie_pos, reset=False, warm=0):
    L, N = stream.n_layers, stream.n_experts
    out = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    KLB.replay_lfu_buckets(stream.offsets, stream.expert, stream.layer, N, L, atomic, np.array([cap]), tie_pos, reset,
                           warm, *out)
    return out


def test_by_hand_sequential_and_event_atomic():
    """A pool of 2 over one layer of 4, tie positions = ids (the lower leaves first among equal counts).
    Sequential, accesses 0 1 2 0 3 2 2: 2 (count 1) evicts 0; 0 (count 2) evicts 1; 3 evicts 2 (counts 1, tie 2 < 3);
    2 (count 2) evicts 3; 2 hits. Under reset: 0 comes back with count 1 and leaves at once (tie 0), 3 evicts 1, 2
    hits twice. Event-atomic, events [0 1 2] [0 3] [2 3]: 0 leaves the first; 1 and 2 the second (count 1 beside 0's
    2 and 3's 1, the lower ties); the third, 3 hits, 2 joins with count 2 and 0 (count 2, tie 0) leaves."""
    seq = EventStream.from_lists(1, 4, 4, list(range(7)), [0] * 7, [[0], [1], [2], [0], [3], [2], [2]], [1] * 7)
    ident = np.arange(4, dtype=np.int64)
    h, m, f = _buckets(seq, False, 2, ident)
    assert f.tolist() == [0, 0, 0, 0, 0, 0, 1] and h.tolist() == [1] and m.tolist() == [6]
    h, m, f = _buckets(seq, False, 2, ident, reset=True)
    assert f.tolist() == [0, 0, 0, 0, 0, 1, 1] and h.tolist() == [2]
    ea = EventStream.from_lists(1, 4, 4, [0, 1, 2], [0] * 3, [[0, 1, 2], [0, 3], [2, 3]], [1] * 3)
    h, m, f = _buckets(ea, True, 2, ident)
    assert f.tolist() == [0, 0, 0, 0, 0, 0, 1] and h.tolist() == [1] and m.tolist() == [6]
    assert _buckets(ea, True, 2, ident, warm=2)[0].tolist() == [1]     # warm-up: counted from the third event
    assert _buckets(ea, True, 2, ident, warm=3)[0].tolist() == [0]


def test_by_hand_a_hit_block_met_in_the_lowest_bucket_and_misses_below_the_pool():
    """Lazy buckets: a hit leaves its block in the bucket it joined. Sequential, a pool of 2 over one layer of 4 (tie
    positions = ids), accesses 0 1 0 0 2 1 2 0: 0 and 1 join with count 1; 0 hits twice (count 3, still in bucket 1);
    2 (count 1) evicts 1, the lowest of count 1 (0 is met first in bucket 1 and moved up, not evicted); 1 (count 2)
    evicts 2 (count 1); 2 (count 2) evicts 1 (count 2, tie 1 < 2); 0 hits. Event-atomic, events [1 2] [0] [3] [0 1]
    [2] [1 2]: 0 (count 1, tie 0 below the pool's lowest, 1) leaves at once; 3 (count 1, tie 3) joins and 1 leaves; 0
    and 1 (count 2) displace 2 and 3; 2 (count 2) joins and 0 (count 2, tie 0) leaves; 1 and 2 hit. Both equal the
    heap loop."""
    seq = EventStream.from_lists(1, 4, 4, list(range(8)), [0] * 8, [[0], [1], [0], [0], [2], [1], [2], [0]], [1] * 8)
    ident = np.arange(4, dtype=np.int64)
    h, m, f = _buckets(seq, False, 2, ident)
    assert f.tolist() == [0, 0, 1, 1, 0, 0, 0, 1] and h.tolist() == [3] and m.tolist() == [5]
    ea = EventStream.from_lists(1, 4, 4, list(range(6)), [0] * 6, [[1, 2], [0], [3], [0, 1], [2], [1, 2]], [1] * 6)
    h, m, f = _buckets(ea, True, 2, ident)
    assert f.tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1] and h.tolist() == [2]
    for stream, atomic in ((seq, False), (ea, True)):
        want = [np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(stream.union, np.uint8)]
        K.replay_heap(stream.offsets, stream.expert, stream.layer, stream.step, 4, 1, True, atomic,
                      np.zeros(0, np.int32), np.array([2], np.int64), ident, KEY_LFU, False, -1.0, 0, *want)
        assert want[2].tolist() == _buckets(stream, atomic, 2, ident)[2].tolist()


@pytest.mark.parametrize("seed", range(3))
def test_random_streams_equal_the_heap_loop(seed):
    """Counts and hit flags of replay_heap (KEY_LFU, one global partition) on streams of 1-3 layers and events of
    one member to every expert, both semantics, counts kept or reset on eviction, pools 0 / 1 / 2 / a third / all
    but one / all / past all, warm-up, random and id tie ranks."""
    rng = np.random.default_rng([seed, 61])
    for trial in range(25):
        s = _any_sizes_stream(rng, 40, 25)
        L, N = s.n_layers, s.n_experts
        nb = L * N
        tie = engine._tie_ranks("random" if trial % 3 else "id", trial, nb)
        tie_pos = np.argsort(np.argsort(tie)).astype(np.int64)
        for atomic in (True, False):
            for reset in (False, True):
                for c in (0, 1, 2, nb // 3, nb - 1, nb, nb + 5):
                    warm = int(rng.integers(0, 3))
                    want = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(s.union, np.uint8)]
                    K.replay_heap(s.offsets, s.expert, s.layer, s.step, N, L, True, atomic, np.zeros(0, np.int32),
                                  np.array([c], np.int64), tie, KEY_LFU, reset, -1.0, warm, *want)
                    got = _buckets(s, atomic, c, tie_pos, reset, warm)
                    assert all((a == b).all() for a, b in zip(got, want, strict=True)), (trial, atomic, reset, c)


@pytest.mark.parametrize("fits", [True, False])
def test_the_engine_takes_the_buckets_where_they_fit_and_both_equal_the_twin(fits, monkeypatch):
    """Through the engine (either loop, the bucket memory bound forced), global lfu equals the naive twin in every
    semantics, with in-cache counters too and a warm-up."""
    from test_twin_large import random_stream

    called = []
    real = KLB.replay_lfu_buckets
    monkeypatch.setattr(KLB, "replay_lfu_buckets", lambda *a: called.append(1) or real(*a))
    if not fits:
        monkeypatch.setattr(KLB, "MAX_WORDS", 1)
    stream = random_stream(12, L=3, N=24, k=6, steps=20)
    for semantics in ("event-atomic", "sequential-ascending", "sequential-random"):
        for in_cache in (False, True):
            kw = dict(rho=0.3, scope="global", semantics=semantics, seed=4, warmup_events=5)
            got = replay(stream, ReplayConfig("lfu", lfu_in_cache_counters=in_cache, **kw))
            want = naive_replay(stream, "lfu", lfu_in_cache_counters=in_cache, **kw)
            assert counts(got) == naive_counts(want), (semantics, in_cache)
    assert bool(called) == fits


def test_the_bucket_memory_bound():
    assert KLB.fits(6144, 1229, 64)                       # the benchmark stream: 1,295 slots of 98 words
    assert not KLB.fits(1 << 20, 1 << 19, 64)             # a million blocks: half a million slots of 16,640 words
    assert KLB.fits(10, 10**9, 5)                         # a pool past the universe holds at most every block
