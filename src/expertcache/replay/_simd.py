"""Vector building blocks for the bitset kernels, written as LLVM vector IR (numba intrinsics).

A per-layer cache in tie-position space is one or a few 64-bit words, and the
state of its blocks sits in dense arrays in the same order. The kernels of
:mod:`._kernels_bits` work on 64 lanes at a time through these intrinsics: a
word of bits becomes a ``<64 x i1>`` lane mask and back (``bitcast``), a
comparison of 64 keys becomes a word of bits, and a small set of keys is
sorted by a bitonic network. LLVM lowers the IR to whatever vector unit the
machine has (AVX-512 here; AVX2, SSE or NEON elsewhere, with more
instructions); the results do not depend on the machine.

Every intrinsic reads or writes whole lane groups: a buffer passed to them
must hold ``off + 64`` (or ``n``) elements.

* :data:`sort8`, :data:`sort16`, :data:`sort32`, :data:`sort64` — sort a float64
  buffer's first ``count`` values ascending into another (or the same) buffer, the network's lanes past
  ``count`` set to ``inf`` (bitonic network; no NaN); :func:`sort_small` the smallest that holds a count (up
  to 64).
* :func:`mask_lt`, :func:`mask_eq` — bit ``q`` set where ``buf[q] < v`` (``== v``),
  ``q < 64``.
* :func:`touch_lanes32` — one added to the float32 counts ``F`` and the last unit ``L`` set on the lanes of a
  word of bits (a unit's members); :func:`touch_cut_masks32` — that, then the masks of :func:`cut_masks32` on
  the new values, in one pass (``ev = 0``: the cuts alone; the per-layer lfru loop).
* :func:`band_pick` — the lowest of up to 16 keys ``count / age``, ties to the lower lane, by counting ranks in
  registers (the narrow band of the global slots loop); :func:`band_pick32` the same from float32 counts and
  last units (the narrow band of the per-layer lfru loop); :func:`keys8_32` 8 such keys divided at once (its
  wider bands); :func:`lrfu_pick32` the same on float32 values (the per-layer lrfu loop's band).
* :func:`lrfu_cut1`, :func:`lrfu_cut2` — 64 float32 lrfu values against the sure and maybe bounds of one or two
  cuts.
* :func:`lanes_below` — the live lanes of a partial group of 64, as bits.
* :data:`lanes_eq` — the lanes of 64 int64 or int32 values equal to one value, as bits (the per-layer lrfu loop's
  members: the lanes whose last unit is the unit's).
* :data:`lanes_max128`, :data:`lanes_min128` — the largest (smallest) of 128 int32 lanes among those whose bits
  are set in two words, by one vector reduction (the per-layer Belady loop of :mod:`._kernels_belady_lanes`);
  ``lanes_max64`` / ``lanes_min64`` and ``lanes_max16`` / ``lanes_min16`` the same over 64 and 16 lanes;
  :data:`lanes_ge` the lanes of 64 integer values at least one value, as bits (that loop's cut).
* :func:`cut_masks32`, :func:`cut_mask1_32` — the bits of the 64 lanes where ``F <= theta * (t1 - L)`` for two
  cuts (one) on float32 counts and last units with 8-bit cuts (:func:`dyadic8_down`, :func:`dyadic8_up`), 16
  lanes to a 512-bit vector, exact below an age bound; the lanes at or past it marked (the lfru loops).
* :func:`cut_masks32_fma`, :func:`cut_mask1_32_fma` — the same test as one fused multiply-add and a compare per
  vector, on units relative to a base (the global slots loop where every lane is young; :data:`HAS_FMA`).
* :data:`cut_list1_32_fma` — :func:`cut_mask1_32_fma`'s lanes listed as :func:`bit_positions` lists them, in
  one step (AVX-512 VBMI2; the mask and the listing otherwise; the global slots loop's one-cut pass).
* :func:`bit_positions` — the set bits of a word as a list of positions (AVX-512 compress where the machine
  has it, a table of each byte's positions otherwise); :data:`bit_positions_some` the same for words of about
  three to eight set bits.
* :func:`values_at`, :func:`values_at32` — the float64 (float32) values at the set bits of a word, as a list
  (AVX-512 compress where the machine has it, a loop otherwise; ``values_at32`` the per-layer lrfu and lfru
  loops' bands).
* :data:`split_low16` — 16 slots of a list split by a float32 low cut into two lists, in order (two gathers, a
  compare and two compresses with AVX-512, a loop otherwise; the global slots loop's list of slots below its high
  cut where :data:`FAST_GATHERS`: AVX-512 on a core other than AMD's Zen).
* :data:`tie_bits1`, :data:`tie_bits2` — a unit's bitset over experts moved to tie positions by
  ``vpshufbitqmb`` (AVX-512 BITALG only, :data:`HAS_BITALG`; the per-layer lfru loop's unit bits).
* :func:`pdep` — parallel bit deposit (BMI2 where the machine has it, a loop otherwise).
* :func:`below_mask` — a word of all ones where one count is below another, that no compiler pass makes a branch.
* :func:`f2u`, :func:`u2f` — the bits of a float64 and back.
* :func:`data_of`, :func:`array_at` — an array's data pointer, and the array of ``n`` elements at a pointer:
  a helper called with pointers and lengths takes two arguments an array, where an array whole takes seven (the
  global slots loop's member loop).

The global lfru loop (:mod:`._kernels_lfru_groups`) builds its own intrinsics from :func:`_lanes` and
:func:`_splat`.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from .._bits import U as _U
from .._jit import jit_helper
from ._kernels import _cttz

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F64 = ir.DoubleType()


def _splat(builder, x, vt, n):
    """A ``<n x T>`` vector of ``x`` in every lane."""
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), [0] * n))


def _lanes(context, builder, aty, ary, off, n, elt=_F64):
    """Pointer to ``n`` lanes of array ``ary`` (numba type ``aty``) from element ``off``."""
    data = context.make_array(aty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [off]), ir.VectorType(elt, n).as_pointer())


def bitonic_stages(n: int) -> list[tuple[list[int], list[int]]]:
    """The stages of a bitonic sorting network on ``n`` (a power of two) lanes, ascending.

    Each stage is ``(partner, pick)``: lane ``i`` compares with lane ``partner[i] = i ^ j`` and keeps
    the minimum when ``pick[i] == i``, the maximum when ``pick[i] == n + i``.
    """
    stages = []
    k = 2
    while k <= n:
        j = k // 2
        while j >= 1:
            partner = [i ^ j for i in range(n)]
            pick = [i if (i < (i ^ j)) == ((i & k) == 0) else n + i for i in range(n)]
            stages.append((partner, pick))
            j //= 2
        k *= 2
    return stages


def _make_sort(n: int):
    stages = bitonic_stages(n)

    @intrinsic
    def _sort(typingctx, src, count, dst):
        sig = types.void(src, types.int64, dst)

        def codegen(context, builder, signature, args):
            v = builder.load(_lanes(context, builder, signature.args[0], args[0], ir.Constant(_I64, 0), n), align=8)
            it = ir.VectorType(_I64, n)
            live = builder.icmp_signed("<", ir.Constant(it, list(range(n))), _splat(builder, args[1], it, n))
            v = builder.select(live, v, ir.Constant(ir.VectorType(_F64, n), [float("inf")] * n))
            for partner, pick in stages:
                w = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), partner))
                lt = builder.fcmp_ordered("<", v, w)
                lo = builder.select(lt, v, w)
                hi = builder.select(lt, w, v)
                v = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, n), pick))
            builder.store(v, _lanes(context, builder, signature.args[2], args[2], ir.Constant(_I64, 0), n), align=8)
            return context.get_dummy_value()

        return sig, codegen

    _sort.__doc__ = (f"``dst[:{n}]`` = the first ``count`` float64 values of ``src`` sorted ascending, then ``inf`` "
                     f"(bitonic network on {n} lanes; ``src`` and ``dst`` may be one buffer; no NaN).")
    return _sort


sort8 = _make_sort(8)
sort16 = _make_sort(16)
sort32 = _make_sort(32)
sort64 = _make_sort(64)


@jit_helper
def sort_small(src, n, dst):
    """``dst`` = ``src[:n]`` (``n <= 64``) sorted, by the smallest network (8, 16, 32 or 64 lanes) that holds it;
    the network's lanes past ``n`` are ``inf``. ``src`` and ``dst`` may be one buffer. Returns the width."""
    if n <= 8:
        sort8(src, n, dst)
        return 8
    if n <= 16:
        sort16(src, n, dst)
        return 16
    if n <= 32:
        sort32(src, n, dst)
        return 32
    sort64(src, n, dst)
    return 64


@jit_helper
def lanes_below(r):
    """The bits of the first ``r`` lanes of 64 (none below 1, all from 64 on): the live lanes of a last, partial
    group of 64."""
    if r <= 0:
        return np.uint64(0)
    return ~np.uint64(0) if r >= 64 else (np.uint64(1) << np.uint64(r)) - np.uint64(1)


def _make_mask(op: str, n: int = 64):
    @intrinsic
    def _mask(typingctx, buf, v):
        sig = types.uint64(buf, types.float64)

        def codegen(context, builder, signature, args):
            x = builder.load(_lanes(context, builder, signature.args[0], args[0], ir.Constant(_I64, 0), n), align=8)
            c = builder.bitcast(builder.fcmp_ordered(op, x, _splat(builder, args[1], ir.VectorType(_F64, n), n)),
                                ir.IntType(n))
            return c if n == 64 else builder.zext(c, _I64)

        return sig, codegen

    return _mask


