"""The register vectors of replay/_vec.py against numpy: loads, lane writes and the lowest packed lfru key."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from expertcache.replay._vec import (
    WIDTHS,
    Lanes,
    icount_le,
    ifind,
    ikey_lowest,
    ilowest,
    iset_lowest,
    vload,
    vlowest,
    vset,
    vstore,
)


@njit
def _apply(R0, L0, lanes, ops, t1, hmask, d, out):
    """Load ``R0`` / ``L0`` as vectors, apply ``ops`` (rows of lane, kind, value: kind 0 sets a reciprocal count
    ``1 / value``, 1 a last unit) and write ``vlowest`` of the result to ``out[0]``."""
    R = vload(R0, 0, lanes)
    L = vload(L0, 0, lanes)
    for i in range(ops.shape[0]):
        lane = np.int64(ops[i, 0])
        if ops[i, 1] == 0:
            R = vset(R, lane, np.float32(1.0) / np.float32(ops[i, 2]))
        else:
            L = vset(L, lane, np.float32(ops[i, 2]))
    out[0] = vlowest(R, L, t1, hmask, d)


def _lowest(R, L, t1, hmask, d):
    """The definition: each lane's float32 product ``R * (t1 - L)``, its bits flipped (``^ 0x7FFFFFFF``), the low
    bits replaced by the lane; the smallest, and bit 32 set where another lies at most ``d`` units above it."""
    k = (R.astype(np.float32) * (np.float32(t1) - L.astype(np.float32))).view(np.int32) ^ np.int32(0x7FFFFFFF)
    p = (k & np.int32(hmask)) | np.arange(R.shape[0], dtype=np.int32)
    g = int(p.min())
    thr = ((g & hmask) + d) | ~hmask
    near = bool(((p <= thr) & (p != g)).any())
    return g | (int(near) << 32)


@pytest.mark.parametrize("n", WIDTHS)
def test_lane_writes_and_the_lowest_key_equal_numpy(n):
    """Random reciprocal counts and last units, random lane writes (a count's reciprocal, a last unit), then the
    lowest packed key and its near flag, against the same steps on numpy arrays; margins from 0 to beyond the keys'
    spread, so the flag is both set and clear; ties of whole keys (equal counts and ages) resolved by the lane
    bits."""
    rng = np.random.default_rng(n)
    bits = int(np.ceil(np.log2(n)))
    hmask = -(1 << bits)
    seen = set()
    for trial in range(300):
        R = np.float32(1.0) / rng.integers(1, 40, n).astype(np.float32)
        L = rng.integers(0, 500, n).astype(np.float32)
        if trial % 3 == 0:
            R[:] = np.float32(1.0) / np.float32(3.0)          # equal counts: ties of whole keys where ages tie
            L = rng.integers(0, 4, n).astype(np.float32)
        if trial % 7 == 0:
            R[rng.random(n) < 0.3] = 0.0                       # empty slots
        ops = np.array([(rng.integers(n), rng.integers(2), rng.integers(1, 600)) for _ in range(rng.integers(0, 9))],
                       dtype=np.int64).reshape(-1, 3)
        R2, L2 = R.copy(), L.copy()
        for lane, kind, x in ops:
            if kind == 0:
                R2[lane] = np.float32(1.0) / np.float32(x)
            else:
                L2[lane] = x
        t1 = float(max(L2.max(), 0) + rng.integers(1, 50))
        d = int(rng.choice([0, 1, 2 << bits, 1 << 20]))
        out = np.zeros(1, np.int64)
        _apply(R, L, Lanes(n), ops, np.float32(t1), np.int32(hmask), np.int32(d), out)
        want = _lowest(R2, L2, t1, hmask, d)
        assert int(out[0]) == want, (trial, n)
        seen.add(want >> 32)
    assert seen == {0, 1}


@njit
def _int_ops(K0, T0, lanes, x, key, tp, out, kout, tout):
    """The int32 intrinsics on ``K0`` / ``T0`` loaded as vectors: ``out`` = (smallest, lanes at most ``x``, the lane of
    ``T0`` holding ``x`` or -1, after ``vset`` of lane 1 the lane holding ``x``); ``kout`` / ``tout`` the keys with
    ``key | lane`` and the positions with ``tp`` in the smallest key's lane."""
    K = vload(K0, 0, lanes)
    T = vload(T0, 0, lanes)
    out[0] = ilowest(K)
    out[1] = icount_le(K, x)
    out[2] = ifind(T, x)
    out[3] = ifind(vset(T, 1, np.int32(x)), x)
    vstore(kout, 0, ikey_lowest(K, np.int32(key)))
    vstore(tout, 0, iset_lowest(T, K, np.int32(tp)))


@pytest.mark.parametrize("n", WIDTHS)
def test_int32_lanes_equal_numpy(n):
    """Random packed keys (distinct: the lane in the low bits) and positions: the smallest, the count at most a
    bound (below, at and past the keys), the lane that holds a value (first of several, absent, set), and the
    smallest's lane replaced in the keys (``key | lane``) and in the positions, each against numpy."""
    rng = np.random.default_rng(n + 1)
    bits = int(np.log2(n))
    for trial in range(200):
        K = ((rng.integers(0, 1 << 20, n) << bits) | np.arange(n)).astype(np.int32)
        if trial % 5 == 0:                                      # empty slots: the largest keys, lanes apart
            K = np.where(rng.random(n) < 0.4, np.int32((2**31 - 1) & ~(n - 1)) | np.arange(n, dtype=np.int32), K)
        T = rng.integers(-1, 8, n).astype(np.int32)
        x = int(rng.choice([int(K.min()) - 1, int(K.min()), int(rng.choice(K)), 2**31 - 1, int(rng.integers(-1, 9))]))
        key = int(rng.integers(0, 1 << 20)) << bits
        tp = int(rng.integers(0, 100))
        out = np.zeros(4, np.int64)
        kout = np.zeros(n, np.int32)
        tout = np.zeros(n, np.int32)
        _int_ops(K, T, Lanes(n), x, key, tp, out, kout, tout)
        low = int(np.argmin(K))
        assert out[0] == K.min() and out[1] == int((K.astype(np.int64) <= x).sum()), trial
        hold = np.flatnonzero(T == x) if -(2**31) <= x < 2**31 else []
        assert out[2] == (hold[0] if len(hold) else -1), trial
        assert out[3] == (hold[0] if len(hold) and hold[0] < 1 else 1), trial
        wantk = K.copy()
        wantk[low] = key | low
        wantt = T.copy()
        wantt[low] = tp
        assert (kout == wantk).all() and (tout == wantt).all(), trial


def test_lanes_of_another_width_are_refused():
    with pytest.raises(ValueError, match="lanes must be one of"):
        Lanes(48)
