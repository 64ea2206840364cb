"""numba kernel for sequential per-layer ``lrfu`` on ranks: each layer's residents in key order, an event at a time.

Under sequential semantics (one unit an access) a layer's cache after each access holds the ``c`` highest ``(key,
tie position)`` of the blocks of the layer accessed so far, ``c`` its quota: :func:`._kernels.replay_heap` admits a
miss and drops the lowest, and an ``lrfu`` key changes only at its block's access, where it rises, so a block that
left sits below every resident until its next access. The residents not accessed keep their order, so a layer's
residents are kept as a list by key (``P``, highest first) and each block's place in it (``rank``), as
:func:`._kernels_seq._replay_lru_seq_ranks` keeps ``lru``'s recency, and an event is replayed whole:

* a member that was resident at the event's start, ``j``-th of the event (from 0) at rank ``r``, hits where fewer
  than ``c`` blocks rank above its old key when it is accessed: the residents of lower rank not yet accessed
  (``r - below``, ``below`` the earlier members of lower rank) and the ``j`` members before it, less those whose new
  key ranks below its old key;
* after the event the list is the ``c`` highest of the members at their new keys and the residents the event did
  not access: two ordered lists merged.

A key ``log2(S) + lam u`` (:func:`._kernels.crf_key`, ``S`` the CRF at the last access, unit ``u``) lies in ``[lam u,
lam u + log2(S_max))``, so of two blocks whose last units lie :func:`._kernels_lrfu_window.window` (``w``) or more
apart the later ranks above. Two blocks are compared by units first, then by ``S_x 2**(lam (u_x - u_y))`` against
``S_y`` beyond a relative margin that covers the keys' rounding, then by their exact keys and tie positions
(:func:`_above_su`). So:

* a member's old key can rank above an earlier member's new key only where its old unit lies within ``w`` of the
  event's first: a *recent* resident, among its layer's last ``w - 1`` accesses (a flag in its rank byte). The few
  such members are set aside in the pass over the members and counted after it (:func:`_not_above`), so that the
  pass holds no call and no branch that waits on a block's state;
* the members' order by key is their order by unit but within the window: where each of the last ``c + w - 1``
  members ranks surely above the one before it (where every new CRF, at least 1, is below ``2**lam`` within the
  margins; else one pass over them), the ``c`` last are the highest, newest first, and they are the new list where
  the event has ``c + w - 1`` members or more, or ``c`` or more and the highest resident it did not access ranks below
  the ``c``-th newest (one comparison); otherwise the members are sorted by insertion (each moves less than ``w``
  places);
* only residents within the window of the event's first unit are compared in the merge; past the first that is not,
  every member ranks above and the residents follow in their order.

Where an event's last ``c`` members become the list (the first case above), nothing is written: the layer records
the event's end (``fend``), and until its next event the ranks are its accesses counted back from its last unit (a
block last accessed at unit ``u`` has rank ``t - 1 - u`` where that is below ``c``, ``t`` the layer's next unit). An
event of that layer that ends on a merge first writes that list out (``P``, the rank bytes).

:func:`._kernels_seq.lrfu_on_ranks` says where the engine runs it (quotas up to :data:`RANKS_MAX`, windows up to
:data:`MAX_WINDOW`, large events); tests/test_lrfu_ranks.py compares it with the heap loop.
"""

from __future__ import annotations

import numpy as np

from .._bits import U as _U
from .._bits import cttz as _cttz
from .._bits import popc as _popc
from .._jit import jit_helper, jit_inline, jit_loop
from ._kernels import LRFU_DECAY_ZERO, crf_decays
from ._kernels_lrfu_window import window
from ._simd import f2u, u2f

#: The longest quota the loop takes: an event's resident members are bits of one 64-bit word by rank.
RANKS_MAX = 64
#: The longest window (layer units) the loop takes (``lam`` 0.07 or more: ``window(0.07)`` is 64).
MAX_WINDOW = 64
#: A rank byte of a block not resident (a resident's is its rank, below 64, plus :data:`_RECENT` where recent): as a
#: rank, 127 counts no hit, and its bit (``127 & 63``) lies above every resident's but rank 63's, which the merge
#: corrects (no test of residence per member).
_OUT = np.uint8(127)
#: A rank byte's flag (added to its rank) of a resident among its layer's last ``window - 1`` accesses.
_RECENT = 128
#: A block never accessed: its last unit (its CRF is 0, and a first access's CRF is 1).
_NEVER = -(1 << 40)