#: ``mask_lt(buf, v)``: bit ``q`` set where ``buf[q] < v``, for the 64 lanes ``buf[0:64]``.
mask_lt = _make_mask("<")
#: ``mask_eq(buf, v)``: bit ``q`` set where ``buf[q] == v``, for the 64 lanes ``buf[0:64]``.
mask_eq = _make_mask("==")
_mask_lt8, _mask_eq8 = _make_mask("<", 8), _make_mask("==", 8)
_mask_lt16, _mask_eq16 = _make_mask("<", 16), _make_mask("==", 16)
_mask_lt32, _mask_eq32 = _make_mask("<", 32), _make_mask("==", 32)


@jit_helper
def band_masks(buf, v, n):
    """``(mask_lt(buf, v), mask_eq(buf, v))`` over only the lanes of the smallest network (8, 16, 32 or 64) that
    holds ``n``, as :func:`sort_small` picks it; the bits past those lanes are clear. A band of a few keys
    compares one or two vectors instead of eight."""
    if n <= 8:
        return _mask_lt8(buf, v), _mask_eq8(buf, v)
    if n <= 16:
        return _mask_lt16(buf, v), _mask_eq16(buf, v)
    if n <= 32:
        return _mask_lt32(buf, v), _mask_eq32(buf, v)
    return mask_lt(buf, v), mask_eq(buf, v)


#: The lowest key :func:`band_pick` orders by its bits (a count of at least 1 over an age below ``2**26``
#: is above it): keys from it on, shifted past the lane number, fit 64 bits.
_PICK_FLOOR_BITS = int(np.float64(2.0 ** -30).view(np.int64))


def _pick_lanes(context, builder, signature, args, kb, nb, need, out, n, floor=_PICK_FLOOR_BITS, nxt=False):
    """The body shared by the band picks: ``kb`` (``<n x i64>``, the bits of non-negative floats at least the one
    whose bits are ``floor``) ranked for lanes below ``nb`` (``args`` indices of the band size, ``need`` and the
    output), each lane's rank the number of lanes below it (the bits minus ``floor``, shifted past a six-bit lane
    number and given it, order the lanes as (key, lane) does); ``out[0]`` the ``need`` lowest lanes as bits,
    ``out[1]`` the bit of the ``need``-th (and ``out[2]`` the next one's where ``nxt``). Returns the live lanes."""
    it = ir.VectorType(_I64, n)
    idx = ir.Constant(it, list(range(n)))
    live = builder.icmp_signed("<", idx, _splat(builder, args[nb], it, n))
    if floor:
        kb = builder.sub(kb, ir.Constant(it, [floor] * n))
    u = builder.or_(builder.shl(kb, ir.Constant(it, [6] * n)), idx)
    u = builder.select(live, u, ir.Constant(it, [-1] * n))       # lanes past the band: after all
    rank = ir.Constant(it, [0] * n)
    for p in range(n):
        up = builder.shuffle_vector(u, u, ir.Constant(ir.VectorType(_I32, n), [p] * n))
        rank = builder.add(rank, builder.zext(builder.icmp_unsigned(">", u, up), it))
    needv = _splat(builder, args[need], it, n)
    leave = builder.and_(builder.icmp_signed("<", rank, needv), live)
    at = builder.and_(builder.icmp_signed("==", rank, builder.sub(needv, ir.Constant(it, [1] * n))), live)
    masks = [leave, at] + ([builder.and_(builder.icmp_signed("==", rank, needv), live)] if nxt else [])
    data = context.make_array(signature.args[out])(context, builder, args[out]).data
    for q, c in enumerate(masks):
        bits = builder.zext(builder.bitcast(c, ir.IntType(n)), _I64)
        builder.store(bits, builder.gep(data, [ir.Constant(_I64, q)]))
    return live


def _store_keys(context, builder, aty, ary, key, live, n):
    """The band's keys into ``ary[0:n]``, ``inf`` in the lanes past it."""
    ft = ir.VectorType(_F64, n)
    builder.store(builder.select(live, key, ir.Constant(ft, [float("inf")] * n)),
                  _lanes(context, builder, aty, ary, ir.Constant(_I64, 0), n), align=8)


def _make_pick(n: int):
    @intrinsic
    def _pick(typingctx, bF, bA, nb, need, out):
        sig = types.void(bF, bA, types.int64, types.int64, out)

        def codegen(context, builder, signature, args):
            zero = ir.Constant(_I64, 0)
            fv = builder.load(_lanes(context, builder, signature.args[0], args[0], zero, n), align=8)
            av = builder.load(_lanes(context, builder, signature.args[1], args[1], zero, n), align=8)
            key = builder.fdiv(fv, av)
            live = _pick_lanes(context, builder, signature, args, builder.bitcast(key, ir.VectorType(_I64, n)),
                               2, 3, 4, n)
            _store_keys(context, builder, signature.args[0], args[0], key, live, n)
            return context.get_dummy_value()

        return sig, codegen

    return _pick


def _keys32(context, builder, signature, args, f, lst, t1, off, n):
    """``n`` float64 keys ``F / (t1 - L)`` from the float32 counts ``args[f]`` and last units ``args[lst]`` at
    element ``off`` (``t1`` the index of the float64 clock), as the loops write
    ``np.float64(F) / (t1 - np.float64(L))``."""
    ft = ir.VectorType(_F64, n)
    fv, lv = (builder.fpext(builder.load(_lanes(context, builder, signature.args[k], args[k], off, n,
                                                ir.FloatType()), align=4), ft) for k in (f, lst))
    return builder.fdiv(fv, builder.fsub(_splat(builder, args[t1], ft, n), lv))


def _make_pick32(n: int):
    @intrinsic
    def _pick(typingctx, bF, bL, t1, nb, need, out, keys):
        sig = types.void(bF, bL, types.float64, types.int64, types.int64, out, keys)

        def codegen(context, builder, signature, args):
            key = _keys32(context, builder, signature, args, 0, 1, 2, ir.Constant(_I64, 0), n)
            live = _pick_lanes(context, builder, signature, args, builder.bitcast(key, ir.VectorType(_I64, n)),
                               3, 4, 5, n)
            _store_keys(context, builder, signature.args[6], args[6], key, live, n)
            return context.get_dummy_value()

        return sig, codegen

    return _pick


def _make_lrfu_pick(n: int):
    @intrinsic
    def _pick(typingctx, band, nb, need, out):
        if not _f32_arrays(band):
            return None
        sig = types.void(band, types.int64, types.int64, out)

        def codegen(context, builder, signature, args):
            x = builder.load(_lanes(context, builder, signature.args[0], args[0], ir.Constant(_I64, 0), n,
                                    ir.FloatType()), align=4)
            bits = builder.zext(builder.bitcast(x, ir.VectorType(_I32, n)), ir.VectorType(_I64, n))
            _pick_lanes(context, builder, signature, args, bits, 1, 2, 3, n, floor=0, nxt=True)
            return context.get_dummy_value()

        return sig, codegen

    return _pick


_pick8, _pick16 = _make_pick(8), _make_pick(16)
_pick32_8, _pick32_16 = _make_pick32(8), _make_pick32(16)
_lrfu_pick8, _lrfu_pick16 = _make_lrfu_pick(8), _make_lrfu_pick(16)


@jit_helper
def lrfu_pick32(band, nb, need, out):
    """The ``need`` lowest (``1 <= need < nb <= 16``) of the float32 values ``band[:nb]`` (at least 0), ties to
    the lower lane: ``out[0]`` their lanes as bits, ``out[1]`` the bit of the ``need``-th, ``out[2]`` the bit of
    the next. A value's bits shifted past a six-bit lane number and given it order the lanes as (value, lane)
    does (non-negative floats order as their bits); ranks counted as in :func:`band_pick`. ``band`` holds 8 or 16
    lanes as ``nb`` needs (lanes past ``nb`` ignored)."""
    if nb <= 8:
        _lrfu_pick8(band, nb, need, out)
    else:
        _lrfu_pick16(band, nb, need, out)


@jit_helper
def band_pick(bF, bA, nb, need, out):
    """The ``need`` lowest (``1 <= need <= nb <= 16``) of the keys ``bF[q] / bA[q]`` (counts over ages, integers
    below ``2**26`` and the count at least 1), ties to the lower lane: ``out[0]`` their lanes as bits, ``out[1]``
    the bit of the ``need``-th; the keys are left in ``bF`` (``inf`` in its lanes past ``nb``, up to 8 or 16).

    The keys are divided as one vector; each key's bits minus those of ``2**-30``, shifted past a lane number of
    six bits and given it, order the lanes exactly as (key, lane) does (positive floats order as their bits), and
    each lane's rank is the number of lanes below it, counted for all lanes at once, one lane per step: no sort,
    no branch. Buffers hold 8 or 16 lanes as ``nb`` needs (lanes past ``nb`` ignored).
    """
    if nb <= 8:
        _pick8(bF, bA, nb, need, out)
    else:
        _pick16(bF, bA, nb, need, out)


@jit_helper
def band_pick32(bF, bL, t1, nb, need, out, keys):
    """:func:`band_pick` on float32 counts ``bF`` and last units ``bL`` (integers below ``2**24``; the ages
    ``t1 - bL`` in float64, exact): ``out`` as there, the keys into ``keys`` (``inf`` past ``nb``). The per-layer
    lfru loop fills ``bF`` and ``bL`` straight from its float32 lanes (:data:`values_at32`): no loop over the
    band's bits, whose exit a branch predictor misses (the per-layer lfru loop in 0.94 of its time;
    docs/performance.md)."""
    if nb <= 8:
        _pick32_8(bF, bL, t1, nb, need, out, keys)
    else:
        _pick32_16(bF, bL, t1, nb, need, out, keys)


