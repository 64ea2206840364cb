"""Sequential per-layer ``belady`` and ``belady-forced`` on slots (``_kernels_seq.replay_belady_seq``): the heap
loop's decision, counts and hit flags, by hand and on random streams; the engine runs it for sequential per-layer
Belady and equals the naive twin."""

from __future__ import annotations

import numpy as np
import pytest
from naive import naive_replay
from test_fast_policies import _any_sizes_stream, counts, naive_counts

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, engine, replay
from expertcache.replay import _kernels as K
from expertcache.replay import _kernels_seq as KQ


def _slots(stream, caps, tie, forced, warm=0):
    L, N = stream.n_layers, stream.n_experts
    _, tie_pos = engine._tie_order(tie, L, N)
    nxt = K.next_use(stream.offsets, stream.expert, stream.layer, N, L, False)
    out = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    KQ.replay_belady_seq(stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos, nxt, forced, warm, *out)
    return out


def _heap(stream, caps, tie, forced, warm=0):
    L, N = stream.n_layers, stream.n_experts
    nxt = K.next_use(stream.offsets, stream.expert, stream.layer, N, L, False)
    out = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    K.replay_belady(stream.offsets, stream.expert, stream.layer, N, L, False, False, nxt, caps, tie, forced, warm,
                    *out)
    return out


def test_by_hand_bypass_and_forced_admission():
    """One layer of 3, a quota of 2, tie ranks = ids (the lower leaves first among equal next uses). Accesses 0 1 | 2
    | 0 | 1 (events in that order): next uses 0 -> 3, 1 -> 4, 2 -> never, then never. ``belady``: 2's next use is the
    farthest, so it is not admitted; 0 and 1 hit. ``belady-forced``: 2 comes in and 1 (next use 4, the farthest)
    leaves; 0 hits; 1 misses, and of 0 and 2 (both never used again) 0, the lower tie, leaves."""
    s = EventStream.from_lists(1, 3, 2, [0, 1, 2, 3], [0] * 4, [[0, 1], [2], [0], [1]], [1] * 4)
    ids = np.arange(3, dtype=np.int64)
    h, m, f = _slots(s, np.array([2]), ids, False)
    assert h.tolist() == [2] and m.tolist() == [3] and f.tolist() == [0, 0, 0, 1, 1]
    h, m, f = _slots(s, np.array([2]), ids, True)
    assert h.tolist() == [1] and m.tolist() == [4] and f.tolist() == [0, 0, 0, 1, 0]
    assert _slots(s, np.array([2]), ids, False, warm=3)[0].tolist() == [1]      # counted from the last event


@pytest.mark.parametrize("seed", range(3))
def test_random_streams_equal_the_heap_loop(seed):
    """Counts and hit flags of replay_belady (per layer, one unit per access) on streams of 1-3 layers, 1 to 99
    experts (below, at and past a multiple of 8 slots and 64 lanes), events of one member to every expert, either
    variant, quotas 0 / 1 / a third / all but one / all / past all (per layer, unequal across layers), warm-up,
    random and id tie ranks."""
    rng = np.random.default_rng([seed, 97])
    for trial in range(20):
        s = _any_sizes_stream(rng, 100, 25)
        L, N = s.n_layers, s.n_experts
        tie = engine._tie_ranks("random" if trial % 3 else "id", trial, L * N)
        for c in (0, 1, N // 3, N - 1, N, N + 5):
            caps = np.array([max(c - (layer % 2), 0) for layer in range(L)], dtype=np.int64)
            warm = int(rng.integers(0, 3))
            for forced in (False, True):
                want = _heap(s, caps, tie, forced, warm)
                got = _slots(s, caps, tie, forced, warm)
                assert all((a == b).all() for a, b in zip(got, want, strict=True)), (trial, c, forced)


def test_the_engine_takes_the_slots_and_they_equal_the_twin(monkeypatch):
    """Through the engine, sequential per-layer Belady runs the slot loop and equals the naive twin, ascending and
    random member orders, both variants, with a warm-up."""
    from test_twin_large import random_stream

    called = []
    real = KQ.replay_belady_seq
    monkeypatch.setattr(KQ, "replay_belady_seq", lambda *a: called.append(1) or real(*a))
    stream = random_stream(7, L=3, N=24, k=6, steps=20)
    for semantics in ("sequential-ascending", "sequential-random"):
        for policy in ("belady", "belady-forced"):
            kw = dict(rho=0.3, semantics=semantics, seed=2, warmup_events=4)
            got = replay(stream, ReplayConfig(policy, **kw))
            want = naive_replay(stream, policy, **kw)
            assert counts(got) == naive_counts(want), (semantics, policy)
    assert len(called) == 4