def fits(lam: float, n_experts: int, capacity) -> bool:
    """Whether :func:`replay_lrfu_ranks` takes a stream: every layer's quota (at most ``n_experts``) at most
    :data:`RANKS_MAX`, ``lam`` with a window of at most :data:`MAX_WINDOW` units, expert ids that fit the lists'
    int16."""
    most = min(int(capacity.max()), n_experts) if capacity.shape[0] else 0
    return most <= RANKS_MAX and window(float(lam)) <= MAX_WINDOW and n_experts <= np.iinfo(np.int16).max + 1


def lrfu_ranks_state(offsets, n_experts: int, n_layers: int, lam: float) -> tuple:
    """The arguments of :func:`replay_lrfu_ranks` after ``hit_flag`` for a stream (``offsets``) and ``lam``: its
    tables and margin, every block's CRF and unit (none accessed), every layer's list (empty), its scratch, and no
    layer's list a fast event's."""
    lam = float(lam)
    n_blocks = n_layers * n_experts
    n_units = int(offsets[-1] - offsets[0]) if offsets.shape[0] > 1 else 0
    n_tab = min(n_units + 1, int(LRFU_DECAY_ZERO / lam) + 2)     # gaps past it decay to 0 (or are first accesses)
    decays = crf_decays(lam, n_tab + 1)
    decays[n_tab] = 0.0
    w = window(lam)
    pw = 2.0 ** (lam * np.arange(-w, w + 1, dtype=np.float64))
    key_max = lam * float(n_units + 1) + 4.0
    eps = 1e-13 + 16.0 * key_max * 2.0 ** -52          # keys' rounding (libm's log2, lam u, their sum) and ours
    SU = np.zeros(2 * n_blocks, np.int64)          # a CRF's bits (0.0: never accessed), a last unit
    SU[1::2] = _NEVER
    return (lam, w, decays, pw, eps, SU, np.zeros(n_blocks, np.int16), np.full(n_blocks, _OUT, np.uint8),
            np.zeros(n_layers, np.int64), np.zeros(n_layers, np.int64), np.zeros(2 * RANKS_MAX + 2, np.int64),
            np.zeros(3 * (RANKS_MAX + MAX_WINDOW), np.int64), np.zeros(RANKS_MAX + MAX_WINDOW),
            np.full(n_layers, -1, np.int64), np.zeros(n_layers, np.int64))


@jit_inline
def _crf(SU, b):
    """Block ``b``'s CRF (its bits at ``SU[2 b]``)."""
    return u2f(np.uint64(SU[_U(2 * b)]))


@jit_inline
def _above_su(sx, ux, tx, sy, uy, ty, lam, w, pw, eps):
    """Whether a block of CRF ``sx`` at unit ``ux`` and tie position ``tx`` ranks above one of ``sy``,
    ``uy``, ``ty``: by units past the window, else by ``sx 2**(lam (ux - uy))`` against ``sy`` past the margin
    ``eps``, else by exact keys (:func:`._kernels.crf_key`), then tie positions."""
    d = ux - uy
    if d >= w:
        return True
    if d <= -w:
        return False
    a = sx * pw[_U(d + w)]
    if a > sy * (1.0 + eps):
        return True
    if a < sy * (1.0 - eps):
        return False
    kx = np.log2(sx) + lam * float(ux)
    ky = np.log2(sy) + lam * float(uy)
    return ky < kx or (kx == ky and ty < tx)


@jit_inline
def _above(x, y, SU, tp, lam, w, pw, eps):
    """Whether block ``x`` ranks above block ``y`` (both accessed; :func:`_above_su`)."""
    return _above_su(_crf(SU, x), SU[_U(2 * x + 1)], tp[_U(x)], _crf(SU, y), SU[_U(2 * y + 1)], tp[_U(y)], lam, w,
                     pw, eps)