@intrinsic
def keys8_32(typingctx, bF, bL, t1, off, out):
    """``out[off:off+8] = bF / (t1 - bL)`` over 8 lanes: float32 counts and last units (integers below ``2**24``)
    to float64 keys, as the loops write ``np.float64(F) / (t1 - np.float64(L))`` (one vector division)."""
    sig = types.void(bF, bL, types.float64, types.int64, out)

    def codegen(context, builder, signature, args):
        key = _keys32(context, builder, signature, args, 0, 1, 2, args[3], 8)
        builder.store(key, _lanes(context, builder, signature.args[4], args[4], args[3], 8), align=8)
        return context.get_dummy_value()

    return sig, codegen


def _touch32(context, builder, signature, args, evi: int, fi: int):
    """Add one to the float32 counts ``F`` and set the float32 last units ``L`` to ``fi`` on the lanes of
    ``off .. off+63`` whose bit is set in the word ``args[evi]`` (``F``, ``L``, ``off`` the first three
    arguments), store both, and return the new ``F`` and ``L`` vectors."""
    vt = ir.VectorType(ir.FloatType(), 64)
    pf = _lanes(context, builder, signature.args[0], args[0], args[2], 64, ir.FloatType())
    pl = _lanes(context, builder, signature.args[1], args[1], args[2], 64, ir.FloatType())
    m = builder.bitcast(args[evi], ir.VectorType(ir.IntType(1), 64))
    f = builder.fadd(builder.load(pf, align=4),
                     builder.select(m, ir.Constant(vt, [1.0] * 64), ir.Constant(vt, [0.0] * 64)))
    last = builder.select(m, _splat(builder, args[fi], vt, 64), builder.load(pl, align=4))
    builder.store(f, pf, align=4)
    builder.store(last, pl, align=4)
    return f, last


@intrinsic
def touch_lanes32(typingctx, F, L, off, ev, fi):
    """Add one to the float32 counts ``F`` and set the float32 last units ``L`` to ``fi`` on the lanes
    ``off .. off+63`` whose bit is set in ``ev``: the members' counts and last units of a unit, as one vector pass
    over the word (the lfru per-layer loop)."""
    sig = types.void(F, L, types.int64, types.uint64, types.float32)

    def codegen(context, builder, signature, args):
        _touch32(context, builder, signature, args, 3, 4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def touch_cut_masks32(typingctx, F, L, off, ev, fi, th0, th1, t1, old_age, out):
    """:func:`touch_lanes32` then, in the same pass over the 64 lanes from ``off``, the masks of
    :func:`cut_masks32` on the new values: ``out[0]`` (``out[1]``) the lanes where ``F <= th0 * (t1 - L)``
    (``th1``) in float32, ``out[2]`` the lanes at least ``old_age`` old, which those two do not decide (with
    ``ev = 0``, the values as they are)."""
    f32 = types.float32
    sig = types.void(F, L, types.int64, types.uint64, f32, f32, f32, f32, f32, out)

    def codegen(context, builder, signature, args):
        vt = ir.VectorType(ir.FloatType(), 64)
        f, last = _touch32(context, builder, signature, args, 3, 4)
        age = builder.fsub(_splat(builder, args[7], vt, 64), last)
        masks = [builder.fcmp_ordered("<=", f, builder.fmul(_splat(builder, th, vt, 64), age))
                 for th in (args[5], args[6])]
        masks.append(builder.fcmp_ordered(">=", age, _splat(builder, args[8], vt, 64)))
        data = context.make_array(signature.args[9])(context, builder, args[9]).data
        for q, c in enumerate(masks):
            builder.store(builder.bitcast(c, _I64), builder.gep(data, [ir.Constant(_I64, q)]))
        return context.get_dummy_value()

    return sig, codegen


#: Ages from this on can leave float32 products with an 8-bit cut inexact: :func:`cut_masks32` marks their lanes
#: (the callers pass it; a lower value only marks more lanes).
AGE32 = float(1 << 16)


def _counts_units32(context, builder, signature, args):
    """The 64 float32 counts and units ``F``, ``L`` (the intrinsics' first two arguments) from lane ``args[2]``."""
    f = builder.load(_lanes(context, builder, signature.args[0], args[0], args[2], 64, ir.FloatType()), align=4)
    last = builder.load(_lanes(context, builder, signature.args[1], args[1], args[2], 64, ir.FloatType()), align=4)
    return f, last


def _cuts32_codegen(n_cuts: int, aged: bool):
    """The body of the float32 cut intrinsics ``(F, L, off, th_1 .. th_n, t1[, old_age], out)`` over the 64
    lanes from ``off``: ``out[k]`` the lanes where ``F <= th_k * (t1 - L)`` in float32, and with ``aged``
    ``out[n]`` the lanes whose age ``t1 - L`` is at least ``old_age``."""

    def codegen(context, builder, signature, args):
        vt = ir.VectorType(ir.FloatType(), 64)
        f, last = _counts_units32(context, builder, signature, args)
        age = builder.fsub(_splat(builder, args[3 + n_cuts], vt, 64), last)
        masks = [builder.fcmp_ordered("<=", f, builder.fmul(_splat(builder, args[3 + k], vt, 64), age))
                 for k in range(n_cuts)]
        if aged:
            masks.append(builder.fcmp_ordered(">=", age, _splat(builder, args[4 + n_cuts], vt, 64)))
        data = context.make_array(signature.args[-1])(context, builder, args[-1]).data
        for q, c in enumerate(masks):
            builder.store(builder.bitcast(c, _I64), builder.gep(data, [ir.Constant(_I64, q)]))
        return context.get_dummy_value()

    return codegen


_F32 = types.float32


@intrinsic
def cut_masks32(typingctx, F, L, off, th0, th1, t1, old_age, out):
    """Two lfru cuts over 64 lanes: float32 counts and last units (integers below ``2**24``, so ``t1 - L`` is
    exact) and float32 cuts of at most 8 significant bits (:func:`dyadic8_down`, :func:`dyadic8_up`): ``out[0]`` (``out[1]``)
    the lanes where ``F <= th0 * (t1 - L)`` (``th1``), exact (the product has at most 24 significant bits) on
    every lane of ``out[2]``'s complement, the lanes whose age is below ``old_age`` (at most :data:`AGE32`); the
    caller decides the others."""
    return types.void(F, L, types.int64, _F32, _F32, _F32, _F32, out), _cuts32_codegen(2, True)


@intrinsic
def cut_mask1_32(typingctx, F, L, off, th, t1, old_age, out):
    """One cut of :func:`cut_masks32`: ``out[0]`` the lanes below it, ``out[1]`` those it does not decide."""
    return types.void(F, L, types.int64, _F32, _F32, _F32, out), _cuts32_codegen(1, True)


@intrinsic
def cut_masks32_young(typingctx, F, L, off, th0, th1, t1, out):
    """:func:`cut_masks32` without the age mask, for a caller that knows every lane younger than the bound."""
    return types.void(F, L, types.int64, _F32, _F32, _F32, out), _cuts32_codegen(2, False)


@intrinsic
def cut_mask1_32_young(typingctx, F, L, off, th, t1, out):
    """One cut of :func:`cut_masks32_young`: ``out[0]`` the lanes below it."""
    return types.void(F, L, types.int64, _F32, _F32, out), _cuts32_codegen(1, False)


def _fused_cut_word(builder, f, last, nth, c):
    """The word of the 64 lanes where ``f <= fma(nth, last, c)`` (``f``, ``last``: float32 vectors of 64 lanes;
    ``nth``, ``c``: float32 scalars), as ``_I64``."""
    vt = ir.VectorType(ir.FloatType(), 64)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), "llvm.fma.v64f32")
    x = builder.call(fma, [_splat(builder, nth, vt, 64), last, _splat(builder, c, vt, 64)])
    return builder.bitcast(builder.fcmp_ordered("<=", f, x), _I64)


def _cuts32_fma_codegen(n_cuts: int):
    """The body of the fused float32 cut intrinsics ``(F, L, off, nth_1, c_1 .. nth_n, c_n, out)`` over the 64 lanes
    from ``off``: ``out[k]`` the lanes where ``F <= fma(nth_k, L, c_k)``, one fused multiply-add and one compare
    per vector where :func:`_cuts32_codegen` takes a subtraction, a multiplication and a compare."""

    def codegen(context, builder, signature, args):
        f, last = _counts_units32(context, builder, signature, args)
        data = context.make_array(signature.args[-1])(context, builder, args[-1]).data
        for k in range(n_cuts):
            m = _fused_cut_word(builder, f, last, args[3 + 2 * k], args[4 + 2 * k])
            builder.store(m, builder.gep(data, [ir.Constant(_I64, k)]))
        return context.get_dummy_value()

    return codegen


@intrinsic
def cut_mask1_32_fma(typingctx, F, L, off, nth, c, out):
    """:func:`cut_mask1_32_young` as ``F <= fma(nth, L, c)`` with ``nth = -th`` and ``c = th * T`` (``T`` the unit
    past the event, ``L`` last units, both relative to a base unit): ``th * (T - L)`` exactly, with no rounding
    anywhere, where ``c`` is exact in float32 (``th`` of 8 significant bits, ``T < 2**16``) and the age
    ``T - L`` is below ``2**16``; a freed lane (``L`` ``inf``) gives ``-inf``, below no cut."""
    return types.void(F, L, types.int64, _F32, _F32, out), _cuts32_fma_codegen(1)


@intrinsic
def cut_masks32_fma(typingctx, F, L, off, nth0, c0, nth1, c1, out):
    """Two cuts of :func:`cut_mask1_32_fma`: ``out[0]`` (``out[1]``) the lanes below the first (second)."""
    return types.void(F, L, types.int64, _F32, _F32, _F32, _F32, out), _cuts32_fma_codegen(2)


