"""The vector building blocks of the bitset loops (``replay/_simd.py``) against plain numpy.

The loops that use them are compared with the generic kernels in tests/test_fast_policies.py; here each
block is checked on its own: the sorting networks, the lane masks, lfru's member update and band pick, the
bit deposit, the dyadic rounding the lfru cuts rely on, lrfu's cuts and the bit lists.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from expertcache.replay import _simd as S


@njit(cache=False)
def _sort(src, k, dst, n):
    if n == 8:
        S.sort8(src, k, dst)
    elif n == 16:
        S.sort16(src, k, dst)
    elif n == 32:
        S.sort32(src, k, dst)
    else:
        S.sort64(src, k, dst)


@njit(cache=False)
def _sort_small(src, k, dst):
    return S.sort_small(src, k, dst)


@pytest.mark.parametrize("n", (8, 16, 32, 64))
def test_networks_sort_like_numpy(n):
    rng = np.random.default_rng(n)
    for trial in range(300):
        k = int(rng.integers(0, n + 1))
        vals = rng.integers(0, 6, k) / rng.integers(1, 4, k) if trial % 2 else rng.random(k)   # many repeats
        src = rng.random(n + 8) - 5.0          # past k: lanes the network must not take
        src[:k] = vals
        keep = src.copy()
        dst = np.full(n + 8, -1.0)             # past the network: untouched
        _sort(src, k, dst, n)
        assert (dst[:k] == np.sort(vals)).all() and np.isinf(dst[k:n]).all() and (dst[n:] == -1.0).all()
        assert (src == keep).all()
        _sort(src, k, src, n)                  # in place
        assert (src[:k] == np.sort(vals)).all() and np.isinf(src[k:n]).all() and (src[n:] == keep[n:]).all()


def test_sort_small_takes_the_smallest_network():
    rng = np.random.default_rng(7)
    for k in range(0, 65):
        src = rng.random(72)
        dst = np.full(72, -1.0)
        width = _sort_small(src, k, dst)
        assert width == max(8, 1 << max(k - 1, 0).bit_length())
        assert (dst[:k] == np.sort(src[:k])).all() and np.isinf(dst[k:width]).all() and (dst[width:] == -1.0).all()


@njit(cache=False)
def _cuts(vals, off, bounds, out, qa, qb):
    if qa == qb:
        S.lrfu_cut1(vals, off, bounds, out, qa)
    else:
        S.lrfu_cut2(vals, off, bounds, out, qa, qb)


def test_lrfu_cuts_place_values_against_sure_and_maybe_bounds():
    """Float32 values against float32 bounds, a value on a bound, no bound below and every one."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        vals = np.round(rng.random(136) * 4.0, 2).astype(np.float32)
        off = int(rng.integers(0, 72))
        bounds = np.sort(np.round(rng.random(8) * 4.0, 2).reshape(4, 2), axis=1).ravel().astype(np.float32)
        bounds[int(rng.integers(0, 8))] = vals[off + int(rng.integers(0, 64))]    # a value on a bound
        bounds[0] = float(rng.choice([bounds[0], -1.0, np.inf]))                  # none below, every one
        qa, qb = (int(q) for q in rng.integers(0, 4, 2))
        out = np.zeros(4, dtype=np.uint64)
        _cuts(vals, off, bounds, out, qa, qb)
        lanes = vals[off:off + 64]
        for i, q in enumerate((qa, qb)[:1 if qa == qb else 2]):
            for r in range(2):
                want = sum(1 << j for j in range(64) if lanes[j] <= bounds[2 * q + r])
                assert int(out[2 * i + r]) == want, (q, r)


@njit(cache=False)
def _masks(buf, v):
    return S.mask_lt(buf, v), S.mask_eq(buf, v)


def test_lane_masks():
    rng = np.random.default_rng(1)
    for _ in range(200):
        buf = rng.integers(0, 5, 64).astype(np.float64)
        v = float(rng.integers(0, 5))
        lt, eq = _masks(buf, v)
        assert int(lt) == sum(1 << q for q in range(64) if buf[q] < v)
        assert int(eq) == sum(1 << q for q in range(64) if buf[q] == v)


@njit(cache=False)
def _lfru_cuts(F, L, off, th0, th1, t1, old_age, out, one):
    S.touch_cut_masks32(F, L, off, np.uint64(0), np.float32(0.0), th0, th1, t1, old_age, out)   # the cuts alone
    S.cut_mask1_32(F, L, off, th0, t1, old_age, one)
    a = one[0]
    S.cut_mask1_32(F, L, off, th1, t1, old_age, one)
    return a, one[0], one[1]


