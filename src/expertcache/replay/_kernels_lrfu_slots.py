"""numba kernel for event-atomic ``lrfu`` under global scope: dense slots, float32 values and vector cuts.

LRFU's key ``log2(S) + lam * u`` (:func:`expertcache.replay._kernels.crf_key`; ``S`` a block's CRF at its last
access, ``u`` that access's unit of the block's layer) changes only when its block is accessed, and then rises. The
pool loop (:mod:`._kernels_lrfu_global`) keeps the residents with the lowest keys in a sorted run: a logarithm a
member, a sort and merges at every fill, a check at every pop. Here an overflowing event is decided as the per-layer
loop :func:`._kernels_bits.replay_lrfu_bits` decides a layer's, over *slots* instead of tie positions:

* the residents and the event's misses sit in dense slots (a miss takes a free slot, the last freed first, so that
  the slots ever used stay about ``C ∪ U``), marked in a bitset; a slot holds its block and a float32 *value*
  ``V = S * 2**(lam * (u - R))`` for a global base unit ``R``: ``2**(key - lam R)``, which ranks like the key and
  costs a multiplication a member where the key takes a logarithm. The members take their slots with no branch on
  their outcome;
* when ``C ∪ U`` overflows the quota by ``m``, one vector pass over the slots' words ranks every value against two
  inner cuts (:func:`._simd.lrfu_cut2`; a value within the margin of a cut is placed by its exact key); where one
  does not do, an outer cut moves out until the low cut holds at most ``m`` and the high one at least ``m``. The
  slots below the low cut leave, and the ``need`` lowest of the band between are found by their values in registers
  (up to 16, :func:`._simd.lrfu_pick32`) or a sorting network (up to 64); a wider band is first halved in key space.
  Where the ``need``-th and the next value are not separated by the margin, or the band stays wider, exact keys
  decide (kept per slot until its block is accessed; a CRF of 1 needs no logarithm), and of keys equal to the
  ``need``-th the lowest tie positions leave;
* the cuts sit around a prediction of the next ``need``-th value: the last one times a running mean of its step per
  leaving block, to the power of the next overflow (the leaving values rise steadily as the oldest blocks go), at a
  spread that halves after a band wider than 16 and doubles after an outer cut was needed; a cut that would fall
  within the margin of the last ``need``-th value, which many blocks often share (those accessed once in one unit),
  is moved just off it, so that their exact keys are not needed.

Each layer keeps its own unit clock, so the layers' units differ where their events do. The base ``R`` moves to an
event's unit when that unit lies :data:`._kernels_bits._LRFU_SPAN` / ``lam`` past it (every resident's value is then
computed again from its CRF and last unit, as the per-layer loop does); a layer behind the base scales its members by
``2**(-lam (R - u))``. Values below ``2**-110`` are kept as 0 (surely below every cut, ranked by exact keys where
they matter), so streams whose layers drift far apart stay exact, only slower. The margin is the per-layer loop's
(:func:`._kernels_bits._lrfu_margin`) at the largest unit so far.

The cost of an overflow is a pass over the slots' words (8-10 ns a word of 64 on the AMD core), so the engine
takes this loop for caches of up to :data:`SLOTS_PER_MEMBER` blocks per member of a mean event and the pool loop
beyond. The decision, the hit counts and the hit flags are those of :func:`._kernels_ranked.replay_ranked` for
``lrfu`` (``tests/test_lrfu_slots.py``: against the heap loop and the pool loop).
"""

from __future__ import annotations

import numpy as np

from .._jit import jit_helper, jit_loop
from ._kernels import _cttz, _max_unit, crf_decays, crf_key
from ._kernels_bits import (
    _LRFU_DECAYS,
    _LRFU_FLOOR,
    _LRFU_MAX_MOVES,
    _LRFU_MIN_STEP_DOWN,
    _LRFU_MIN_STEP_UP,
    _LRFU_SPAN,
    _LRFU_TINY,
    _U,
    MAX_LRFU_EVENTS,
    _band_leave,
    _kth_lowest,
    _lrfu_decay,
    _lrfu_margin,
    _lrfu_set_cut,
    _most_layer_events,
    _popc,
    lrfu_cut_word,
    lrfu_place,
    lrfu_rank_band,
)
from ._simd import bit_positions, pdep, values_at32