@intrinsic
def _cut_list1_32_fma_vbmi2(typingctx, F, L, off, nth, c, out, q):
    sig = types.int64(F, L, types.int64, _F32, _F32, out, types.int64)

    def codegen(context, builder, signature, args):
        f, last = _counts_units32(context, builder, signature, args)
        m = _fused_cut_word(builder, f, last, args[3], args[4])
        data = context.make_array(signature.args[5])(context, builder, args[5]).data
        return _positions_vbmi2(builder, data, m, args[2], args[6])

    return sig, codegen


@intrinsic
def _cut_word1_32_fma(typingctx, F, L, off, nth, c):
    """:func:`cut_mask1_32_fma`'s mask returned as a word (no array)."""
    sig = types.uint64(F, L, types.int64, _F32, _F32)

    def codegen(context, builder, signature, args):
        f, last = _counts_units32(context, builder, signature, args)
        return _fused_cut_word(builder, f, last, args[3], args[4])

    return sig, codegen


@jit_helper
def _cut_list1_32_fma_any(F, L, off, nth, c, out, q):
    """The portable form of :data:`cut_list1_32_fma`: the mask as a word, then :data:`bit_positions`."""
    return bit_positions(_cut_word1_32_fma(F, L, off, nth, c), off, out, q)


@jit_helper
def _cut_list1_32_fma_any_dense(F, L, off, nth, c, out, q):
    """The portable form of :data:`cut_list1_32_fma_dense`: the mask as a word, then :data:`bit_positions_dense`."""
    return bit_positions_dense(_cut_word1_32_fma(F, L, off, nth, c), off, out, q)


@jit_helper
def dyadic8_down(x):
    """``x`` (``>= 0``) rounded down to 8 significant bits; 0 below ``2**-30`` (under every key of the float32
    loops, ``f / age >= 2**-24``)."""
    if x < 2.0 ** -30:
        return 0.0
    return u2f(f2u(x) & ~np.uint64((1 << 45) - 1))


@jit_helper
def dyadic8_up(x):
    """``x`` (``>= 0``, or ``inf``) rounded up to 8 significant bits (``inf`` stays ``inf``; a value above
    ``2**100``, above every key, becomes ``inf``)."""
    if x > 2.0 ** 100:
        return np.inf
    return u2f((f2u(x) + np.uint64((1 << 45) - 1)) & ~np.uint64((1 << 45) - 1))


@jit_helper
def dyadic8_mid(a, b):
    """A value of 8 significant bits strictly between ``a`` and ``b`` (``0 < a < b < inf``, both of 8 significant
    bits), about their geometric mean (the mean of their bit patterns, rounded down), or ``a`` where none lies between.

    >>> dyadic8_mid(1.0, 4.0), dyadic8_mid(1.0, 1.0078125)
    (2.0, 1.0)
    """
    x = u2f(((f2u(a) + f2u(b)) >> np.uint64(1)) & ~np.uint64((1 << 45) - 1))
    return x if a < x < b else a


@intrinsic
def f2u(typingctx, x):
    """The bits of a float64 as a uint64."""
    sig = types.uint64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _I64)

    return sig, codegen


@intrinsic
def u2f(typingctx, x):
    """The float64 whose bits are the uint64 ``x``."""
    sig = types.float64(types.uint64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _F64)

    return sig, codegen


@intrinsic
def _pdep_bmi2(typingctx, src, mask):
    sig = types.uint64(types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_I64, _I64]),
                                            "llvm.x86.bmi.pdep.64")
        return builder.call(fn, args)

    return sig, codegen


@jit_helper
def _pdep_loop(src, mask):
    """Parallel bit deposit: the low bits of ``src``, in order, into the set bits of ``mask``."""
    out = np.uint64(0)
    one = np.uint64(1)
    while mask:
        low = mask & (np.uint64(0) - mask)
        if src & one:
            out |= low
        src >>= one
        mask ^= low
    return out


def _has_feature(name: str) -> bool:
    """Whether numba compiles for a machine with the CPU feature ``name`` (the host, unless NUMBA_CPU_NAME says
    otherwise)."""
    if numba.config.CPU_NAME not in (None, "host"):
        return f"+{name}" in (numba.config.CPU_FEATURES or "")
    try:
        import llvmlite.binding as llvm

        return bool(llvm.get_host_cpu_features().get(name, False))
    except Exception:  # pragma: no cover - an llvmlite without the query: the portable loop
        return False


def _host_cpu_name() -> str:
    """The CPU numba compiles for: ``NUMBA_CPU_NAME`` where set, else LLVM's name of the host ("" if unknown)."""
    if numba.config.CPU_NAME not in (None, "host"):
        return str(numba.config.CPU_NAME)
    try:
        import llvmlite.binding as llvm

        return str(llvm.get_host_cpu_name())
    except Exception:  # pragma: no cover - an llvmlite without the query
        return ""


#: Whether a 16-lane AVX-512 gather beats 16 scalar loads: on the Intel core measured (the global lfru slots
#: loop's list split in 0.95 of its time), not on AMD's Zen 4 (0.97 with scalar loads; docs/performance.md,
#: *Session 30*).
FAST_GATHERS = _has_feature("avx512f") and not _host_cpu_name().startswith("znver")


#: Whether the machine has 512-bit vectors (AVX-512): a pass over 64 lanes of float32 takes four of them, where
#: AVX2 takes eight and more instructions to pack their masks. Where a vector pass competes with scalar work the
#: engine's thresholds depend on it (:data:`._kernels_lfru_slots.CAND_WORDS`,
#: :func:`._kernels_belady_lanes.lru_lanes_pay`, :func:`._kernels_belady_lanes.lfu_lanes_pay`).
WIDE_VECTORS = _has_feature("avx512f")


#: Whether the machine fuses a multiply and an add (with no FMA LLVM's ``fma`` is a slow library call).
HAS_FMA = _has_feature("fma") or _has_feature("neon") or _has_feature("sve")


#: ``pdep(src, mask)``: parallel bit deposit (BMI2's ``pdep`` where the machine has it).
pdep = _pdep_bmi2 if _has_feature("bmi2") else _pdep_loop


@jit_helper
def below_mask(a, b):
    """A word of all ones where ``a < b`` (two non-negative int64 below ``2**62``), else 0: the sign of their
    difference spread by an arithmetic shift. Taken in unsigned arithmetic, so that LLVM does not fold it into a
    compare and a select (a signed difference may not wrap, and ``(a - b) >> 63`` becomes ``a < b``): its x86
    pass that turns conditional moves in loops into branches made the per-layer lfu loop's radix selection
    branch on every plane, mispredicted."""
    return np.uint64(np.int64(np.uint64(a) - np.uint64(b)) >> np.int64(63))


def _compress_store(builder, data, q, x, vt, align, name, lanes_of):
    """The lanes of the word ``x``'s set bits, ``vt.count`` at a time (``lanes_of(c)``: the vector of chunk
    ``c``), compressed in a register (a store of the memory form is slow) and stored whole at ``data[q:]``
    (``align`` bytes), ``q`` advanced by each chunk's count; returns the last ``q``. AVX-512 (``name``: its
    compress intrinsic)."""
    n = vt.count
    it = ir.IntType(n)
    mt = ir.VectorType(ir.IntType(1), n)
    compress = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, mt]), name)
    ctpop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(it, [it]), f"llvm.ctpop.i{n}")
    for c in range(64 // n):
        mc = builder.trunc(builder.lshr(x, ir.Constant(_I64, n * c)), it)
        packed = builder.call(compress, [lanes_of(c), ir.Constant(vt, None), builder.bitcast(mc, mt)])
        builder.store(packed, builder.bitcast(builder.gep(data, [q]), vt.as_pointer()), align=align)
        q = builder.add(q, builder.zext(builder.call(ctpop, [mc]), _I64))
    return q


def _positions_intrinsic(body, doc: str | None = None):
    """An intrinsic ``(x, base, out, q) -> int64`` (the form of every :data:`bit_positions`) whose code is
    ``body(builder, data, x, base, q)`` (``data`` the int32 pointer of ``out``; returns the new ``q``); its
    docstring ``doc``, else the body's."""

    def positions(typingctx, x, base, out, q):
        sig = types.int64(types.uint64, types.int64, out, types.int64)

        def codegen(context, builder, signature, args):
            x, base, out, q = args
            return body(builder, context.make_array(signature.args[2])(context, builder, out).data, x, base, q)

        return sig, codegen

    positions.__doc__ = doc or body.__doc__
    return intrinsic(positions)


def _positions_avx512(builder, data, x, base, q):
    """Codegen of :func:`_bit_positions_avx512`: four 16-lane compresses of the lane numbers plus ``base``."""
    vt = ir.VectorType(_I32, 16)
    b = _splat(builder, builder.trunc(base, _I32), vt, 16)
    return _compress_store(builder, data, q, x, vt, 4, "llvm.x86.avx512.mask.compress.v16i32",
                           lambda c: builder.add(ir.Constant(vt, list(range(16 * c, 16 * c + 16))), b))


_bit_positions_avx512 = _positions_intrinsic(_positions_avx512)


def _packed_lanes(builder, x, first=0):
    """The lane numbers ``first + i`` of the set bits ``i`` of the word ``x`` (``_I64``), in order, in the low bytes
    of a ``<64 x i8>`` (the rest 0): one AVX-512 VBMI2 byte compress."""
    bt = ir.VectorType(ir.IntType(8), 64)
    compress = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(bt, [bt, bt, ir.VectorType(ir.IntType(1), 64)]),
        "llvm.x86.avx512.mask.compress.v64i8")
    return builder.call(compress, [ir.Constant(bt, list(range(first, first + 64))), ir.Constant(bt, None),
                                   builder.bitcast(x, ir.VectorType(ir.IntType(1), 64))])


