"""numba kernel for ``lfru`` under global scope: residents in frequency groups, a pool of low keys, a timing wheel.

``lfru`` ranks a block by ``freq / (t - last + 1)`` (the float expression of ``replay_scan``; lower leaves first,
equal keys by lower tie rank). Under global scope one pool holds ``c`` of all ``L * N`` blocks, and re-ranking
every resident at every unit (:func:`._kernels_lfru.replay_select`) costs ``O(c)`` per unit. This kernel makes
the same decision while touching, per unit, only its members and the residents whose key is near the ``m``
lowest. Its structure rests on two facts about the key:

* A resident's key only falls until its block is accessed again, so under a threshold ``theta`` the first
  unit at which it may fall below ``theta`` is known when it is last touched.
* Two residents with the same count ``f`` keep their order while neither is accessed: the one accessed
  earlier has the lower key at every later unit. So the residents of count ``f`` form a *group* ordered by
  last unit, and only a group's *front* (its oldest) can be the next of the group to fall below ``theta``.

State:

* **Groups** — one doubly linked list per count ``f`` (a sentinel node per list), in last-unit order: an
  access moves its block to the tail of the list of ``f + 1`` in O(1). A block in the pool links to itself, a
  block not resident to a spare node (the sentinel of count 0, which never holds a list), so that unlinking
  a block needs no test and ``next == itself`` says "in the pool". Every node is one record of four
  integers in one array (next, previous, then last unit and count for a block, unit in the wheel and link
  in its slot for a sentinel): int32 below ``_NARROW_UNITS`` units, int64 past it.
* **Pool** — dense arrays (count, last unit, block) of the residents that have left their list because their
  key fell below ``theta``, or rather below ``thu = theta * (1 + 2**-40)``. A resident outside the pool is in
  its list and not below ``thu``, hence its float key is at least ``theta``. The rare access to a resident in
  the pool finds its entry by a vector compare of the pool's blocks (after the unit's other members, among
  the entries that were there before them); the entries that leave at a unit are swap-removed from the
  highest index down (the entry moved into a hole is then never one still to leave).
* **Wheel** — a timing wheel of groups (4,096 one-unit slots and a far list, swept every 2,048 units) keyed
  by the first unit at which the group's front may fall below ``thu``: ``last + D`` with ``D =`` :func:`_span`
  of the count (rounded early, never late), so a visit tests its fronts on integers (``last <= t - D``).
  When a group's slot comes, its fronts due move to the pool and the group waits for its next front. A front
  that leaves its list (accessed, evicted) only makes the group's unit early, and an early unit is checked
  again.

At a unit whose ``C ∪ U`` holds ``m = |C ∪ U| - c > 0`` blocks too many, the exact keys of the pool are
computed 64 lanes at a time (32 or 16 for the last ones; :func:`_keys_n`, LLVM vector IR like :mod:`._simd`)
together with the bits of the keys below ``theta`` and below a cut (``cut``: a little above the last unit's
``m``-th lowest key). If at least ``m`` keys lie below ``min(cut, theta)``, the ``m`` lowest of ``C ∪ U`` are
among them (every other candidate ranks at or above the cut): those keys are sorted by the smallest bitonic
network of :mod:`._simd` that holds them (``_kernels_bits._kth_lowest`` past 64; :func:`_mth`), the ``m``-th
is ``v``, the keys below ``v`` leave, and of those equal to it the lowest tie ranks (equal keys are common:
blocks of one event with one count), found the same way (the needed-th lowest of their ranks, as floats).
A unit with one block to leave (every unit of sequential replay) takes the lowest of the pool's keys
instead (:func:`_keys_min_n`: computed the same way and halved to their minimum in registers; the lanes holding it
by one vector compare). Too few below the cut: the candidates are the
keys below ``theta``. Too few below ``theta``: every resident is ranked in a max-heap of the ``m`` best
(:func:`_rank_all`: the pool, then each list from its front, stopping at the first key above the heap's top:
later members of a list rank no lower), and ``theta`` rises to ``up * v``, every list moving its fronts
below the new ``theta`` to the pool. A pool that grows past ``a * m + b`` entries lowers
``theta`` to ``low * v``, which needs no filing again (a lower ``theta`` only makes every waiting unit
early). The unit's members take part as any resident (a miss that leaves is bypassed): they are in their
lists, or in the pool when their key ``f / 1`` is below ``thu``. Before the first overflow ``theta`` is 0
(nothing waits in the pool), so the first overflowing unit ranks every resident and sets it.

The keys compared are the float expression of ``replay_select``: within a group the float key is monotone
in the last unit (the division is correctly rounded, the numerator shared), so list order and float order
agree, and equal floats in a list (same last unit) are gathered, or not, together. The decision, the hit
counts and the hit flags are therefore those of ``replay_select`` exactly (``tests/test_lfru_groups.py``).

Arrays are indexed with unsigned integers (``arr[_U(i)]``): numba then skips its negative-index wraparound
(a shift, a mask and an add per access), which measured half of the list moves' time. No index here is ever
negative (``NUMBA_BOUNDSCHECK=1`` runs of the tests check it). The members' list moves do nothing else in
their loop: a member's old pool entry and a group that needs filing are noted and handled after it.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .._jit import jit, jit_helper
from ._kernels import _cttz, _max_unit
from ._kernels_bits import _kth_lowest, _popc
from ._kernels_lfru import _sel_offer
from ._kernels_order import _ctlz
from ._pages import Packed
from ._simd import (
    _F64,
    _I64,
    _lanes,
    _splat,
    lanes_below,
    lowest_lane,
    mask_eq,
    mask_lt,
    sort_small,
)

#: An unsigned index: numba skips the negative-index wraparound (no index here is negative).
_U = np.uint64

#: Wheel slots: ``_FAR`` of one unit, then one far list (swept every ``_FAR / 2`` units).
_FAR = 4096
#: ``thu = theta * _UP``: "below" is decided on ``thu``, so a resident left waiting has a float key >= theta.
_UP = 1.0 + 2.0 ** -40
#: Pool tuning ``(a, b, low, up, cut)``: a pool of more than ``a * m + b`` live entries lowers ``theta`` to
#: ``low * v``; a unit with too few keys below ``theta`` raises it to ``up * v``; the gather's cut is ``cut * v``
#: (``v`` the last ``m``-th lowest key). Any positive values give the same decision; these were measured fastest
#: on ``benchmarks/replay_throughput.py``'s stream (flat within a few percent around them).
TUNE = (4, 16, 1.03, 1.06, 1.005)
#: :data:`TUNE` for sequential units (one to leave each): a larger pool before ``theta`` falls, a larger rise
#: (``benchmarks/lfru_groups_tune.py``; docs/performance.md, *Session 43*). The engine replays sequential units on
#: :mod:`._kernels_lfru_cands` since session 53 (0.41-0.97 of this loop's time on the shapes measured there).
TUNE_SEQ = (8, 32, 1.03, 1.12, 1.005)
#: A group's unit in the wheel is at most this far past its front's last unit with int32 records (early,
#: never late: :func:`_span`); ``2**60`` with int64 ones.
_HORIZON = float(2 ** 30)
#: Streams of fewer units keep their node records in int32 (a unit plus ``_HORIZON`` stays below ``2**31``).
_NARROW_UNITS = 2 ** 30 - 2


def _stored_keys(context, builder, signature, args, n):
    """Codegen of ``PX = PF / (tf - PL)`` on the ``n`` lanes from ``off`` (``args``: ``PF``, ``PL``, ``PX``, ``off``,
    ``tf``, ...); the keys' vector."""
    vt = ir.VectorType(_F64, n)
    f = builder.load(_lanes(context, builder, signature.args[0], args[0], args[3], n), align=8)
    last = builder.load(_lanes(context, builder, signature.args[1], args[1], args[3], n), align=8)
    x = builder.fdiv(f, builder.fsub(_splat(builder, args[4], vt, n), last))
    builder.store(x, _lanes(context, builder, signature.args[2], args[2], args[3], n), align=8)
    return x


