"""Sequential per-layer lrfu on the event-atomic loop's selection: a prototype, against the slot loop.

    python benchmarks/lrfu_seq_selection.py [--steps 2600] [--pairs 5] [--rhos 0.1,0.2,0.3,0.4,0.75] [--json]
    python benchmarks/lrfu_seq_selection.py --check

Under sequential semantics a layer's cache after each access holds the ``c`` highest ``(key, tie position)`` of all
the blocks of the layer accessed so far (``c`` its quota): ``_kernels.replay_heap`` admits a miss and drops the
lowest of the residents and the miss, and an ``lrfu`` key only changes at its block's access, where it rises. So
after an event the cache holds the ``c`` highest of the residents before it and its members at their new keys
(``C ∪ U``): the selection of the event-atomic loop (``_kernels_bits._lrfu_overflow``), with a unit an access (a
member's unit is its layer's accesses before it). Only the hits need the accesses' order: a member that was resident
before the event hits where fewer than ``c`` blocks rank above its old key among the residents not yet accessed in
the event and the members accessed before it (at their new keys); any other member misses.

The prototype here (``replay_lrfu_seq_bits``, not used by the engine) decides a resident member by units where it
can: a key lies in ``[lam u, lam u + log2(S_max))`` for last unit ``u``, a layer's residents have distinct last
units (one access a unit), so a block last accessed ``W`` units after another ranks above it
(``_kernels_lrfu_window.window``): a member whose old unit is ``d`` units before the event's first and that comes
``k``-th has at most ``d + W - 1 + k`` blocks that may rank above it (fewer than ``c``: a hit), and the members from
``max(W - 1 - d, 0)`` on rank above it surely (``c`` of them: a miss). The others are counted 16 at a time against
the residents' old values in registers (``above16``), exact keys where values lie within the margins.

``--check`` compares its hits, misses and hit flags with the slot loop (``_kernels_seq.replay_lrfu_seq`` with
``on_ranks=False``: the engine's loop before session 63 moved large events to ranks, ``_kernels_lrfu_ranks``) and
with the heap loop (``_kernels.replay_heap``) on small streams at several lambdas, quotas and tie orders (exit 1
where any differs); ``--check --window 2`` forces a window narrower than lambda's on it, which the check must catch.
The timing rows alternate the prototype and the slot loop pair by pair on
``bench_vs_libcachesim.drifting_qwen_stream(steps)`` (48 x 128, B = 8, members ascending, lambda 0.5): the
prototype / slot loop ratio (min and median of the pairs), each side's median ns an access, and whether their hit
counts and flags are equal (exit 1 where not). docs/performance.md, *Session 62*, has the figures and where the
prototype's time goes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ab import checked_pairs, machine, pair_fields, positive_int, report, rho_list, yes_no  # noqa: E402

from expertcache._bits import U as _U  # noqa: E402
from expertcache._bits import popc as _popc  # noqa: E402
from expertcache._jit import jit_inline, jit_loop  # noqa: E402
from expertcache.replay._kernels import LRFU_DECAY_ZERO, _cttz, crf_decays, crf_key  # noqa: E402
from expertcache.replay._kernels_bits import (  # noqa: E402
    _LRFU_CUT_FACTORS,
    _LRFU_FLOOR,
    _LRFU_MAX_MOVES,
    _LRFU_SPAN,
    _LRFU_TINY,
    MAX_BITS_EXPERTS,
    _admit,
    _lrfu_margin,
    _lrfu_overflow,
    _lrfu_set_cut,
    lrfu_lanes,
)
from expertcache.replay._kernels_lrfu_window import MAX_WINDOW, window  # noqa: E402
from expertcache.replay._pages import Packed  # noqa: E402
from expertcache.replay._simd import (  # noqa: E402
    _I32,
    _I64,
    _f32_arrays,
    _lanes,
    _splat,
    lanes_ge,
    lrfu_cut1,
    values_at32,
)


def _make_above(n16: int):
    @intrinsic
    def _above(typingctx, cv, ck, n, hi, lo, mk, out):
        if not (_f32_arrays(cv, hi, lo) and all(isinstance(a, types.Array) and a.dtype == types.int32
                                                for a in (ck, mk, out))):
            return None
        sig = types.void(cv, ck, types.int64, hi, lo, mk, out)

        def codegen(context, builder, signature, args):
            f32 = ir.FloatType()
            vf, vi = ir.VectorType(f32, n16), ir.VectorType(_I32, n16)
            zero = ir.Constant(_I64, 0)
            hiv, lov = (builder.load(_lanes(context, builder, signature.args[q], args[q], zero, n16, f32), align=4)
                        for q in (3, 4))
            mkv = builder.load(_lanes(context, builder, signature.args[5], args[5], zero, n16, _I32), align=4)
            c_hi = cgutils.alloca_once_value(builder, ir.Constant(vi, [0] * n16))
            c_lo = cgutils.alloca_once_value(builder, ir.Constant(vi, [0] * n16))
            cvd = context.make_array(signature.args[0])(context, builder, args[0]).data
            ckd = context.make_array(signature.args[1])(context, builder, args[1]).data
            with cgutils.for_range(builder, args[2]) as loop:
                b = _splat(builder, builder.load(builder.gep(cvd, [loop.index])), vf, n16)
                valid = builder.icmp_signed(">", _splat(builder, builder.load(builder.gep(ckd, [loop.index])), vi,
                                                        n16), mkv)
                for acc, op, bound in ((c_hi, ">", hiv), (c_lo, ">=", lov)):
                    m = builder.and_(builder.fcmp_ordered(op, b, bound), valid)
                    a = builder.load(acc)
                    builder.store(builder.select(m, builder.add(a, ir.Constant(vi, [1] * n16)), a), acc)
            od = context.make_array(signature.args[6])(context, builder, args[6]).data
            ch = builder.load(c_hi)
            builder.store(ch, builder.bitcast(od, vi.as_pointer()), align=4)
            near = builder.icmp_signed(">", builder.load(c_lo), ch)
            builder.store(builder.zext(builder.bitcast(near, ir.IntType(n16)), _I32),
                          builder.gep(od, [ir.Constant(_I64, 16)]))
            return context.get_dummy_value()

        return sig, codegen

    return _above


_above8, _above16 = _make_above(8), _make_above(16)
#: The place of a lane that is not a member of the event being replayed: after every member (and of an unused lane of
#: :func:`above16`).
_NO_PLACE = np.int32(2**31 - 1)


@jit_inline
def above16(cv, ck, n, hi, lo, mk, out):
    """For up to 16 lanes ``q`` (float32 bounds ``hi[q]`` / ``lo[q]``, int32 places ``mk[q]``; 8 lanes of half the
    width where ``mk[8]`` is the largest int32, as unused lanes have) over ``n`` items ``r`` (float32 values ``cv[r]``,
    int32 places ``ck[r]``), counting only the items placed after the lane (``ck[r] > mk[q]``): ``out[q]`` (int32)
    the items above ``hi[q]``, and ``out[16]`` the bits of the lanes with an item within ``[lo[q], hi[q]]`` (more at
    least ``lo[q]`` than above ``hi[q]``). Each item one broadcast and three compares against all the lanes."""
    if mk[8] == _NO_PLACE:
        _above8(cv, ck, n, hi, lo, mk, out)
    else:
        _above16(cv, ck, n, hi, lo, mk, out)

#: Accesses of a layer below this (int32 last units, and a unit plus :data:`._kernels_lrfu_window.MAX_WINDOW`).
MAX_LAYER_ACCESSES = 2**31 - 2 * MAX_WINDOW


def fits(lam: float, n_experts: int, most_layer_accesses: int, largest_event: int) -> bool:
    """Whether :func:`replay_lrfu_seq_bits` replays a stream: a window of at most
    :data:`._kernels_lrfu_window.MAX_WINDOW` units (``lam`` about 0.04 or more), at most
    :data:`._kernels_bits.MAX_BITS_EXPERTS` experts a layer, fewer than :data:`MAX_LAYER_ACCESSES` accesses a layer,
    and every event within the table of value scales (a layer's base unit moves to an event's first unit).

    >>> fits(0.5, 128, 10**6, 64), fits(0.0, 128, 100, 8), fits(1.0, 128, 100, 128)
    (True, False, False)
    """
    return (window(lam) <= MAX_WINDOW and n_experts <= MAX_BITS_EXPERTS and most_layer_accesses < MAX_LAYER_ACCESSES
            and largest_event < _n_scale(lam, most_layer_accesses))


def _n_scale(lam: float, most_layer_accesses: int) -> int:
    """Entries of the table of value scales ``2**(lam g)``: as :func:`._kernels_bits.replay_lrfu_bits`'s."""
    n = most_layer_accesses + 1
    return min(n, int(_LRFU_SPAN / lam) + 1) if lam > 0.0 else n