def _positions_vbmi2(builder, data, x, base, q):
    """``base + i`` for every set bit ``i`` of the word ``x`` (``_I64``), stored as int32 at ``data[q:]`` (16 lanes
    at a time, whole); returns ``q`` plus their count. AVX-512 VBMI2: one byte compress of the lane numbers."""
    vt = ir.VectorType(_I32, 16)
    ctpop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_I64]), "llvm.ctpop.i64")
    packed = _packed_lanes(builder, x)
    b = _splat(builder, builder.trunc(base, _I32), vt, 16)
    n = builder.call(ctpop, [x])

    def chunk(c):                      # bytes 16 c .. 16 c + 15 of the packed positions, widened, stored whole
        lanes = builder.shuffle_vector(packed, packed, ir.Constant(ir.VectorType(_I32, 16),
                                                                   list(range(16 * c, 16 * c + 16))))
        v = builder.add(builder.zext(lanes, vt), b)
        ptr = builder.gep(data, [builder.add(q, ir.Constant(_I64, 16 * c))])
        builder.store(v, builder.bitcast(ptr, vt.as_pointer()), align=4)

    chunk(0)
    with cgutils.if_unlikely(builder, builder.icmp_unsigned(">", n, ir.Constant(_I64, 16))):
        for c in (1, 2, 3):            # more than 16 bits: the rest (rare where the words are sparse)
            chunk(c)
    return builder.add(q, n)


_bit_positions_vbmi2 = _positions_intrinsic(_positions_vbmi2)


@jit_helper
def _bit_positions_loop(x, base, out, q):
    """``base + i`` for every set bit ``i`` of ``x``, ascending, into ``out[q:]``; returns ``q`` plus their count."""
    one = np.uint64(1)
    while x:
        out[q] = base + np.int64(_cttz(x))
        x &= x - one
        q += 1
    return q


def _byte_positions() -> np.ndarray:
    """``[256 * 8]`` uint8: row ``b`` the positions of the set bits of the byte ``b``, ascending, then zeros."""
    rows = np.zeros((256, 8), dtype=np.uint8)
    for b in range(256):
        pos = [i for i in range(8) if b >> i & 1]
        rows[b, :len(pos)] = pos
    return rows.ravel()


#: The positions of each byte's set bits (:func:`_byte_positions`), a constant of :func:`_bit_positions_bytes`.
_BYTE_POSITIONS = _byte_positions()


def _positions_bytes(builder, data, x, base, q):
    """Codegen of :func:`_bit_positions_bytes`, :func:`_bit_positions_loop` with no branch on the data: each of the
    word's eight bytes writes the eight positions of its row of :data:`_BYTE_POSITIONS` (plus ``base``; one widening
    load, an add and a store of eight int32 lanes) from ``out[q]`` and moves ``q`` on by its count (``out`` must hold
    ``q + 64`` elements). For machines without AVX-512: a loop over the bits ends at a count that depends on the
    data, and a branch predictor misses that exit about once a word."""
    i8 = ir.IntType(8)
    name = "expertcache_byte_positions"
    table = builder.module.globals.get(name)
    if table is None:
        table = cgutils.global_constant(builder.module, name,
                                        ir.Constant(ir.ArrayType(i8, 2048), bytearray(_BYTE_POSITIONS.tobytes())))
    v8 = ir.VectorType(_I32, 8)
    ctpop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_I64]), "llvm.ctpop.i64")
    row = builder.bitcast(table, i8.as_pointer())
    b = _splat(builder, builder.trunc(base, _I32), v8, 8)
    for c in range(8):
        byte = builder.and_(builder.lshr(x, ir.Constant(_I64, 8 * c)), ir.Constant(_I64, 255))
        ptr = builder.bitcast(builder.gep(row, [builder.shl(byte, ir.Constant(_I64, 3))]),
                              ir.VectorType(i8, 8).as_pointer())
        pos = builder.zext(builder.load(ptr, align=1), v8)
        lanes = builder.add(pos, builder.add(b, ir.Constant(v8, [8 * c] * 8)))
        builder.store(lanes, builder.bitcast(builder.gep(data, [q]), v8.as_pointer()), align=4)
        q = builder.add(q, builder.call(ctpop, [byte]))
    return q


_bit_positions_bytes = _positions_intrinsic(_positions_bytes)


#: A word of at most this many set bits is listed by :func:`_bit_positions_few`'s unrolled lowest-bit steps.
FEW_BITS = 4


def _few_positions(few: int):
    """:func:`_bit_positions_bytes` for words of at most ``few`` set bits (an intrinsic): such a word writes ``few``
    positions, each the lowest set bit of what is left (``cttz``, then the bit cleared; past the last, 63 plus
    ``base``, beyond the returned count), where the byte table writes eight rows whatever the word; a denser word
    takes the table. The branch is on the count, taken the same way while the words hold at most ``few``."""

    def body(builder, data, x, base, q):
        ctpop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_I64]), "llvm.ctpop.i64")
        n = builder.call(ctpop, [x])
        with builder.if_else(builder.icmp_unsigned("<=", n, ir.Constant(_I64, few)), likely=True) as (then, other):
            with then:
                y = x
                b32 = builder.trunc(base, _I32)
                top = ir.Constant(_I64, 1 << 63)
                for k in range(few):
                    t = builder.cttz(builder.or_(y, top), ir.Constant(ir.IntType(1), 0))
                    builder.store(builder.add(b32, builder.trunc(t, _I32)),
                                  builder.gep(data, [builder.add(q, ir.Constant(_I64, k))]))
                    y = builder.and_(y, builder.sub(y, ir.Constant(_I64, 1)))
            with other:
                _positions_bytes(builder, data, x, base, q)
        return builder.add(q, n)

    return _positions_intrinsic(body, _few_positions.__doc__)


#: :func:`_few_positions` for words of at most :data:`FEW_BITS` set bits, mostly sparse ones (the slots loops' cuts).
_bit_positions_few = _few_positions(FEW_BITS)
#: A word of at most this many set bits is listed by :func:`_bit_positions_few8`'s unrolled lowest-bit steps.
MANY_BITS = 8
#: :func:`_few_positions` for words of at most :data:`MANY_BITS` set bits: words of about three to eight set bits,
#: where :func:`_bit_positions_few`'s branch on its four goes either way (the sequential global lfru candidates'
#: pass at rho 0.1, about five a word).
_bit_positions_few8 = _few_positions(MANY_BITS)


#: ``bit_positions(x, base, out, q)``: ``base + i`` for every set bit ``i`` of the word ``x``, ascending, written
#: as int32 to ``out[q:]``; returns ``q`` plus their count. With AVX-512 it is branch-free (four 16-lane
#: compresses, each stored whole: ``out`` must hold ``q + 64`` elements), so a loop over the set bits of many
#: words costs no mispredicted loop exit per word; elsewhere from a table of each byte's positions (no branch on
#: the data; the global lfru and lrfu slots loops in 0.73-0.95 of the time of a loop over the bits on an AVX2 core,
#: docs/performance.md, *Session 50*), a word of at most :data:`FEW_BITS` set bits by unrolled steps instead
#: (:func:`_bit_positions_few`: the lists of the slots loops' cuts are sparse; with the candidates' threshold of that
#: session, global lfru in 0.78-0.97 of its time at rho 0.15-0.3, unchanged at 0.1 and 0.4-0.5: *Session 52*).
bit_positions = (_bit_positions_vbmi2 if _has_feature("avx512vbmi2") else
                 _bit_positions_avx512 if _has_feature("avx512f") else _bit_positions_few)
#: :data:`bit_positions` for lists of many set bits a word (the global lfru slots loop's candidates): the byte table
#: alone where there is no AVX-512, so that no branch on the count is taken for such words.
bit_positions_dense = bit_positions if WIDE_VECTORS else _bit_positions_bytes
#: :data:`bit_positions` for words of about three to eight set bits: :func:`_bit_positions_few8` where there is no
#: AVX-512 (sequential global lfru at rho 0.1 in 0.90-0.97 of its time, four runs: docs/performance.md,
#: *Session 58*).
bit_positions_some = (_bit_positions_vbmi2 if _has_feature("avx512vbmi2") else
                      _bit_positions_avx512 if _has_feature("avx512f") else _bit_positions_few8)


def _f32_arrays(*tys) -> bool:
    """Whether every numba type is a float32 array (the lrfu intrinsics' values and bounds; another dtype is a
    typing error rather than lanes read at the wrong width)."""
    return all(isinstance(t, types.Array) and t.dtype == types.float32 for t in tys)


def _lrfu_cuts_codegen(k: int):
    """The body of :func:`lrfu_cut1` (``k = 1``) and :func:`lrfu_cut2` (``k = 2``): float32 values and bounds,
    16 lanes to a 512-bit compare (float64 took 8: twice the compares and mask merges, 1.10x the loop's time)."""

    def codegen(context, builder, signature, args):
        n = 64
        f32 = ir.FloatType()
        vt = ir.VectorType(f32, n)
        x = builder.load(_lanes(context, builder, signature.args[0], args[0], args[1], n, f32), align=4)
        thd = context.make_array(signature.args[2])(context, builder, args[2]).data
        data = context.make_array(signature.args[3])(context, builder, args[3]).data
        for i in range(k):
            q2 = builder.add(args[4 + i], args[4 + i])
            for r in range(2):
                t = builder.load(builder.gep(thd, [builder.add(q2, ir.Constant(_I64, r))]))
                c = builder.fcmp_ordered("<=", x, _splat(builder, t, vt, n))
                builder.store(builder.bitcast(c, _I64), builder.gep(data, [ir.Constant(_I64, 2 * i + r)]))
        return context.get_dummy_value()

    return codegen


@intrinsic
def lrfu_cut1(typingctx, V, off, bounds, out, q):
    """For the 64 float32 values ``V[off:off+64]``: ``out[0]`` the lanes at most ``bounds[2q]`` (a cut's sure
    bound), ``out[1]`` those at most ``bounds[2q + 1]`` (its maybe bound); ``bounds`` float32."""
    if not _f32_arrays(V, bounds):
        return None
    sig = types.void(V, types.int64, bounds, out, types.int64)
    return sig, _lrfu_cuts_codegen(1)


