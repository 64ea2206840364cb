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

An overflow costs a pass over the slots' words (8-10 ns a word of 64 on the AMD core). From :data:`CAND_WORDS`
words of slots on, it is decided over *candidates* instead: copies of the values of the occupied slots at most a
bound some overflows ahead, listed by one pass (a value only rises, when its block is accessed, so a slot above the
bound stays above it; a candidate's copy follows its slot's value, and a miss at most the bound joins them). A
decision whose highest cut needed would pass the bound is made again over every slot, and the candidates are listed
afresh with a bound further ahead. The engine takes this loop for caches of up to :data:`SLOTS_BASE` +
:data:`SLOTS_SLOPE` ``E`` blocks per member of a mean event of ``E`` members, and the pool loop beyond. The
decision, the hit counts and the hit flags are those of :func:`._kernels_ranked.replay_ranked` for ``lrfu``
(``tests/test_lrfu_slots.py``: against the heap loop and the pool loop).
"""

from __future__ import annotations

import numpy as np

from .._jit import jit_helper, jit_inline, jit_loop
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
from ._kernels_lfru_slots import _slot_tie, _tie_cut
from ._simd import bit_positions, lrfu_cut1, pdep, values_at32

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
_LN2 = 0.6931471805599453
#: From this many words of slots on, overflows are decided over *candidates*: copies of the values of the occupied
#: slots at most a bound some overflows ahead (a value rises when its block is accessed, so a slot above the bound
#: stays above it), listed afresh where a decision needs a cut past the bound.
CAND_WORDS = 36
#: At most this many candidates (past it they are listed again with a lower bound).
_CAND_MAX = 1024
#: The bound lies this many leaving blocks' mean steps above the predicted ``need``-th value (and the outer high
#: cut's spread): doubled after a decision that needed a cut past it, halved after a listing that held too many.
_CAND_AHEAD = 256.0
_CAND_AHEAD_MAX = 65536.0
#: The engine replays here global caches of at most ``SLOTS_BASE + SLOTS_SLOPE * E`` blocks per member of a mean
#: event of ``E`` members (the pool loop beyond: an overflow's pass grows with the cache, or with the candidates,
#: and a unit's fixed work is shared by its members; the pool's work grows with the unit). Measured with ``python
#: benchmarks/lrfu_slots.py --batches 1,2,4,8,64 --rhos 0.05,0.1,0.2,0.4,0.6,0.75`` (docs/performance.md, *Session
#: 46*): slots / pool crosses 1 between 38 and 77 blocks per member at B = 1 (mean events of 8), 43 and 86 at B = 2
#: (14), 100 and 150 at B = 4 (25), past 115 at B = 8 (40); at B = 64 (110) 1.03 / 1.10 at 3 / 6 and 0.57-0.81 at
#: 11-42.
SLOTS_BASE = 40.0
SLOTS_SLOPE = 2.0


def fits(n_events: int, n_accesses: int, cap: int) -> bool:
    """Whether the engine replays a global ``lrfu`` cache of ``cap`` blocks here (:data:`SLOTS_BASE`,
    :data:`SLOTS_SLOPE`), on a stream whose last units fit int32 (:data:`._kernels_bits.MAX_LRFU_EVENTS`).

    >>> fits(100, 800, 448), fits(100, 800, 449), fits(100, 4000, 4800), fits(100, 4000, 4801), fits(0, 0, 1)
    (True, False, True, False, False)
    """
    if not 0 < n_events < MAX_LRFU_EVENTS:
        return False
    e = n_accesses / n_events
    return cap <= (SLOTS_BASE + SLOTS_SLOPE * e) * e


def replay_lrfu_slots(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, lam, count_from, hits,
                      misses, hit_flag, max_moves=None, span=None, cand=None, cand_max=None):
    """Event-atomic ``lrfu`` with one global pool of ``capacity[0]`` blocks (the decision of ``replay_ranked``).

    ``tie_pos[b]`` is block ``b``'s position among all ``n_layers * n_experts`` blocks by ascending tie rank (lower
    leaves first among equal keys); the other parameters are those of :func:`._kernels_bits.replay_lrfu_bits`.
    ``max_moves`` bounds an outer cut's moves (:data:`._kernels_bits._LRFU_MAX_MOVES`), ``span`` the units a base
    holds, ``cand`` the words of slots from which overflows are decided over candidates (:data:`CAND_WORDS`) and
    ``cand_max`` how many candidates fit (:data:`_CAND_MAX`); tests pass small ones, so that every path runs on
    small streams. The state is allocated here and the loop runs in :func:`_replay_lrfu_slots`.
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
    use_c = n_words >= (CAND_WORDS if cand is None else int(cand))
    n_cand = min(n_slots, _CAND_MAX if cand_max is None else max(int(cand_max), 1))
    n_mw = max(n_words, (n_cand + 128) // 64)           # the words of a decision, over slots or candidates
    z = np.zeros
    _replay_lrfu_slots(offsets, expert, ev_layer, n_experts, cap, tie_pos.astype(np.int64), lam, count_from, hits,
                       misses, hit_flag, z(n_blocks), np.full(n_blocks, -1, np.int32), np.full(n_blocks, -1, np.int32),
                       z(n_slots, np.float32), z(n_slots, np.int32), np.full(n_slots, np.nan), z(n_words, np.uint64),
                       np.arange(n_slots - 1, -1, -1, dtype=np.int32), z(max(n_layers, 1), np.int64),
                       crf_decays(lam, min(n_units + 1, _LRFU_DECAYS)),
                       2.0 ** (lam * np.arange(n_scale, dtype=np.float64)), z(4), z(8, np.float32), z(4, np.uint64),
                       z((4, n_mw), np.uint64), z(4, np.int64), z(n_mw, np.uint64), z(128, np.float32),
                       z(width), z(width, np.int64), z(width), z(width), z(width, np.int64), z(n_slots + 64, np.int32),
                       _LRFU_MAX_MOVES if max_moves is None else max(int(max_moves), 0),
                       np.arange(n_slots, dtype=np.int32), use_c, np.full(n_cand + 128, np.inf, np.float32),
                       z(n_cand + 128, np.int32), np.full(n_slots, n_cand + 127, np.int32),
                       z((n_cand + 128) // 64, np.uint64), z(2, np.float32), z(4))


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
def _cut_pass(V, S, PL, sB, sK, ls, lam, lam_r, occ, n_w, th, thv, w4, msk, qa, qb, cnt):
    """Cuts ``qa`` and ``qb`` (one cut where they are equal) over the lanes ``occ`` of the first ``n_w`` words
    (values ``V``, lane ``j`` standing for slot ``ls[j]``): ``msk[q]`` the lanes whose key is at most the cut's key
    ``log2(th[q]) + lam_r``, ``cnt[q]`` how many. The values place a lane surely
    (:func:`._kernels_bits.lrfu_cut_word`); one within the margin is placed by its exact key."""
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
            c = _slot_key(S, PL, sB, sK, ls[_U(o + j)], lam)
            sa, sb = lrfu_place(c, one << _U(j), ua, ub, sa, sb, th, qa, qb, lam_r)
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
def _leave_exact(key, tie_pos, sB, spos, pos, k, need, buf, scratch, lv):
    """Of the ``k`` lanes ``pos[:k]`` with exact keys ``key[:k]`` (slots ``spos[:k]``, blocks ``sB``, their tie
    positions ``tie_pos``), the ``need`` lowest ``(key, tie position)`` marked in the words ``lv``; returns the
    ``need``-th key. ``buf`` and ``scratch`` hold ``k``. Of the keys equal to it, the lowest tie positions by
    :func:`._kernels_lfru_slots._tie_cut`."""
    for r in range(k):
        buf[_U(r)] = key[_U(r)]
    v = _kth_lowest(buf, scratch, k, need)
    n_less = 0
    n_eq = 0
    for r in range(k):
        c = key[_U(r)]
        n_less += c < v
        n_eq += c == v
    tr = _tie_cut(key, v, k, tie_pos, sB, spos, buf, scratch, need - n_less, n_eq)
    for r in range(k):
        c = key[_U(r)]
        if c < v or (c == v and _slot_tie(tie_pos, sB, spos[_U(r)]) <= tr):
            j = pos[_U(r)]
            lv[_U(j >> 6)] |= np.uint64(1) << _U(j & 63)
    return v


@jit_helper
def _band_exact(S, PL, sB, sK, ls, tie_pos, occ, msk, a, b, n_w, lam, lam_r, need, ckey, spos, pos, sel, sel2, lv,
                every):
    """The band's lanes (below cut ``b``, not below cut ``a``; every lane of ``occ`` where ``every``) ranked by exact
    keys: the ``need`` lowest ``(key, tie position)`` marked in ``lv`` with every lane below cut ``a`` (none where
    ``every``); returns the ``need``-th key's value ``2**(key - lam_r)``."""
    one = np.uint64(1)
    q = 0
    for w in range(n_w):
        x = occ[w] if every else msk[b, w] & ~msk[a, w]
        lv[w] = np.uint64(0) if every else msk[a, w]
        while x:
            j = (w << 6) + np.int64(_cttz(x))
            x &= x - one
            sj = ls[_U(j)]
            ckey[_U(q)] = _slot_key(S, PL, sB, sK, sj, lam)
            spos[_U(q)] = sj
            pos[_U(q)] = j
            q += 1
    return 2.0 ** (_leave_exact(ckey, tie_pos, sB, spos, pos, q, need, sel, sel2, lv) - lam_r)


@jit_inline
def _decide(V, occ, n_w, ls, bound, S, PL, sB, sK, tie_pos, lam, lam_r, delta, m, cv, fac, near, th, thv, w4,
            msk, cnt, lv, band, ckey, spos, pos, sel, sel2, max_moves):
    """The ``m`` lowest ``(key, tie position)`` of the lanes ``occ`` (values ``V``, lane ``j`` standing for slot
    ``ls[j]``) marked in ``lv``: the cuts at ``cv * fac[q]`` (``cv`` 0: every lane ranked), their passes, the band.
    Returns ``(ok, v, wide, outer)``: ``ok`` false where a lane past the lanes' float32 ``bound`` could lie below
    the highest cut needed (the candidates do not hold every lane that may leave; ``lv`` is then not the answer),
    ``v`` the ``need``-th value (or the cut's), whether the band was wider than 16, whether an outer cut was
    needed."""
    if cv > 0.0:
        for q in range(4):
            _set_cut(th, thv, q, cv * fac[q], delta, near)
    else:                              # no centre: every lane ranked
        _lrfu_set_cut(th, thv, 0, -1.0, delta)
        _lrfu_set_cut(th, thv, 1, -1.0, delta)
        _lrfu_set_cut(th, thv, 2, np.inf, delta)
        _lrfu_set_cut(th, thv, 3, np.inf, delta)
    _cut_pass(V, S, PL, sB, sK, ls, lam, lam_r, occ, n_w, th, thv, w4, msk, 1, 2, cnt)
    a = 1                              # the inner cuts, and an outer one only where an inner one does not do
    b = 2
    moves = 0
    outer = cnt[1] > m or cnt[2] < m
    if cnt[1] > m:                     # more than leave sit below the inner low cut: the outer one, moved down
        a = 0
        b = 1
        while moves < max_moves:
            _cut_pass(V, S, PL, sB, sK, ls, lam, lam_r, occ, n_w, th, thv, w4, msk, 0, 0, cnt)
            if cnt[0] <= m:
                break
            r = min(th[0] / th[1], _LRFU_MIN_STEP_DOWN)
            c = th[0] * (r * r) * (r * r)
            _set_cut(th, thv, 0, c if c >= _LRFU_FLOOR else -1.0, delta, near)
            moves += 1
    elif cnt[2] < m:                   # fewer than leave sit below the inner high cut: the outer one, moved up
        a = 2
        b = 3
        while moves < max_moves and thv[7] <= bound:
            _cut_pass(V, S, PL, sB, sK, ls, lam, lam_r, occ, n_w, th, thv, w4, msk, 3, 3, cnt)
            if cnt[3] >= m:
                break
            r = max(th[3] / th[2], _LRFU_MIN_STEP_UP)
            _set_cut(th, thv, 3, th[3] * (r * r) * (r * r), delta, near)
            moves += 1
    if not thv[2 * b + 1] <= bound:    # a lane outside the candidates may lie below cut b
        return False, 0.0, False, outer
    stuck = a != 1 and moves >= max_moves  # an outer cut that never enclosed the m-th value (values that
    need = m - cnt[a]                  # disagree with the keys, e.g. NaN): every lane ranked by exact keys
    nb = cnt[b] - cnt[a]
    wide = nb > 16
    halves = 0                         # a band past 64 halved in key space by a cut at its middle
    stall = 0
    while not stuck and need > 0 and nb > 64 and halves < _HALVES and 0.0 < th[a] and th[b] < np.inf:
        c = 0                          # a cut neither bound holds
        while c == a or c == b:
            c += 1
        mid = np.sqrt(th[a] * th[b])
        if not th[a] < mid < th[b]:
            break
        _set_cut(th, thv, c, mid, delta, near)
        _cut_pass(V, S, PL, sB, sK, ls, lam, lam_r, occ, n_w, th, thv, w4, msk, c, c, cnt)
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
        if bound < np.inf:             # (every lane is every slot only outside the candidates)
            return False, 0.0, wide, outer
        need = m
        nb = -1
    v = th[a]
    if need == 0:
        for w in range(n_w):
            lv[w] = msk[a, w]
    elif need == nb:                   # the whole band leaves
        v = th[b]
        for w in range(n_w):
            lv[w] = msk[b, w]
    elif 0 < nb <= 64:
        q = 0
        for w in range(n_w):
            x = msk[b, w] & ~msk[a, w]
            if x:
                q = values_at32(V, w << 6, x, band, q)
        v, nxt, leave = lrfu_rank_band(band, nb, need, w4, ckey, sel)
        if nxt <= v * (1.0 + 3.0 * delta) or nxt < _LRFU_FLOOR:
            v = _band_exact(S, PL, sB, sK, ls, tie_pos, occ, msk, a, b, n_w, lam, lam_r, need, ckey, spos, pos, sel,
                            sel2, lv, False)
        else:
            if nb > 16:
                leave = _band_leave(ckey, v, need, nb)
            for w in range(n_w):
                x = msk[b, w] & ~msk[a, w]
                lv[w] = msk[a, w] | pdep(leave, x)
                c = _popc(x)
                leave = (leave >> c) if c < 64 else np.uint64(0)
    else:                              # a wide band (or every lane): exact keys
        v = _band_exact(S, PL, sB, sK, ls, tie_pos, occ, msk, a, b, n_w, lam, lam_r, need, ckey, spos, pos, sel, sel2,
                        lv, nb < 0)
    return True, v, wide, outer


@jit_inline
def _member(a, base, u, qu, lam, expert, S, PL, P, where, sB, sV, sK, occ, free, nf, record, hit_flag):
    """Member ``a`` of a unit ``u`` (scale ``qu``): its block's CRF, last unit and value, its slot (a miss's from
    the free stack, ``nf`` on it, with no branch on the outcome); returns ``(slot, value, miss, nf)``, ``miss`` -1
    for a miss and 0 for a hit."""
    t = _U(base + expert[_U(a)])
    s = 1.0 + S[t] * _lrfu_decay(P, lam, u - PL[t])              # a first access: S 0, its CRF 1
    S[t] = s
    PL[t] = u
    y = s * qu
    jo = np.int64(where[t])
    jn = np.int64(free[_U(nf - 1)])
    miss = jo >> 63                   # -1 for a miss, 0 for a hit (a select here compiled to a branch)
    j = (jn & miss) | (jo & ~miss)
    nf += miss
    if record:
        hit_flag[_U(a)] |= np.uint8(1 + miss)
    where[t] = j
    sB[_U(j)] = np.int32(t)
    occ[_U(j >> 6)] |= np.uint64(1) << _U(j & 63)
    x = np.float32(y) if y >= _LRFU_TINY else np.float32(0.0)
    sV[_U(j)] = x
    sK[_U(j)] = np.nan
    return j, x, miss, nf


@jit_helper
def _touch(expert, lo, hi, base, u, qu, lam, S, PL, P, where, sB, sV, sK, occ, free, nf, j_max, record, hit_flag):
    """The members ``lo .. hi`` of a unit (:func:`_member`); returns ``(hits, nf, j_max)``, the highest slot taken
    so far in ``j_max``."""
    n_hit = 0
    for a in range(lo, hi):
        j, _, miss, nf = _member(a, base, u, qu, lam, expert, S, PL, P, where, sB, sV, sK, occ, free, nf, record,
                                 hit_flag)
        n_hit += 1 + miss
        j_max = max(j_max, j)
    return n_hit, nf, j_max


@jit_helper
def _touch_c(expert, lo, hi, base, u, qu, lam, S, PL, P, where, sB, sV, sK, occ, free, nf, j_max, record, hit_flag,
             c_ok, cV, cS, cpos, nc, c32):
    """:func:`_touch` with candidates: a candidate's copy of its value follows it, and a miss at most ``c32`` joins
    them (``c_ok`` false once they are full). Returns ``(hits, nf, j_max, c_ok, nc)``."""
    n_hit = 0
    dummy = cV.shape[0] - 1            # the copy of a slot that is no candidate (outside every pass)
    for a in range(lo, hi):
        j, x, miss, nf = _member(a, base, u, qu, lam, expert, S, PL, P, where, sB, sV, sK, occ, free, nf, record,
                                 hit_flag)
        n_hit += 1 + miss
        j_max = max(j_max, j)
        join = np.int64(miss != 0 and x <= c32 and c_ok)
        if join and nc >= dummy - 64:
            c_ok = False
            join = 0
        k = nc if join else np.int64(cpos[_U(j)])
        cV[_U(k)] = x
        cS[_U(k)] = np.int32(j)
        cpos[_U(j)] = np.int32(k)
        nc += join
    return n_hit, nf, j_max, c_ok, nc


@jit_helper
def _rebuild(sV, occ, n_w, c32, cV, cS, cpos, lst, w4, cb, nc_old):
    """The candidates afresh: the old ones (``nc_old``) dropped, the occupied slots whose value is at most ``c32``
    listed (their copies in ``cV``, the lanes past them ``inf``); returns how many, or -1 (none kept) where they
    would not fit."""
    dummy = cV.shape[0] - 1
    for r in range(nc_old):            # the old candidates' slots hold none now
        cpos[_U(cS[_U(r)])] = np.int32(dummy)
    for r in range(nc_old + 64):
        cV[_U(r)] = np.inf
    cb[0] = c32
    cb[1] = c32
    nc = 0
    for w in range(n_w):
        lrfu_cut1(sV, w << 6, cb, w4, 0)
        nc = bit_positions(occ[w] & w4[0], w << 6, lst, nc)
        if nc > dummy - 128:
            return -1
    for r in range(nc):
        j = lst[_U(r)]
        cV[_U(r)] = sV[_U(j)]
        cS[_U(r)] = j
        cpos[_U(j)] = np.int32(r)
    for r in range(nc, nc + 64):
        cV[_U(r)] = np.inf
    return nc


@jit_loop
def _replay_lrfu_slots(offsets, expert, ev_layer, n_experts, cap, tie_pos, lam, count_from, hits, misses, hit_flag,
                       S, PL, where, sV, sB, sK, occ, free, lunits, P, scale, th, thv, w4, msk, cnt, lv, band, ckey,
                       spos, sel, sel2, pos, lst, max_moves, ident, use_c, cV, cS, cpos, cw, cb, fac):
    """The loop of :func:`replay_lrfu_slots`. Per block (``layer * n_experts + expert``, so that an event's state is
    one layer's lines): the CRF ``S``, the layer unit of the last access ``PL`` (-1: none), the slot ``where`` it is
    resident in (-1: none); per slot its value ``sV``, block ``sB`` and exact key ``sK`` (NaN until needed), ``occ``
    the occupied slots as bits; ``free`` the free slots, a stack; ``P[g] = 2**(-lam g)``, ``scale[g] = 2**(lam g)``;
    ``th`` / ``thv`` the unit's four cuts and their sure / maybe bounds, ``msk[q]`` / ``cnt[q]`` the lanes below cut
    ``q`` / how many; ``lv`` the leaving lanes as bits; ``ident[j] = j``; with candidates (``use_c``) ``cV`` / ``cS``
    their values and slots, ``cpos`` a slot's candidate (the last lane of ``cV`` where none), ``cw`` their lanes as
    words; the rest scratch."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_scale = scale.shape[0]
    one = np.uint64(1)
    zero = np.uint64(0)
    inf32 = np.float32(np.inf)
    dummy = cV.shape[0] - 1
    nf = free.shape[0]                 # free slots, the next on top
    n_occ = 0
    n_w = 0                            # words holding every slot ever taken
    j_max = -1
    base_u = 0                         # the base unit R
    u_max = 0
    spread = _SPREAD_START
    for q in range(4):                 # the cuts' factors at that spread
        fac[q] = 2.0 ** (spread * _CUT_SPREADS[q])
    lc = 0.0                           # log2 of the last need-th value (relative to the base)
    per = 0.0                          # its mean step per leaving block
    have = False
    vprev = 0.0
    c_ok = False                       # the candidates: every occupied slot at most c32 is one of them
    nc = 0
    c32 = np.float32(-1.0)
    ahead = _CAND_AHEAD
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
            c_ok = False
        qu = scale[_U(g)] if g >= 0 else _lrfu_decay(P, lam, -g)     # (a layer behind the base)
        if use_c:
            n_hit, nf, j_max, c_ok, nc = _touch_c(expert, lo, hi, base, u, qu, lam, S, PL, P, where, sB, sV, sK, occ,
                                                  free, nf, j_max, record, hit_flag, c_ok, cV, cS, cpos, nc, c32)
        else:
            n_hit, nf, j_max = _touch(expert, lo, hi, base, u, qu, lam, S, PL, P, where, sB, sV, sK, occ, free, nf,
                                      j_max, record, hit_flag)
        n_w = max(n_w, (j_max >> 6) + 1)
        n_occ += (hi - lo) - n_hit
        if i >= count_from:
            hits[layer] += n_hit
            misses[layer] += (hi - lo) - n_hit
        m = n_occ - cap
        if m <= 0:
            continue
        v = 0.0
        wide = False
        outer = False
        nl = 0
        if cap <= 0:                   # no room: every member leaves
            for w in range(n_w):
                x = occ[w]
                occ[w] = zero
                nl = bit_positions(x, w << 6, lst, nl)
        else:
            lam_r = lam * float(base_u)
            delta = _lrfu_margin(u_max, lam)
            d = per * float(m)         # the predicted need-th value (to first order where the step is small:
            cv = (vprev * (1.0 + _LN2 * d) if abs(d) < 0.125 else vprev * 2.0 ** d) if have else 0.0   # no pow)
            done = False
            if use_c and cv > 0.0:
                if not c_ok:           # candidates up to a bound some overflows ahead
                    c32 = np.float32(cv * 2.0 ** (3.0 * spread + max(per, 0.0) * ahead))
                    nc = _rebuild(sV, occ, n_w, c32, cV, cS, cpos, lst, w4, cb, nc)
                    c_ok = nc >= 0
                    if not c_ok:       # too many below it: fewer next time
                        ahead *= 0.5
                        nc = 0
                if c_ok:
                    n_cw = (nc + 63) >> 6
                    for w in range(n_cw):
                        cw[w] = ~zero
                    if nc & 63:
                        cw[n_cw - 1] = (one << _U(nc & 63)) - one
                    for w in range(n_cw):
                        lv[w] = zero
                    done, v, wide, outer = _decide(cV, cw, n_cw, cS, c32, S, PL, sB, sK, tie_pos, lam, lam_r, delta,
                                                   m, cv, fac, vprev, th, thv, w4, msk, cnt, lv, band, ckey, spos,
                                                   pos, sel, sel2, max_moves)
                    if done:           # the leaving candidates' slots
                        for w in range(n_cw):
                            nl = bit_positions(lv[w], w << 6, lst, nl)
                        for r in range(nl):
                            k = lst[_U(r)]
                            j = cS[_U(k)]
                            lst[_U(r)] = j
                            cV[_U(k)] = inf32
                            cpos[_U(j)] = np.int32(dummy)
                            occ[_U(j >> 6)] &= ~(one << _U(j & 63))
                    else:              # a cut past the bound: a wider one next time
                        c_ok = False
                        ahead = min(ahead * 2.0, _CAND_AHEAD_MAX)
            if not done:               # over every slot (the candidates are listed afresh before their next use)
                c_ok = False
                for w in range(n_w):
                    lv[w] = zero
                _, v, wide, outer = _decide(sV, occ, n_w, ident, inf32, S, PL, sB, sK, tie_pos, lam, lam_r, delta, m,
                                            cv, fac, vprev, th, thv, w4, msk, cnt, lv, band, ckey, spos, pos, sel,
                                            sel2, max_moves)
                for w in range(n_w):   # the leaving slots, listed with no branch a word
                    x = lv[w]
                    occ[w] &= ~x
                    nl = bit_positions(x, w << 6, lst, nl)
            if wide or outer:          # the cuts follow the band: narrower after a band past 16, wider after an
                spread = max(spread * 0.5, _SPREAD_MIN) if wide else min(spread * 2.0, _SPREAD_MAX)  # outer cut
                for q in range(4):     # was needed
                    fac[q] = 2.0 ** (spread * _CUT_SPREADS[q])
        for r in range(nl):            # the leaving slots freed
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