def _counts_and_units(rng):
    """One to three words of small float32 counts and last units (many equal products) and the offset of one
    word."""
    n = 64 * int(rng.integers(1, 4))
    F = rng.integers(1, 9, n).astype(np.float32)
    L = rng.integers(0, 40, n).astype(np.float32)
    return F, L, 64 * int(rng.integers(0, n // 64))


def _below(F, L, off, th, t1):
    """The lanes ``off .. off+63`` where ``F <= th * (t1 - L)`` (float64), as an int, lane by lane."""
    return sum(1 << j for j in range(64) if float(F[off + j]) <= th * (t1 - float(L[off + j])))


def _old(L, off, t1, old_age):
    """The lanes ``off .. off+63`` at least ``old_age`` old, as an int."""
    return sum(1 << j for j in range(64) if t1 - float(L[off + j]) >= old_age)


def test_cut_masks_and_one_cut_against_the_products():
    """``F <= th * (t1 - L)`` lane by lane, both cuts of the fused pass at once (no member) and each alone, on
    float32 counts and last units with many equal products (8-bit cuts and small integers) and an infinite cut;
    the lanes at least ``old_age`` old marked by both."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        F, L, off = _counts_and_units(rng)
        t1 = 41.0
        th0, th1 = sorted(float(x) for x in rng.integers(0, 17, 2) / 8.0)
        if rng.random() < 0.1:
            th1 = np.inf
        old_age = float(rng.choice([2.0, 20.0, 2.0**16]))
        out = np.zeros(3, dtype=np.uint64)
        one0, one1, old1 = _lfru_cuts(F, L, off, np.float32(th0), np.float32(th1), np.float32(t1),
                                      np.float32(old_age), out, np.zeros(2, dtype=np.uint64))
        for q, th in enumerate((th0, th1)):
            want = _below(F, L, off, th, t1)
            assert int(out[q]) == want and int((one0, one1)[q]) == want
        assert int(out[2]) == int(old1) == _old(L, off, t1, old_age)


@njit(cache=False)
def _touch(F, L, off, ev, fi, th0, th1, t1, old_age, out, fused):
    if fused:
        S.touch_cut_masks32(F, L, off, ev, fi, th0, th1, t1, old_age, out)
    else:
        S.touch_lanes32(F, L, off, ev, fi)


@pytest.mark.parametrize("fused", (False, True))
def test_touch_adds_the_members_and_cuts_on_the_new_values(fused):
    """One added to the count and the last unit set on exactly the lanes of the word, the other 63 and the
    lanes of the other words untouched; fused with the cuts, the masks (and the old lanes) are those of the new
    values."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        F, L, off = _counts_and_units(rng)
        ev = int(rng.integers(0, 1 << 63, dtype=np.int64)) & int(rng.integers(0, 1 << 63, dtype=np.int64))
        ev |= int(rng.integers(0, 2)) << 63
        fi = 40.0
        t1 = 41.0
        th0, th1 = sorted(float(x) for x in rng.integers(0, 17, 2) / 8.0)
        wantF, wantL = F.copy(), L.copy()
        for j in range(64):
            if ev >> j & 1:
                wantF[off + j] += 1.0
                wantL[off + j] = fi
        out = np.zeros(3, dtype=np.uint64)
        _touch(F, L, off, np.uint64(ev), np.float32(fi), np.float32(th0), np.float32(th1), np.float32(t1),
               np.float32(20.0), out, fused)
        assert (F == wantF).all() and (L == wantL).all()
        if fused:
            for q, th in enumerate((th0, th1)):
                assert int(out[q]) == _below(wantF, wantL, off, th, t1)
            assert int(out[2]) == _old(wantL, off, t1, 20.0)


@njit(cache=False)
def _band_pick(bF, bA, nb, need, out):
    S.band_pick(bF, bA, nb, need, out)


@pytest.mark.parametrize("nb", [1, 2, 7, 8, 9, 15, 16])
def test_band_pick_takes_the_lowest_keys_ties_to_the_lower_lane(nb):
    """The ``need`` lowest of ``count / age`` by a stable sort of the float quotients (lane order breaks ties),
    on small counts and ages with many equal keys, and on counts and ages near ``2**26`` whose quotients
    differ by one unit in the last place or less; the keys are left in the count buffer."""
    rng = np.random.default_rng(nb)
    for trial in range(400):
        if trial % 4 == 3:             # near the bound: neighbouring quotients
            big = (1 << 26) - 1
            F = (big - rng.integers(0, 3, nb)).astype(np.float64)
            A = (big - rng.integers(0, 3, nb)).astype(np.float64)
        else:
            F = rng.integers(1, 6, nb).astype(np.float64)
            A = rng.integers(1, 6, nb).astype(np.float64)
        keys = F / A
        need = int(rng.integers(1, nb + 1))
        order = np.argsort(keys, kind="stable")
        bF = np.full(16, np.nan)
        bA = np.full(16, np.nan)
        bF[:nb] = F
        bA[:nb] = A
        out = np.zeros(2, dtype=np.uint64)
        _band_pick(bF, bA, nb, need, out)
        assert int(out[0]) == sum(1 << int(q) for q in order[:need])
        assert int(out[1]) == 1 << int(order[need - 1])
        assert (bF[:nb] == keys).all()


@njit(cache=False)
def _band_pick32(bF, bL, t1, nb, need, out, keys):
    S.band_pick32(bF, bL, t1, nb, need, out, keys)


@pytest.mark.parametrize("nb", [1, 2, 7, 8, 9, 15, 16])
def test_band_pick32_takes_the_lowest_keys_from_float32_counts_and_last_units(nb):
    """``band_pick32`` on float32 counts and last units (integers below ``2**24``) and a float64 clock: the
    ``need`` lowest of ``count / (t1 - last)`` by a stable sort of the float64 quotients, as ``band_pick`` on the
    counts and ages; the keys in ``keys``, ``inf`` past the band (the lanes past it hold stale values here);
    small counts and ages with many equal keys, and counts and last units near ``2**24``."""
    rng = np.random.default_rng(100 + nb)
    for trial in range(400):
        if trial % 4 == 3:             # near the bound: neighbouring quotients
            big = (1 << 24) - 1
            F = big - rng.integers(0, 3, nb)
            Lst = rng.integers(0, 4, nb)
            t1 = float(big + 1)
        else:
            t1 = float(rng.integers(6, 1000))
            F = rng.integers(1, 6, nb)
            Lst = t1 - rng.integers(1, 6, nb)
        keys = F.astype(np.float64) / (t1 - Lst.astype(np.float64))
        need = int(rng.integers(1, nb + 1))
        order = np.argsort(keys, kind="stable")
        bF = rng.integers(0, 9, 16).astype(np.float32)    # stale lanes past the band, ages 0 among them
        bL = np.full(16, np.float32(t1))
        bF[:nb] = F
        bL[:nb] = Lst
        out = np.zeros(2, dtype=np.uint64)
        got = np.full(16, -1.0)
        _band_pick32(bF, bL, t1, nb, need, out, got)
        assert int(out[0]) == sum(1 << int(q) for q in order[:need])
        assert int(out[1]) == 1 << int(order[need - 1])
        width = 8 if nb <= 8 else 16
        assert (got[:nb] == keys).all() and (got[nb:width] == np.inf).all()


@njit(cache=False)
def _lrfu_pick32(band, nb, need, out):
    S.lrfu_pick32(band, nb, need, out)


@pytest.mark.parametrize("nb", [2, 7, 8, 9, 15, 16])
def test_lrfu_pick32_takes_the_lowest_values_ties_to_the_lower_lane(nb):
    """``lrfu_pick32`` on float32 values: the ``need`` lowest by a stable sort (lane order breaks ties), the bit
    of the ``need``-th and of the next; many equal values, zeros, neighbouring floats and values near float32's
    top, with stale lanes (NaN, inf, negative) past the band."""
    rng = np.random.default_rng(300 + nb)
    for trial in range(400):
        kind = trial % 4
        if kind == 0:                  # few distinct values, zeros among them
            vals = rng.choice(np.array([0.0, 1.0, 1.5, 2.0], dtype=np.float32), nb)
        elif kind == 1:                # neighbouring floats
            vals = np.nextafter(np.float32(3.0), np.float32(np.inf)) * np.ones(nb, np.float32)
            vals = np.array([np.float32(3.0) if rng.random() < 0.5 else v for v in vals], dtype=np.float32)
        elif kind == 2:                # near the top of float32
            vals = (np.float32(2.0 ** 127) * rng.uniform(0.5, 1.0, nb)).astype(np.float32)
        else:
            vals = rng.uniform(0.0, 1e6, nb).astype(np.float32)
        need = int(rng.integers(1, nb))
        order = np.argsort(vals, kind="stable")
        band = np.array(rng.choice([np.nan, np.inf, -1.0, 0.0], 16), dtype=np.float32)
        band[:nb] = vals
        out = np.zeros(3, dtype=np.uint64)
        _lrfu_pick32(band, nb, need, out)
        assert int(out[0]) == sum(1 << int(q) for q in order[:need])
        assert int(out[1]) == 1 << int(order[need - 1])
        assert int(out[2]) == 1 << int(order[need])


@njit(cache=False)
def _keys8_32(bF, bL, t1, off, out):
    S.keys8_32(bF, bL, t1, off, out)


def test_keys8_32_divides_eight_counts_by_their_ages_as_the_scalar_loops_do():
    """``out[off:off+8]`` is ``float64(F) / (t1 - float64(L))`` bit for bit (counts and last units up to
    ``2**24``); the lanes around the eight untouched."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        t1 = float(rng.integers(10, 1 << 24))
        bF = rng.integers(1, 1 << 24, 40).astype(np.float32)
        bL = np.minimum((t1 - rng.integers(1, min(t1, 1 << 20), 40)).astype(np.float32), np.float32(t1 - 1))
        off = int(rng.integers(0, 32))
        out = np.full(48, -1.0)
        _keys8_32(bF, bL, t1, off, out)
        want = bF[off:off + 8].astype(np.float64) / (t1 - bL[off:off + 8].astype(np.float64))
        assert (out[off:off + 8] == want).all()
        assert (out[:off] == -1.0).all() and (out[off + 8:] == -1.0).all()


@njit(cache=False)
def _band_masks(buf, v, n):
    return S.band_masks(buf, v, n)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 17, 32, 33, 64])
def test_band_masks_compare_only_the_network_lanes(n):
    """Bits of the lanes of the smallest network holding ``n`` (8, 16, 32, 64) where the key is below / equal
    to ``v``; the lanes past that network are ignored even where they hold lower or equal keys."""
    width = next(w for w in (8, 16, 32, 64) if n <= w)
    rng = np.random.default_rng(n)
    for _ in range(100):
        buf = rng.integers(0, 5, 64).astype(np.float64)
        v = float(rng.integers(0, 5))
        lt, eq = _band_masks(buf, v, n)
        assert int(lt) == sum(1 << q for q in range(width) if buf[q] < v)
        assert int(eq) == sum(1 << q for q in range(width) if buf[q] == v)


def _lowest_of(n):
    """A kernel: ``lowest_lane`` of the first ``n`` float32 lanes of an array, and ``lowest_lane_at``'s value and
    lane."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def low(typingctx, a):
        rt = types.Tuple((types.float32, types.float32, types.int32))

        def codegen(context, builder, signature, args):
            p = S._lanes(context, builder, signature.args[0], args[0], ir.Constant(ir.IntType(64), 0), n,
                         ir.FloatType())
            x = builder.load(p, align=4)
            return context.make_tuple(builder, rt, [S.lowest_lane(builder, x), *S.lowest_lane_at(builder, x)])

        return rt(a), codegen

    return njit(cache=False)(lambda a: low(a))


@pytest.mark.parametrize("n", (1, 3, 5, 8, 12, 16, 24, 32, 40, 48, 56, 64))
def test_lowest_lane_of_any_number_of_lanes(n):
    """The lowest of ``n`` lanes, and with it the lane that holds it, its lane drawn anywhere, for lane counts that
    are and are not powers of two (the sequential global lfru candidates' 24, 40, 48 and 56: halving 40 lanes left
    one of five out); of two equal lowest lanes, either."""
    low = _lowest_of(n)
    rng = np.random.default_rng(n)
    for q in range(n):
        a = rng.random(n).astype(np.float32) + np.float32(1.0)
        a[q] = np.float32(0.5)
        assert low(a) == (np.float32(0.5), np.float32(0.5), q), (n, q)
        if n > 1:
            r = int(rng.integers(0, n - 1))
            r += r >= q
            a[r] = np.float32(0.5)
            v, w, at = low(a)
            assert v == w == np.float32(0.5) and at in (q, r), (n, q, r)


@njit(cache=False)
def _pdeps(src, mask):
    return S.pdep(src, mask), S._pdep_loop(src, mask)


def test_bit_deposit_with_and_without_bmi2():
    rng = np.random.default_rng(2)
    for _ in range(500):
        src = np.uint64(int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2)))
        mask = np.uint64(int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2)))
        want, bit = 0, 0
        for q in range(64):
            if (int(mask) >> q) & 1:
                want |= ((int(src) >> bit) & 1) << q
                bit += 1
        a, b = _pdeps(src, mask)
        assert int(a) == want and int(b) == want