@intrinsic
def lrfu_cut2(typingctx, V, off, bounds, out, qa, qb):
    """:func:`lrfu_cut1` for two cuts in one pass: ``out[0]`` / ``out[1]`` for cut ``qa``, ``out[2]`` /
    ``out[3]`` for cut ``qb``."""
    if not _f32_arrays(V, bounds):
        return None
    sig = types.void(V, types.int64, bounds, out, types.int64, types.int64)
    return sig, _lrfu_cuts_codegen(2)


def compare_word(builder, op: str, x, y, movmsk: bool | None = None):
    """The lanes where ``x op y`` (two ``<n x T>`` vectors, ``n`` at most 64; ``T`` int32 or int64, compared signed,
    or float32 or float64, ordered) as the low bits of a uint64. Where ``movmsk`` (by default :data:`_CMP_MOVMSK`:
    x86 with AVX2, no AVX-512) per 256-bit chunk one compare and one sign-bit mask (``vmovmskps`` for 32-bit lanes,
    ``vmovmskpd`` for 64-bit ones), shifted into place (``n`` a multiple of the chunk's lanes); else one compare
    and a bitcast. Without AVX-512, LLVM lowered the bitcast of such a compare (where a vector reduction gave the
    splat: the Belady lanes loop) a byte at a time, about a hundred ``vpextrb`` / ``vpinsrb`` a word, and packed a
    64-lane float compare with long chains of ``vpackssdw`` (the sequential global lfru candidates' pass)."""
    et = x.type.element
    n = x.type.count
    fp = isinstance(et, (ir.FloatType, ir.DoubleType))

    def cmp(a, b):
        return builder.fcmp_ordered(op, a, b) if fp else builder.icmp_signed(op, a, b)

    if not (_CMP_MOVMSK if movmsk is None else movmsk):
        bits = builder.bitcast(cmp(x, y), ir.IntType(n))
        return builder.zext(bits, _I64) if n < 64 else bits
    width = 32 if isinstance(et, ir.FloatType) or (not fp and et.width == 32) else 64
    per = 256 // width
    ft = ir.FloatType() if width == 32 else _F64
    name = "llvm.x86.avx.movmsk.ps.256" if width == 32 else "llvm.x86.avx.movmsk.pd.256"
    movmsk_fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [ir.VectorType(ft, per)]), name)
    word = ir.Constant(_I64, 0)
    for q in range(n // per):
        idx = ir.Constant(ir.VectorType(_I32, per), list(range(q * per, (q + 1) * per)))
        c = builder.sext(cmp(builder.shuffle_vector(x, x, idx), builder.shuffle_vector(y, y, idx)),
                         ir.VectorType(ir.IntType(width), per))
        bits = builder.zext(builder.call(movmsk_fn, [builder.bitcast(c, ir.VectorType(ft, per))]), _I64)
        word = builder.or_(word, builder.shl(bits, ir.Constant(_I64, q * per)))
    return word


def _chunks(builder, x, p):
    """The lanes of vector ``x`` as consecutive vectors of ``p`` lanes (``p`` divides their number)."""
    n = x.type.count
    if p == n:
        return [x]
    return [builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_I32, p), list(range(j, j + p))))
            for j in range(0, n, p)]


def _lowest(builder, x, ix=None):
    """The lowest lane of the float vector ``x`` and, where ``ix`` (an ``i32`` vector beside it) is given, its lane
    of ``ix`` (else ``None``): the chunks of the largest power of two that divides the lane count reduced lane by
    lane as a tree, then halved; each step keeps the lower of two lanes (and its ``ix``)."""
    p = x.type.count & -x.type.count
    xs = _chunks(builder, x, p)
    chunks = list(zip(xs, _chunks(builder, ix, p) if ix is not None else [None] * len(xs), strict=True))

    def lower(a, b):
        lt = builder.fcmp_ordered("<", b[0], a[0])
        return builder.select(lt, b[0], a[0]), None if a[1] is None else builder.select(lt, b[1], a[1])

    while len(chunks) > 1:
        out = [lower(chunks[q], chunks[q + 1]) for q in range(0, len(chunks) - 1, 2)]
        chunks = out + chunks[len(out) * 2:]
    x, ix = chunks[0]
    h = x.type.count
    while h > 1:
        h //= 2
        halves = [ir.Constant(ir.VectorType(_I32, h), list(range(k, k + h))) for k in (0, h)]
        a, b = ((builder.shuffle_vector(x, x, m), None if ix is None else builder.shuffle_vector(ix, ix, m))
                for m in halves)
        x, ix = lower(a, b)
    zero = ir.Constant(_I32, 0)
    return builder.extract_element(x, zero), None if ix is None else builder.extract_element(ix, zero)


def lowest_lane(builder, x):
    """The lowest of the lanes of the float vector ``x``, halved in registers (:func:`_lowest`: where the lanes are
    not a power of two, their chunks first; halving 40 lanes would leave one lane of five out at the third step)."""
    return _lowest(builder, x)[0]


def lowest_lane_at(builder, x):
    """:func:`lowest_lane` and a lane that holds it (an ``i32``; of equal lowest lanes, any): each step keeps the
    lower of two lanes and its lane number, so the number is known when the value is."""
    return _lowest(builder, x, ir.Constant(ir.VectorType(_I32, x.type.count), list(range(x.type.count))))


#: Whether :func:`compare_word` (:data:`lanes_eq`, :data:`lanes_ge`) builds its words by sign-bit masks (x86 with
#: AVX2, no AVX-512: per-layer Belady on the lanes in 0.46-0.50 of its time on a Zen 3 core, docs/performance.md,
#: *Session 51*).
_CMP_MOVMSK = _has_feature("avx2") and not WIDE_VECTORS


def _make_lanes_cmp(op: str, movmsk: bool = _CMP_MOVMSK):
    """:data:`lanes_eq` (``op`` ``"=="``) or :data:`lanes_ge` (``">="``): bit ``q`` set where ``buf[off + q] op v``
    for the 64 integer lanes from ``off`` (int64 or int32; ``v`` compared at the lanes' width); the word by
    :func:`compare_word`, by sign-bit masks where ``movmsk`` (x86 with AVX only), else by a bitcast of the compare."""

    @intrinsic
    def _cmp(typingctx, buf, off, v):
        sig = types.uint64(buf, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            it = ir.IntType(signature.args[0].dtype.bitwidth)
            x = builder.load(_lanes(context, builder, signature.args[0], args[0], args[1], 64, it),
                             align=it.width // 8)
            v = args[2] if it.width == 64 else builder.trunc(args[2], it)
            return compare_word(builder, op, x, _splat(builder, v, ir.VectorType(it, 64), 64), movmsk)

        return sig, codegen

    return _cmp


#: ``lanes_eq(buf, off, v)``: bit ``q`` set where ``buf[off + q] == v`` for the 64 integer lanes from ``off`` (int64
#: or int32): one vector compare where a loop setting one bit per matching lane would chain read-modify-writes of a
#: word through memory.
lanes_eq = _make_lanes_cmp("==")
#: ``lanes_ge(buf, off, v)``: bit ``q`` set where ``buf[off + q] >= v`` (signed; the per-layer Belady loop's cut at a
#: next use).
lanes_ge = _make_lanes_cmp(">=")



def _make_lanes_reduce(op: str, n: int):
    """:data:`lanes_max128` (``op`` ``"smax"``) or :data:`lanes_min128` (``"smin"``), over ``n`` lanes (16, 64 or
    128; below 128 the lanes of ``x0``'s low ``n`` bits, ``x1`` unread)."""
    fill = -(2**31) if op == "smax" else 2**31 - 1

    @intrinsic
    def _reduce(typingctx, buf, off, x0, x1):
        if getattr(buf, "dtype", None) != types.int32:
            return None
        sig = types.int64(buf, types.int64, types.uint64, types.uint64)

        def codegen(context, builder, signature, args):
            vt = ir.VectorType(_I32, n)
            v = builder.load(_lanes(context, builder, signature.args[0], args[0], args[1], n, _I32), align=4)
            if n == 128:
                i128 = ir.IntType(128)
                x = builder.or_(builder.zext(args[2], i128),
                                builder.shl(builder.zext(args[3], i128), ir.Constant(i128, 64)))
            else:
                x = builder.trunc(args[2], ir.IntType(n)) if n < 64 else args[2]
            live = builder.select(builder.bitcast(x, ir.VectorType(ir.IntType(1), n)), v, ir.Constant(vt, [fill] * n))
            red = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [vt]),
                                                 f"llvm.vector.reduce.{op}.v{n}i32")
            return builder.sext(builder.call(red, [live]), _I64)

        return sig, codegen

    return _reduce


#: ``lanes_max128(buf, off, x0, x1)``: the largest of the int32 lanes ``buf[off:off+128]`` whose bits are set in the
#: words ``x0`` (lanes ``off`` to ``off + 63``) and ``x1`` (the next 64), as int64; ``-2**31`` where none is.
#: One vector reduction of every live lane (the per-layer Belady loop's farthest next use).
lanes_max128 = _make_lanes_reduce("smax", 128)
#: ``lanes_min128(buf, off, x0, x1)``: the smallest, as :data:`lanes_max128` the largest; ``2**31 - 1`` where none is.
lanes_min128 = _make_lanes_reduce("smin", 128)
#: :data:`lanes_max128` over 64 lanes (``x0``'s; ``x1`` unread).
lanes_max64 = _make_lanes_reduce("smax", 64)
#: :data:`lanes_min128` over 64 lanes.
lanes_min64 = _make_lanes_reduce("smin", 64)
#: :data:`lanes_max128` over 16 lanes (``x0``'s low 16 bits).
lanes_max16 = _make_lanes_reduce("smax", 16)
#: :data:`lanes_min128` over 16 lanes.
lanes_min16 = _make_lanes_reduce("smin", 16)

