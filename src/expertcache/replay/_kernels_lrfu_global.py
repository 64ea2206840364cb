"""numba kernel for ``lrfu`` under global scope: the low keys of one pool in a sorted run.

LRFU's key ``log2(S) + lam * u`` (:func:`expertcache.replay._kernels.crf_key`; ``S`` a block's CRF at its last
access, ``u`` that access's unit of the block's layer) changes only when its block is accessed, and then rises. The
heap loop (:func:`._kernels_ranked.replay_ranked`) sifted at every access and at every eviction, about 90 ns an
access on the benchmark stream. Here only the residents with the lowest keys are ordered:

* every resident whose key is below a threshold ``T`` sits in the *pool*: a *run* sorted by ``(key, tie position)``,
  read from its front, and a *side* list of accessed blocks whose new key fell below ``T``, kept descending (an
  access's key joins it at once; an event's new keys are sorted and merged in at its end) and spilled into the run
  when full. An entry whose block was accessed or left since is stale (its key is no longer the block's, or the block
  is gone) and is skipped;
* a unit's members get their CRF (decays from a table), key and resident slot; a unit past the quota evicts the
  lowest ``(key, tie)`` of the run's and the side's fronts, one at a time, which are the lowest of ``C ∪ U`` since
  every resident below ``T`` is in the pool and every other is at least ``T``;
* when both are spent, the pool is filled again from the residents' keys (a dense copy per resident slot): those
  below a new threshold about :data:`_RUN` entries on (guessed from the last fill's spread of keys; an exact
  selection, :func:`._kernels_bits._kth_lowest`, where the guess holds fewer than the unit still has to evict), sorted
  (:func:`_sort`: runs of 64 by sorting networks, then merges).

Ties leave by lower tie position, as in every loop. Event-atomic units evict at the end of the event, sequential ones
at each access (one unit per access, the layer clock counting accesses). The decision, the hit counts and the hit
flags are those of ``replay_ranked`` for ``lrfu`` (``tests/test_lrfu_global.py``; the engine against the naive
twin).
"""

from __future__ import annotations

import numpy as np

from .._bits import ctlz
from .._jit import jit_helper, jit_inline, jit_loop
from ._kernels import _max_unit, crf_decays, crf_key
from ._kernels_bits import _LRFU_DECAYS, _U, _kth_lowest, _lrfu_decay, _most_layer_events
from ._simd import f2u, sort_small, u2f

#: Entries a fill of the pool aims for (the next fill's threshold is set so that the last fill's spread of keys
#: holds about this many).
_RUN = 256
#: Entries the side list holds, besides room for one unit's, before it spills into the run.
_SIDE = 64
#: Entries a sorting network takes (``_simd.sort_small``): the first runs of :func:`_sort`.
_NETWORK = 64
#: The most bits a tie position may take in a packed key (``2**-32`` of the key); past it (more than ``2**20``
#: blocks) :func:`_sort` starts from runs of 8 by insertion.
_MAX_TIE_BITS = 20


def replay_lrfu_global(offsets, expert, ev_layer, n_experts, n_layers, atomic, capacity, tie_pos, lam, count_from,
                       hits, misses, hit_flag, run=_RUN, side=_SIDE):
    """``lrfu`` with one global pool of ``capacity[0]`` blocks, either semantics (the decision of ``replay_ranked``).

    ``tie_pos[b]`` is block ``b``'s position among all ``n_layers * n_experts`` blocks by ascending tie rank (lower
    leaves first among equal keys); the other parameters are those of :func:`._kernels.replay_heap` for one
    partition; ``run`` and ``side`` size the pool (:data:`_RUN`, :data:`_SIDE`; tests pass small ones, so that
    every path runs on small streams). The state is allocated here and the loop runs in :func:`_replay_lrfu_global`.
    """
    n_blocks = n_layers * n_experts
    cap = min(int(capacity[0]), n_blocks)
    max_unit = int(_max_unit(offsets, atomic))
    side = max(int(side), 1) + max_unit           # the side list's room: the short list, and a unit's new entries
    # a run, a unit and the side at most, and room for a network's lanes
    width = min(cap + max_unit, n_blocks) + max_unit + side + 2 + _NETWORK
    unit = max_unit + 1
    n_units = int(_most_layer_events(ev_layer, n_layers)) if atomic else int(offsets[-1])
    f = np.array([-np.inf, 0.0])                   # the threshold T, the last fill's spread of keys per entry
    z = np.zeros
    _replay_lrfu_global(offsets, expert, ev_layer, n_experts, bool(atomic), cap, tie_pos.astype(np.int64),
                        float(lam), count_from, hits, misses, hit_flag, z(n_blocks), np.full(n_blocks, -1, np.int64),
                        np.full(n_blocks, -1.0), z(n_blocks, np.int64), z(width, np.int64), z(width),
                        z(max(n_layers, 1), np.int64), crf_decays(float(lam), min(n_units + 1, _LRFU_DECAYS)),
                        z(width), z(width, np.int64), z(side), z(side, np.int64), z(width), z(width, np.int64), z(unit),
                        z(unit, np.int64), z(width), z(width, np.int64), f,
                        max(int(run), 1))