def _positions_of(fn):
    @njit(cache=False)
    def positions(words, base, out, q):
        for w in range(words.shape[0]):
            q = fn(words[w], base + 64 * w, out, q)
        return q

    return positions


@pytest.mark.parametrize("name", ["bit_positions", "bit_positions_dense", "_bit_positions_loop",
                                  "_bit_positions_bytes", "_bit_positions_few", "_bit_positions_avx512",
                                  "_bit_positions_vbmi2", "bit_positions_some", "_bit_positions_few8"])
def test_bit_positions_list_the_set_bits_in_order(name):
    """Every set bit of a run of words, ascending, as ``base + 64 w + bit`` after the ``q`` entries already there
    (left as they were); empty words, full words (past 16 bits: the VBMI2 form's rarer path), the top bit, words of
    ``FEW_BITS`` or ``MANY_BITS`` and one more set bits (the few forms' two paths). The AVX-512 forms only where the
    machine has them; the loop, the bytes and the few forms (machines without AVX-512) on any."""
    need = {"_bit_positions_avx512": "avx512f", "_bit_positions_vbmi2": "avx512vbmi2"}.get(name)
    if need and not S._has_feature(need):
        pytest.skip(f"no {need} here")
    positions = _positions_of(getattr(S, name))
    rng = np.random.default_rng(5)
    assert S.FEW_BITS == 4 and S.MANY_BITS == 8
    special = [0, 2**64 - 1, 1, 2**63, 0x8000_0000_0001_0001, 0x0000_FFFF_0000_0000, 0x8000_0400_0001_0001,
               0x8000_0400_0001_0003, 0x0000_0000_0000_000F, 0x0000_0000_0000_001F, 0x8000_0000_0100_0C0F,
               0x8000_0000_0100_0C1F]
    for _ in range(300):
        n = int(rng.integers(1, 6))
        def word():
            r = rng.random()
            if r < 0.3:
                return special[int(rng.integers(0, len(special)))]
            w = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
            for _ in range(int(rng.integers(0, 4)) if r < 0.7 else 0):   # sparser: about 16, 8 or 4 bits
                w &= int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
            return w

        words = np.array([word() for _ in range(n)], dtype=np.uint64)
        base, q = int(rng.integers(0, 10_000)), int(rng.integers(0, 5))
        out = np.full(q + 64 * n + 64, -7, dtype=np.int32)
        end = positions(words, base, out, q)
        want = [base + 64 * w + i for w in range(n) for i in range(64) if (int(words[w]) >> i) & 1]
        assert end == q + len(want)
        assert out[:q].tolist() == [-7] * q
        assert out[q:end].tolist() == want