def _make_values_at(elt, n: int, name: str):
    """The AVX-512 body of :data:`values_at` (``elt`` float64, ``n`` 8) and :data:`values_at32` (float32, 16):
    the 64 lanes as ``64 / n`` compresses (``name``), each stored whole."""

    @intrinsic
    def _values_at(typingctx, V, off, x, out, q):
        sig = types.int64(V, types.int64, types.uint64, out, types.int64)

        def codegen(context, builder, signature, args):
            V, off, x, out, q = args
            data = context.make_array(signature.args[3])(context, builder, out).data
            align = 8 if elt == _F64 else 4

            def lanes_of(c):
                return builder.load(_lanes(context, builder, signature.args[0], V,
                                           builder.add(off, ir.Constant(_I64, n * c)), n, elt), align=align)

            return _compress_store(builder, data, q, x, ir.VectorType(elt, n), align, name, lanes_of)

        return sig, codegen

    return _values_at


_values_at_avx512 = _make_values_at(_F64, 8, "llvm.x86.avx512.mask.compress.v8f64")
_values_at32_avx512 = _make_values_at(ir.FloatType(), 16, "llvm.x86.avx512.mask.compress.v16f32")


@jit_helper
def _values_at_loop(V, off, x, out, q):
    """``V[off + i]`` for every set bit ``i`` of ``x``, ascending, into ``out[q:]``; returns ``q`` plus their count."""
    one = np.uint64(1)
    while x:
        out[q] = V[off + np.int64(_cttz(x))]
        x &= x - one
        q += 1
    return q


@intrinsic
def _split_low16_avx512(typingctx, src, r0, n, SF, SL, l32, t32, lv, c0, bpos, bb):
    sig = types.uint64(src, types.int64, types.int64, SF, SL, types.float32, types.float32, lv, types.int64, bpos,
                       types.int64)

    def codegen(context, builder, signature, args):
        src, r0, n, SF, SL, l32, t32, lv, c0, bpos, bb = args
        v16 = ir.VectorType(_I32, 16)
        f16 = ir.VectorType(ir.FloatType(), 16)
        m16 = ir.VectorType(ir.IntType(1), 16)
        i8p = ir.IntType(8).as_pointer()
        idx = builder.load(_lanes(context, builder, signature.args[0], src, r0, 16, _I32), align=4)
        live = builder.icmp_signed("<", ir.Constant(v16, list(range(16))),
                                   _splat(builder, builder.trunc(builder.sub(n, r0), _I32), v16, 16))
        gather = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f16, [f16, i8p, v16, m16, _I32]),
                                                "llvm.x86.avx512.mask.gather.dps.512")

        def lanes_of(k):
            data = context.make_array(signature.args[k])(context, builder, args[k]).data
            return builder.call(gather, [ir.Constant(f16, None), builder.bitcast(data, i8p), idx, live,
                                         ir.Constant(_I32, 4)])

        f = lanes_of(3)
        last = lanes_of(4)
        prod = builder.fmul(_splat(builder, l32, f16, 16), builder.fsub(_splat(builder, t32, f16, 16), last))
        low = builder.and_(builder.fcmp_ordered("<=", f, prod), live)
        rest = builder.and_(builder.not_(low), live)
        compress = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16, v16, m16]),
                                                  "llvm.x86.avx512.mask.compress.v16i32")
        lvd = context.make_array(signature.args[7])(context, builder, lv).data
        builder.store(builder.call(compress, [idx, ir.Constant(v16, None), low]),
                      builder.bitcast(builder.gep(lvd, [c0]), v16.as_pointer()), align=4)
        bpd = context.make_array(signature.args[9])(context, builder, bpos).data
        wide = builder.sext(builder.call(compress, [idx, ir.Constant(v16, None), rest]), ir.VectorType(_I64, 16))
        builder.store(wide, builder.bitcast(builder.gep(bpd, [bb]), ir.VectorType(_I64, 16).as_pointer()), align=8)
        return builder.zext(builder.bitcast(low, ir.IntType(16)), _I64)

    return sig, codegen


@jit_helper
def _split_low16_loop(src, r0, n, SF, SL, l32, t32, lv, c0, bpos, bb):
    """The loop form of :data:`split_low16`."""
    m = np.uint64(0)
    for j in range(min(16, n - r0)):
        s = np.int64(src[r0 + j])
        if SF[s] <= l32 * (t32 - SL[s]):
            lv[c0] = np.int32(s)
            c0 += 1
            m |= np.uint64(1) << np.uint64(j)
        else:
            bpos[bb] = s
            bb += 1
    return m


#: ``split_low16(src, r0, n, SF, SL, l32, t32, lv, c0, bpos, bb)``: the slots ``src[r0:min(r0 + 16, n)]`` (int32)
#: split by ``SF[s] <= l32 * (t32 - SL[s])`` in float32 (the global slots loop's low cut on its list): those at
#: or below it to ``lv[c0:]`` (int32), the others to ``bpos[bb:]`` (int64), each in order; returns the chunk's
#: lanes at or below as bits. With AVX-512 two gathers, a compare and two compresses, each stored whole (``lv`` and
#: ``bpos`` must hold 16 past ``c0`` and ``bb``; ``src`` may be ``lv`` itself where ``c0 <= r0``); elsewhere a loop.
split_low16 = _split_low16_avx512 if _has_feature("avx512f") else _split_low16_loop


#: ``values_at(V, off, x, out, q)``: ``V[off + i]`` for every set bit ``i`` of ``x``, ascending, into ``out[q:]``;
#: returns ``q`` plus their count. With AVX-512 it is branch-free (eight 8-lane compresses, each stored whole:
#: ``out`` must hold ``q + 64`` elements), elsewhere a loop over the bits.
values_at = _values_at_avx512 if _has_feature("avx512f") else _values_at_loop

#: ``values_at32(V, off, x, out, q)``: :data:`values_at` for float32 values (four 16-lane compresses with
#: AVX-512; ``out`` must hold ``q + 64`` elements).
values_at32 = _values_at32_avx512 if _has_feature("avx512f") else _values_at_loop


#: ``cut_list1_32_fma(F, L, off, nth, c, out, q)``: the lanes of :func:`cut_mask1_32_fma` (``off .. off+63`` where
#: ``F <= fma(nth, L, c)``) listed as :data:`bit_positions` lists them, into ``out[q:]``; returns ``q`` plus their
#: count. With AVX-512 VBMI2 in one pass (the mask never leaves its register); elsewhere the two calls.
cut_list1_32_fma = _cut_list1_32_fma_vbmi2 if _has_feature("avx512vbmi2") else _cut_list1_32_fma_any
#: :data:`cut_list1_32_fma` for lists of many lanes a word (listed by :data:`bit_positions_dense`).
cut_list1_32_fma_dense = _cut_list1_32_fma_vbmi2 if _has_feature("avx512vbmi2") else _cut_list1_32_fma_any_dense


#: Whether the machine has AVX-512 BITALG (``vpshufbitqmb``): :data:`tie_bits1` / :data:`tie_bits2` in two
#: instructions a word.
HAS_BITALG = _has_feature("avx512bitalg") and _has_feature("avx512bw")


def _tie_bits_codegen(n_words: int):
    """The body of :data:`tie_bits1` / :data:`tie_bits2`: each tie position's bit picked from the expert-space words by
    the expert at that position (``vpshufbitqmb`` takes, for each byte, the bit it names of the 64-bit lane it sits
    in), from ``e0`` where that expert is below 64, else from ``e1``."""

    def codegen(context, builder, signature, args):
        e0, e1, order, off, ev = args
        b64 = ir.VectorType(ir.IntType(8), 64)
        m64 = ir.VectorType(ir.IntType(1), 64)
        shuf = cgutils.get_or_insert_function(builder.module, ir.FunctionType(m64, [b64, b64]),
                                              "llvm.x86.avx512.vpshufbitqmb.512")
        v8 = ir.VectorType(_I64, 8)
        lo = builder.bitcast(_splat(builder, e0, v8, 8), b64)
        hi = builder.bitcast(_splat(builder, e1, v8, 8), b64)
        data = context.make_array(signature.args[4])(context, builder, ev).data
        for w in range(n_words):
            t = builder.load(_lanes(context, builder, signature.args[2], order,
                                    builder.add(off, ir.Constant(_I64, 64 * w)), 64, ir.IntType(8)), align=1)
            upper = builder.icmp_unsigned(">=", t, ir.Constant(b64, [64] * 64))
            bits = builder.select(upper, builder.call(shuf, [hi, t]), builder.call(shuf, [lo, t]))
            builder.store(builder.bitcast(bits, _I64), builder.gep(data, [ir.Constant(_I64, w)]))
        return context.get_dummy_value()

    return codegen


def _make_tie_bits(n_words: int):
    @intrinsic
    def _tie_bits(typingctx, e0, e1, order, off, ev):
        return types.void(types.uint64, types.uint64, order, types.int64, ev), _tie_bits_codegen(n_words)

    return _tie_bits


#: ``tie_bits1(e0, e1, order, off, ev)`` / ``tie_bits2``: a unit's bitset over tie positions (one word / two) into
#: ``ev``, from its bitset over experts (``e0``: experts 0-63, ``e1``: 64-127), ``order[off + t]`` the expert at tie
#: position ``t`` (uint8, 127 at a position past the layer's experts: that bit is never set). AVX-512 BITALG
#: only (:data:`HAS_BITALG`): the bitset loops' unit bits without a gather of tie positions.
tie_bits1, tie_bits2 = _make_tie_bits(1), _make_tie_bits(2)