@jit_inline
def _below(ka, ta, kb, tb):
    """Whether ``(ka, ta)`` ranks below ``(kb, tb)`` (leaves first); no branch on the tie."""
    return (ka < kb) | ((ka == kb) & (ta < tb))


@jit_helper
def _sort(k, t, n, sk, st, K):
    """Sort ``(k, t)[:n]`` by ``(key, tie)`` in place, where each ``k[i]`` is ``K[t[i]]`` (the key of tie position
    ``t[i]``; ``K`` has one entry per block): runs of :data:`_NETWORK` sorted by a network (``_simd.sort_small``, in
    ``sk``) on the keys with the tie position in their low bits (the exact keys back from ``K``, then an insertion
    pass, which moves only keys that agree above those bits), or, past :data:`_MAX_TIE_BITS` bits of tie positions,
    runs of 8 by insertion; then a bottom-up merge through the scratch ``sk`` / ``st`` (at least :data:`_NETWORK`
    entries). Runs of 8 and their merges took about 38% of the loop's samples at rho 0.2; with the networks the loop
    takes 0.67-0.82 of its time (``benchmarks/kernel_ab.py --kernel lrfu-global``; docs/performance.md, *Session
    43*)."""
    tie_bits = 64 - np.int64(ctlz(np.uint64(max(K.shape[0] - 1, 1))))
    if tie_bits <= _MAX_TIE_BITS:
        width = _NETWORK
        pk = sk                        # (free until the merges)
        low = (np.uint64(1) << _U(tie_bits)) - np.uint64(1)
        for lo in range(0, n, _NETWORK):
            cn = min(_NETWORK, n - lo)
            for r in range(cn):
                pk[r] = u2f((f2u(k[lo + r]) & ~low) | _U(t[lo + r]))
            sort_small(pk, cn, pk)
            for r in range(cn):
                x = np.int64(f2u(pk[r]) & low)
                t[lo + r] = x
                k[lo + r] = K[_U(x)]
            _insertion(k, t, lo, lo + cn)
    else:
        width = 8
        for lo in range(0, n, 8):
            _insertion(k, t, lo, min(lo + 8, n))
    src_k, src_t, dst_k, dst_t = k, t, sk, st
    flipped = False
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            _merge(src_k, src_t, lo, mid, src_k, src_t, mid, hi, dst_k, dst_t, lo)
        src_k, src_t, dst_k, dst_t = dst_k, dst_t, src_k, src_t
        flipped = not flipped
        width *= 2
    if flipped:
        for i in range(n):
            k[i] = sk[i]
            t[i] = st[i]


@jit_inline
def _insertion(k, t, lo, hi):
    """Insertion sort of ``(k, t)[lo:hi]`` by ``(key, tie)``."""
    for i in range(lo + 1, hi):
        x = k[i]
        y = t[i]
        j = i - 1
        while j >= lo and _below(x, y, k[j], t[j]):
            k[j + 1] = k[j]
            t[j + 1] = t[j]
            j -= 1
        k[j + 1] = x
        t[j + 1] = y