def replay_lrfu_seq_bits(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, lam, count_from, hits,
                         misses, hit_flag, w=None):
    """Sequential (one unit per access), per-layer ``lrfu``: the decision of :func:`._kernels.replay_heap`, where
    :func:`fits` holds. Parameters are those of :func:`._kernels_bits.replay_lrfu_bits` without ``pages``, and ``w``
    the window of units taken to decide two keys (``window(lam)`` unless given: a smaller one is wrong, for the check
    of the check). The state is allocated here and the loop runs in :func:`_replay_lrfu_seq_bits`."""
    lam = float(lam)
    n_words = (n_experts + 63) // 64
    npad = n_words * 64
    sizes = np.diff(offsets)
    most = int(np.bincount(ev_layer, weights=sizes, minlength=n_layers).max()) if sizes.shape[0] else 0
    largest = int(sizes.max()) if sizes.shape[0] else 0
    if not fits(lam, n_experts, most, largest):
        raise ValueError("replay_lrfu_seq_bits: lrfu_lambda, the experts, a layer's accesses or an event are past "
                         "its bounds (fits)")
    width = max(min(int(np.max(capacity, initial=0)) + largest, n_experts) + 1, 64)      # |C ∪ U| at most
    n_tab = min(most + 1, int(LRFU_DECAY_ZERO / lam) + 2)                # every decay the stream needs that is not 0
    tie_pos = tie_pos.astype(np.int16)
    pa = Packed()
    state = (pa(n_layers, np.int64, 0), pa((n_layers, n_words), np.uint64, 0), pa(n_words, np.uint64, 0),
             pa(n_words, np.uint64, 0), pa((4, n_words), np.uint64, 0), pa(4, np.uint64, 0),
             pa(n_layers * npad, np.float64, 0), pa(n_layers * npad, np.int32, -1),
             pa(n_layers * npad, np.float32, 0), pa(n_layers, np.int64, 0), pa(n_layers, np.int64, 0),
             pa.copy(crf_decays(lam, max(n_tab, 2))), pa.copy(2.0 ** (lam * np.arange(_n_scale(lam, most)))),
             pa(n_layers, np.float64, 0), pa(4, np.float64), pa(8, np.float32), pa(width, np.int64),
             pa(width + 64, np.float64), pa(width, np.float64), pa(width, np.float64), pa(width, np.float64),
             pa(4, np.int64, 0), pa(width + 64, np.float32), pa.copy(lrfu_lanes(tie_pos, n_layers, n_experts)),
             _LRFU_MAX_MOVES, pa.copy(np.tile(np.array(_LRFU_CUT_FACTORS), (n_layers, 1))),
             pa(n_layers, np.float64, 1.0), window(lam) if w is None else w, pa(largest + 1, np.int64),
             pa(npad, np.int32, _NO_PLACE), pa(n_words, np.uint64), pa(npad, np.int32), pa(npad + 64, np.float32),
             pa(npad + 64, np.int32),
             pa(16, np.float32), pa(16, np.float32), pa(16, np.int32), pa(17, np.int32), pa(MAX_WINDOW, np.float64),
             pa(MAX_WINDOW, np.float64))

    _replay_lrfu_seq_bits(offsets, expert, ev_layer, n_experts, capacity, lam, count_from, hits, misses, hit_flag,
                          *state)