@njit(cache=False)
def _dyadic8(x):
    return S.dyadic8_down(x), S.dyadic8_up(x)


@njit(cache=False)
def _cuts32(F, L, th0, th1, t1, old_age, out):
    S.cut_masks32(F, L, 0, th0, th1, t1, old_age, out)
    a = out.copy()
    S.cut_mask1_32(F, L, 0, th1, t1, old_age, out)
    one, old1 = out[0], out[1]
    S.cut_masks32_young(F, L, 0, th0, th1, t1, out)       # the same cuts without the age mask
    same = out[0] == a[0] and out[1] == a[1]
    S.cut_mask1_32_young(F, L, 0, th1, t1, out)
    same = same and out[0] == one
    return a, one, old1, same


def test_eight_bit_cuts_round_outward_with_eight_significant_bits():
    """``dyadic8_down(x) <= x <= dyadic8_up(x)``, each with at most 8 significant bits; below ``2**-30`` (under
    every float32-loop key) the low cut is 0; ``inf`` and values past ``2**100`` round up to ``inf``. The product
    of a cut and an age below ``2**24`` is exact in float64, and a key ``f / a`` lies on the cut's side that the
    product test gives (the per-layer lfru loop sorts its band by those keys)."""
    from fractions import Fraction

    rng = np.random.default_rng(8)
    for _ in range(3000):
        x = float(rng.random() * 10 ** rng.uniform(-8, 8))
        lo, hi = _dyadic8(x)
        assert lo <= x <= hi
        for theta in (lo, hi):
            if theta > 0:
                assert float(np.frexp(theta)[0] * 2**8).is_integer()
        if x >= 2.0**-30:
            assert hi <= x * (1 + 2**-7) and lo >= x * (1 - 2**-7)
        for theta in (lo, hi):         # a float64 key f / a (below 2**24 each) other than the cut never rounds
            a = int(rng.integers(1, 2**24))                          # onto it: the product test and the key agree
            f = int(rng.integers(1, 2**24))
            assert Fraction(theta) * a == Fraction(theta * a)
            assert (f <= theta * a) == (f / a <= theta)
            f = max(1, round(theta * a))                             # counts at the product
            assert (f <= theta * a) == (f / a <= theta)
    assert _dyadic8(2.0**-31)[0] == 0.0 and _dyadic8(np.inf)[1] == np.inf and _dyadic8(2.0**101)[1] == np.inf