@jit_inline
def _merge(ak, at, a0, a1, bk, bt, b0, b1, ok, ot, o):
    """Merge the sorted ``(ak, at)[a0:a1]`` and ``(bk, bt)[b0:b1]`` into ``(ok, ot)`` from ``o``; returns the end.
    The choice is data, not a branch (a branch mispredicts on about every other step of a merge)."""
    while a0 < a1 and b0 < b1:
        xa = ak[_U(a0)]
        ya = at[_U(a0)]
        xb = bk[_U(b0)]
        yb = bt[_U(b0)]
        tb = _below(xb, yb, xa, ya)
        ok[_U(o)] = xb if tb else xa
        ot[_U(o)] = yb if tb else ya
        b0 += np.int64(tb)
        a0 += 1 - np.int64(tb)
        o += 1
    while a0 < a1:
        ok[_U(o)] = ak[_U(a0)]
        ot[_U(o)] = at[_U(a0)]
        a0 += 1
        o += 1
    while b0 < b1:
        ok[_U(o)] = bk[_U(b0)]
        ot[_U(o)] = bt[_U(b0)]
        b0 += 1
        o += 1
    return o


@jit_inline
def _live(k, t, K):
    """Whether the pool entry ``(k, t)`` still names a resident with that key (``K`` is -1 where none)."""
    return K[_U(t)] == k


@jit_helper
def _fill(slot_key, slot_tp, n_res, rk, rt, xk, xt, f, need, run, K):
    """Fill the run ``(rk, rt)`` with the residents below a new threshold, sorted; returns its length. Every
    resident is at least the old threshold ``f[0]`` (the pool is spent). The new one lies the last fill's spread
    ``f[1]`` per entry times ``run`` (:data:`_RUN`) above the lowest key; where that holds fewer than ``need`` (or no
    spread is known) the ``run``-th lowest key is selected exactly and the threshold is just above it."""
    lo = np.inf
    for s in range(n_res):
        lo = min(lo, slot_key[s])
    q = 0
    thr = lo + f[1] * run if f[1] > 0.0 else -np.inf
    if thr > lo:
        for s in range(n_res):         # (branch-free: an entry written at q, kept where it counts)
            x = slot_key[s]
            rk[q] = x
            rt[q] = slot_tp[s]
            q += x < thr
    if q < need or q == 0:
        for s in range(n_res):
            xk[s] = slot_key[s]
        v = _kth_lowest(xk, rk, n_res, max(min(run, n_res), need))
        thr = np.nextafter(v, np.inf)
        q = 0
        for s in range(n_res):
            x = slot_key[s]
            rk[q] = x
            rt[q] = slot_tp[s]
            q += x < thr
    _sort(rk, rt, q, xk, xt, K)
    if q > 1 and rk[q - 1] > rk[0]:
        f[1] = (rk[q - 1] - rk[0]) / (q - 1)
    f[0] = thr
    return q


@jit_helper
def _merge_run(rk, rt, head, tail, ak, at, na, xk, xt, K):
    """Merge the ascending ``(ak, at)[:na]`` into the run ``[head, tail)`` through the scratch ``(xk, xt)``, keeping
    only live entries; the run then starts at 0 and its end is returned."""
    n = _merge(rk, rt, head, tail, ak, at, 0, na, xk, xt, 0)
    q = 0
    for r in range(n):
        rk[q] = xk[r]
        rt[q] = xt[r]
        q += _live(xk[r], xt[r], K)
    return q


@jit_helper
def _side_up(sk, stp, n_side, yk, yt):
    """The side list (descending) ascending in ``(yk, yt)``."""
    for r in range(n_side):
        yk[r] = sk[n_side - 1 - r]
        yt[r] = stp[n_side - 1 - r]


@jit_helper
def _add_unit(rk, rt, head, tail, sk, stp, n_side, nk, nt, n_new, xk, xt, yk, yt, K):
    """An event-atomic unit's entries below the threshold ``(nk, nt)[:n_new]`` (in member order) into the pool:
    sorted, merged with the side list; where that overfills the side list's room (:data:`_SIDE` and a unit), all
    of it into the run. Returns the run's head and end and the side's length."""
    _sort(nk, nt, n_new, yk, yt, K)
    _side_up(sk, stp, n_side, yk, yt)
    n = _merge(yk, yt, 0, n_side, nk, nt, 0, n_new, xk, xt, 0)
    if n <= sk.shape[0]:
        for r in range(n):
            sk[r] = xk[n - 1 - r]
            stp[r] = xt[n - 1 - r]
        return head, tail, n
    return 0, _merge_run(rk, rt, head, tail, xk, xt, n, yk, yt, K), 0