@jit_inline
def _new_above(j, p, k, u0, W, lo_, hi, jl, nvf, nsf, S, lam):
    """Of the members before member ``k`` (lane ``j``, old unit ``p``, old CRF in ``S``; margins ``lo_`` / ``hi``
    around its old value), how many rank above its old key at their new keys: those from ``max(p + W - u0, 0)`` on
    surely (last units ``W`` or more after ``p``), the ones before by their new values ``nvf`` or, within the
    margins, their exact keys (new CRFs ``nsf``)."""
    q = max(p + W - u0, 0)
    c = k - q if k > q else 0
    n = min(q, k)
    near = 0
    for k2 in range(n):
        c += np.int64(nvf[k2] > hi)
        near += np.int64(nvf[k2] >= lo_) & np.int64(nvf[k2] <= hi)
    if near:
        kk = crf_key(S[_U(j)], float(p), lam)
        for k2 in range(n):
            if lo_ <= nvf[k2] <= hi:
                j2 = jl[_U(k2)]
                kn = crf_key(nsf[k2], float(u0 + k2), lam)
                c += np.int64(kn > kk or (kn == kk and j2 > j))
    return c


@jit_inline
def _count_above(mem, ul, R, n_words, pbase, u0, cap, W, k, j, kx, jl, nvf, nsf, S, PL, V, lam, delta, th, thv,
                 w8):
    """How many blocks rank above the old key of member ``k`` (lane ``j``, resident before the event) when it is
    accessed, counted until ``cap``, from the layer's state before the event: the members before it at their new
    keys, and the residents other than the resident members before it (``R`` the resident members, ``kx`` a
    member's place by tie position) at their old ones. Values decide where they differ by more than the margins
    (``3 delta``; a cut of the residents' values a word, ``_simd.lrfu_cut1``), exact keys elsewhere (a value of 0
    stands for any below ``_LRFU_TINY``: every value up to the floor is compared by its exact key)."""
    one = np.uint64(1)
    p = np.int64(PL[_U(j)])
    tk = j - pbase
    kk = np.inf                        # its exact key, computed where a value lies within the margins
    v = np.float64(V[_U(j)])
    tiny = v < _LRFU_FLOOR
    _lrfu_set_cut(th, thv, 0, v, 3.0 * delta)       # (raised to the floor where below it)
    hi = np.float64(thv[1])
    lo_ = -1.0 if tiny else np.float64(thv[0])
    c = _new_above(j, p, k, u0, W, lo_, hi, jl, nvf, nsf, S, lam)
    for w in range(n_words):           # the residents but the resident members up to it
        if c >= cap:
            break
        o = w << 6
        x = mem[ul, w] & ~(R[w] & ~lanes_ge(kx, o, k + 1))
        lrfu_cut1(V, pbase + o, thv, w8, 0)
        c += np.int64(_popc(x & ~w8[1]))
        near = x & w8[1] & (w8[1] if tiny else ~w8[0])
        if near:
            kk = crf_key(S[_U(j)], float(p), lam) if kk == np.inf else kk
        while near:
            j3 = pbase + o + np.int64(_cttz(near))
            near &= near - one
            kr = crf_key(S[_U(j3)], float(PL[_U(j3)]), lam)
            c += np.int64(kr > kk or (kr == kk and j3 - pbase > tk))
    return c


