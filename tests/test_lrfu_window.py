"""Sequential global ``lrfu`` on per-layer recency lists and a tournament of the layers' lowest keys
(``_kernels_lrfu_window``): the window bound, against the pool loop on random streams, the engine against the twin."""

from __future__ import annotations

import math

import naive
import numpy as np
import pytest
from conftest import random_events, spy_calls

from expertcache.replay import ReplayConfig, engine, replay
from expertcache.replay import _kernels_lrfu_global as KLR
from expertcache.replay import _kernels_lrfu_window as KLW


def test_the_window_bounds_every_key_of_a_layer():
    """A CRF stays below S_max = 1 / (1 - 2**-lam), so a block accessed ``window`` units after another keys above it
    whatever its CRF: the lowest possible key there against the highest possible key at the first."""
    for lam in (0.05, 0.1, 0.25, 0.5, 0.75, 1.0):
        w = KLW.window(lam)
        s_max = 1.0 / (1.0 - 2.0 ** -lam)
        assert lam * w >= math.log2(s_max) + lam                     # a unit of margin
        s, u = 1.0, 0                                                # a CRF grown by an access at every unit
        for _ in range(5000):
            s = 1.0 + s * 2.0 ** -lam
        assert math.log2(s) + lam * u < lam * (u + w) + math.log2(1.0)
    assert KLW.window(0.0) > KLW.MAX_WINDOW


def _run(loop, s, cap, tpg, lam, count_from):
    L, N = s.n_layers, s.n_experts
    h, m, flags = np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(s.union, np.uint8)
    if loop is KLR.replay_lrfu_global:
        loop(s.offsets, s.expert, s.layer, N, L, False, np.array([cap]), tpg, lam, count_from, h, m, flags)
    else:
        loop(s.offsets, s.expert, s.layer, N, L, np.array([cap]), tpg, lam, count_from, h, m, flags)
    return h.tolist(), m.tolist(), flags.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_equals_the_pool_loop_on_random_streams(seed):
    rng = np.random.default_rng(seed)
    for _ in range(80):
        L, N = int(rng.integers(1, 6)), int(rng.integers(1, 30))
        s = random_events(rng, L, N, int(rng.integers(1, 80)), int(rng.integers(1, N + 1)))
        tie = engine._tie_ranks(str(rng.choice(["random", "id"])), int(rng.integers(0, 5)), L * N)
        _, tpg = engine._tie_order(tie, 1, L * N)
        cap = int(rng.integers(0, L * N + 3))
        lam = float(rng.choice([0.1, 0.25, 0.5, 0.7, 1.0]))
        cf = int(rng.integers(0, 3))
        assert _run(KLW.replay_lrfu_window, s, cap, tpg, lam, cf) == _run(KLR.replay_lrfu_global, s, cap, tpg, lam,
                                                                          cf), (L, N, cap, lam)


def test_the_engine_takes_it_for_sequential_units_and_equals_the_twin(monkeypatch):
    used = spy_calls(monkeypatch, KLW, "replay_lrfu_window")
    rng = np.random.default_rng(5)
    for _ in range(10):
        L, N = int(rng.integers(1, 4)), int(rng.integers(4, 20))
        s = random_events(rng, L, N, int(rng.integers(5, 30)), min(N, 6))
        for semantics in ("sequential-ascending", "sequential-random", "event-atomic"):
            for lam in (0.5, 0.0):
                kw = dict(scope="global", semantics=semantics, rho=float(rng.choice([0.1, 0.3, 0.6])),
                          tie_break=str(rng.choice(["random", "id"])), seed=int(rng.integers(0, 5)),
                          warmup_events=int(rng.integers(0, 3)), lrfu_lambda=lam)
                before = len(used)
                got = replay(s, ReplayConfig("lrfu", **kw))
                want = naive.naive_replay(s, "lrfu", **kw)
                assert (got.hits, got.demand_misses) == (want["hits"], want["demand_misses"]), kw
                assert (len(used) > before) == (semantics != "event-atomic" and lam > 0)


def test_the_log2_memo_gives_libms_results_through_collisions():
    """Every CRF's log2 from a memo of two entries (colliding and repeated CRFs, a CRF met again after its entry was
    taken) equals numpy's; a memo entry is filled only where the CRF was computed."""
    import numba

    @numba.njit
    def through_memo(xs, tag, val, mask):
        out = np.empty_like(xs)
        for q in range(xs.shape[0]):
            out[q] = KLW._log2_memo(xs[q], tag, val, mask)
        return out

    rng = np.random.default_rng(7)
    crfs = np.concatenate([1.0 + rng.random(50) * 2.5, [1.0, 2.0, 1.0 + 2.0 ** -52, 3.4142135623730945]])
    xs = rng.choice(crfs, 400)                      # each CRF met many times, in a random order
    tag, val = np.zeros(2, np.uint64), np.zeros(2)
    got = through_memo(xs, tag, val, np.uint64(1))
    assert got.tobytes() == np.log2(xs).tobytes()
    held = tag != 0
    assert held.all() and val[held].tobytes() == np.log2(tag[held].view(np.float64)).tobytes()


def test_equals_the_pool_loop_with_a_memo_of_two_entries(monkeypatch):
    """The loop's keys through a memo of two entries (nearly every CRF evicts another's entry) decide as the pool
    loop, whose keys are libm's at every access; the stream's memo, sized by its accesses, likewise."""
    rng = np.random.default_rng(11)
    for bits in ((1, 1), KLW.MEMO_BITS):
        monkeypatch.setattr(KLW, "MEMO_BITS", bits)
        for _ in range(30):
            L, N = int(rng.integers(1, 5)), int(rng.integers(2, 30))
            s = random_events(rng, L, N, int(rng.integers(5, 120)), int(rng.integers(1, N + 1)))
            tie = engine._tie_ranks("random", int(rng.integers(0, 5)), L * N)
            _, tpg = engine._tie_order(tie, 1, L * N)
            cap = int(rng.integers(1, L * N + 1))
            assert _run(KLW.replay_lrfu_window, s, cap, tpg, 0.5, 0) == _run(KLR.replay_lrfu_global, s, cap, tpg,
                                                                             0.5, 0), (bits, L, N, cap)
