"""Global-scope event-atomic ``belady`` and ``belady-forced`` in buckets by next use
(``replay/_kernels_belady_buckets.py``): the heap loop's decision, counts and hit flags, by hand and on random
streams; the engine runs it where its buckets fit and equals the naive twin."""

from __future__ import annotations

import numpy as np
import pytest
from naive import naive_replay
from test_fast_policies import _any_sizes_stream, counts, naive_counts

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, engine, replay
from expertcache.replay import _kernels as K
from expertcache.replay import _kernels_belady_buckets as KBB


def _run(kernel, stream, cap, tie, forced, warm=0, atomic=True):
    L, N = stream.n_layers, stream.n_experts
    nxt = K.next_use(stream.offsets, stream.expert, stream.layer, N, L, atomic)
    out = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    if kernel == "buckets":
        g = engine._tie_order(tie, 1, L * N)
        head = (stream.offsets, stream.expert, stream.layer, N, L, nxt, np.array([cap]))
        if atomic:
            KBB.replay_belady_buckets(*head, *engine._tie_order(tie, L, N), *g, forced, warm, *out)
        else:
            KBB.replay_belady_units(*head, *g, forced, warm, *out)
    else:
        K.replay_belady(stream.offsets, stream.expert, stream.layer, N, L, True, atomic, nxt, np.array([cap]), tie,
                        forced, warm, *out)
    return out


def test_by_hand_two_layers_one_pool():
    """Two layers of two experts (blocks 0 1 | 2 3), a pool of 2, tie ranks = ids (the lower leaves first among equal
    next uses). Events: e0 layer 0 [0 1], e1 layer 1 [2 3], e2 layer 0 [0], e3 layer 1 [3], e4 layer 0 [1].
    Next uses: 0 -> e2, 1 -> e4, 2 -> never, 3 -> e3; then 0 and 3 never again, 1 never.

    * ``belady``: e1's four candidates 0 (e2), 1 (e4), 2 (never), 3 (e3): 2 and then 1 leave; e2: 0 hits; e3: 3 hits;
      e4: 1 misses, and of 0, 1 and 3 (all never used again) 0, the lowest tie rank, leaves. Hits 2 (one a layer).
    * ``belady-forced``: e1's misses 2 and 3 stay, 0 and 1 (the older residents) leave; e2: 0 misses, and of 2
      (never), 3 (e3) 2 leaves; e3: 3 hits; e4: 1 misses, 0 (never, tie 0) leaves. Hits 1 (layer 1)."""
    s = EventStream.from_lists(2, 2, 2, [0, 0, 1, 1, 2], [0, 1, 0, 1, 0], [[0, 1], [0, 1], [0], [1], [1]], [1] * 5)
    ids = np.arange(4, dtype=np.int64)
    h, m, f = _run("buckets", s, 2, ids, False)
    assert h.tolist() == [1, 1] and m.tolist() == [3, 2] and f.tolist() == [0, 0, 0, 0, 1, 1, 0]
    h, m, f = _run("buckets", s, 2, ids, True)
    assert h.tolist() == [0, 1] and m.tolist() == [4, 2] and f.tolist() == [0, 0, 0, 0, 0, 1, 0]
    for forced in (False, True):
        assert all((a == b).all() for a, b in zip(_run("buckets", s, 2, ids, forced), _run("heap", s, 2, ids, forced),
                                                  strict=True))
    assert _run("buckets", s, 2, ids, False, warm=3)[0].tolist() == [0, 1]


def test_by_hand_one_unit_per_access():
    """The stream above, one unit per access (0 1 | 2 3 | 0 | 3 | 1), a pool of 2. ``belady``: 2 (never used again)
    is not admitted, then 3 (next use unit 5) evicts 1 (unit 6); 0 and 3 hit; 1 misses, and of 0, 3 and 1 (none
    used again) 0, the lowest tie rank, leaves. ``belady-forced``: 2 evicts 1 (unit 6, the farther), 3 evicts 2
    (never); 0 and 3 hit; 1 evicts 0. Both: hits 1 / 1 a layer."""
    s = EventStream.from_lists(2, 2, 2, [0, 0, 1, 1, 2], [0, 1, 0, 1, 0], [[0, 1], [0, 1], [0], [1], [1]], [1] * 5)
    ids = np.arange(4, dtype=np.int64)
    for forced in (False, True):
        h, m, f = _run("buckets", s, 2, ids, forced, atomic=False)
        assert h.tolist() == [1, 1] and m.tolist() == [3, 2] and f.tolist() == [0, 0, 0, 0, 1, 1, 0], forced
        assert all((a == b).all() for a, b in zip(_run("heap", s, 2, ids, forced, atomic=False), (h, m, f),
                                                  strict=True))


@pytest.mark.parametrize("seed", range(3))
def test_random_streams_equal_the_heap_loop(seed):
    """Counts and hit flags of replay_belady (one global partition, either semantics) on streams of 1-3 layers, 1 to
    99 experts, events of one member to every expert, either variant, pools 0 / 1 / 2 / a third / all but one / all /
    past all, warm-up, random and id tie ranks."""
    rng = np.random.default_rng([seed, 101])
    for trial in range(25):
        s = _any_sizes_stream(rng, 100, 30)
        nb = s.n_layers * s.n_experts
        tie = engine._tie_ranks("random" if trial % 3 else "id", trial, nb)
        for c in (0, 1, 2, nb // 3, nb - 1, nb, nb + 5):
            warm = int(rng.integers(0, 3))
            for forced in (False, True):
                for atomic in (True, False):
                    got = _run("buckets", s, c, tie, forced, warm, atomic)
                    want = _run("heap", s, c, tie, forced, warm, atomic)
                    assert all((a == b).all() for a, b in zip(got, want, strict=True)), (trial, c, forced, atomic)


@pytest.mark.parametrize("fits", [True, False])
def test_the_engine_takes_the_buckets_where_they_fit_and_both_equal_the_twin(fits, monkeypatch):
    """Through the engine (either loop, the bounds forced), global Belady equals the naive twin in every semantics,
    both variants, with a warm-up."""
    from test_twin_large import random_stream

    called = []
    for name in ("replay_belady_buckets", "replay_belady_units"):
        real = getattr(KBB, name)
        monkeypatch.setattr(KBB, name, lambda *a, real=real: called.append(1) or real(*a))
    if not fits:
        monkeypatch.setattr(KBB, "MAX_BYTES", 8)
        monkeypatch.setattr(KBB, "MAX_EVENTS", 8)
    stream = random_stream(5, L=3, N=24, k=6, steps=20)
    for semantics in ("event-atomic", "sequential-ascending", "sequential-random"):
        for policy in ("belady", "belady-forced"):
            kw = dict(rho=0.3, scope="global", semantics=semantics, seed=1, warmup_events=4)
            got = counts(replay(stream, ReplayConfig(policy, **kw)))
            assert got == naive_counts(naive_replay(stream, policy, **kw)), (semantics, policy)
    assert len(called) == (6 if fits else 0)


def test_the_bucket_memory_bound():
    assert KBB.fits(249_600, 128)                      # the benchmark stream: 2 words an event, 4 MB
    assert not KBB.fits(10_000_000, 1024)              # 16 words an event: 1.3 GB
    assert not KBB.fits(KBB.MAX_EVENTS, 1)
