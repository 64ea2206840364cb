"""Event-atomic global ``lru`` with its residents filed by event (``_kernels_lru_events``): by hand, against the list
loop it replaces (``_kernels.replay_lru``) on random streams, and the engine against the naive twin."""

from __future__ import annotations

import naive
import numpy as np
import pytest
from conftest import random_events, spy_calls

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, engine, replay
from expertcache.replay import _kernels as K
from expertcache.replay import _kernels_lru_events as KLE


def _run(loop, s, cap, tie, count_from=0):
    L, N = s.n_layers, s.n_experts
    order, tie_pos = engine._tie_order(tie, L, N)
    h, m, flags = np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(s.union, np.uint8)
    c = np.array([cap])
    if loop is K.replay_lru:
        K.replay_lru(s.offsets, s.expert, s.layer, N, L, True, True, c, order, tie_pos, count_from, h, m, flags)
    else:
        KLE.replay_lru_events(s.offsets, s.expert, s.layer, N, L, c, order, tie_pos, count_from, h, m, flags)
    return h.tolist(), m.tolist(), flags.tolist()


def test_by_hand_oldest_event_first_then_lower_tie_position():
    # one layer of 4 experts, tie_break "id": block b has rank 4 - b, so tie positions are 3, 2, 1, 0 (expert 3
    # has the lowest rank and leaves first among equals). Capacity 3.
    s = EventStream.from_lists(1, 4, 3, steps=[0, 1, 2, 3], layers=[0, 0, 0, 0],
                               experts=[[0, 1], [2, 3], [0, 2], [1, 3]], active=[1, 1, 1, 1])
    tie = engine._tie_ranks("id", 0, 4)
    h, m, flags = _run(KLE.replay_lru_events, s, 3, tie)
    # e0 {0,1}: 2 misses; e1 {2,3}: 2 misses, one leaves: the oldest event's lowest tie position, block 1 -> {0,2,3}
    # e2 {0,2}: 2 hits -> order by event: e1 {3}, e2 {0,2}; e3 {1,3}: 1 miss (1), 1 hit (3): 4 held, block 2 (e2's
    # lower tie position: rank 2 < rank 4 of block 0) leaves -> {0, 1, 3}
    assert flags == [0, 0, 0, 0, 1, 1, 0, 1]
    assert (h, m) == ([3], [5])
    assert _run(K.replay_lru, s, 3, tie) == (h, m, flags)
    # a quota below one event: members past it are bypassed (the lowest tie positions)
    assert _run(KLE.replay_lru_events, s, 1, tie) == _run(K.replay_lru, s, 1, tie)


@pytest.mark.parametrize("seed", range(4))
def test_equals_the_list_loop_on_random_streams(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        L, N = int(rng.integers(1, 4)), int(rng.integers(1, 200))          # up to four words of bits
        s = random_events(rng, L, N, int(rng.integers(1, 50)), int(rng.integers(1, min(N, 40) + 1)))
        tie = engine._tie_ranks(str(rng.choice(["random", "id"])), int(rng.integers(0, 5)), L * N)
        cap = int(rng.integers(0, L * N + 3))
        count_from = int(rng.integers(0, 3))
        assert _run(KLE.replay_lru_events, s, cap, tie, count_from) == _run(K.replay_lru, s, cap, tie, count_from)


def test_the_engine_takes_it_where_its_bitsets_fit_and_equals_the_twin(monkeypatch):
    used = spy_calls(monkeypatch, KLE, "replay_lru_events")
    rng = np.random.default_rng(7)
    for _ in range(12):
        L, N = int(rng.integers(1, 4)), int(rng.integers(8, 60))
        s = random_events(rng, L, N, int(rng.integers(5, 40)), min(N, 24))
        for policy in ("lru", "least-stale"):
            kw = dict(scope="global", semantics="event-atomic", rho=float(rng.choice([0.1, 0.3, 0.6])),
                      tie_break=str(rng.choice(["random", "id"])), seed=int(rng.integers(0, 5)),
                      warmup_events=int(rng.integers(0, 3)))
            before = len(used)
            got = replay(s, ReplayConfig(policy, **kw))
            want = naive.naive_replay(s, policy, **kw)
            assert (got.hits, got.demand_misses) == (want["hits"], want["demand_misses"]), (policy, kw)
            assert (len(used) > before) == KLE.fits(s.n_events, s.union, N)
    assert used                                              # some streams ran on it


def test_fits_bounds_the_bitsets_per_access():
    assert KLE.fits(100, 800, 128)                           # 16 bytes an event over 8 accesses
    assert not KLE.fits(100, 700, 128)
    assert not KLE.fits(10, 10, 4096)                        # 64 words an event