def _keys_n(n):
    """An intrinsic for ``n`` lanes ``off .. off+n-1``: ``PX = PF / (tf - PL)``; ``out[0]`` (``out[1]``) the bits
    where ``PX < th0`` (``th1``)."""

    @intrinsic
    def keys(typingctx, PF, PL, PX, off, tf, th0, th1, out):
        sig = types.void(PF, PL, PX, types.int64, types.float64, types.float64, types.float64, out)

        def codegen(context, builder, signature, args):
            vt = ir.VectorType(_F64, n)
            x = _stored_keys(context, builder, signature, args, n)
            c0 = builder.fcmp_ordered("<", x, _splat(builder, args[5], vt, n))
            c1 = builder.fcmp_ordered("<", x, _splat(builder, args[6], vt, n))
            data = context.make_array(signature.args[7])(context, builder, args[7]).data
            for k, c in enumerate((c0, c1)):
                bits = builder.bitcast(c, ir.IntType(n))
                bits = builder.zext(bits, _I64) if n < 64 else bits
                builder.store(bits, builder.gep(data, [ir.Constant(_I64, k)]))
            return context.get_dummy_value()

        return sig, codegen

    return keys


#: The pool's exact keys and their bits below two thresholds, 64, 32 or 16 lanes (the last lanes of a pool).
_pool_keys = _keys_n(64)
_pool_keys32 = _keys_n(32)
_pool_keys16 = _keys_n(16)