def test_float32_cuts_are_exact_below_the_age_bound():
    """With float32 counts and last units (integers below ``2**24``) and 8-bit cuts, ``F <= th * (t1 - L)`` in
    float32 equals the exact test on every lane whose age is below the bound, whatever the bound (the lanes at or
    above it are marked), including counts at the product, one below and one above it; the one-cut form agrees."""
    from fractions import Fraction

    rng = np.random.default_rng(9)
    out = np.zeros(3, dtype=np.uint64)
    for trial in range(400):
        t1 = int(rng.integers(2**17, 2**24))
        age = np.where(rng.random(64) < 0.8, rng.integers(1, 2**16, 64), rng.integers(1, 2**17 + 2, 64))
        th = _dyadic8(float(rng.random() * 10 ** rng.uniform(-3, 3)))[trial % 2]
        exact = [Fraction(th) * int(a) for a in age]
        F = np.array([max(1, min(2**24 - 1, int(e) + int(rng.integers(-1, 2)))) for e in exact], dtype=np.float32)
        L = (t1 - age).astype(np.float32)
        bound = [AGE, 2.0**10, 40.0][trial % 3]
        a, one, old1, same = _cuts32(F, L, np.float32(th / 4), np.float32(th), np.float32(t1), np.float32(bound),
                                     out)
        assert same                    # the forms without the age mask give the same cut masks
        for q in range(64):
            old = int(age[q]) >= bound
            assert ((int(a[2]) >> q) & 1) == old and ((int(old1) >> q) & 1) == old
            if not old:
                assert ((int(a[1]) >> q) & 1) == (int(F[q]) <= exact[q]), (th, age[q], F[q])
                assert ((int(one) >> q) & 1) == (int(F[q]) <= exact[q])
                assert ((int(a[0]) >> q) & 1) == (int(F[q]) <= Fraction(th / 4) * int(age[q]))


AGE = S.AGE32


def _cmp_runner(op: str, movmsk: bool):
    """A kernel calling :func:`S._make_lanes_cmp`'s form alone (the AVX form does not compile without AVX)."""
    cmp = S._make_lanes_cmp(op, movmsk)

    @njit(cache=False)
    def run(buf, off, v):
        return cmp(buf, off, v)

    return run