#: The four cuts around a centre ``c``: ``c * 2**(spread * f)`` for these ``f`` (outer low, inner low, inner high,
#: outer high); ``spread`` halves after a band wider than 16 and doubles after an outer cut was needed, within
#: :data:`_SPREAD_MIN` and :data:`_SPREAD_MAX` (log2 units; the per-layer loop's fixed cuts are 0.08 / 0.25).
_CUT_SPREADS = (-3.25, -1.125, 0.875, 2.75)
_SPREAD_MIN = 2.0 ** -12
_SPREAD_MAX = 0.5
_SPREAD_START = 0.08
#: A band wider than 64 is halved in key space by a cut at its middle up to this many times (or until two halvings
#: in a row keep more than 7/8 of it: equal values) before its exact keys rank it.
_HALVES = 24
#: The predicted ``need``-th value's step per leaving block moves this share of the way to each overflow's own.
_RATE = 0.25
#: The engine replays here global caches of at most this many blocks per member of a mean event (the pool loop
#: beyond: an overflow's pass grows with the cache, the pool's work with the unit). Measured with
#: ``python benchmarks/lrfu_slots.py`` (docs/performance.md, *Session 46*): slots / pool 0.45 / 1.39 at 38 / 77
#: blocks per member at B = 1 (1 at about 60), 0.74 / 1.20 at 61 / 92 at B = 8 (1 at about 80), 0.67-1.05 at 3-33
#: at B = 64.
SLOTS_PER_MEMBER = 64


def fits(n_events: int, n_accesses: int, cap: int) -> bool:
    """Whether the engine replays a global ``lrfu`` cache of ``cap`` blocks here: at most :data:`SLOTS_PER_MEMBER`
    blocks per member of a mean event, on a stream whose last units fit int32 (:data:`._kernels_bits.MAX_LRFU_EVENTS`).

    >>> fits(100, 4000, 2560), fits(100, 4000, 2561), fits(0, 0, 1)
    (True, False, False)
    """
    return 0 < n_events < MAX_LRFU_EVENTS and cap <= SLOTS_PER_MEMBER * n_accesses / n_events


def replay_lrfu_slots(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, lam, count_from, hits,
                      misses, hit_flag, max_moves=None, span=None):
    """Event-atomic ``lrfu`` with one global pool of ``capacity[0]`` blocks (the decision of ``replay_ranked``).

    ``tie_pos[b]`` is block ``b``'s position among all ``n_layers * n_experts`` blocks by ascending tie rank (lower
    leaves first among equal keys); the other parameters are those of :func:`._kernels_bits.replay_lrfu_bits`.
    ``max_moves`` bounds an outer cut's moves (:data:`._kernels_bits._LRFU_MAX_MOVES`) and ``span`` the units a base
    holds (tests pass small ones, so that every path runs on small streams). The state is allocated here and the
    loop runs in :func:`_replay_lrfu_slots`.
    """
    n_blocks = n_layers * n_experts
    cap = min(int(capacity[0]), n_blocks)
    max_unit = int(_max_unit(offsets, True))
    n_words = (min(cap + max_unit, n_blocks) + 63) // 64 + 1           # C ∪ U at most, in whole words
    n_slots = n_words * 64
    n_units = int(_most_layer_events(ev_layer, n_layers))
    lam = float(lam)
    n_scale = min(n_units + 1, _LRFU_DECAYS)
    if lam > 0.0:
        n_scale = min(n_scale, int(_LRFU_SPAN / lam) + 1)             # lam * (n_scale - 1) <= _LRFU_SPAN
    if span is not None:
        n_scale = max(min(n_scale, int(span)), 1)
    width = min(cap + max_unit, n_blocks) + 64
    z = np.zeros
    _replay_lrfu_slots(offsets, expert, ev_layer, n_experts, cap, tie_pos.astype(np.int64), lam, count_from, hits,
                       misses, hit_flag, z(n_blocks), np.full(n_blocks, -1, np.int32), np.full(n_blocks, -1, np.int32),
                       z(n_slots, np.float32), z(n_slots, np.int32), np.full(n_slots, np.nan), z(n_words, np.uint64),
                       np.arange(n_slots - 1, -1, -1, dtype=np.int32), z(max(n_layers, 1), np.int64),
                       crf_decays(lam, min(n_units + 1, _LRFU_DECAYS)),
                       2.0 ** (lam * np.arange(n_scale, dtype=np.float64)), z(4), z(8, np.float32), z(4, np.uint64),
                       z((4, n_words), np.uint64), z(4, np.int64), z(n_words, np.uint64), z(128, np.float32),
                       z(width), z(width), z(width), z(width), z(width, np.int64), z(n_slots + 64, np.int32),
                       _LRFU_MAX_MOVES if max_moves is None else max(int(max_moves), 0))


