"""numba kernels for ``lfru``, whose key ``freq / (t - last + 1)`` drifts with time.

They make the decision of :func:`._kernels.replay_scan` with the lfru key (computed
by the same float expression) and trust their inputs.

:func:`replay_select` keeps residents in per-partition slots with their counts
and clocks; every candidate is re-ranked at each overflowing unit and the leaving
``n_go`` are selected in a small max-heap of contiguous keys (the non-negative
float key's bits order like the float).

The engine runs :func:`replay_select` for ``lfru`` per layer where the bitset
loop of ``_kernels_bits`` does not apply (more than 1,024 experts, streams past
its bound of units); :mod:`._kernels_lfru_groups` takes
global scope (:mod:`._kernels_lfru_slots` small event-atomic global caches, :mod:`._kernels_lfru_cands`
sequential units).
"""

from __future__ import annotations

import numpy as np

from .._jit import jit, jit_helper
from ._kernels_ranked import _below, _max_unit, _slots


@jit_helper
def _sel_sink(sk, st, si, i, n, k, tb, j):
    """Binary max-heap on ``(sk, st)`` (top: the best of those selected to leave): place ``j`` at ``i``."""
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        c2 = child + 1
        if c2 < n and _below(sk[child], st[child], sk[c2], st[c2]):
            child = c2
        if not _below(k, tb, sk[child], st[child]):
            break
        sk[i] = sk[child]
        st[i] = st[child]
        si[i] = si[child]
        i = child
    sk[i] = k
    st[i] = tb
    si[i] = j


@jit_helper
def _sel_rise(sk, st, si, i, k, tb, j):
    """Binary max-heap on ``(sk, st)``: place candidate ``j`` at ``i``, sift up."""
    while i > 0:
        parent = (i - 1) >> 1
        if not _below(sk[parent], st[parent], k, tb):
            break
        sk[i] = sk[parent]
        st[i] = st[parent]
        si[i] = si[parent]
        i = parent
    sk[i] = k
    st[i] = tb
    si[i] = j


@jit_helper
def _sel_offer(sk, st, si, n_sel, m, k, tb, j):
    """Offer candidate ``j`` (key ``k``, tie rank ``tb``) to the max-heap of the ``m`` lowest so far (``n_sel``
    of them); return the heap's new size."""
    if n_sel < m:
        _sel_rise(sk, st, si, n_sel, k, tb, j)
        return n_sel + 1
    if _below(k, tb, sk[0], st[0]):
        _sel_sink(sk, st, si, 0, n_sel, k, tb, j)
    return n_sel


@jit
def replay_select(offsets, expert, ev_layer, n_experts, n_layers, global_scope, atomic, capacity, tie, count_from,
                  hits, misses, hit_flag):
    """``lfru``: residents in per-partition slots, selection per unit.

    No order is kept between units: each slot holds its block's count, last
    unit and tie rank; the key ``freq / (t - last + 1)`` is evaluated at each
    overflow by the float expression of ``replay_scan`` (its non-negative float
    bits then rank like the float). At an overflowing unit the ``n_go`` lowest
    of the slots and the unit's misses are selected in a small max-heap of
    contiguous keys and leave. Cheap where units are large against the capacity
    (event-atomic, per layer): ``O(c + |U| log n_go)`` per unit. Parameters are
    those of :func:`._kernels.replay_heap` less the ones ``lfru`` does not read.
    """
    n_blocks = n_layers * n_experts
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_parts = capacity.shape[0]
    max_unit = _max_unit(offsets, atomic)
    slots = max(_slots(capacity, n_blocks), 1)
    rb = np.empty((n_parts, slots), dtype=np.int64)     # block in each slot
    rk = np.empty((n_parts, slots), dtype=np.int64)     # its count
    rl = np.empty((n_parts, slots), dtype=np.int64)     # its last unit
    rt = np.empty((n_parts, slots), dtype=np.int64)     # its tie rank
    n_res = np.zeros(n_parts, dtype=np.int64)
    spos = np.full(n_blocks, -1, dtype=np.int64)        # slot of a resident, -1 if absent
    freq = np.zeros(n_blocks, dtype=np.int64)
    fkey = np.empty(1, dtype=np.float64)
    fkey_bits = fkey.view(np.int64)
    miss_buf = np.empty(max_unit, dtype=np.int64)
    miss_key = np.empty(max_unit, dtype=np.int64)
    miss_tie = np.empty(max_unit, dtype=np.int64)
    width = slots + max_unit
    sk = np.empty(width, dtype=np.int64)
    st = np.empty(width, dtype=np.int64)
    si = np.empty(width, dtype=np.int64)
    go = np.zeros(width, dtype=np.bool_)
    free = np.empty(width, dtype=np.int64)
    t = 0
    for i in range(n_events):
        layer = ev_layer[i]
        p = 0 if global_scope else layer
        cap = capacity[p]
        base = layer * n_experts
        counted = i >= count_from
        lo = offsets[i]
        hi = offsets[i + 1]
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            n_miss = 0
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                f = freq[b] + 1             # the count now; the float key at selection
                freq[b] = f
                s = spos[b]
                if s >= 0:
                    rk[p, s] = f
                    rl[p, s] = t
                    if record:
                        hit_flag[a] = 1
                else:
                    miss_buf[n_miss] = b
                    miss_key[n_miss] = f
                    miss_tie[n_miss] = tie[b]
                    n_miss += 1
            if counted:
                hits[layer] += (a_hi - a_lo) - n_miss
                misses[layer] += n_miss
            t1 = t
            t += 1
            if n_miss == 0:
                continue
            r = n_res[p]
            n_go = r + n_miss - cap
            if n_go <= 0:
                for j in range(n_miss):
                    s = r + j
                    b = miss_buf[j]
                    rb[p, s] = b
                    rk[p, s] = miss_key[j]
                    rl[p, s] = t1
                    rt[p, s] = miss_tie[j]
                    spos[b] = s
                n_res[p] = r + n_miss
                continue
            # the n_go lowest of slots 0..r-1 then misses r..r+n_miss-1, in a max-heap of contiguous keys
            n_sel = 0
            for j in range(r + n_miss):
                if j < r:
                    fkey[0] = rk[p, j] / float(t1 - rl[p, j] + 1)
                    tb = rt[p, j]
                else:
                    fkey[0] = miss_key[j - r] / 1.0
                    tb = miss_tie[j - r]
                n_sel = _sel_offer(sk, st, si, n_sel, n_go, fkey_bits[0], tb, j)
            n_free = 0
            for j in range(n_sel):
                c = si[j]
                go[c] = True
                if c < r:
                    b = rb[p, c]
                    spos[b] = -1
                    free[n_free] = c
                    n_free += 1
            nxt_slot = r
            for j in range(n_miss):
                if go[r + j]:
                    continue
                b = miss_buf[j]
                if n_free:
                    n_free -= 1
                    s = free[n_free]
                else:
                    s = nxt_slot
                    nxt_slot += 1
                rb[p, s] = b
                rk[p, s] = miss_key[j]
                rl[p, s] = t1
                rt[p, s] = miss_tie[j]
                spos[b] = s
            for j in range(n_sel):
                go[si[j]] = False
            n_res[p] = cap
