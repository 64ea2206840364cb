"""numba kernel for sequential ``lfru`` under global scope: dense slots, and candidates made afresh every few units.

``lfru`` ranks a block by ``freq / (t - last + 1)`` (``t`` the unit, here the access index; lower leaves first,
equal keys by lower tie rank; the float expression of ``replay_select``). Under sequential replay each unit holds
one access, and an access that misses a full cache makes one block leave: the lowest of the residents and the
miss itself (a miss that ranks lowest is bypassed). The frequency groups of :mod:`._kernels_lfru_groups` find it
exactly, but every access moves its block through linked lists and a timing wheel (86-99 ns an access on the
benchmark stream on an AVX2 core). Here the residents sit in dense *slots* and the lowest is found among a few
*candidates*, made afresh for a window of about :data:`WINDOW` overflowing units by one vector pass over the slots:

* A key only falls while its block is not accessed, so a resident whose key at the window's last unit ``c_end``
  is above a bound ``c_max`` stays above it at every unit of the window. The pass lists the slots whose count is
  at most ``c_max * (c_end - last + 1)`` (float32 lanes, :func:`_slot_cands`, with a margin that keeps every
  slot it leaves out above ``c_max`` in the float64 key); an accessed block whose key may fall to ``c_max`` by
  ``c_end`` joins them (a hit, or a miss taking a slot) or stays one, any other accessed candidate leaves them.
  A candidate that leaves (or is evicted) keeps its lane, marked in words of dead lanes that the ranking reads
  (:func:`_drop`): no store goes to the lanes the next ranking loads; one that joins takes the lowest dead lane.
* At a miss the candidates are ranked as float32 vectors (:func:`_low_n`) by ``-(age / count)``, the product of
  a copy of minus their count's reciprocal and their age (the lowest key has the lowest rank; a division took
  1.05x the loop's time: docs/performance.md, *Session 54*), and the lanes within a relative ``2**-19`` of the
  lowest rank (they hold every lane that may tie with it in float64) are ranked by their exact float64 keys and
  tie ranks. Where that lowest key is at most ``c_max`` it is the lowest of every resident; otherwise (too few
  candidates) they are made again with ``c_max`` at that key times ``up``, which holds it.
* ``c_max`` is the last leaving key times ``up``; ``up`` shrinks after a pass that lists more than
  :data:`MANY` times :data:`WINDOW` candidates and grows after a window whose candidates ran out (any value above
  1 gives the same decision). A window spans :data:`WINDOW` times the units an overflow took in the last one.

The slots' float32 last units are kept relative to a base moved up every :data:`REBASE` units; a slot older than
``2**23`` units then has its float32 count set to 0 (a candidate at every pass) until it is accessed. The
decision, the hit counts and the hit flags are those of :func:`._kernels_lfru.replay_select`
(``tests/test_lfru_cands.py``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .._jit import jit_helper, jit_inline, jit_loop
from ._kernels import _cttz
from ._pages import Packed
from ._simd import (
    _lanes,
    _splat,
    bit_positions,
    bit_positions_some,
    compare_word,
    lanes_below,
    lowest_lane,
    lowest_lane_at,
)

__all__ = ["MANY", "REBASE", "UP", "WINDOW", "replay_lfru_cands"]

#: An unsigned index: numba skips the negative-index wraparound (no index here is negative).
_U = np.uint64
_F32 = ir.FloatType()

#: Overflowing units a set of candidates serves before it is made again, about: its window spans this many times
#: the units an overflow took in the last window (at least this many units, at most :data:`_MAX_SPAN`).
WINDOW = 32
#: The first ``c_max`` is the last leaving key times this.
UP = 1.05
#: The most units a set of candidates serves.
_MAX_SPAN = 1 << 16
#: A pass listing more than this many candidates an overflow of the window (times :data:`WINDOW`) makes ``up``
#: smaller.
MANY = 2
#: The slots' float32 last units are relative to a base moved up every this many units (below ``2**23``).
REBASE = 1 << 22
#: A slot last accessed more than this many units before the base is a candidate at every pass (its float32 last
#: unit would not be exact).
_OLD = float(1 << 23)
#: Candidate lanes: float32 ranks ``-(age / count)`` at most the lowest times this (every lane that may tie with it
#: in float64: each rank is within four roundings of its exact value; ranks are negative).
_NEAR = np.float32(1.0 - 2.0 ** -19)
#: :func:`_at_most` tests ``f <= c * age * _FAST`` first: true only where ``f / age`` rounds to at most ``c`` (the
#: two products' roundings and the division's are each below ``2**-52`` relative).
_FAST = 1.0 - 2.0 ** -50
#: A pass lists its slots by :data:`._simd.bit_positions_some` where the last one listed more than this many a word
#: of slots (:data:`._simd.bit_positions`, whose unrolled steps take words of four, otherwise).
_SOME = 3
#: The pass's bound: ``c_max`` times this in float32 (slots left out have float64 keys above ``c_max``).
_PASS_MARGIN = 1.0 + 2.0 ** -18
#: A joining block's bound: ``c_max`` times this in float64.
_JOIN_MARGIN = 1.0 + 2.0 ** -40


@intrinsic
def _slot_cands(typingctx, SF, SL, off, thr, ce):
    """The bits of the 64 float32 lanes from ``off`` with ``SF <= thr * (ce - SL)``."""
    sig = types.uint64(SF, SL, types.int64, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        vt = ir.VectorType(_F32, 64)
        f = builder.load(_lanes(context, builder, signature.args[0], args[0], args[2], 64, _F32), align=4)
        last = builder.load(_lanes(context, builder, signature.args[1], args[1], args[2], 64, _F32), align=4)
        p = builder.fmul(_splat(builder, args[3], vt, 64), builder.fsub(_splat(builder, args[4], vt, 64), last))
        return compare_word(builder, "<=", f, p)

    return sig, codegen


def _cand_ranks(context, builder, signature, args, n):
    """The ranks ``QR * (a - QL)`` (``-(age / count)``) of the ``n`` float32 lanes from ``off`` (``args``: ``QR``,
    ``QL``, ``off``, ``a``, ``dead``), 0 in the lanes whose bit of the word ``dead`` is set (entries that left: a
    rank of 0 lies above every candidate's). Each lane's bit is shifted into the sign of an int32 lane (one variable
    shift of the word's half), which selects the 0."""
    vt = ir.VectorType(_F32, n)
    f = builder.load(_lanes(context, builder, signature.args[0], args[0], args[2], n, _F32), align=4)
    last = builder.load(_lanes(context, builder, signature.args[1], args[1], args[2], n, _F32), align=4)
    x = builder.fmul(f, builder.fsub(_splat(builder, args[3], vt, n), last))
    i32 = ir.IntType(32)
    it = ir.VectorType(i32, n)
    dead = args[4]
    pair = ir.VectorType(i32, 2)
    halves = builder.insert_element(
        builder.insert_element(ir.Constant(pair, None), builder.trunc(dead, i32), ir.Constant(i32, 0)),
        builder.trunc(builder.lshr(dead, ir.Constant(ir.IntType(64), 32)), i32), ir.Constant(i32, 1))
    words = builder.shuffle_vector(halves, ir.Constant(pair, None), ir.Constant(it, [j >> 5 for j in range(n)]))
    signs = builder.shl(words, ir.Constant(it, [31 - (j & 31) for j in range(n)]))
    return builder.select(builder.icmp_signed("<", signs, ir.Constant(it, [0] * n)), ir.Constant(vt, [0.0] * n), x)


def _low_n(n):
    """An intrinsic for the ``n`` lanes from ``off``: ``(bits, v, q)``, ``v`` the lowest float32 rank
    ``QR * (a - QL)`` of them, ``q`` a lane that holds it (:func:`._simd.lowest_lane_at`: the lane is known with the
    value, so the caller's loads of that candidate need not wait on ``bits``; 0.91-0.94 of the loop's time at rho
    0.1-0.2, where the bits' lowest set bit gave it) and ``bits`` the lanes whose rank is at most ``v`` times
    :data:`_NEAR` (lanes past the candidates hold ``QR = 0``, ``QL = 0``, and the lanes whose bit of the word
    ``dead`` is set are ranked 0 by :func:`_cand_ranks`: a rank of 0, above every candidate's)."""

    @intrinsic
    def low(typingctx, QR, QL, off, a, dead):
        rt = types.Tuple((types.uint64, types.float32, types.int64))
        sig = rt(QR, QL, types.int64, types.float32, types.uint64)

        def codegen(context, builder, signature, args):
            x = _cand_ranks(context, builder, signature, args, n)
            v, q = lowest_lane_at(builder, x)
            near = _splat(builder, builder.fmul(v, ir.Constant(_F32, float(_NEAR))), ir.VectorType(_F32, n), n)
            return context.make_tuple(builder, rt, [compare_word(builder, "<=", x, near), v,
                                                    builder.zext(q, ir.IntType(64))])

        return sig, codegen

    return low


#: :func:`_low_n` for 8, 16, ..., 64 lanes.
_low8, _low16, _low24, _low32, _low40, _low48, _low56, _low64 = (_low_n(8 * k) for k in range(1, 9))


@jit_inline
def _low_lanes(QR, QL, a, n_lanes, dead):
    """:func:`_low_n` over the first ``n_lanes`` (1 to 64) lanes, rounded up to a multiple of 8."""
    k = (n_lanes + 7) >> 3
    if k <= 4:
        if k <= 2:
            return _low8(QR, QL, 0, a, dead) if k == 1 else _low16(QR, QL, 0, a, dead)
        return _low24(QR, QL, 0, a, dead) if k == 3 else _low32(QR, QL, 0, a, dead)
    if k <= 6:
        return _low40(QR, QL, 0, a, dead) if k == 5 else _low48(QR, QL, 0, a, dead)
    return _low56(QR, QL, 0, a, dead) if k == 7 else _low64(QR, QL, 0, a, dead)


@intrinsic
def _min64(typingctx, QR, QL, off, a, dead):
    """The lowest float32 rank ``QR * (a - QL)`` of the 64 lanes from ``off`` (0 in the lanes of ``dead``)."""
    sig = types.float32(QR, QL, types.int64, types.float32, types.uint64)

    def codegen(context, builder, signature, args):
        return lowest_lane(builder, _cand_ranks(context, builder, signature, args, 64))

    return sig, codegen


@intrinsic
def _near64(typingctx, QR, QL, off, a, dead, v):
    """The bits of the 64 lanes from ``off`` whose float32 rank ``QR * (a - QL)`` (0 in the lanes of ``dead``) is
    at most ``v``."""
    sig = types.uint64(QR, QL, types.int64, types.float32, types.uint64, types.float32)

    def codegen(context, builder, signature, args):
        x = _cand_ranks(context, builder, signature, args, 64)
        return compare_word(builder, "<=", x, _splat(builder, args[5], ir.VectorType(_F32, 64), 64))

    return sig, codegen


@jit_inline
def _lowest_entry(QR, QL, PF, PL, PB, DW, n_lanes, n_cand, tf, tb, rec):
    """The candidate of lowest ``(float64 key at unit tf - 1, tie rank)``: ``(its entry, its count, its age)``, its
    key the count over the age; ``(-1, inf, 1)`` without candidates. Where one lane alone lies near the lowest
    float32 rank, it is the lowest (no other lane's float64 key can equal its own): no division (the caller's
    tests on the key multiply where they can, :func:`_at_most`). ``rec[4 b + 3]``: block ``b``'s tie rank; the
    entries sit in the first ``n_lanes`` lanes, ``n_cand`` of them live, those whose bits of ``DW`` are set gone."""
    a = np.float32(tf - tb)
    best = -1
    bk = np.inf
    if n_cand <= 0:
        return best, np.inf, 1.0
    if n_lanes <= 64:
        x, v, q = _low_lanes(QR, QL, a, n_lanes, DW[0])
        if x and not x & (x - _U(1)):  # (q, the lowest lane, is that bit: known before the bits are)
            return q, PF[_U(q)], tf - PL[_U(q)]
        w_hi = 1
    else:
        v = np.float32(np.inf)
        w_hi = (n_lanes + 63) >> 6
        for w in range(w_hi):
            v = min(v, _min64(QR, QL, w << 6, a, DW[_U(w)]))
        x = _near64(QR, QL, 0, a, DW[0], v * _NEAR)
    for w in range(w_hi):
        if w > 0:
            x = _near64(QR, QL, w << 6, a, DW[_U(w)], v * _NEAR)
        while x:
            q = (w << 6) + np.int64(_cttz(x))
            x &= x - _U(1)
            k = PF[_U(q)] / (tf - PL[_U(q)])
            if k < bk or (k == bk and rec[_U(4 * PB[_U(q)] + 3)] < rec[_U(4 * PB[_U(best)] + 3)]):
                bk = k
                best = q
    return best, PF[_U(best)], tf - PL[_U(best)]


@jit_inline
def _at_most(f, age, c):
    """Whether the float64 key ``f / age`` (a count and an age, integers below ``2**53``) is at most ``c`` (positive
    or ``inf``): where ``f`` lies below ``c * age`` by more than the products round, without the division that
    would otherwise wait on the candidate's lane (sequential global lfru at rho 0.1 in 0.97x the time)."""
    return f <= c * age * _FAST or f / age <= c


@jit_inline
def _against(f, g, age):
    """Whether the count ``f`` is below, and whether it equals, the float64 key ``g / age`` (integers below
    ``2**53``): by the product ``f * age`` where it is below ``2**52`` (exact, and an integer other than ``g`` then
    lies beyond the division's rounding), else by the key."""
    fa = f * age
    if fa < 2.0 ** 52:
        return fa < g, fa == g
    k = g / age
    return f < k, f == k


@jit_inline
def _may_join(ff, jmax, join, c_end, t):
    """Whether a block of count ``ff`` accessed at unit ``t`` may have its key fall to ``c_max`` by the window's last
    unit ``c_end`` (``ff <= join * (c_end + 1 - t)``, ``join`` ``c_max`` with its margin): first against ``jmax``,
    that bound at the window's first unit, which decides most accesses without the conversion and product."""
    return ff <= jmax and ff <= join * float(c_end + 1 - t)


@jit_inline
def _put(q, f, last, tb, b, QR, QL, PF, PL, PB, rec):
    """Candidate entry ``q``: block ``b`` of count ``f`` last accessed at unit ``last`` (:func:`_put_exact`), its
    float32 copies beside (:func:`_put_copies`). A hit's entry and a joining miss's; :func:`_make` calls the two
    parts in two loops (the float32 copies as vectors: 0.97 of the loop's time at rho 0.1)."""
    _put_exact(q, f, last, b, PF, PL, PB, rec)
    _put_copies(q, tb, QR, QL, PF, PL)


@jit_inline
def _put_exact(q, f, last, b, PF, PL, PB, rec):
    """Candidate entry ``q``'s exact values (block ``b`` of count ``f`` last accessed at unit ``last``), and ``b``'s
    record names the entry."""
    PF[_U(q)] = f
    PL[_U(q)] = last
    PB[_U(q)] = b
    rec[_U(4 * b + 2)] = q


@jit_inline
def _put_copies(q, tb, QR, QL, PF, PL):
    """Candidate entry ``q``'s float32 copies of its exact values: minus the count's reciprocal, the unit relative
    to ``tb``."""
    QR[_U(q)] = np.float32(-1.0 / PF[_U(q)])
    QL[_U(q)] = np.float32(PL[_U(q)] - tb)


@jit_inline
def _drop(q, n_cand, DW):
    """Candidate entry ``q`` leaves: its bit of the dead words ``DW`` set (its lane then ranks 0; no lane is
    written, so the next ranking's loads wait on no store of this one: a throwaway loop of rankings alone that moved
    the last entry into the freed lane took twice the time of one that marked it, docs/performance.md, *Session
    58*); returns how many are left."""
    DW[_U(q >> 6)] |= _U(1) << _U(q & 63)
    return n_cand - 1


@jit_inline
def _free_lane(DW, n_lanes):
    """A lane for a joining entry: the lowest dead one (its bit cleared), else lane ``n_lanes``; returns
    ``(lane, lanes in use)``."""
    for w in range((n_lanes + 63) >> 6):
        d = DW[_U(w)]
        if d:
            DW[_U(w)] = d & (d - _U(1))
            return (w << 6) + np.int64(_cttz(d)), n_lanes
    return n_lanes, n_lanes + 1


@jit_inline
def _window(t, span, c_max, n_res, sbase, SF, SL, SX, SB, QR, QL, PF, PL, PB, rec, n_lanes, LS, n_last, DW):
    """The candidates made (:func:`_make`) for the window of units ``t .. t + span - 1`` and the bound ``c_max``
    (at a window's end, and where they ran out): returns ``(c_end, join, jmax, n_cand)``, the window's last unit,
    the joining bound ``c_max`` times :data:`_JOIN_MARGIN`, that bound times the window's units (the most of ``join
    * (c_end + 1 - t)`` in it, :func:`_may_join`) and the candidates."""
    join = c_max * _JOIN_MARGIN
    n_cand = _make(t, span, c_max, n_res, sbase, SF, SL, SX, SB, QR, QL, PF, PL, PB, rec, n_lanes, LS, n_last, DW)
    return t + span - 1, join, join * float(span), n_cand


@jit_helper
def _make(t, window, c_max, n_res, sbase, SF, SL, SX, SB, QR, QL, PF, PL, PB, rec, n_lanes, LS, n_last, DW):
    """The candidates for units ``t .. t + window - 1``: every slot whose count is at most ``c_max`` times its age
    at the last of them (float32, :data:`_PASS_MARGIN`); returns how many. The old candidates' entries (the first
    ``n_lanes`` lanes) are cleared first, the lanes past the new ones hold ``QR = 0`` and ``QL = 0`` (a rank of 0)
    and the dead words ``DW`` none. The pass lists the slots of every word in ``LS`` (:data:`._simd.bit_positions`:
    no loop over a word's bits, whose exit a branch predictor misses: docs/performance.md, *Session 54*) before
    their entries are written; where the last pass listed ``n_last``, more than :data:`_SOME` a word of slots, by
    :data:`._simd.bit_positions_some` (0.90-0.97 of the loop's time at rho 0.1, about five a word: *Session 58*)."""
    for q in range(n_lanes):
        rec[_U(4 * PB[_U(q)] + 2)] = -1
    thr = np.float32(c_max * _PASS_MARGIN)
    ce = np.float32(t + window - sbase)
    tb = float(t)
    n_l = 0
    n_w = (n_res + 63) >> 6
    some = n_last > _SOME * n_w
    for w in range(n_w):
        x = _slot_cands(SF, SL, w << 6, thr, ce) & lanes_below(n_res - (w << 6))
        n_l = bit_positions_some(x, w << 6, LS, n_l) if some else bit_positions(x, w << 6, LS, n_l)
    for q in range(n_l):               # the entries' exact values, then their float32 copies as vectors (no
        s = LS[_U(q)]                  # division waits on the next)
        b = SB[_U(s)]
        _put_exact(q, float(rec[_U(4 * b)]), SX[_U(s)], b, PF, PL, PB, rec)
    for q in range(n_l):
        _put_copies(q, tb, QR, QL, PF, PL)
    for q in range(n_l, n_lanes):
        QR[_U(q)] = np.float32(0.0)
        QL[_U(q)] = np.float32(0.0)
    for w in range((max(n_lanes, n_l) + 63) >> 6):
        DW[_U(w)] = _U(0)
    return n_l


@jit_helper
def _rebase(t, sbase, n_res, SF, SL, old):
    """The slots' float32 last units moved to the base ``t`` (from ``sbase``); a slot then older than ``old``
    units gets count 0 (a candidate at every pass) and last unit ``-old``."""
    d = np.float32(t - sbase)
    lim = np.float32(-old)
    for s in range(n_res):
        x = SL[_U(s)] - d
        if x < lim:
            SF[_U(s)] = np.float32(0.0)
            x = lim
        SL[_U(s)] = x


def replay_lfru_cands(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie, count_from, hits, misses,
                      hit_flag, window=None, up=None, many=None, rebase=None, old=None, trace=None, wide=False,
                      pages=None):
    """Sequential ``lfru`` under global scope (one pool of ``capacity[0]`` blocks, one unit per access).

    Parameters are those of :func:`._kernels_lfru_groups.replay_lfru_groups` less ``atomic`` (always one unit per
    access; sequential-random passes the members shuffled) and, for tests (each value gives the same decision):
    ``window`` (:data:`WINDOW`), ``up`` (:data:`UP`), ``many`` (:data:`MANY`), ``rebase`` (:data:`REBASE`, the
    most), ``old`` (the age past which a rebased slot is a candidate at every pass, ``2**23`` the most), ``wide``
    (int64 block records, as streams of ``2**31`` accesses or more take), ``trace`` (an int64[5], when given
    accumulates the overflowing units, the sets of candidates made, those made again because they ran out, the
    candidates summed over the overflowing units, and the overflowing units with more than 64 lanes of them) and
    ``pages``, the allocator of the state arrays (:class:`._pages.Packed` by default). The state is allocated here
    and the loop runs in :func:`_replay_lfru_cands`.
    """
    n_blocks = n_layers * n_experts
    cap = int(min(max(int(capacity[0]), 0), n_blocks))
    n_access = int(offsets[-1]) if offsets.shape[0] > 1 else 0
    ix = np.int32 if not wide and n_access < 2 ** 31 - 1 and n_blocks < 2 ** 31 - 1 else np.int64
    pa = Packed() if pages is None else pages      # no list across a page boundary (_pages)
    rec = pa((n_blocks, 4), ix, -1)                 # count, slot, candidate entry, tie rank
    rec[:, 0] = 0
    rec[:, 3] = tie
    width = cap + 64
    f32, f64 = np.float32, np.float64
    _replay_lfru_cands(offsets, expert, ev_layer, n_experts, cap, count_from, hits, misses, hit_flag,
                       max(int(WINDOW if window is None else window), 1), float(UP if up is None else up),
                       float(MANY if many is None else many),
                       min(max(int(REBASE if rebase is None else rebase), 1), REBASE),
                       min(max(float(_OLD if old is None else old), 1.0), _OLD),
                       np.zeros(0, np.int64) if trace is None else trace, rec.reshape(-1),
                       pa(width, f32, 0), pa(width, f32, 0), pa(width, f64, 0), pa(width, ix, 0),
                       pa(width, f32, 0), pa(width, f32, 0), pa(width, f64, 0), pa(width, f64, 0),
                       pa(width, ix, 0), pa(width, np.int32, 0), pa((width + 63) >> 6, np.uint64, 0))


@jit_loop
def _replay_lfru_cands(offsets, expert, ev_layer, n_experts, cap, count_from, hits, misses, hit_flag, window, up,
                       many, rebase, old, trace, rec, SF, SL, SX, SB, QR, QL, PF, PL, PB, LS, DW):
    """The loop of :func:`replay_lfru_cands`. ``rec[4 b .. 4 b + 3]``: block ``b``'s count, slot (-1: not
    resident), candidate entry (-1: none) and tie rank; slot ``s``: float32 count ``SF`` and last unit ``SL``
    (relative to the base ``sbase``), exact last unit ``SX``, block ``SB``; candidate entry ``q``: minus its
    count's reciprocal ``QR`` and its last unit ``QL`` (float32; relative to ``tb``, the unit they were made at),
    exact count ``PF`` and last unit ``PL``, block ``PB``; ``DW`` the words of the entries that left (a bit a lane;
    ``n_lanes`` lanes in use, ``n_cand`` of them live); ``LS`` the pass's list of slots."""
    record = hit_flag.shape[0] > 0
    traced = trace.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_res = 0
    n_cand = 0
    n_lanes = 0                        # the lanes of candidate entries, those that left among them (DW)
    c_end = -1                         # the candidates hold up to this unit (none yet)
    c_max = np.inf
    join = np.inf                      # c_max * _JOIN_MARGIN
    jmax = -np.inf                     # join times the window's units, the most of join * (c_end + 1 - t) in it
    tb = 0.0
    sbase = 0
    v_f = -1.0                         # the last leaving key, v_f / v_a (none yet)
    v_a = 1.0
    span = window                      # the units a set of candidates serves
    t_made = 0                         # the unit the candidates were made at
    n_go = 0                           # overflowing units since then
    t = 0
    n_last = 0                         # the candidates the last pass listed
    for i in range(n_events):
        layer = ev_layer[_U(i)]
        base = layer * n_experts
        counted = i >= count_from
        n_hit = 0                      # the event's hits (its misses: the rest), added when it ends
        for a in range(offsets[_U(i)], offsets[_U(i + 1)]):
            b = base + expert[_U(a)]
            r = _U(4 * b)
            f = rec[r] + 1
            rec[r] = f
            s = rec[r + _U(1)]
            ff = float(f)
            tt = float(t)
            if t - sbase >= rebase:
                _rebase(t, sbase, n_res, SF, SL, old)
                sbase = t
            if s >= 0:                 # a hit: the slot's count and unit; a candidate's copy, or it joins
                n_hit += 1
                if record:
                    hit_flag[_U(a)] = 1
                SF[_U(s)] = np.float32(ff)
                SL[_U(s)] = np.float32(t - sbase)
                SX[_U(s)] = tt
                q = rec[r + _U(2)]
                if _may_join(ff, jmax, join, c_end, t):
                    if q < 0:
                        q, n_lanes = _free_lane(DW, n_lanes)
                        n_cand += 1
                    _put(q, ff, tt, tb, b, QR, QL, PF, PL, PB, rec)
                elif q >= 0:           # a candidate no more
                    rec[r + _U(2)] = -1
                    n_cand = _drop(q, n_cand, DW)
                t += 1
                continue
            if cap == 0:
                t += 1
                continue
            if n_res < cap:
                s = n_res
                n_res += 1
            else:                      # one leaves: the lowest candidate, or the miss itself
                tf = tt + 1.0
                n_go += 1
                if t > c_end:          # a window of about `window` overflowing units, as the last one had
                    span = min(max(window * (t - t_made) // n_go, window), _MAX_SPAN) if c_end >= 0 else window
                    t_made = t
                    n_go = 1
                    c_max = v_f / v_a * up if v_f >= 0.0 else np.inf
                    c_end, join, jmax, n_cand = _window(t, span, c_max, n_res, sbase, SF, SL, SX, SB, QR, QL, PF,
                                                        PL, PB, rec, n_lanes, LS, n_last, DW)
                    tb = tt
                    n_last = n_lanes = n_cand
                    if n_cand > many * window:
                        up = 1.0 + (up - 1.0) * 0.8
                    if traced:
                        trace[1] += 1
                if traced:
                    trace[0] += 1
                    trace[3] += n_cand
                    trace[4] += n_lanes > 64
                best, bf, ba = _lowest_entry(QR, QL, PF, PL, PB, DW, n_lanes, n_cand, tf, tb, rec)
                if not _at_most(bf, ba, c_max):     # too few candidates: made again to hold the lowest found
                    c_max = bf / ba * up if best >= 0 else np.inf               # (or all)
                    if best < 0:
                        span = window
                    up = 1.0 + (up - 1.0) * 2.0
                    if traced:
                        trace[2] += 1
                    c_end, join, jmax, n_cand = _window(t, span, c_max, n_res, sbase, SF, SL, SX, SB, QR, QL, PF,
                                                        PL, PB, rec, n_lanes, LS, n_last, DW)
                    tb = tt
                    n_last = n_lanes = n_cand
                    best, bf, ba = _lowest_entry(QR, QL, PF, PL, PB, DW, n_lanes, n_cand, tf, tb, rec)
                v_f = bf
                v_a = ba
                vb = PB[_U(best)]
                rv = _U(4 * vb)
                if ff <= c_max:        # (else above the lowest's key, at most c_max)
                    lt, eq = _against(ff, bf, ba)  # the miss's key (its count over an age of 1) against the lowest's
                    if lt or (eq and rec[r + _U(3)] < rec[rv + _U(3)]):
                        t += 1         # the miss ranks lowest: bypassed
                        continue
                s = rec[rv + _U(1)]    # the lowest leaves
                rec[rv + _U(1)] = -1
                rec[rv + _U(2)] = -1
                n_cand = _drop(best, n_cand, DW)
            SF[_U(s)] = np.float32(ff)
            SL[_U(s)] = np.float32(t - sbase)
            SX[_U(s)] = tt
            SB[_U(s)] = b
            rec[r + _U(1)] = s
            if _may_join(ff, jmax, join, c_end, t):
                q, n_lanes = _free_lane(DW, n_lanes)
                _put(q, ff, tt, tb, b, QR, QL, PF, PL, PB, rec)
                n_cand += 1
            t += 1
        if counted:                    # (_kernels_seq._count, written out: as that call, 1.02x the time at rho 0.2-0.3)
            n = offsets[_U(i + 1)] - offsets[_U(i)]
            hits[_U(layer)] += n_hit
            misses[_U(layer)] += n - n_hit