@jit_helper
def _slot_key(S, PL, sB, sK, j, lam):
    """The exact key of the block in slot ``j`` (:func:`expertcache.replay._kernels.crf_key`), kept in ``sK[j]``
    until the block is accessed (NaN: not known)."""
    c = sK[_U(j)]
    if c != c:
        t = _U(sB[_U(j)])
        x = S[t]
        c = lam * float(PL[t]) if x == 1.0 else crf_key(x, float(PL[t]), lam)   # (log2(1) is 0: the same bits)
        sK[_U(j)] = c
    return c


@jit_helper
def _cut_pass(V, S, PL, sB, sK, lam, lam_r, occ, n_w, th, thv, w4, msk, qa, qb, cnt):
    """Cuts ``qa`` and ``qb`` (one cut where they are equal) over the occupied slots ``occ`` of the first ``n_w``
    words: ``msk[q]`` the slots whose key is at most the cut's key ``log2(th[q]) + lam_r``, ``cnt[q]`` how many. The
    values place a slot surely (:func:`._simd.lrfu_cut2`); one within the margin is placed by its exact key."""
    one = np.uint64(1)
    ca = 0
    cb = 0
    for w in range(n_w):
        o = w << 6
        sa, sb, ua, ub = lrfu_cut_word(V, o, thv, w4, qa, qb, occ[w])
        un = ua | ub
        while un:                      # a value within the margin of a cut (rare): the exact keys decide
            j = np.int64(_cttz(un))
            un &= un - one
            sa, sb = lrfu_place(_slot_key(S, PL, sB, sK, o + j, lam), one << _U(j), ua, ub, sa, sb, th, qa, qb, lam_r)
        msk[qa, w] = sa
        msk[qb, w] = sb
        ca += np.int64(_popc(sa))
        cb += np.int64(_popc(sb))
    cnt[qa] = ca
    cnt[qb] = cb


@jit_helper
def _set_cut(th, thv, q, t, delta, near):
    """:func:`._kernels_bits._lrfu_set_cut` with a cut within ``16 delta`` of ``near`` (the last ``need``-th value,
    often shared by many blocks: their exact keys would place each) moved ``32 delta`` away from it."""
    if near > 0.0 and abs(t - near) <= 16.0 * delta * near:
        t = near * (1.0 - 32.0 * delta) if t <= near else near * (1.0 + 32.0 * delta)
    _lrfu_set_cut(th, thv, q, t, delta)


@jit_helper
def _leave_exact(key, ctp, pos, k, need, buf, scratch, lv):
    """Of the ``k`` slots ``pos[:k]`` with exact keys ``key[:k]`` and tie positions ``ctp[:k]``, the ``need`` lowest
    ``(key, tie position)`` marked in the words ``lv``; returns the ``need``-th key. ``buf`` and ``scratch`` hold
    ``k``."""
    for r in range(k):
        buf[_U(r)] = key[_U(r)]
    v = _kth_lowest(buf, scratch, k, need)
    n_less = 0
    n_eq = 0
    for r in range(k):
        c = key[_U(r)]
        n_less += c < v
        n_eq += c == v
    eq = need - n_less
    tr = np.inf                        # of the keys equal to v, those at tie positions up to tr leave
    if eq < n_eq:
        q = 0
        for r in range(k):
            if key[_U(r)] == v:
                buf[_U(q)] = ctp[_U(r)]
                q += 1
        tr = _kth_lowest(buf, scratch, n_eq, eq)
    for r in range(k):
        c = key[_U(r)]
        if c < v or (c == v and ctp[_U(r)] <= tr):
            j = pos[_U(r)]
            lv[_U(j >> 6)] |= np.uint64(1) << _U(j & 63)
    return v