@jit_loop
def _replay_lrfu_seq_bits(offsets, expert, ev_layer, n_experts, capacity, lam, count_from, hits, misses, hit_flag,
                          size, mem, ev, cu, msk, w8, S, PL, V, lunits, ubase, P, scale, centre, th, thv, cpos, ckey,
                          sel, sel2, fb, cnt, band, lane, max_moves, fac, spread, W, jl, kx, R, ut, cv, ck, mhi, mlo,
                          mk, cnt16, nvf, nsf):
    """The loop of :func:`replay_lrfu_seq_bits`: the state arrays of :func:`._kernels_bits._replay_lrfu_bits`
    (``PL`` a lane's last unit, one an access), ``P`` the decays up to where they are 0, ``W`` the window of units
    that decides two keys; for an event, its members' lanes ``jl``, each member's place by tie position ``kx`` and
    its resident members ``R``. An event's members are listed, its resident members' hits found from the state
    before it, and then its members' new state written."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_words = (n_experts + 63) // 64
    npad = n_words * 64
    n_scale = scale.shape[0]
    last = P.shape[0] - 1                # every longer gap's decay is 0, as this one's (or no gap is longer)
    one = np.uint64(1)
    zero = np.uint64(0)
    kxf = kx.view(np.float32)           # (places compressed as values_at32 compresses values)
    ckf = ck.view(np.float32)
    for i in range(n_events):
        layer = ev_layer[i]
        ul = _U(layer)
        cap = capacity[ul]
        base = layer * n_experts
        pbase = layer * npad
        lo = offsets[i]
        n_mem = offsets[i + 1] - lo
        u0 = lunits[ul]
        lunits[ul] = u0 + n_mem
        if n_mem == 0:
            continue
        u = u0 + n_mem - 1             # the event's last unit: the margins, the centre's scale
        if u - ubase[ul] >= n_scale:   # the base moves to the event's first unit: the residents' values again (no
            for w in range(n_words):   # other lane's value is read before its next access writes it)
                x = mem[ul, w]
                while x:
                    j = pbase + (w << 6) + np.int64(_cttz(x))
                    x &= x - one
                    y = S[_U(j)] * P[_U(min(u0 - PL[_U(j)], last))]
                    V[_U(j)] = np.float32(y) if y >= _LRFU_TINY else np.float32(0.0)
            ubase[ul] = u0
        g0 = u0 - ubase[ul]
        for w in range(n_words):
            ev[w] = zero
        for k in range(n_mem):         # the members: lanes, places, bits
            j = np.int64(lane[_U(base + expert[_U(lo + k)])])
            jl[k] = j
            tp = _U(j - pbase)
            kx[tp] = np.int32(k)
            ev[tp >> np.uint64(6)] |= one << (tp & np.uint64(63))
        n_res = 0
        for w in range(n_words):
            R[w] = ev[w] & mem[ul, w]
            n_res += np.int64(_popc(R[w]))
        n_hit = 0
        nu = 0                         # a resident member hits surely where fewer than cap blocks can rank above it
        for w in range(n_words):       # (d + W - 1 residents, k members), misses surely where cap members before it
            x = R[w]                   # do (from max(W - 1 - d, 0) on); the others are counted
            while x:
                tp = (w << 6) + np.int64(_cttz(x))
                x &= x - one
                k = np.int64(kx[_U(tp)])
                d = u0 - 1 - np.int64(PL[_U(pbase + tp)])
                sure = np.int64(d + W - 1 + k < cap)
                n_hit += sure
                ut[nu] = np.int32(tp)
                nu += (1 - sure) & (np.int64(k < cap) | np.int64(k + d < cap + W - 1))
                if record:
                    hit_flag[_U(lo + k)] = np.uint8(sure)
        if nu:                         # the residents' old values and places (kx: a large place outside the event),
            delta = _lrfu_margin(u, lam)   # 16 members counted at once (above16), the layer as before the event
            for k2 in range(min(W - 1, n_mem)):    # the first members' new CRFs and values
                j2 = _U(jl[k2])
                s2 = 1.0 + S[j2] * P[_U(min(u0 + k2 - PL[j2], last))]
                nsf[k2] = s2
                nvf[k2] = s2 * scale[_U(g0 + k2)]
            for q in range(16):
                mhi[q] = np.float32(np.inf)
                mlo[q] = np.float32(np.inf)
                mk[q] = _NO_PLACE
            nc = 0
            for w in range(n_words):
                values_at32(kxf, w << 6, mem[ul, w], ckf, nc)
                nc = values_at32(V, pbase + (w << 6), mem[ul, w], cv, nc)
            for b0 in range(0, nu, 16):
                nq = min(16, nu - b0)
                for q in range(nq):
                    tp = np.int64(ut[b0 + q])
                    v = np.float64(V[_U(pbase + tp)])
                    mhi[q] = np.float32(max(v, _LRFU_FLOOR) * (1.0 + 3.0 * delta))
                    mlo[q] = np.float32(-1.0 if v < _LRFU_FLOOR else v * (1.0 - 3.0 * delta))
                    mk[q] = kx[_U(tp)]
                for q in range(nq, 16):
                    mhi[q] = np.float32(np.inf)
                    mlo[q] = np.float32(np.inf)
                    mk[q] = _NO_PLACE
                above16(cv, ck, nc, mhi, mlo, mk, cnt16)
                near = np.int64(cnt16[16])
                for q in range(nq):
                    tp = np.int64(ut[b0 + q])
                    j = pbase + tp
                    k = np.int64(kx[_U(tp)])
                    if (near >> q) & 1:    # a resident within the margins: every count again, exact where near
                        c = _count_above(mem, ul, R, n_words, pbase, u0, cap, W, k, j, kx, jl, nvf, nsf, S, PL, V,
                                         lam, delta, th, thv, w8)
                    else:
                        c = np.int64(cnt16[q]) + _new_above(j, np.int64(PL[_U(j)]), k, u0, W, np.float64(mlo[q]),
                                                            np.float64(mhi[q]), jl, nvf, nsf, S, lam)
                    hit = np.int64(c < cap)
                    n_hit += hit
                    if record:
                        hit_flag[_U(lo + k)] = np.uint8(hit)
        if i >= count_from:
            hits[ul] += n_hit
            misses[ul] += n_mem - n_hit
        for k in range(n_mem):         # the members' new CRF, unit and value
            j = _U(jl[k])
            kx[j - _U(pbase)] = _NO_PLACE
            s = 1.0 + S[j] * P[_U(min(u0 + k - PL[j], last))]      # (a first access: S 0, PL -1)
            S[j] = s
            PL[j] = u0 + k
            V[j] = np.float32(s * scale[_U(g0 + k)])
        if cap == 0:
            continue
        m = _admit(mem, ev, size, layer, n_words, n_mem - n_res, cap)
        if m == 0:
            continue
        _lrfu_overflow(mem, size, layer, cap, m, u, scale[_U(u - ubase[ul])], lam, ubase, centre, fac, spread, th,
                       thv, cu, ev, msk, w8, cnt, V, S, PL, ckey, sel, sel2, fb, band, cpos, max_moves)


def _heap_counts(s, caps, tie, lam):
    """The heap loop's hits, misses and flags (``_kernels.replay_heap``, sequential, per layer): the twin."""
    from expertcache.replay import keys
    from expertcache.replay._kernels import replay_heap

    L, N = s.n_layers, s.n_experts
    h, m, f = np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(s.union, np.uint8)
    replay_heap(s.offsets, s.expert, s.layer, s.step, N, L, False, False, np.zeros(0, np.int32), caps, tie,
                keys.KEY_LRFU, False, lam, 0, h, m, f)
    return h, m, f