@jit_loop
def _replay_lrfu_global(offsets, expert, ev_layer, n_experts, atomic, cap, tie_pos, lam, count_from, hits, misses,
                        hit_flag, S, PL, K, slot_of, slot_tp, slot_key, lunits, P, rk, rt, sk, stp, xk, xt, nk, nt, yk, yt,
                        f, run):
    """The loop of :func:`replay_lrfu_global`. Per tie position: the CRF ``S``, the layer unit of the last access
    ``PL`` (-1: none), the key ``K`` while resident (-1 otherwise), the resident's slot; per slot its tie position
    and key; the run ``(rk, rt)`` ascending, the side ``(sk, stp)`` descending, an event's new entries ``(nk, nt)``,
    scratch ``xk`` / ``xt`` / ``yk`` / ``yt``; ``f`` the threshold and the last fill's spread."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_res = 0                          # the residents, the run's head and end, the side's length
    head = 0
    tail = 0
    n_side = 0
    for i in range(n_events):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        counted = i >= count_from
        for un in range(1 if atomic else hi - lo):
            a_lo, a_hi = (lo, hi) if atomic else (lo + un, lo + un + 1)     # the event, or its un-th access
            u = lunits[layer]
            lunits[layer] = u + 1
            now = float(u)
            thr = f[0]
            n_hit = 0
            n_new = 0
            for a in range(a_lo, a_hi):
                t = tie_pos[_U(base + expert[_U(a)])]
                j = _U(t)
                s = 1.0 + S[j] * _lrfu_decay(P, lam, u - PL[j])   # a first access: S 0, its CRF 1
                S[j] = s
                PL[j] = u
                k = crf_key(s, now, lam)
                if K[j] >= 0.0:        # a hit
                    n_hit += 1
                    if record:
                        hit_flag[_U(a)] = 1
                    slot_key[_U(slot_of[j])] = k
                else:
                    slot_of[j] = n_res
                    slot_tp[_U(n_res)] = t
                    slot_key[_U(n_res)] = k
                    n_res += 1
                K[j] = k
                if k < thr and atomic:     # below the threshold: into the pool at the unit's end
                    nk[_U(n_new)] = k
                    nt[_U(n_new)] = t
                    n_new += 1
                elif k < thr:          # (one access a unit: into the side list, kept descending; a new key is
                    if n_side == sk.shape[0]:  # mostly among the lowest, so few entries move)
                        _side_up(sk, stp, n_side, yk, yt)
                        tail = _merge_run(rk, rt, head, tail, yk, yt, n_side, xk, xt, K)
                        head = 0
                        n_side = 0
                    q = n_side
                    while q > 0 and _below(sk[_U(q - 1)], stp[_U(q - 1)], k, t):
                        sk[_U(q)] = sk[_U(q - 1)]
                        stp[_U(q)] = stp[_U(q - 1)]
                        q -= 1
                    sk[_U(q)] = k
                    stp[_U(q)] = t
                    n_side += 1
            if counted:
                hits[layer] += n_hit
                misses[layer] += (a_hi - a_lo) - n_hit
            if n_new:
                head, tail, n_side = _add_unit(rk, rt, head, tail, sk, stp, n_side, nk, nt, n_new, xk, xt, yk, yt, K)
            m = n_res - cap
            while m > 0:
                while head < tail and not _live(rk[_U(head)], rt[_U(head)], K):
                    head += 1
                while n_side > 0 and not _live(sk[_U(n_side - 1)], stp[_U(n_side - 1)], K):
                    n_side -= 1
                if head == tail and n_side == 0:        # the pool is spent: fill it again
                    head = 0
                    tail = _fill(slot_key, slot_tp, n_res, rk, rt, xk, xt, f, m, run, K)
                    continue
                if n_side == 0 or (head < tail and _below(rk[_U(head)], rt[_U(head)], sk[_U(n_side - 1)],
                                                          stp[_U(n_side - 1)])):
                    t = rt[_U(head)]
                    head += 1
                else:
                    n_side -= 1
                    t = stp[_U(n_side)]
                j = _U(t)
                K[j] = -1.0
                q = slot_of[j]                          # its slot takes the last one's
                n_res -= 1
                last = slot_tp[_U(n_res)]
                slot_tp[_U(q)] = last
                slot_key[_U(q)] = slot_key[_U(n_res)]
                slot_of[_U(last)] = q
                m -= 1