@jit_inline
def _members(expert, lo, lim, base, SU, rank, decays, NJ, NO, hit_flag, t0, c, last, wc, mode, record):
    """The event's first ``lim`` members (from ``lo``; blocks ``base + e``) from unit ``t0``: their old ranks as bits
    (``m``), their hits where not recent (added to ``n_hit``, in ``hit_flag`` where ``record``), the recent
    residents set aside (``nn`` of them in ``NJ`` / ``NO``), their new CRFs (``SU``) and units. ``mode`` 0:
    the ranks from rank bytes (a member not resident sets bit 63); 1: by units (the layer's list a fast event's last
    ``c`` members, ``wc`` = ``min(w - 1, c)`` of them recent; a member not resident sets a bit of rank ``c`` or
    more); 2: by units, a branch on residence (where residents are rare: no bit for the others). Returns ``(m,
    n_hit, nn, nh, mx)``, ``nh`` the resident members where the ranks are by units, ``mx`` the largest new CRF."""
    one = np.uint64(1)
    m = np.uint64(0)
    n_hit = 0
    nn = 0
    nh = 0
    mx = 0.0                                        # the largest new CRF
    tj = t0                                         # the member's unit
    cj = c                                          # c less the members before it
    for j in range(lim):
        b = base + expert[_U(lo + j)]
        sb = _crf(SU, b)
        ub = SU[_U(2 * b + 1)]
        if mode == 0:                               # 127 where not resident: bit 63
            rb = np.int64(rank[_U(b)])
            r = rb & 127
            bit = one << np.uint64(r & 63)
            recent = rb >= _RECENT
        else:                                       # not resident where c or more: its bit above the residents'
            r = t0 - 1 - ub
            bit = one << np.uint64(min(r, 63))
            recent = r < wc
        if mode != 2 or r < c:
            below = np.int64(_popc(m & (bit - one)))
            m |= bit
            if recent:                              # held and among the layer's last w - 1 accesses (rare, and
                NJ[_U(nn)] = j                      # known early): decided after the loop, its old state kept
                NJ[_U(nn + RANKS_MAX + MAX_WINDOW)] = r - below + j - c
                NO[_U(nn)] = sb
                NJ[_U(nn + 2 * (RANKS_MAX + MAX_WINDOW))] = ub
                nn += 1
            hit = r - below < cj                    # never where not resident: r >= c and below <= j
            n_hit += hit
            if record:
                hit_flag[_U(lo + j)] = hit
            if mode == 2:
                nh += 1
        sn = 1.0 + sb * decays[_U(min(tj - ub, last))]
        SU[_U(2 * b)] = np.int64(f2u(sn))
        mx = max(mx, sn)
        SU[_U(2 * b + 1)] = tj
        tj += 1
        cj -= 1
    if mode == 1:                                   # (at a quota of 64 a member not resident may count: only the
        nh = np.int64(_popc(m & (np.uint64(0) if c == 0 else ~np.uint64(0) >> np.uint64(64 - c))))  # loop's choice)
    return m, n_hit, nn, nh, mx


@jit_inline
def _kept(m, s, P, base, SU, t0):
    """The residents of a list of ``s`` (``P`` from ``base``) that an event from unit ``t0`` did not access, as bits
    by rank: those not in ``m``, the members' old ranks, whose bit 63 may be a member not resident's (so rank 63's
    own by its unit)."""
    kept = (np.uint64(0) if s == 0 else (np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - s))) & ~m
    if s == RANKS_MAX:
        y = base + P[_U(base + RANKS_MAX - 1)]
        kept = (kept & (~np.uint64(0) >> np.uint64(1))) | (np.uint64(SU[_U(2 * y + 1)] < t0) << np.uint64(63))
    return kept


@jit_helper
def _not_above(expert, lo, n, base, sb, ub, tb, SU, tp, lam, w, pw, eps):
    """How many of the event's first ``n`` members (from ``lo``; blocks ``base + e``) rank, at their new keys, below
    a block of CRF ``sb`` at unit ``ub`` and tie position ``tb`` (a member's old state): out of line, as few members
    take it (in the loop it cost the loop a third of its time at rho 0.4)."""
    k = 0
    for i in range(n):
        x = base + expert[_U(lo + i)]
        k += not _above_su(_crf(SU, x), SU[_U(2 * x + 1)], tp[_U(x)], sb, ub, tb, lam, w, pw, eps)
    return k