def _slot_loop(*args) -> None:
    """``_kernels_seq.replay_lrfu_seq`` on its slot loop (not on ranks), the prototype's peer."""
    from expertcache.replay._kernels_seq import replay_lrfu_seq

    replay_lrfu_seq(*args, on_ranks=False)


def _counts(loop, s, caps, tie_pos, lam, *extra):
    """A loop's hits, misses and flags (the parameters of ``_kernels_bits.replay_lrfu_bits``, then ``extra``)."""
    L, N = s.n_layers, s.n_experts
    h, m, f = np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(s.union, np.uint8)
    loop(s.offsets, s.expert, s.layer, N, L, caps, tie_pos, lam, 0, h, m, f, *extra)
    return h, m, f


def check(w: int | None = None) -> int:
    """The prototype's hits, misses and flags against the slot loop's and the heap loop's on small streams: the
    benchmark stream's first 60 steps and ``routed_stream`` shapes (batch 1 to 64, 2 to 256 experts a layer), two tie
    orders, lambda 0.1 / 0.5 / 1, quotas from 0 to every expert; ``w`` a window of units forced on the prototype.
    Prints each difference; 1 where any."""
    from bench_scaling import routed_stream
    from bench_vs_libcachesim import drifting_qwen_stream

    from expertcache.replay import engine

    streams = [("drifting, 60 steps", drifting_qwen_stream(60, sample_seed=1)),
               ("8 x 128, B = 1", routed_stream(8, 128, 1, 100_000)),
               ("6 x 64, B = 64", routed_stream(6, 64, 64, 100_000)),
               ("4 x 256, B = 4", routed_stream(4, 256, 4, 50_000)),
               ("5 x 5, top-2, B = 2", routed_stream(5, 5, 2, 10_000, 2)),
               ("2 x 8, top-2, B = 1", routed_stream(2, 8, 1, 20_000, 2))]
    bad = 0
    n = 0
    for name, s in streams:
        L, N = s.n_layers, s.n_experts
        for seed in (0, 1):
            tie = engine._tie_ranks("random", seed, L * N)
            tie_pos = engine._tie_order(tie, L, N)[1]
            for lam in (0.1, 0.5, 1.0):
                for rho in (0.0, 0.05, 0.1, 0.2, 0.4, 0.75, 1.0):
                    caps = engine.capacities_for_rho(rho, L, N)
                    ours = _counts(replay_lrfu_seq_bits, s, caps, tie_pos, lam, w)
                    peers = [("slot", _counts(_slot_loop, s, caps, tie_pos, lam))]
                    if seed == 0 and s.union <= 200_000:
                        peers.append(("heap", _heap_counts(s, caps, tie, lam)))
                    for peer, counts in peers:
                        n += 1
                        if not all(np.array_equal(a, b) for a, b in zip(ours, counts, strict=True)):
                            bad += 1
                            print(f"differs from the {peer} loop: {name}, tie seed {seed}, lambda {lam}, rho {rho}: "
                                  f"{int(ours[0].sum())} hits against {int(counts[0].sum())}")
    print(f"{n - bad} of {n} comparisons equal (hits, misses and hit flags)")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=2600, help="steps of the benchmark stream (default 2600)")
    ap.add_argument("--pairs", type=positive_int, default=5, help="alternated pairs a row (default 5)")
    ap.add_argument("--rhos", type=rho_list, default=[0.1, 0.2, 0.3, 0.4, 0.75],
                    help="comma list (default 0.1,0.2,0.3,0.4,0.75)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--check", action="store_true", help="compare with the slot and heap loops on small streams")
    ap.add_argument("--window", type=positive_int, default=None,
                    help="with --check: force this window of units on the prototype (a smaller one than lambda's is "
                         "wrong: the check must then find differences)")
    args = ap.parse_args()
    if args.window is not None and not args.check:
        ap.error("--window goes with --check")
    if args.check:
        return check(args.window)
    from bench_vs_libcachesim import drifting_qwen_stream

    from expertcache.replay import engine

    s = drifting_qwen_stream(args.steps, sample_seed=1)
    L, N = s.n_layers, s.n_experts
    tie_pos = engine._tie_order(engine._tie_ranks("random", 0, L * N), L, N)[1]
    rows = []
    for rho in args.rhos:
        caps = engine.capacities_for_rho(rho, L, N)

        def timed(first: bool, record: bool, caps=caps) -> tuple:
            h, m = np.zeros(L, np.int64), np.zeros(L, np.int64)
            f = np.zeros(s.union if record else 0, np.uint8)
            loop = replay_lrfu_seq_bits if first else _slot_loop
            t0 = time.perf_counter()
            loop(s.offsets, s.expert, s.layer, N, L, caps, tie_pos, 0.5, 0, h, m, f)
            return time.perf_counter() - t0, h, m, f

        first, second, equal = checked_pairs(timed, args.pairs)
        rows.append({"rho": rho, "capacity": int(caps[0]),
                     **pair_fields(("prototype", "slot"), first, second, s.union), "hits_equal": equal})
    meta = {"machine": machine(), "steps": args.steps, "pairs": args.pairs, "union": s.union}
    header = [f"machine: {meta['machine']}",
              f"sequential per-layer lrfu (lambda 0.5), {args.steps} steps ({s.union:,} accesses), {args.pairs} "
              "alternated pairs: prototype / slot loop",
              f"{'rho':>5} {'c':>4} {'ratio min':>9} {'median':>7} {'prototype ns':>12} {'slot ns':>10} "
              f"{'hits equal':>10}"]
    return report(rows, args.json, meta, header,
                  lambda r: f"{r['rho']:>5} {r['capacity']:>4} {r['ratio_min']:>9.3f} {r['ratio']:>7.3f} "
                            f"{r['prototype_ns']:>12.2f} {r['slot_ns']:>10.2f} {yes_no(r['hits_equal']):>10}")


if __name__ == "__main__":
    sys.exit(main())
