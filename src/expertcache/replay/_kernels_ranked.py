"""numba kernels for the frequency and staleness policies: lfu, lrfu, least-stale, lfru.

They make the decision of :func:`._kernels.replay_heap` / :func:`._kernels.replay_scan`
(at the end of a unit keep the ``c`` best of ``C ∪ U`` by ``(key, tie)``) on
structures fitted to small partitions, and trust their inputs.

* :func:`replay_ranked` — keys that change only when their block is accessed
  (``lfu``, ``lrfu``, ``least-stale``). Each key is one int64 that orders like
  the policy's key, ``lfu``: ``count << tie_bits | tie``; ``least-stale``:
  ``(cycle << coff_bits | offset) << tie_bits | tie`` with cycles numbered from
  0; ``lrfu``: the bits of the non-negative float key, which order like the
  float, with the tie rank in a second column. Keys sit in an 8-ary min-heap
  per partition (contiguous keys, shallow: the layout of ``replay_belady``'s
  heap). A hit only raises its block's key (sift down).
* :func:`replay_lfru` — ``lfru``'s ``freq / (t - last + 1)`` drifts, so every
  candidate is re-ranked at each overflowing unit, from per-slot arrays of the
  residents' counts and clocks (no per-candidate indirection); the leaving
  ``n_go`` are selected in a small max-heap of contiguous keys.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit, jit_helper
from .keys import KEY_LEAST_STALE, KEY_LFRU, KEY_LFU, KEY_LRFU


@jit_helper
def _below(ka, ta, kb, tb):
    """Whether ``(ka, ta)`` ranks below ``(kb, tb)`` (leaves first)."""
    return ka < kb or (ka == kb and ta < tb)


@jit_helper
def _rise(heap, hk, ht, p, i, b, key, tb, pos):
    """8-ary min-heap on ``(hk, ht)``: place block ``b`` (key ``key``, tie ``tb``) at ``i``, sift up."""
    while i > 0:
        parent = (i - 1) >> 3
        if not _below(key, tb, hk[p, parent], ht[p, parent]):
            break
        q = heap[p, parent]
        heap[p, i] = q
        hk[p, i] = hk[p, parent]
        ht[p, i] = ht[p, parent]
        pos[q] = i
        i = parent
    heap[p, i] = b
    hk[p, i] = key
    ht[p, i] = tb
    pos[b] = i


@jit_helper
def _sink(heap, hk, ht, p, i, n, b, key, tb, pos):
    """8-ary min-heap on ``(hk, ht)``: place block ``b`` at ``i`` of ``heap[p, :n]``, sift down."""
    while True:
        first = 8 * i + 1
        if first >= n:
            break
        child = first
        bk = hk[p, first]
        bt = ht[p, first]
        for c in range(first + 1, min(first + 8, n)):
            if _below(hk[p, c], ht[p, c], bk, bt):
                bk = hk[p, c]
                bt = ht[p, c]
                child = c
        if not _below(bk, bt, key, tb):
            break
        q = heap[p, child]
        heap[p, i] = q
        hk[p, i] = bk
        ht[p, i] = bt
        pos[q] = i
        i = child
    heap[p, i] = b
    hk[p, i] = key
    ht[p, i] = tb
    pos[b] = i


@jit
def _max_unit(offsets, atomic):
    if not atomic:
        return 1
    m = 1
    for i in range(offsets.shape[0] - 1):
        m = max(m, offsets[i + 1] - offsets[i])
    return m


@jit
def _slots(capacity, n_blocks):
    """Residents a partition can ever hold: the largest capacity, at most the universe."""
    slots = 0
    for p in range(capacity.shape[0]):
        slots = max(slots, min(capacity[p], n_blocks))
    return slots


@jit
def replay_ranked(offsets, expert, ev_layer, ev_step, n_experts, n_layers, global_scope, atomic, capacity, tie,
                  key_code, tie_bits, coff_bits, reset_freq_on_evict, lam, count_from, hits, misses, hit_flag):
    """``lfu``, ``lrfu`` or ``least-stale`` (``key_code``) with one int64 key per block in 8-ary heaps.

    Parameters are those of :func:`._kernels.replay_heap` (without ``access_next``), plus
    tie_bits : int
        Under ``lfu`` and ``least-stale`` the tie rank is packed into the key's low
        ``tie_bits`` bits (``tie < 2**tie_bits``), so one int64 comparison ranks two blocks
        (the heap's tie column then stays 0); ``lrfu`` compares the tie column.
    coff_bits : int
        ``least-stale``: the offset in the cycle takes the ``coff_bits`` bits above the tie
        (``offset < 2**coff_bits``), the cycle number the bits above (the caller checks the fit).

    The keys, and so every decision, are those of ``replay_heap``: LFU's count (reset on
    leaving under ``reset_freq_on_evict``), least-stale's ``(cycle, offset in cycle)`` and
    LRFU's recursive ``log2`` CRF computed by the same float expression.
    """
    n_blocks = n_layers * n_experts
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_parts = capacity.shape[0]
    max_unit = _max_unit(offsets, atomic)
    width = _slots(capacity, n_blocks) + max_unit
    heap = np.empty((n_parts, width), dtype=np.int64)
    hk = np.empty((n_parts, width), dtype=np.int64)
    ht = np.empty((n_parts, width), dtype=np.int64)
    size = np.zeros(n_parts, dtype=np.int64)
    pos = np.full(n_blocks, -1, dtype=np.int64)
    freq = np.zeros(n_blocks, dtype=np.int64)
    crf = np.full(n_blocks, -np.inf, dtype=np.float64)
    crf_bits = crf.view(np.int64)                  # crf >= 0 once accessed: its bits order like the float
    lunits = np.zeros(n_layers, dtype=np.int64)    # the LRFU clock: units of each layer so far
    t = 0
    cur_step = -1
    cycle = np.int64(-1)
    cycle_start = 0
    key = np.int64(0)
    stale = np.int64(0)
    now = 0.0
    for i in range(n_events):
        layer = ev_layer[i]
        p = 0 if global_scope else layer
        cap = capacity[p]
        base = layer * n_experts
        if ev_step[i] != cur_step:
            cur_step = ev_step[i]
            cycle += 1
            cycle_start = t
        counted = i >= count_from
        lo = offsets[i]
        hi = offsets[i + 1]
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            n_miss = 0
            if key_code == KEY_LEAST_STALE:
                stale = ((cycle << coff_bits) | (t - cycle_start)) << tie_bits
            elif key_code == KEY_LRFU:
                now = lam * float(lunits[layer])
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                tb = np.int64(0)
                if key_code == KEY_LFU:
                    f = freq[b] + 1
                    freq[b] = f
                    key = (f << tie_bits) | tie[b]
                elif key_code == KEY_LEAST_STALE:
                    key = stale | tie[b]
                else:
                    crf[b] = now + np.log2(1.0 + np.exp2(crf[b] - now))
                    key = crf_bits[b]
                    tb = tie[b]
                if pos[b] >= 0:
                    _sink(heap, hk, ht, p, pos[b], size[p], b, key, tb, pos)   # its key rose
                    if record:
                        hit_flag[a] = 1
                else:
                    n_miss += 1
                    n = size[p]
                    size[p] = n + 1
                    _rise(heap, hk, ht, p, n, b, key, tb, pos)
            if counted:
                hits[layer] += (a_hi - a_lo) - n_miss
                misses[layer] += n_miss
            while size[p] > cap:
                b = heap[p, 0]
                pos[b] = -1
                n = size[p] - 1
                size[p] = n
                if n > 0:
                    _sink(heap, hk, ht, p, 0, n, heap[p, n], hk[p, n], ht[p, n], pos)
                if reset_freq_on_evict:
                    freq[b] = 0
            t += 1
            lunits[layer] += 1


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
def replay_select(offsets, expert, ev_layer, ev_step, n_experts, n_layers, global_scope, atomic, capacity, tie,
                  key_code, tie_bits, coff_bits, reset_freq_on_evict, lam, count_from, hits, misses, hit_flag):
    """``lfu``, ``lrfu``, ``least-stale`` or ``lfru``: residents in per-partition slots, selection per unit.

    No order is kept between units: each slot holds its block's int64 key (for
    ``lfru``, its count and last unit, the key ``freq / (t - last + 1)`` being
    evaluated at each overflow by the float expression of ``replay_scan``, its
    non-negative float bits then ranking like the float) and tie column (0 when
    the tie rank is packed into the key). At an overflowing unit the ``n_go``
    lowest of the slots and the unit's misses are selected in a small max-heap of
    contiguous keys and leave. Cheap where units are large against the capacity
    (event-atomic, per layer): ``O(c + |U| log n_go)`` per unit. Parameters and
    keys are those of :func:`replay_ranked`.
    """
    n_blocks = n_layers * n_experts
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_parts = capacity.shape[0]
    max_unit = _max_unit(offsets, atomic)
    slots = max(_slots(capacity, n_blocks), 1)
    rb = np.empty((n_parts, slots), dtype=np.int64)     # block in each slot
    rk = np.empty((n_parts, slots), dtype=np.int64)     # its key (lfru: its count)
    rl = np.empty((n_parts, slots), dtype=np.int64)     # lfru: its last unit
    rt = np.empty((n_parts, slots), dtype=np.int64)     # its tie column
    n_res = np.zeros(n_parts, dtype=np.int64)
    spos = np.full(n_blocks, -1, dtype=np.int64)        # slot of a resident, -1 if absent
    freq = np.zeros(n_blocks, dtype=np.int64)
    crf = np.full(n_blocks, -np.inf, dtype=np.float64)
    crf_bits = crf.view(np.int64)                       # crf >= 0 once accessed: its bits order like the float
    fkey = np.empty(1, dtype=np.float64)
    fkey_bits = fkey.view(np.int64)
    lunits = np.zeros(n_layers, dtype=np.int64)
    miss_buf = np.empty(max_unit, dtype=np.int64)
    miss_key = np.empty(max_unit, dtype=np.int64)
    miss_tie = np.empty(max_unit, dtype=np.int64)
    width = slots + max_unit
    sk = np.empty(width, dtype=np.int64)
    st = np.empty(width, dtype=np.int64)
    si = np.empty(width, dtype=np.int64)
    go = np.zeros(width, dtype=np.bool_)
    free = np.empty(width, dtype=np.int64)
    lfru = key_code == KEY_LFRU
    t = 0
    cur_step = -1
    cycle = np.int64(-1)
    cycle_start = 0
    key = np.int64(0)
    stale = np.int64(0)
    now = 0.0
    for i in range(n_events):
        layer = ev_layer[i]
        p = 0 if global_scope else layer
        cap = capacity[p]
        base = layer * n_experts
        if ev_step[i] != cur_step:
            cur_step = ev_step[i]
            cycle += 1
            cycle_start = t
        counted = i >= count_from
        lo = offsets[i]
        hi = offsets[i + 1]
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            n_miss = 0
            if key_code == KEY_LEAST_STALE:
                stale = ((cycle << coff_bits) | (t - cycle_start)) << tie_bits
            elif key_code == KEY_LRFU:
                now = lam * float(lunits[layer])
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                f = freq[b] + 1
                freq[b] = f
                tb = np.int64(0)
                if key_code == KEY_LFU:
                    key = (f << tie_bits) | tie[b]
                elif key_code == KEY_LEAST_STALE:
                    key = stale | tie[b]
                elif key_code == KEY_LRFU:
                    crf[b] = now + np.log2(1.0 + np.exp2(crf[b] - now))
                    key = crf_bits[b]
                    tb = tie[b]
                else:               # lfru: the count now; the float key at selection
                    key = f
                    tb = tie[b]
                s = spos[b]
                if s >= 0:
                    rk[p, s] = key
                    rl[p, s] = t
                    if record:
                        hit_flag[a] = 1
                else:
                    miss_buf[n_miss] = b
                    miss_key[n_miss] = key
                    miss_tie[n_miss] = tb
                    n_miss += 1
            if counted:
                hits[layer] += (a_hi - a_lo) - n_miss
                misses[layer] += n_miss
            t1 = t
            t += 1
            lunits[layer] += 1
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
                    k = rk[p, j]
                    tb = rt[p, j]
                    if lfru:
                        fkey[0] = k / float(t1 - rl[p, j] + 1)
                        k = fkey_bits[0]
                else:
                    k = miss_key[j - r]
                    tb = miss_tie[j - r]
                    if lfru:
                        fkey[0] = k / 1.0
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
                else:
                    b = miss_buf[c - r]
                if reset_freq_on_evict:
                    freq[b] = 0
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