@pytest.mark.parametrize("movmsk", [False, True], ids=["bitcast", "movmsk"])
@pytest.mark.parametrize("op", ["==", ">="])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_lanes_eq_and_ge_mark_their_lanes(dtype, op, movmsk):
    """Bit ``q`` of the word where ``buf[off + q] == v`` (``lanes_eq``; ``>= v``: ``lanes_ge``) for the 64 lanes from
    ``off`` (values around it, -1 and the value itself on the word's first and last lane); the lanes past the 64 are
    not read into it. Int64 lanes and int32 ones (the per-layer lrfu loop's last units); the word from a bitcast of
    the compare, and from AVX's sign-bit masks of 256-bit chunks (machines without AVX-512)."""
    if movmsk and not S._has_feature("avx2"):
        pytest.skip("the sign-bit masks of 256-bit chunks need AVX2")
    run = _cmp_runner(op, movmsk)
    rng = np.random.default_rng(2)
    for _ in range(200):
        buf = rng.integers(-1, 6, 200).astype(dtype)
        off = int(rng.integers(0, 136))
        v = int(rng.integers(-1, 6))
        buf[off + int(rng.choice([0, 63]))] = v
        want = sum(1 << q for q in range(64) if (buf[off + q] == v if op == "==" else buf[off + q] >= v))
        assert int(run(buf, off, v)) == want


def _values_runner(fn):
    """A kernel calling ``fn``, the form under test alone: a kernel that also names an AVX-512 intrinsic does not
    compile on a machine without AVX-512 (LLVM aborts the process), whichever branch runs."""

    @njit(cache=False)
    def run(V, off, x, out, q):
        return fn(V, off, x, out, q)

    return run


@pytest.mark.parametrize("name", ["avx512", "loop", "avx512-float32", "loop-float32"])
def test_values_at_lists_the_values_of_the_set_bits_in_order(name):
    """``V[off + i]`` for the set bits ``i`` of the word, ascending, from ``out[q]``; the count returned; the
    values before ``q`` kept (empty words, full words, the top bit). Float64 (``values_at``) and float32
    (``values_at32``) values."""
    if name.startswith("avx512") and not S._has_feature("avx512f"):
        pytest.skip("no AVX-512 on this machine")
    f32 = name.endswith("float32")
    if name.startswith("avx512"):
        run = _values_runner(S._values_at32_avx512 if f32 else S._values_at_avx512)
    else:
        run = _values_runner(S._values_at_loop)
    rng = np.random.default_rng(4)
    V = rng.random(300).astype(np.float32 if f32 else np.float64)
    for x in [0, 1, 1 << 63, (1 << 64) - 1] + [int(rng.integers(0, 1 << 63, dtype=np.int64)) * 2 + int(rng.integers(0, 2))
                                              for _ in range(200)]:
        off = int(rng.integers(0, 236))
        q = int(rng.integers(0, 5))
        out = np.full(q + 64 + 8, -1.0, dtype=V.dtype)
        want = [V[off + i] for i in range(64) if x >> i & 1]
        got = run(V, off, np.uint64(x), out, q)
        assert got == q + len(want) and list(out[q:got]) == want and (out[:q] == -1.0).all()


@njit(cache=False)
def _below_masks(a, b):
    out = np.empty(a.shape[0], dtype=np.uint64)
    for k in range(a.shape[0]):
        out[k] = S.below_mask(a[k], b[k])
    return out


def test_below_mask_is_all_ones_exactly_where_the_first_count_is_lower():
    rng = np.random.default_rng(5)
    edge = np.array([0, 1, 2, 63, 64, 2**31, 2**62 - 1], dtype=np.int64)
    a = np.concatenate([rng.integers(0, 200, 500), edge, edge, edge[::-1]]).astype(np.int64)
    b = np.concatenate([rng.integers(0, 200, 500), edge, np.roll(edge, 1), edge]).astype(np.int64)
    want = np.where(a < b, np.uint64(2**64 - 1), np.uint64(0))
    assert np.array_equal(_below_masks(a, b), want)


def _split_runner(split):
    """The global slots loop's split of ``src[:n]`` by 16-lane chunks with ``split`` (one form alone, as
    :func:`_values_runner`), as it runs it; returns the two counts."""

    @njit(cache=False)
    def run(src, n, SF, SL, l32, t32, lv, bpos):
        c0 = 0
        bb = 0
        for r in range(0, n, 16):
            x = split(src, r, n, SF, SL, l32, t32, lv, c0, bpos, bb)
            c = 0
            while x:
                c += 1
                x &= x - np.uint64(1)
            c0 += c
            bb += min(16, n - r) - c
        return c0, bb

    return run