@jit_helper
def _band_exact(S, PL, sB, sK, tie_pos, occ, msk, a, b, n_w, lam, lam_r, need, ckey, ctp, pos, sel, sel2, lv, every):
    """The band's slots (below cut ``b``, not below cut ``a``; every occupied slot where ``every``) ranked by exact
    keys: the ``need`` lowest ``(key, tie position)`` marked in ``lv`` with every slot below cut ``a`` (none where
    ``every``); returns the ``need``-th key's value ``2**(key - lam_r)``."""
    one = np.uint64(1)
    q = 0
    for w in range(n_w):
        x = occ[w] if every else msk[b, w] & ~msk[a, w]
        lv[w] = np.uint64(0) if every else msk[a, w]
        while x:
            j = (w << 6) + np.int64(_cttz(x))
            x &= x - one
            ckey[_U(q)] = _slot_key(S, PL, sB, sK, j, lam)
            ctp[_U(q)] = float(tie_pos[_U(sB[_U(j)])])
            pos[_U(q)] = j
            q += 1
    return 2.0 ** (_leave_exact(ckey, ctp, pos, q, need, sel, sel2, lv) - lam_r)


@jit_helper
def _touch(expert, lo, hi, base, u, qu, lam, S, PL, P, where, sB, sV, sK, occ, free, nf, j_max, record, hit_flag):
    """The members ``lo .. hi`` of a unit ``u`` (scale ``qu``): each block's CRF, last unit and value, its slot (a
    miss's from the free stack, ``nf`` on it, with no branch on the outcome); returns ``(hits, nf, j_max)``, the
    highest slot taken so far in ``j_max``."""
    one = np.uint64(1)
    n_hit = 0
    for a in range(lo, hi):
        t = _U(base + expert[_U(a)])
        s = 1.0 + S[t] * _lrfu_decay(P, lam, u - PL[t])          # a first access: S 0, its CRF 1
        S[t] = s
        PL[t] = u
        y = s * qu
        jo = np.int64(where[t])
        jn = np.int64(free[_U(nf - 1)])
        miss = jo >> 63               # -1 for a miss, 0 for a hit (a select here compiled to a branch)
        j = (jn & miss) | (jo & ~miss)
        nf += miss
        n_hit += 1 + miss
        if record:
            hit_flag[_U(a)] |= np.uint8(1 + miss)
        where[t] = j
        sB[_U(j)] = np.int32(t)
        occ[_U(j >> 6)] |= one << _U(j & 63)
        j_max = max(j_max, j)
        sV[_U(j)] = np.float32(y) if y >= _LRFU_TINY else np.float32(0.0)
        sK[_U(j)] = np.nan
    return n_hit, nf, j_max