@jit_loop
def replay_lrfu_ranks(offsets, expert, ev_layer, n_experts, capacity, tie_pos, count_from, hits, misses, hit_flag,
                      lam, w, decays, pw, eps, SU, P, rank, size, unit, buf, NJ, NO, fend, fheld):
    """Sequential per-layer ``lrfu`` on ranks, the decision of :func:`._kernels.replay_heap` (parameters up to
    ``hit_flag`` as :func:`._kernels_seq.replay_lrfu_seq`'s, ``tie_pos`` as int32; the rest from
    :func:`lrfu_ranks_state`): ``lam`` and its window ``w``, ``decays[g]`` the decay of a gap of ``g`` units (its
    last entry 0, every longer gap's), ``pw[d + w]`` ``2**(lam d)``, ``eps`` the margin; ``SU[2 b]`` / ``SU[2 b + 1]``
    block ``b``'s CRF (its bits) and last layer unit, ``P[l N : l N + size[l]]`` layer ``l``'s residents by key
    (expert ids, highest first), ``rank`` each block's rank byte, ``unit`` each layer's accesses so far; scratch:
    ``buf`` (the members by key, then the merged list), ``NJ`` / ``NO`` the recent resident members (place,
    shortfall and old unit; old CRF); ``fend[l]`` the end of the fast event whose last ``size[l]`` members are layer
    ``l``'s list, -1 where ``P`` and the rank bytes hold it; ``fheld[l]`` how many of the first members of layer
    ``l``'s last event with ranks by units were resident (0: its next such event branches on residence)."""
    record = hit_flag.shape[0] > 0
    last = decays.shape[0] - 1
    up = pw[_U(w + 1)] * (1.0 - eps) / (1.0 + eps) * (1.0 - 2.0 ** -40)  # 2**lam within the margins, less a bit
    L = buf[:RANKS_MAX + 1]
    M = buf[RANKS_MAX + 1:]
    one = np.uint64(1)
    for e in range(offsets.shape[0] - 1):
        layer = ev_layer[e]
        ul = _U(layer)
        c = min(capacity[ul], n_experts)
        lo = offsets[e]
        n = offsets[e + 1] - lo
        base = layer * n_experts
        t0 = unit[ul]
        s = size[ul]
        lim = min(n, c + w - 1)                     # later members surely miss: c blocks rank above them
        wc = min(w - 1, c)
        fe = fend[ul]
        mode = 0 if fe < 0 else 2 if fheld[ul] == 0 else 1
        if record:
            m, n_hit, nn, nh, mx = _members(expert, lo, lim, base, SU, rank, decays, NJ, NO, hit_flag, t0, c,
                                            last, wc, mode, True)
        elif mode == 2:                             # (a loop for each: a test per member cost more)
            m, n_hit, nn, nh, mx = _members(expert, lo, lim, base, SU, rank, decays, NJ, NO, hit_flag, t0, c,
                                            last, wc, 2, False)
        elif mode == 1:
            m, n_hit, nn, nh, mx = _members(expert, lo, lim, base, SU, rank, decays, NJ, NO, hit_flag, t0, c,
                                            last, wc, 1, False)
        else:
            m, n_hit, nn, nh, mx = _members(expert, lo, lim, base, SU, rank, decays, NJ, NO, hit_flag, t0, c,
                                            last, wc, 0, False)
        if fe >= 0:
            fheld[ul] = nh
        for z in range(nn):                         # the recent resident members: hits where more than
            j = NJ[_U(z)]                           # short = r - below + j - c of the earlier members within
            short = NJ[_U(z + RANKS_MAX + MAX_WINDOW)]      # the window of its old unit rank below it
            uo = NJ[_U(z + 2 * (RANKS_MAX + MAX_WINDOW))]
            n_near = min(j, w - (t0 - uo))
            if 0 <= short < n_near:
                b = base + expert[_U(lo + j)]
                hit = _not_above(expert, lo, n_near, base, NO[_U(z)], uo, tie_pos[_U(b)], SU, tie_pos, lam, w, pw,
                                 eps) > short
                n_hit += hit
                if record:
                    hit_flag[_U(lo + j)] = hit
        for j in range(lim, n):                     # (their rank bytes below, where the list is merged)
            b = base + expert[_U(lo + j)]
            sn = 1.0 + _crf(SU, b) * decays[_U(min(t0 - SU[_U(2 * b + 1)] + j, last))]
            SU[_U(2 * b)] = np.int64(f2u(sn))
            mx = max(mx, sn)
            SU[_U(2 * b + 1)] = t0 + j
        unit[ul] = t0 + n
        # the members by key, highest first, the c highest at most: by unit where each of the last c + w - 1
        # ranks surely above the one before it (by transitivity, and the earlier members lie past the window):
        # surely where every new CRF is below up (each at least 1), else by a pass over them
        ordered = mx < up
        if not ordered:
            ordered = True
            down = pw[_U(w - 1)] * (1.0 + eps)      # 2**-lam, a margin: S_j 2**-lam below S_{j+1} beyond it
            for j in range(max(n - c - w + 1, 0), n - 1):
                ordered &= (_crf(SU, base + expert[_U(lo + j)]) * down
                            < _crf(SU, base + expert[_U(lo + j + 1)]) * (1.0 - eps))
        fast = ordered and n >= c + w - 1
        if ordered and c <= n < c + w - 1:          # also where no resident not accessed ranks above the c-th
            y = np.int64(-1)                        # newest member: the highest such resident
            if fe >= 0:
                for z in range(s):
                    x = base + expert[_U(fe - 1 - z)]
                    if SU[_U(2 * x + 1)] < t0:
                        y = x
                        break
            else:
                kept = _kept(m, s, P, base, SU, t0)     # (every member's bit in m: lim is n)
                y = -1 if kept == 0 else base + P[_U(base + np.int64(_cttz(kept)))]
            x = base + expert[_U(lo + n - c)]
            fast = y < 0 or t0 + n - c - SU[_U(2 * y + 1)] >= w or _above(x, y, SU, tie_pos, lam, w, pw, eps)
        if fast:                                    # the list becomes the event's last c members, newest first
            fend[ul] = lo + n                       # (written out where a later event merges)
            size[ul] = c
            if e >= count_from:
                hits[ul] += n_hit
                misses[ul] += n - n_hit
            continue
        if fe >= 0:                                 # the list a fast event's last s members: written out, and
            rank[base:base + n_experts] = _OUT      # the resident members' ranks by their new units (every rank
            m = np.uint64(0)                        # byte of the layer at once: a few vector stores)
            for z in range(s):
                x = expert[_U(fe - 1 - z)]
                P[_U(base + z)] = x
                m |= np.uint64(SU[_U(2 * (base + x) + 1)] >= t0) << np.uint64(z)
            fend[ul] = -1
        else:
            for j in range(lim, n):                 # the resident members' ranks (the first lim's are in m)
                m |= one << np.uint64(rank[_U(base + expert[_U(lo + j)])] & 63)
            for j in range(n):                      # (written out above, every byte is _OUT already)
                rank[_U(base + expert[_U(lo + j)])] = _OUT
        kept = _kept(m, s, P, base, SU, t0)
        k = 0
        if ordered:
            k = min(n, c)
            for i in range(k):
                L[i] = base + expert[_U(lo + n - 1 - i)]
        for j in range(n - 1, -1 if not ordered else n, -1):
            x = base + expert[_U(lo + j)]
            if k == c:
                if k == 0 or SU[_U(2 * L[k - 1] + 1)] - (t0 + j) >= w:
                    break
                if not _above(x, L[k - 1], SU, tie_pos, lam, w, pw, eps):
                    continue
                k -= 1
            p = k
            while p > 0 and _above(x, L[p - 1], SU, tie_pos, lam, w, pw, eps):
                L[p] = L[p - 1]
                p -= 1
            L[p] = x
            k += 1
        # merged with the residents not accessed (bits of ``kept`` by old rank), cut at c: only residents within
        # the window of the event's first unit may rank below a member; past the first that does not, the members
        # come first and the residents follow in their order
        q = 0
        i = 0
        while q < c and kept != 0 and i < k:
            y = base + P[_U(base + np.int64(_cttz(kept)))]
            uy = SU[_U(2 * y + 1)]
            if t0 - uy >= w:
                break
            if ordered:                             # the members surely above y: L[i]'s unit is t0 + n - 1 - i
                i_to = min(t0 - uy + n - w, k, i + c - q)
                while i < i_to:
                    M[_U(q)] = L[_U(i)]
                    i += 1
                    q += 1
            while q < c and i < k and _above(L[_U(i)], y, SU, tie_pos, lam, w, pw, eps):
                M[_U(q)] = L[_U(i)]
                i += 1
                q += 1
            if q < c:
                M[_U(q)] = y
                kept &= kept - one
                q += 1
        while q < c and i < k:
            M[_U(q)] = L[_U(i)]
            i += 1
            q += 1
        while q < c and kept != 0:
            M[_U(q)] = base + P[_U(base + np.int64(_cttz(kept)))]
            kept &= kept - one
            q += 1
        while kept != 0:
            rank[_U(base + P[_U(base + np.int64(_cttz(kept)))])] = _OUT
            kept &= kept - one
        t_new = t0 + n - (w - 1)                  # a block last accessed at t_new or later is recent (only the
        for z in range(q):                          # first 2 w - 1 by key can be)
            x = M[_U(z)]
            P[_U(base + z)] = np.int16(x - base)
            rank[_U(x)] = np.uint8(z + _RECENT * (z < 2 * w - 1 and SU[_U(2 * x + 1)] >= t_new))
        size[ul] = q
        if e >= count_from:
            hits[ul] += n_hit
            misses[ul] += n - n_hit