@pytest.mark.parametrize("name", ["avx512", "loop"])
def test_split_low16_splits_a_list_by_the_float32_low_cut_in_order(name):
    """The slots of a list at or below ``count <= cut * (t1 - last)`` (float32, as the scalar loop computes it) in
    ``lv`` and the others in ``bpos``, each in list order; partial last chunks; slots equal to the cut (kept low),
    last units ``inf`` (never low), a zero cut; and the list split in place (``src`` is ``lv``, as after the low
    cut moves down)."""
    if name == "avx512" and not S._has_feature("avx512f"):
        pytest.skip("no AVX-512 on this machine")
    split_all = _split_runner(S._split_low16_avx512 if name == "avx512" else S._split_low16_loop)
    rng = np.random.default_rng(11)
    n_slots = 700
    for trial in range(300):
        SF = rng.integers(1, 40, n_slots).astype(np.float32)
        SL = rng.integers(0, 500, n_slots).astype(np.float32)
        SL[rng.random(n_slots) < 0.05] = np.inf
        t32 = np.float32(600.0)
        l32 = np.float32(0.0 if trial % 17 == 0 else rng.choice([0.0625, 0.09375, 0.125, 0.25, 1.5]))
        eq = rng.integers(0, n_slots, 20)                  # counts exactly at the cut's product
        SF[eq] = l32 * (t32 - np.where(np.isinf(SL[eq]), np.float32(0), SL[eq]))
        n = int(rng.integers(0, 90))
        src = rng.permutation(n_slots)[:n].astype(np.int32)
        lv = np.full(n + 64, -3, dtype=np.int32)
        bpos = np.full(n + 64, -3, dtype=np.int64)
        with np.errstate(invalid="ignore"):
            low = [bool(SF[s] <= l32 * (t32 - SL[s])) for s in src]
        want_lv = [int(s) for s, k in zip(src, low, strict=True) if k]
        want_b = [int(s) for s, k in zip(src, low, strict=True) if not k]
        in_place = trial % 3 == 0
        if in_place:
            lv[:n] = src
        c0, bb = split_all(lv if in_place else src, n, SF, SL, l32, t32, lv, bpos)
        assert (c0, bb) == (len(want_lv), len(want_b))
        assert lv[:c0].tolist() == want_lv and bpos[:bb].tolist() == want_b


@pytest.mark.parametrize("name", ["cut_list1_32_fma", "_cut_list1_32_fma_any", "_cut_list1_32_fma_vbmi2"])
def test_cut_list1_32_fma_lists_the_lanes_below_an_exact_cut(name):
    """The fused one-cut pass with its listing: the lanes ``j`` of 64 from ``off`` whose count is at most
    ``th * (T - L)``, exactly (counted in fractions), as ``off + j`` ascending after the ``q`` entries already there;
    8-bit cuts, units below ``2**16``, freed lanes (``L`` ``inf``) below no cut, the cut 0, ties on the cut, and
    words of more than 16 such lanes (the VBMI2 form's rarer path). The VBMI2 form only where the machine has it."""
    from fractions import Fraction

    if name.endswith("vbmi2") and not S._has_feature("avx512vbmi2"):
        pytest.skip("no avx512vbmi2 here")
    fn = getattr(S, name)

    @njit(cache=False)
    def run(F, L, off, nth, c, out, q):
        return fn(F, L, off, nth, c, out, q)

    rng = np.random.default_rng(30)
    for _ in range(400):
        T = int(rng.integers(1, 2**16))
        th = float(S.dyadic8_up(float(rng.choice([0.0, rng.random() * 4.0, rng.random() * 0.01]))))
        th = 0.0 if th < 2.0**-30 else th
        F = rng.integers(1, 2**20 if rng.random() < 0.5 else 40, 128).astype(np.float32)
        L = (T - rng.integers(0, min(T, 2**16 - 1) + 1, 128)).astype(np.float32)
        L[rng.random(128) < 0.1] = np.inf
        on = rng.random(128) < (0.5 if rng.random() < 0.3 else 0.05)
        age = (T - L).astype(np.float64)
        F[on & np.isfinite(L)] = np.maximum(np.floor(th * age[on & np.isfinite(L)]), 1)    # at or by the cut
        off, q = int(rng.choice([0, 64])), int(rng.integers(0, 5))
        out = np.full(q + 128, -7, dtype=np.int32)
        end = run(F, L, off, np.float32(-th), np.float32(th) * np.float32(T), out, q)
        want = [off + j for j in range(64)
                if np.isfinite(L[off + j]) and Fraction(float(F[off + j])) <= Fraction(th) * (T - int(L[off + j]))]
        assert end == q + len(want) and out[:q].tolist() == [-7] * q and out[q:end].tolist() == want


#: The band lists of each form (two arrays for one and two words, then one array): as this machine picks them, the
#: word-by-word lists of machines without VBMI2 (``values_at32``: a loop over the bits without AVX-512, whole 16-lane
#: compresses with it, hence out arrays of ``S.BAND16_OUT``), and the sixteen steps of machines without AVX-512
#: (whose one-array lists are the word-by-word ones).
_BAND16_FORMS = {"host": ("band16_1", "band16_2", "band16v_1", "band16v_2"),
                 "loop": ("_band16_1_loop", "_band16_2_loop", "_band16v_1_loop", "_band16v_2_loop"),
                 "fixed": ("_band16_1_fixed", "_band16_2_fixed", "_band16v_1_loop", "_band16v_2_loop")}