@jit_loop
def _replay_lrfu_slots(offsets, expert, ev_layer, n_experts, cap, tie_pos, lam, count_from, hits, misses, hit_flag,
                       S, PL, where, sV, sB, sK, occ, free, lunits, P, scale, th, thv, w4, msk, cnt, lv, band, ckey,
                       ctp, sel, sel2, pos, lst, max_moves):
    """The loop of :func:`replay_lrfu_slots`. Per block (``layer * n_experts + expert``, so that an event's state is
    one layer's lines): the CRF ``S``, the layer unit of the last access ``PL`` (-1: none), the slot ``where`` it is
    resident in (-1: none); per slot its value ``sV``, block ``sB`` and exact key ``sK`` (NaN until needed), ``occ``
    the occupied slots as bits; ``free`` the free slots, a stack; ``P[g] = 2**(-lam g)``, ``scale[g] = 2**(lam g)``;
    ``th`` / ``thv`` the unit's four cuts and their sure / maybe bounds, ``msk[q]`` / ``cnt[q]`` the slots below cut
    ``q`` / how many; ``lv`` the leaving slots as bits; the rest scratch."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_scale = scale.shape[0]
    one = np.uint64(1)
    zero = np.uint64(0)
    nf = free.shape[0]                 # free slots, the next on top
    n_occ = 0
    n_w = 0                            # words holding every slot ever taken
    j_max = -1
    base_u = 0                         # the base unit R
    u_max = 0
    spread = _SPREAD_START
    lc = 0.0                           # log2 of the last need-th value (relative to the base)
    per = 0.0                          # its mean step per leaving block
    have = False
    vprev = 0.0
    for i in range(n_events):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        u = lunits[layer]
        lunits[layer] = u + 1
        u_max = max(u_max, u)
        g = u - base_u
        if g >= n_scale:               # the base moves to this unit (every resident's last unit is below it):
            vprev *= _lrfu_decay(P, lam, u - base_u)
            lc -= lam * float(u - base_u)                           # each value again from its CRF and last unit,
            base_u = u                 # one rounding to float32
            for w in range(n_w):
                x = occ[w]
                while x:
                    j = (w << 6) + np.int64(_cttz(x))
                    x &= x - one
                    t = _U(sB[_U(j)])
                    y = S[t] * _lrfu_decay(P, lam, base_u - PL[t])
                    sV[_U(j)] = np.float32(y) if y >= _LRFU_TINY else np.float32(0.0)
            g = 0
        qu = scale[_U(g)] if g >= 0 else _lrfu_decay(P, lam, -g)     # (a layer behind the base)
        n_hit, nf, j_max = _touch(expert, lo, hi, base, u, qu, lam, S, PL, P, where, sB, sV, sK, occ, free, nf, j_max,
                                  record, hit_flag)
        n_w = max(n_w, (j_max >> 6) + 1)
        n_occ += (hi - lo) - n_hit
        if i >= count_from:
            hits[layer] += n_hit
            misses[layer] += (hi - lo) - n_hit
        m = n_occ - cap
        if m <= 0:
            continue
        for w in range(n_w):
            lv[w] = zero
        v = 0.0
        if cap <= 0:                   # no room: every member leaves
            for w in range(n_w):
                lv[w] = occ[w]
        else:
            lam_r = lam * float(base_u)
            delta = _lrfu_margin(u_max, lam)
            cv = 2.0 ** (lc + per * float(m)) if have else 0.0
            if cv > 0.0:
                for q in range(4):
                    _set_cut(th, thv, q, cv * 2.0 ** (spread * _CUT_SPREADS[q]), delta, vprev)
            else:                      # no centre: every slot ranked
                _lrfu_set_cut(th, thv, 0, -1.0, delta)
                _lrfu_set_cut(th, thv, 1, -1.0, delta)
                _lrfu_set_cut(th, thv, 2, np.inf, delta)
                _lrfu_set_cut(th, thv, 3, np.inf, delta)
            _cut_pass(sV, S, PL, sB, sK, lam, lam_r, occ, n_w, th, thv, w4, msk, 1, 2, cnt)
            a = 1                      # the inner cuts, and an outer one only where an inner one does not do
            b = 2
            moves = 0
            outer = cnt[1] > m or cnt[2] < m
            if cnt[1] > m:             # more than leave sit below the inner low cut: the outer one, moved down
                a = 0
                b = 1
                while moves < max_moves:
                    _cut_pass(sV, S, PL, sB, sK, lam, lam_r, occ, n_w, th, thv, w4, msk, 0, 0, cnt)
                    if cnt[0] <= m:
                        break
                    r = min(th[0] / th[1], _LRFU_MIN_STEP_DOWN)
                    c = th[0] * (r * r) * (r * r)
                    _set_cut(th, thv, 0, c if c >= _LRFU_FLOOR else -1.0, delta, vprev)
                    moves += 1
            elif cnt[2] < m:           # fewer than leave sit below the inner high cut: the outer one, moved up
                a = 2
                b = 3
                while moves < max_moves:
                    _cut_pass(sV, S, PL, sB, sK, lam, lam_r, occ, n_w, th, thv, w4, msk, 3, 3, cnt)
                    if cnt[3] >= m:
                        break
                    r = max(th[3] / th[2], _LRFU_MIN_STEP_UP)
                    _set_cut(th, thv, 3, th[3] * (r * r) * (r * r), delta, vprev)
                    moves += 1
            stuck = a != 1 and moves >= max_moves  # an outer cut that never enclosed the m-th value (values
            need = m - cnt[a]          # that disagree with the keys, e.g. NaN): every slot ranked by exact keys
            nb = cnt[b] - cnt[a]
            wide = nb > 16
            halves = 0                 # a band past 64 halved in key space by a cut at its middle
            stall = 0
            while not stuck and need > 0 and nb > 64 and halves < _HALVES and 0.0 < th[a] and th[b] < np.inf:
                c = 0                  # a cut neither bound holds
                while c == a or c == b:
                    c += 1
                mid = np.sqrt(th[a] * th[b])
                if not th[a] < mid < th[b]:
                    break
                _set_cut(th, thv, c, mid, delta, vprev)
                _cut_pass(sV, S, PL, sB, sK, lam, lam_r, occ, n_w, th, thv, w4, msk, c, c, cnt)
                if cnt[c] <= m:
                    a = c
                else:
                    b = c
                need = m - cnt[a]
                stall = stall + 1 if cnt[b] - cnt[a] > (nb * 7) >> 3 else 0   # equal values the middle cannot split
                nb = cnt[b] - cnt[a]
                halves += 1
                if stall >= 2:
                    break
            if stuck:
                need = m
                nb = -1
            v = th[a]
            if need == 0:
                for w in range(n_w):
                    lv[w] = msk[a, w]
            elif need == nb:           # the whole band leaves
                v = th[b]
                for w in range(n_w):
                    lv[w] = msk[b, w]
            elif 0 < nb <= 64:
                q = 0
                for w in range(n_w):
                    x = msk[b, w] & ~msk[a, w]
                    if x:
                        q = values_at32(sV, w << 6, x, band, q)
                v, nxt, leave = lrfu_rank_band(band, nb, need, w4, ckey, sel)
                if nxt <= v * (1.0 + 3.0 * delta) or nxt < _LRFU_FLOOR:
                    v = _band_exact(S, PL, sB, sK, tie_pos, occ, msk, a, b, n_w, lam, lam_r, need, ckey, ctp, pos,
                                    sel, sel2, lv, False)
                else:
                    if nb > 16:
                        leave = _band_leave(ckey, v, need, nb)
                    for w in range(n_w):
                        x = msk[b, w] & ~msk[a, w]
                        lv[w] = msk[a, w] | pdep(leave, x)
                        c = _popc(x)
                        leave = (leave >> c) if c < 64 else zero
            else:                      # a wide band (or every slot): exact keys
                v = _band_exact(S, PL, sB, sK, tie_pos, occ, msk, a, b, n_w, lam, lam_r, need, ckey, ctp, pos, sel,
                                sel2, lv, nb < 0)
            if wide:                   # the cuts follow the band: narrower after a band past 16, wider after an
                spread = max(spread * 0.5, _SPREAD_MIN)             # outer cut was needed
            elif outer:
                spread = min(spread * 2.0, _SPREAD_MAX)
        nl = 0                         # the leaving slots freed, listed with no branch a word
        for w in range(n_w):
            x = lv[w]
            occ[w] &= ~x
            nl = bit_positions(x, w << 6, lst, nl)
        for r in range(nl):
            where[_U(sB[_U(lst[_U(r)])])] = -1
        for r in range(nl):
            free[_U(nf + r)] = lst[_U(r)]
        nf += nl
        n_occ = max(cap, 0)
        if 0.0 < v < np.inf:          # the next need-th value predicted: this one, and the mean step per
            x = np.log2(v)             # leaving block times the next unit's overflow
            if have and m > 0:
                per += _RATE * ((x - lc) / float(m) - per)
            lc = x
            vprev = v
            have = True