def _keys_min_n(n):
    """An intrinsic for ``n`` lanes ``off .. off+n-1``: ``PX = PF / (tf - PL)``, and the smallest of the first ``r``
    of them (``inf`` where ``r <= 0``), halved in registers (a unit of sequential replay needs only the lowest)."""

    @intrinsic
    def keys(typingctx, PF, PL, PX, off, tf, r):
        sig = types.float64(PF, PL, PX, types.int64, types.float64, types.int64)

        def codegen(context, builder, signature, args):
            vt = ir.VectorType(_F64, n)
            x = _stored_keys(context, builder, signature, args, n)
            it = ir.VectorType(_I64, n)
            live = builder.icmp_signed("<", ir.Constant(it, list(range(n))), _splat(builder, args[5], it, n))
            return lowest_lane(builder, builder.select(live, x, ir.Constant(vt, [float("inf")] * n)))

        return sig, codegen

    return keys


#: The pool's exact keys and the lowest of them, 64, 32 or 16 lanes.
_pool_low = _keys_min_n(64)
_pool_low32 = _keys_min_n(32)
_pool_low16 = _keys_min_n(16)


@intrinsic
def _find(typingctx, PB, off, b):
    """The bits of the lanes ``off .. off+63`` of ``PB`` (an integer array) equal to ``b``."""
    sig = types.uint64(PB, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        elt = ir.IntType(signature.args[0].dtype.bitwidth)
        x = builder.load(_lanes(context, builder, signature.args[0], args[0], args[1], 64, elt), align=4)
        c = builder.icmp_signed("==", x, _splat(builder, builder.trunc(args[2], elt) if elt.width < 64 else args[2],
                                                ir.VectorType(elt, 64), 64))
        return builder.bitcast(c, _I64)

    return sig, codegen


@jit_helper
def _pool_slot(b, pb, n_pool):
    """The pool entry of block ``b`` (it has one)."""
    w = 0
    while True:
        x = _find(pb, w, b) & lanes_below(n_pool - w)
        if x:
            return w + np.int64(_cttz(x))
        w += 64


@jit_helper
def _pool_keys_any(pf, pl, px, off, r, tf, th0, th1, kb):
    """:func:`_keys_n` on the lanes from ``off``: 64 of them, or 32 or 16 when ``r <= 32`` (``<= 16``) remain."""
    if r > 32:
        _pool_keys(pf, pl, px, off, tf, th0, th1, kb)
    elif r > 16:
        _pool_keys32(pf, pl, px, off, tf, th0, th1, kb)
    else:
        _pool_keys16(pf, pl, px, off, tf, th0, th1, kb)


@jit_helper
def _pool_low_any(pf, pl, px, off, r, tf):
    """:func:`_keys_min_n` on the lanes from ``off``: 64 of them, or 32 or 16 when ``r <= 32`` (``<= 16``) remain."""
    if r > 32:
        return _pool_low(pf, pl, px, off, tf, r)
    if r > 16:
        return _pool_low32(pf, pl, px, off, tf, r)
    return _pool_low16(pf, pl, px, off, tf, r)


@jit_helper
def _span(f, inv, horizon):
    """``D`` with ``l + D`` the first unit ``u`` at which ``f < thu * float(u - l + 1)`` (``inv = 1 / thu``), or
    one unit before it; at most ``horizon``.

    ``x = f * inv`` errs by a few ulps; scaled down by ``2**-50`` it is below ``f / thu`` and the float product
    of the test, so ``floor(x) + 1`` is at most the first age that tests below (capped, early).
    """
    return np.int64(min(f * inv * (1.0 - 2.0 ** -50), horizon))


@jit_helper
def _file(x, d, t, wheel, nd):
    """Group of sentinel node ``x`` waits for unit ``d >= t``; ``t`` is the first unit whose one-unit slot is
    still to come."""
    nd[_U(4 * x + 2)] = d
    s = d & (_FAR - 1) if d - t < _FAR else _FAR
    nd[_U(4 * x + 3)] = wheel[_U(s)]
    wheel[_U(s)] = x


@jit_helper
def _wheel_take(wheel, nd, nb, allg):
    """Every group in the wheel (its sentinel node), into ``allg`` (the wheel left empty); returns how many.
    With fewer groups than slots it reads the groups' units (-1: not in the wheel) rather than the slots."""
    n = 0
    n_nodes = nd.shape[0] >> 2
    if n_nodes - nb < wheel.shape[0]:
        for x in range(nb, n_nodes):
            if nd[_U(4 * x + 2)] >= 0:
                allg[_U(n)] = x
                n += 1
        for s in range(wheel.shape[0]):
            wheel[_U(s)] = -1
        return n
    for s in range(wheel.shape[0]):
        x = wheel[_U(s)]
        wheel[_U(s)] = -1
        while x >= 0:
            allg[_U(n)] = x
            n += 1
            x = nd[_U(4 * x + 3)]
    return n


@jit_helper
def _pool_add(b, f, l, pf, pl, pb, n_pool):
    """Block ``b`` (count ``f``, last unit ``l``) joins the pool; returns the new pool size."""
    pf[_U(n_pool)] = f
    pl[_U(n_pool)] = l
    pb[_U(n_pool)] = b
    return n_pool + 1


@jit_helper
def _pool_remove(q, pf, pl, pb, n_pool):
    """Pool entry ``q`` leaves (the last entry takes its place); returns the new pool size."""
    n = n_pool - 1
    pf[_U(q)] = pf[_U(n)]
    pl[_U(q)] = pl[_U(n)]
    pb[_U(q)] = pb[_U(n)]
    return n


@jit_helper
def _rank_all(m, t, nb, n_pool, tie, nd, wheel, allg, pf, pl, pb, px, sk, st, si):
    """Every resident ranked in a max-heap of the ``m`` best (``sk`` / ``st`` / ``si``; the pool, with its keys
    in ``px``, then each list from its front up to the first key above the heap's top), those leave; every
    group taken from the wheel into ``allg``. Returns the pool size and how many groups (a rare path, kept
    out of the replay loop)."""
    n_all = _wheel_take(wheel, nd, nb, allg)
    n_sel = 0
    for q in range(n_pool):
        x = px[_U(q)]
        b = pb[_U(q)]
        n_sel = _sel_offer(sk, st, si, n_sel, m, x, tie[_U(b)], b)
    for q in range(n_all):
        sn = allg[_U(q)]
        gf = float(sn - nb)
        e = nd[_U(4 * sn)]
        while e != sn:
            x = gf / float(t - nd[_U(4 * e + 2)] + 1)
            if n_sel == m and x > sk[0]:   # a full heap rejects it, and later members of the list rank no
                break                      # lower (tested before the offer: most groups end here, no call)
            n_sel = _sel_offer(sk, st, si, n_sel, m, x, tie[_U(e)], e)   # after it, sk[0] >= x
            e = nd[_U(4 * e)]
    for q in range(n_sel):
        b = si[_U(q)]
        n = nd[_U(4 * b)]
        if n != b:             # waiting in a list (pool entries are dropped below)
            p = nd[_U(4 * b + 1)]
            nd[_U(4 * p)] = n
            nd[_U(4 * n + 1)] = p
        _evict(b, nb, nd)
    dst = 0
    for q in range(n_pool):
        b = pb[_U(q)]
        pf[_U(dst)] = pf[_U(q)]
        pl[_U(dst)] = pl[_U(q)]
        pb[_U(dst)] = b
        dst += nd[_U(4 * b + 2)] >= 0
    n_pool = dst
    return n_pool, n_all


@jit_helper
def _mth(sel, sel2, k, m):
    """The ``m``-th lowest of ``sel[:k]``: sorted by the smallest bitonic network of :mod:`._simd` that holds
    them (``sel`` readable 64 lanes), ``_kernels_bits._kth_lowest`` past 64 (``sel2`` its scratch)."""
    if k > 64:
        return _kth_lowest(sel, sel2, k, m)
    sort_small(sel, k, sel)
    return sel[_U(m - 1)]


@jit_helper
def _evict(b, nb, nd):
    """Block ``b`` (out of any list) leaves the cache: not resident, linked to the spare node ``nb``."""
    nd[_U(4 * b)] = nb
    nd[_U(4 * b + 1)] = nb
    nd[_U(4 * b + 2)] = -1


@jit_helper
def _pool_drop(qs, n, pf, pl, pb, n_pool):
    """The pool entries ``qs[:n]`` that are not negative leave, the highest first (the last entry is then never
    one still to leave); returns the new pool size. ``qs`` is left sorted."""
    for i in range(1, n):      # insertion sort, descending (a few entries)
        q = qs[_U(i)]
        j = i
        while j > 0 and qs[_U(j - 1)] < q:
            qs[_U(j)] = qs[_U(j - 1)]
            j -= 1
        qs[_U(j)] = q
    for i in range(n):
        q = qs[_U(i)]
        if q < 0:
            break
        n_pool = _pool_remove(q, pf, pl, pb, n_pool)
    return n_pool


@jit_helper
def _visit(x, g, t, inv, horizon, nd, wheel, pf, pl, pb, n_pool):
    """Move the fronts of group ``g`` (sentinel node ``x``) below ``thu`` at unit ``t`` to the pool, then file
    the group for its new front (or mark it out of the wheel when its list is empty); returns the new pool
    size. The list keeps its first member not below, whose key and every later one's is >= theta."""
    e = nd[_U(4 * x)]
    gf = float(g)
    span = _span(g, inv, horizon)
    lim = t - span             # a front last accessed at or before lim is due now
    d = t
    while e != x:
        l = nd[_U(4 * e + 2)]
        if l > lim:
            d = l + span
            break
        n = nd[_U(4 * e)]
        nd[_U(4 * e)] = e
        nd[_U(4 * e + 1)] = e
        n_pool = _pool_add(e, gf, l, pf, pl, pb, n_pool)
        e = n
    nd[_U(4 * x)] = e
    nd[_U(4 * e + 1)] = x
    if e != x:
        _file(x, d, t, wheel, nd)
    else:
        nd[_U(4 * x + 2)] = -1
    return n_pool


def replay_lfru_groups(offsets, expert, ev_layer, n_experts, n_layers, atomic, capacity, tie, count_from, hits,
                       misses, hit_flag, tune=None, trace=None, wide=False, pages=None):
    """``lfru`` under global scope (one pool of ``capacity[0]`` blocks): the decision of ``replay_select``.

    Parameters
    ----------
    offsets, expert, ev_layer
        The stream's CSR arrays (members in access order; sequential-random passes them shuffled).
    n_experts, n_layers : int
        ``N`` and ``L``; block ``l * N + e``.
    atomic : bool
        One unit per event (its index is the clock), else one per access (the access index).
    capacity : int64[1]
        The global capacity (0, or beyond ``L * N``, allowed).
    tie : int64[L*N]
        Distinct tie ranks; among equal keys the lower rank leaves first.
    count_from : int
        Events before it are replayed but not counted (warm-up).
    hits, misses : int64[L]
        Per-layer counts (accumulated).
    hit_flag : uint8[n_access] or uint8[0]
        Set to 1 on the accesses that hit, when not empty.
    tune : tuple or None
        ``(a, b, low, up, cut)`` of the pool (:data:`TUNE`, :data:`TUNE_SEQ` for sequential units where None); any
        positive values give the same decision.
    trace : int64[6] or None
        When given, accumulates the units that overflowed, those ranked in full (``theta`` raised), those whose
        cut held too few, the times ``theta`` was lowered, the units whose ``m``-th lowest key was shared past
        the ``m`` (tie ranks deciding) outside a full ranking, and the groups re-filed from the far list.
    wide : bool
        Keep the node records and the pool's blocks in int64 even where int32 holds them (it does below
        ``_NARROW_UNITS`` units and ``2**31`` nodes); for the tests.
    pages
        The allocator of the state arrays (:class:`._pages.Packed` by default: no list across a page boundary;
        ``benchmarks/placement.py`` passes others).

    The state is allocated here and the loop runs in :func:`_replay_lfru_groups`.
    """
    n_blocks = n_layers * n_experts
    n_events = offsets.shape[0] - 1
    f_max = int(np.bincount(ev_layer, minlength=1).max()) if n_events else 0   # a block counts once per event
    n_groups = f_max + 2
    max_unit = int(_max_unit(offsets, atomic))
    n_units = n_events if atomic else int(offsets[-1]) if n_events else 0
    cap = int(capacity[0])
    if tune is None:
        tune = TUNE if atomic else TUNE_SEQ
    width = min(cap, n_blocks) + max_unit + 1          # |C ∪ U| at most
    ix = np.int32 if not wide and n_units < _NARROW_UNITS and n_blocks + n_groups < 2 ** 31 else np.int64
    n_nodes = n_blocks + n_groups
    pa = Packed() if pages is None else pages      # no list across a page boundary (_pages)
    nd = pa((n_nodes, 4), ix, 0)                       # node records: next, previous, last unit / due, count / link
    nd[:, 0] = nd[:, 1] = np.arange(n_nodes)
    nd[:n_blocks, 0] = nd[:n_blocks, 1] = n_blocks     # blocks not resident link to the spare node
    nd[:, 2] = -1
    i64 = np.int64
    f64 = np.float64
    _replay_lfru_groups(offsets, expert, ev_layer, n_experts, atomic, cap, tie, count_from, hits, misses, hit_flag,
                        _HORIZON if ix is np.int32 else 2.0 ** 60, int(tune[0]), int(tune[1]), float(tune[2]), float(tune[3]), float(tune[4]),
                        np.zeros(0, i64) if trace is None else trace,
                        nd.reshape(-1), pa(_FAR + 1, ix, -1), pa(n_groups, ix),
                        pa(width + 64, f64), pa(width + 64, f64), pa(width + 64, ix),  # pool
                        pa(width + 64, f64), pa(width + 64, f64), pa(width + 64, f64),
                        pa(max_unit + 1, f64), pa(max_unit + 1, i64), pa(max_unit + 1, i64),
                        pa(2, np.uint64, 0), pa(width // 64 + 2, np.uint64, 0),
                        pa(width // 64 + 2, np.uint64, 0), pa(2 * max_unit + 2, i64))


@jit
def _replay_lfru_groups(offsets, expert, ev_layer, n_experts, atomic, cap, tie, count_from, hits, misses, hit_flag,
                        horizon, low_a, low_b, low_f, up_f, cut_f, trace, nd, wheel, allg, pf, pl, pb, px, sel, sel2, sk,
                        st, si, kb, cbits, tbits, out):
    """The loop of :func:`replay_lfru_groups`.

    ``nd`` the node records, four integers each (one array): blocks ``0 .. n_blocks-1`` then one list sentinel
    per count (node ``n_blocks + f``; that of count 0 is the spare node). A block's record is its list links
    (next, previous: itself twice in the pool, the spare node twice when not resident), its last unit (-1 when
    not resident) and its count; a sentinel's is its list's links (front, tail), the group's unit in the wheel
    (-1 when not in it) and its link in the wheel's slot. ``wheel`` the slots' first sentinels; ``pf`` / ``pl`` /
    ``pb`` the pool (count and last unit as floats, block; readable 64 lanes past its end), ``px`` its keys;
    ``cbits`` / ``tbits`` a unit's lane bits (below the cut, below theta; then below / equal to ``v``); ``out``
    what the members' loop leaves to do after it (pool entries to drop, groups to file); the rest scratch
    (``allg`` the groups taken from the wheel, ``sel`` the candidates' keys, then the tie ranks at ``v``,
    ``sk`` / ``st`` / ``si`` the full ranking's heap).
    """
    record = hit_flag.shape[0] > 0
    traced = trace.shape[0] > 0
    n_events = offsets.shape[0] - 1
    nb = tie.shape[0]
    n_pool = 0
    size = 0                           # |C| between units
    theta = 0.0                        # nothing in the pool until the first overflow ranks every resident
    thu = 0.0
    inv = np.inf
    f_pool = 0                         # a member (age 1) joins the pool when f < thu, i.e. f < f_pool
    cut = theta
    t = 0
    for i in range(n_events):
        layer = ev_layer[_U(i)]
        base = layer * n_experts
        counted = i >= count_from
        lo = offsets[_U(i)]
        hi = offsets[_U(i + 1)]
        if cap == 0:                   # every access a miss, nothing retained
            if counted:
                misses[_U(layer)] += hi - lo
            continue
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            if t & (_FAR // 2 - 1) == 0:   # the far list swept: its groups due within _FAR units to slots
                x = wheel[_U(_FAR)]
                wheel[_U(_FAR)] = -1
                while x >= 0:
                    nx = nd[_U(4 * x + 3)]
                    if traced:
                        trace[5] += 1
                    _file(x, nd[_U(4 * x + 2)], t, wheel, nd)
                    x = nx
            x = wheel[_U(t & (_FAR - 1))]  # groups due now: their fronts below thu join the pool
            wheel[_U(t & (_FAR - 1))] = -1
            while x >= 0:
                nx = nd[_U(4 * x + 3)]
                n_pool = _visit(x, x - nb, t, inv, horizon, nd, wheel, pf, pl, pb, n_pool)
                x = nx
            if record:
                for a in range(a_lo, a_hi):
                    hit_flag[_U(a)] |= np.uint8(nd[_U(4 * (base + expert[_U(a)]) + 2)] >= 0)
            n_hit = 0
            n_old = n_pool             # the pool before the unit's members (they only append to it)
            n_out = 0
            for a in range(a_lo, a_hi):
                b = base + expert[_U(a)]
                n_hit += nd[_U(4 * b + 2)] >= 0
                p = nd[_U(4 * b + 1)]  # out of its list (a no-op for a block linked to the spare node)
                n = nd[_U(4 * b)]
                if n == b:             # linked to itself: in the pool, its entry leaves below
                    out[_U(n_out)] = b
                    n_out += 1
                nd[_U(4 * p)] = n
                nd[_U(4 * n + 1)] = p
                f = nd[_U(4 * b + 3)] + 1
                nd[_U(4 * b + 3)] = f
                nd[_U(4 * b + 2)] = t
                if f < f_pool:         # key f / 1 below thu
                    nd[_U(4 * b)] = b
                    nd[_U(4 * b + 1)] = b
                    n_pool = _pool_add(b, f, t, pf, pl, pb, n_pool)
                    continue
                sn = nb + f            # to the tail of its new group
                q = nd[_U(4 * sn + 1)]
                nd[_U(4 * q)] = b
                nd[_U(4 * b + 1)] = q
                nd[_U(4 * b)] = sn
                nd[_U(4 * sn + 1)] = b
                if nd[_U(4 * sn + 2)] < 0:     # the group not in the wheel (its list was empty): filed below
                    nd[_U(4 * sn + 2)] = t
                    out[_U(n_out)] = -1 - sn
                    n_out += 1
            for j in range(n_out):     # the members' old pool entries (found among the first n_old; removed
                b = out[_U(j)]         # last first, so that none moves before it leaves), the groups to file
                if b >= 0:
                    out[_U(j)] = _pool_slot(b, pb, n_old)
                else:
                    sn = -1 - b
                    _file(sn, t + max(_span(sn - nb, inv, horizon), 1), t, wheel, nd)
                    out[_U(j)] = -1
            if n_out:
                n_pool = _pool_drop(out, n_out, pf, pl, pb, n_pool)
            n_new = (a_hi - a_lo) - n_hit
            if counted:
                hits[_U(layer)] += n_hit
                misses[_U(layer)] += n_new
            size += n_new
            if size <= cap:
                t += 1
                continue
            m = size - cap
            size = cap
            if traced:
                trace[0] += 1
            tf = float(t + 1)
            if m == 1:                 # one to leave (sequential units): the lowest key of the pool
                bk = np.inf
                for w in range((n_pool + 63) >> 6):
                    bk = min(bk, _pool_low_any(pf, pl, px, w << 6, n_pool - (w << 6), tf))
                fits = bk < theta
            else:
                n_w = (n_pool + 63) >> 6
                n_below = 0
                n_cut = 0
                for w in range(n_w):       # exact keys (float(t + 1) - float(last) is float(t - last + 1))
                    _pool_keys_any(pf, pl, px, w << 6, n_pool - (w << 6), tf, cut, theta, kb)
                    lim = lanes_below(n_pool - (w << 6))
                    cbits[_U(w)] = kb[0] & lim
                    tbits[_U(w)] = kb[1] & lim
                    n_below += np.int64(_popc(tbits[_U(w)]))
                    n_cut += np.int64(_popc(cbits[_U(w)] & tbits[_U(w)]))
                fits = n_below >= m
            if fits and m == 1:
                best = -1
                for w in range((n_pool + 63) >> 6):    # the lanes holding the lowest key (one compare a vector)
                    x = mask_eq(px[w << 6:], bk) & lanes_below(n_pool - (w << 6))
                    while x:
                        q = (w << 6) + np.int64(_cttz(x))
                        x &= x - np.uint64(1)
                        if best < 0 or tie[_U(pb[_U(q)])] < tie[_U(pb[_U(best)])]:
                            best = q
                _evict(pb[_U(best)], nb, nd)
                n_pool = _pool_remove(best, pf, pl, pb, n_pool)
                v = bk
            elif fits:
                use_cut = n_cut >= m
                if not use_cut and traced:
                    trace[2] += 1
                k = 0
                for w in range(n_w):   # the candidates: keys below min(cut, theta), or below theta
                    x = (cbits[_U(w)] & tbits[_U(w)]) if use_cut else tbits[_U(w)]
                    while x:
                        q = (w << 6) + np.int64(_cttz(x))
                        x &= x - np.uint64(1)
                        sel[_U(k)] = px[_U(q)]
                        k += 1
                v = _mth(sel, sel2, k, m)
                n_less = 0
                n_eq = 0
                for w in range(n_w):
                    lanes = px[w << 6:]
                    lim = lanes_below(n_pool - (w << 6))
                    cbits[_U(w)] = mask_lt(lanes, v) & lim
                    tbits[_U(w)] = mask_eq(lanes, v) & lim
                    n_less += np.int64(_popc(cbits[_U(w)]))
                    n_eq += np.int64(_popc(tbits[_U(w)]))
                if n_less + n_eq > m:  # equal keys at the m-th: the lowest tie ranks leave
                    if traced:
                        trace[4] += 1
                    n_e = 0            # the (m - n_less)-th lowest of their tie ranks (distinct; as floats,
                    for w in range(n_w):   # exact below 2**53), then those at or below it
                        x = tbits[_U(w)]
                        while x:
                            q = (w << 6) + np.int64(_cttz(x))
                            x &= x - np.uint64(1)
                            sel[_U(n_e)] = float(tie[_U(pb[_U(q)])])
                            n_e += 1
                    tr = _mth(sel, sel2, n_e, m - n_less)
                    for w in range(n_w):
                        x = tbits[_U(w)]
                        while x:
                            j = np.int64(_cttz(x))
                            x &= x - np.uint64(1)
                            if float(tie[_U(pb[_U((w << 6) + j)])]) <= tr:
                                cbits[_U(w)] |= np.uint64(1) << np.uint64(j)
                else:
                    for w in range(n_w):
                        cbits[_U(w)] |= tbits[_U(w)]
                for w in range(n_w - 1, -1, -1):   # the leaving entries out, from the last: the last entry
                    x = cbits[_U(w)]                # is then never one still to leave
                    while x:
                        j = np.uint64(63) - _ctlz(x)
                        x ^= np.uint64(1) << j
                        q = (w << 6) + np.int64(j)
                        _evict(pb[_U(q)], nb, nd)
                        n_pool = _pool_remove(q, pf, pl, pb, n_pool)
            if fits:
                cut = cut_f * v
                if n_pool > low_a * m + low_b and low_f * v < theta:   # a large pool: a lower theta
                    if traced:
                        trace[3] += 1
                    theta = low_f * v
                    thu = theta * _UP
                    inv = 1.0 / thu
                    f_pool = np.int64(np.ceil(min(thu, 1e18)))
            else:                      # too few below theta: every resident ranked, then theta rises
                if traced:
                    trace[1] += 1
                n_pool, n_all = _rank_all(m, t, nb, n_pool, tie, nd, wheel, allg, pf, pl, pb, px, sk, st, si)
                v = sk[0]
                theta = up_f * v
                thu = theta * _UP
                inv = 1.0 / thu
                f_pool = np.int64(np.ceil(min(thu, 1e18)))
                cut = cut_f * v
                for q in range(n_all):   # every list's fronts below the new theta to the pool
                    sn = allg[_U(q)]
                    n_pool = _visit(sn, sn - nb, t, inv, horizon, nd, wheel, pf, pl, pb, n_pool)
            t += 1