def _band16_runners(form):
    b1, b2, v1, v2 = (getattr(S, name) for name in _BAND16_FORMS[form])

    @njit(cache=False)
    def band16(A, B, off, xa, xb, outA, outB, two):
        if two:
            b2(A, B, off, xa, xb, outA, outB)
        else:
            b1(A, B, off, xa, xb, outA, outB)

    @njit(cache=False)
    def band16v(A, off, xa, xb, outA, two):
        if two:
            v2(A, off, xa, xb, outA)
        else:
            v1(A, off, xa, xb, outA)

    return band16, band16v


@pytest.mark.parametrize("form", ("host", "loop", "fixed"))
@pytest.mark.parametrize("arrays", (1, 2))
def test_band16_lists_both_arrays_at_the_set_bits_in_order(arrays, form):
    """``band16_1`` / ``band16_2`` (two arrays) and ``band16v_1`` / ``band16v_2`` (one): the values of float32 arrays
    at the set bits of one word (two words, the second's lanes from ``off + 64``), in lane order, for bands of 0-16
    lanes anywhere in the words, against numpy; as this machine picks them, and the forms of machines without VBMI2
    on any machine (the loop over the bits; for two arrays also the sixteen steps of machines without AVX-512), none
    writing past the ``S.BAND16_OUT`` elements the lists may fill (with AVX-512 the loop over the words stores whole
    16-lane compresses: 16 + 64)."""
    _band16, _band16v = _band16_runners(form)
    rng = np.random.default_rng(16)
    A = rng.random(64 * 6).astype(np.float32)
    B = rng.random(64 * 6).astype(np.float32)
    for _ in range(400):
        two = bool(rng.integers(2))
        off = 64 * int(rng.integers(0, 4))
        n = int(rng.integers(0, 17))
        lanes = np.sort(rng.choice(128 if two else 64, size=n, replace=False))
        words = [0, 0]
        for j in lanes:
            words[j >> 6] |= 1 << int(j & 63)
        outA = np.full(S.BAND16_OUT + 8, -1.0, np.float32)
        outB = np.full(S.BAND16_OUT + 8, -1.0, np.float32)
        if arrays == 2:
            _band16(A, B, off, np.uint64(words[0]), np.uint64(words[1]), outA, outB, two)
            assert outB[:n].tolist() == B[off + lanes].tolist() and (outB[S.BAND16_OUT:] == -1).all()
        else:
            _band16v(A, off, np.uint64(words[0]), np.uint64(words[1]), outA, two)
        assert outA[:n].tolist() == A[off + lanes].tolist() and (outA[S.BAND16_OUT:] == -1).all()


@njit(cache=False, _nrt=False)
def _through_pointer(x, n, k, v):
    y = S.array_at(S.data_of(x), n)
    y[k] = v
    return y[0] + y[n - 1], y.shape[0], y.strides[0], y.itemsize


@pytest.mark.parametrize("dtype", (np.int16, np.int32, np.float32, np.float64, np.uint8))
def test_array_at_views_the_array_data_of_points_to(dtype):
    """``array_at(data_of(x), n)`` in code without the numba runtime is ``x[:n]`` itself: its reads see x's
    elements, its writes land in x, and its length, stride and item size are n and x's."""
    x = np.arange(10, dtype=dtype)
    before = x.copy()
    got, length, stride, itemsize = _through_pointer(x, 7, 3, dtype(9))
    assert (length, stride, itemsize) == (7, x.itemsize, x.itemsize) and got == before[0] + before[6]
    want = before.copy()
    want[3] = 9
    assert (x == want).all()


@njit(cache=False, _nrt=False)
def _through_pointer_at(x, off, n, k, v):
    y = S.array_at(S.data_at(x, off), n)
    y[k] = v
    return y[0]


def test_data_at_points_to_an_element_in_flat_order():
    """``data_at(x, off)`` of a C-contiguous 3-d array points to its flat element ``off``: the view's first element
    is it and a write lands at ``off + k`` (fails when the offset is dropped or taken in bytes)."""
    x = np.arange(4 * 3 * 2, dtype=np.uint64).reshape(4, 3, 2)
    first = _through_pointer_at(x, 7, 5, 2, np.uint64(100))
    flat = np.arange(24, dtype=np.uint64)
    flat[9] = 100
    assert first == 7 and (x.reshape(-1) == flat).all()


def test_data_of_refuses_a_strided_array():
    """``data_of`` / ``data_at`` compile only for C-contiguous arrays: a strided view's data pointer would read
    the wrong elements through ``array_at``."""
    from numba.core.errors import TypingError

    x = np.arange(20, dtype=np.int32)[::2]
    with pytest.raises(TypingError):
        _through_pointer(x, 5, 1, np.int32(3))
    with pytest.raises(TypingError):
        _through_pointer_at(np.arange(24, dtype=np.uint64).reshape(4, 6)[:, ::2], 1, 3, 0, np.uint64(1))
