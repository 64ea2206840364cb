"""numba kernels for ``lfru``, whose key ``freq / (t - last + 1)`` drifts with time.

They make the decision of :func:`._kernels.replay_scan` with the lfru key (computed
by the same float expression) and trust their inputs.

* :func:`replay_select` — residents in per-partition slots with their counts and
  clocks; every candidate is re-ranked at each overflowing unit and the leaving
  ``n_go`` are selected in a small max-heap of contiguous keys (the non-negative
  float key's bits order like the float).
* :func:`replay_lfru_pool` — for one large partition with one access per unit
  (sequential units, global scope): only a pool of residents whose key may lie
  below a threshold is re-ranked. The engine no longer dispatches it: global
  ``lfru`` replays in :mod:`._kernels_lfru_groups` (about 25x faster there).

The engine runs :func:`replay_select` for ``lfru`` per layer where the bitset
loop of ``_kernels_bits`` does not apply (sequential units, more than 1,024
experts, streams past its event bound); :mod:`._kernels_lfru_groups` takes
global scope.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit, jit_helper
from ._kernels_ranked import _below, _max_unit, _rise, _sink, _slots


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
    those of :func:`replay_lfru_pool`.
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
                k = fkey_bits[0]
                if n_sel < n_go:
                    _sel_rise(sk, st, si, n_sel, k, tb, j)
                    n_sel += 1
                elif _below(k, tb, sk[0], st[0]):
                    _sel_sink(sk, st, si, 0, n_sel, k, tb, j)
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


@jit_helper
def _lfru_due(f, last, theta):
    """A unit from which ``f / (t - last + 1)`` may be below ``theta`` (never later than the first such unit)."""
    x = f / theta
    if x > 1e15:
        x = 1e15
    return last + np.int64(x) - 3


@jit
def replay_lfru_pool(offsets, expert, ev_layer, n_experts, n_layers, global_scope, atomic, capacity, tie, count_from,
                     hits, misses, hit_flag):
    """``lfru`` for large partitions (global scope, one access per unit): only residents whose key may be low.

    A resident's key ``freq / (t - last + 1)`` only falls until its block is
    accessed, so under a threshold ``theta`` per partition the unit from which
    it may lie below ``theta`` is known when it is last touched
    (:func:`_lfru_due`, rounded early). Residents wait in a min-heap by that
    unit and join a *pool* when it comes; residents still waiting rank at or
    above ``theta``. At an overflowing unit the candidates are the pool and the
    unit's members, re-ranked by the float expression of ``replay_scan``; if
    fewer than ``n_go`` of them rank below ``theta`` the lowest may wait
    outside, so every resident joins the pool and ``theta`` doubles. A pool
    grown large lowers ``theta`` to twice the highest key that left (waiting
    residents' units stay early, hence valid). The decision is that of ``replay_scan``; other parameters are those
    of :func:`replay_select`.
    """
    n_blocks = n_layers * n_experts
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_parts = capacity.shape[0]
    max_unit = _max_unit(offsets, atomic)
    slots = max(_slots(capacity, n_blocks), 1)
    heap = np.empty((n_parts, slots + max_unit), dtype=np.int64)   # waiting residents, by due unit
    hk = np.empty((n_parts, slots + max_unit), dtype=np.int64)
    ht = np.zeros((n_parts, slots + max_unit), dtype=np.int64)
    n_heap = np.zeros(n_parts, dtype=np.int64)
    hpos = np.full(n_blocks, -1, dtype=np.int64)
    pool = np.empty((n_parts, slots + max_unit), dtype=np.int64)   # residents whose key may be below theta
    n_pool = np.zeros(n_parts, dtype=np.int64)
    ppos = np.full(n_blocks, -1, dtype=np.int64)
    n_res = np.zeros(n_parts, dtype=np.int64)
    resident = np.zeros(n_blocks, dtype=np.bool_)
    theta = np.ones(n_parts, dtype=np.float64)
    freq = np.zeros(n_blocks, dtype=np.int64)
    last = np.zeros(n_blocks, dtype=np.int64)
    mem = np.empty(max_unit, dtype=np.int64)
    width = slots + max_unit
    cand = np.empty(width, dtype=np.int64)
    sk = np.empty(width, dtype=np.int64)
    st = np.empty(width, dtype=np.int64)
    si = np.empty(width, dtype=np.int64)
    go = np.zeros(n_blocks, dtype=np.bool_)
    fkey = np.empty(1, dtype=np.float64)
    fkey_bits = fkey.view(np.int64)
    tau_bits = np.int64(0)
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
            n_mem = 0
            n_hit = 0
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                freq[b] += 1
                last[b] = t
                mem[n_mem] = b
                n_mem += 1
                if resident[b]:
                    n_hit += 1
                    if record:
                        hit_flag[a] = 1
                    # a member leaves the waiting heap or the pool; it rejoins after the decision
                    if hpos[b] >= 0:
                        j = hpos[b]
                        hpos[b] = -1
                        n = n_heap[p] - 1
                        n_heap[p] = n
                        if j < n:
                            q = heap[p, n]
                            _sink(heap, hk, ht, p, j, n, q, hk[p, n], 0, hpos)
                            _rise(heap, hk, ht, p, hpos[q], q, hk[p, hpos[q]], 0, hpos)
                    else:
                        j = ppos[b]
                        ppos[b] = -1
                        n = n_pool[p] - 1
                        n_pool[p] = n
                        if j < n:
                            q = pool[p, n]
                            pool[p, j] = q
                            ppos[q] = j
                    n_res[p] -= 1
                    resident[b] = False
            if counted:
                hits[layer] += n_hit
                misses[layer] += n_mem - n_hit
            # residents whose key may now be below theta join the pool
            while n_heap[p] > 0 and hk[p, 0] <= t:
                q = heap[p, 0]
                hpos[q] = -1
                n = n_heap[p] - 1
                n_heap[p] = n
                if n > 0:
                    _sink(heap, hk, ht, p, 0, n, heap[p, n], hk[p, n], 0, hpos)
                ppos[q] = n_pool[p]
                pool[p, n_pool[p]] = q
                n_pool[p] += 1
            n_go = n_res[p] + n_mem - cap
            if n_go > 0:
                th = theta[p]
                while True:
                    # candidates: the pool, then the members; count those ranking below theta
                    n_c = 0
                    below = 0
                    for j in range(n_pool[p]):
                        cand[n_c] = pool[p, j]
                        n_c += 1
                    for j in range(n_mem):
                        cand[n_c] = mem[j]
                        n_c += 1
                    n_sel = 0
                    for j in range(n_c):
                        b = cand[j]
                        kf = freq[b] / float(t - last[b] + 1)
                        if kf < th:
                            below += 1
                        fkey[0] = kf
                        k = fkey_bits[0]
                        tb = tie[b]
                        if n_sel < n_go:
                            _sel_rise(sk, st, si, n_sel, k, tb, b)
                            n_sel += 1
                        elif _below(k, tb, sk[0], st[0]):
                            _sel_sink(sk, st, si, 0, n_sel, k, tb, b)
                    if below >= n_go or n_heap[p] == 0:
                        break
                    # the lowest may still wait: every resident joins the pool, theta doubles
                    for j in range(n_heap[p]):
                        q = heap[p, j]
                        hpos[q] = -1
                        ppos[q] = n_pool[p]
                        pool[p, n_pool[p]] = q
                        n_pool[p] += 1
                    n_heap[p] = 0
                    th *= 2.0
                    theta[p] = th
                tau_bits = sk[0]
                for j in range(n_sel):
                    go[si[j]] = True
                # pool residents selected leave
                j = 0
                while j < n_pool[p]:
                    q = pool[p, j]
                    if go[q]:
                        go[q] = False
                        ppos[q] = -1
                        resident[q] = False
                        n_res[p] -= 1
                        n = n_pool[p] - 1
                        n_pool[p] = n
                        if j < n:
                            r = pool[p, n]
                            pool[p, j] = r
                            ppos[r] = j
                        continue
                    j += 1
            # members that stay rejoin: in the pool if their key may be low, else waiting
            th = theta[p]
            for j in range(n_mem):
                b = mem[j]
                if go[b]:
                    go[b] = False
                    continue
                resident[b] = True
                n_res[p] += 1
                due = _lfru_due(freq[b], t, th)
                if due <= t:
                    ppos[b] = n_pool[p]
                    pool[p, n_pool[p]] = b
                    n_pool[p] += 1
                else:
                    n = n_heap[p]
                    n_heap[p] = n + 1
                    _rise(heap, hk, ht, p, n, b, due, 0, hpos)
            # a large pool: halve theta; pool residents not yet due go back to wait
            if n_go > 0 and n_pool[p] > 8 * n_go + 64:
                fkey_bits[0] = tau_bits            # the n_go-th lowest key of this unit
                th = min(theta[p], 2.0 * fkey[0])
                theta[p] = th
                j = 0
                while j < n_pool[p]:
                    q = pool[p, j]
                    due = _lfru_due(freq[q], last[q], th)
                    if due > t:
                        ppos[q] = -1
                        n = n_pool[p] - 1
                        n_pool[p] = n
                        if j < n:
                            r = pool[p, n]
                            pool[p, j] = r
                            ppos[r] = j
                        m = n_heap[p]
                        n_heap[p] = m + 1
                        _rise(heap, hk, ht, p, m, q, due, 0, hpos)
                        continue
                    j += 1
            t += 1