def _band16_codegen(n_words: int, n_arrays: int = 2):
    """The body of :data:`band16_1` / :data:`band16_2` (``n_arrays`` 2: arguments ``A, B, off, xa, xb, outA,
    outB``) and :data:`band16v_1` / :data:`band16v_2` (1: ``A, off, xa, xb, outA``): the band's lane numbers by a
    byte compress of each word (the second word's after the first's count by a byte permute), widened to 16 int32
    indices; then, for each array, the values looked up in the word's float32 lanes held in registers (two-source
    permutes of 32 lanes, selects on the index's bits 5 and 6) and stored whole, once."""

    def codegen(context, builder, signature, args):
        off, xa, xb = args[n_arrays:n_arrays + 3]
        f32 = ir.FloatType()
        b64 = ir.VectorType(ir.IntType(8), 64)
        v16i = ir.VectorType(_I32, 16)
        v16f = ir.VectorType(f32, 16)
        permb = cgutils.get_or_insert_function(builder.module, ir.FunctionType(b64, [b64, b64, b64]),
                                               "llvm.x86.avx512.vpermi2var.qi.512")
        permps = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16f, [v16f, v16i, v16f]),
                                                "llvm.x86.avx512.vpermi2var.ps.512")
        ctpop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_I64]), "llvm.ctpop.i64")
        iota = ir.Constant(b64, list(range(64)))
        idx = _packed_lanes(builder, xa)
        if n_words == 2:               # the second word's lane numbers (64 + i) after the first word's count
            pb = _packed_lanes(builder, xb, 64)
            ca = _splat(builder, builder.trunc(builder.call(ctpop, [xa]), ir.IntType(8)), b64, 64)
            sel = builder.select(builder.icmp_unsigned("<", iota, ca), iota,
                                 builder.add(builder.sub(iota, ca), ir.Constant(b64, [64] * 64)))
            idx = builder.call(permb, [idx, sel, pb])
        i16 = builder.zext(builder.shuffle_vector(idx, idx, ir.Constant(v16i, list(range(16)))), v16i)

        def bit(b):
            return builder.icmp_unsigned("!=", builder.and_(i16, ir.Constant(v16i, [b] * 16)),
                                         ir.Constant(v16i, None))

        b5, b6 = bit(32), bit(64)
        for k in range(n_arrays):
            lanes = [builder.load(_lanes(context, builder, signature.args[k], args[k],
                                         builder.add(off, ir.Constant(_I64, 16 * c)), 16, f32), align=4)
                     for c in range(4 * n_words)]
            r = [builder.call(permps, [lanes[2 * c], i16, lanes[2 * c + 1]]) for c in range(2 * n_words)]
            s = [builder.select(b5, r[2 * c + 1], r[2 * c]) for c in range(n_words)]
            res = builder.select(b6, s[1], s[0]) if n_words == 2 else s[0]
            o = n_arrays + 3 + k
            builder.store(res, _lanes(context, builder, signature.args[o], args[o], ir.Constant(_I64, 0), 16, f32),
                          align=4)
        return context.get_dummy_value()

    return codegen


def _make_band16(n_words: int):
    @intrinsic
    def _band16(typingctx, A, B, off, xa, xb, outA, outB):
        if not _f32_arrays(A, B, outA, outB):
            return None
        return (types.void(A, B, types.int64, types.uint64, types.uint64, outA, outB),
                _band16_codegen(n_words))

    return _band16


def _make_band16v(n_words: int):
    @intrinsic
    def _band16v(typingctx, A, off, xa, xb, outA):
        if not _f32_arrays(A, outA):
            return None
        return types.void(A, types.int64, types.uint64, types.uint64, outA), _band16_codegen(n_words, 1)

    return _band16v


@jit_helper
def _band16v_1_loop(A, off, xa, xb, outA):
    values_at32(A, off, xa, outA, 0)


@jit_helper
def _band16v_2_loop(A, off, xa, xb, outA):
    q = values_at32(A, off, xa, outA, 0)
    values_at32(A, off + 64, xb, outA, q)


#: The top bit of a word: ``cttz(x | _TOP)`` is ``x``'s lowest set bit, 63 where ``x`` is 0 (no poison).
_TOP = np.uint64(1) << np.uint64(63)


@jit_helper
def _band16_fixed(A, B, off, xa, xb, outA, outB, two):
    """:data:`band16_2` (``two``; :data:`band16_1` with ``xb`` 0) on machines without AVX-512: sixteen steps,
    each the lowest set bit of ``xa``, else of ``xb`` (lane ``off + 64 + i``), with no branch. A loop over the
    bits (:func:`_values_at_loop`) ends at a count that depends on the data, and a branch predictor misses that
    exit, once a word and array: with AVX2 the two loops took 20% of the per-layer lfru loop's samples
    (docs/performance.md, *Session 50*). Steps past the band read lanes within the layer's words (a word with no
    bit left gives 63) and write ``out[:16]``, which holds them."""
    one = np.uint64(1)
    for k in range(16):
        rest = np.uint64(0) - np.uint64(xa == 0)           # all ones once xa has no bit left
        x = xa | (xb & rest)
        j = _U(off + np.int64(_cttz(x | _TOP)) + np.int64(rest & np.uint64(64 if two else 0)))
        outA[k] = A[j]
        outB[k] = B[j]
        xa &= xa - one
        xb &= xb - (rest & one)


@jit_helper
def _band16_1_fixed(A, B, off, xa, xb, outA, outB):
    _band16_fixed(A, B, off, xa, np.uint64(0), outA, outB, False)


@jit_helper
def _band16_2_fixed(A, B, off, xa, xb, outA, outB):
    _band16_fixed(A, B, off, xa, xb, outA, outB, True)


@jit_helper
def _band16_1_loop(A, B, off, xa, xb, outA, outB):
    _band16v_1_loop(A, off, xa, xb, outA)
    _band16v_1_loop(B, off, xa, xb, outB)


@jit_helper
def _band16_2_loop(A, B, off, xa, xb, outA, outB):
    _band16v_2_loop(A, off, xa, xb, outA)
    _band16v_2_loop(B, off, xa, xb, outB)


#: Whether the machine has AVX-512 VBMI and VBMI2 (byte permutes and compresses).
HAS_VBMI2 = _has_feature("avx512vbmi") and _has_feature("avx512vbmi2")
#: The elements a band list's out array must hold: 16, and past them the 64 lanes of :data:`values_at32`'s last
#: whole compress (machines with AVX-512F and without VBMI2).
BAND16_OUT = 16 + 64
#: ``band16_1(A, B, off, xa, xb, outA, outB)`` / ``band16_2``: the float32 values ``A[off + i]`` and ``B[off + i]``
#: at the set bits ``i`` of a band of at most 16 lanes over one word ``xa`` (two: ``xa``, then ``xb`` for the lanes
#: from ``off + 64``), in order, into ``outA[:16]`` / ``outB[:16]`` (lanes past the band undefined; each out array
#: must hold :data:`BAND16_OUT` elements, which the AVX-512F form's whole compresses may write). With AVX-512
#: VBMI and VBMI2 built in registers and stored once each, so that a load of the band is forwarded from that store
#: (:data:`values_at32`'s compressed stores sit at offsets that depend on the data, and a load over several of them
#: waits until they are written); with AVX-512F alone :data:`values_at32` word by word; without AVX-512 in sixteen
#: steps with no branch (:func:`_band16_fixed`).
band16_1 = _make_band16(1) if HAS_VBMI2 else _band16_1_loop if _has_feature("avx512f") else _band16_1_fixed
band16_2 = _make_band16(2) if HAS_VBMI2 else _band16_2_loop if _has_feature("avx512f") else _band16_2_fixed
#: ``band16v_1(A, off, xa, xb, outA)`` / ``band16v_2``: :data:`band16_1` / :data:`band16_2` for one array (per-layer
#: lrfu's float32 values).
band16v_1 = _make_band16v(1) if HAS_VBMI2 else _band16v_1_loop
band16v_2 = _make_band16v(2) if HAS_VBMI2 else _band16v_2_loop


def _data_pointer(offset: bool):
    """The typing of :func:`data_of` / :func:`data_at`: a pointer to a C-contiguous array's data (at element
    ``args[1]`` of its flat order with ``offset``); no signature for another layout, so it does not compile."""

    def typer(ary, *off):
        if not isinstance(ary, types.Array) or ary.layout != "C":
            return None

        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            return builder.gep(data, [args[1]]) if offset else data

        return types.CPointer(ary.dtype)(ary, *([types.int64] if offset else [])), codegen

    return typer


@intrinsic
def data_of(typingctx, ary):
    """A pointer to a C-contiguous array's first element, for :func:`array_at`: a helper called with pointers and
    lengths takes two arguments an array where the array whole takes seven. Another layout does not compile."""
    return _data_pointer(False)(ary)


@intrinsic
def data_at(typingctx, ary, off):
    """A pointer to element ``off`` of a C-contiguous array counted in its flat order (``data_of`` at 0); another
    layout does not compile."""
    return _data_pointer(True)(ary, off)


@intrinsic
def array_at(typingctx, ptr, n):
    """The 1-d C array of ``n`` elements at ``ptr`` (:func:`data_of`), borrowed: no reference count (where
    ``numba.carray`` will not compile, in code without the numba runtime)."""
    aty = types.Array(ptr.dtype, 1, "C")
    sig = aty(ptr, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(aty)(context, builder)
        itemsize = context.get_abi_sizeof(context.get_data_type(ptr.dtype))
        populate_array(ary, data=args[0], shape=[args[1]], strides=[ir.Constant(_I64, itemsize)],
                       itemsize=ir.Constant(_I64, itemsize), meminfo=None)
        return ary._getvalue()

    return sig, codegen
