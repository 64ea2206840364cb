"""numba kernels for the frequency and staleness policies whose keys change only on access: lfu, lrfu, least-stale.

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
* :func:`replay_sorted` — event-atomic units per layer, where a unit is a large
  share of the quota: each layer's residents stay sorted by key and every unit
  is merged in.

``lfru``'s drifting key has its own kernels in :mod:`._kernels_lfru`.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit, jit_helper
from ._kernels import _cttz, _max_unit, _slots, crf_key, crf_update
from .keys import KEY_LEAST_STALE, KEY_LFU, KEY_LRFU


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
    LRFU's key computed by the same float expressions (``_kernels.crf_update``, ``crf_key``).
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
    crf = np.full(n_blocks, -np.inf, dtype=np.float64)     # LRFU's key (crf_key)
    crf_bits = crf.view(np.int64)                  # crf >= 0 once accessed: its bits order like the float
    crf_s = np.zeros(n_blocks, dtype=np.float64)   # its CRF at the last access, and that access's layer unit
    crf_u = np.zeros(n_blocks, dtype=np.float64)
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
                now = float(lunits[layer])
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
                    crf_s[b] = crf_update(crf_s[b], crf_u[b], now, lam)
                    crf_u[b] = now
                    crf[b] = crf_key(crf_s[b], now, lam)
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


@jit
def replay_sorted(offsets, expert, ev_layer, ev_step, n_experts, n_layers, global_scope, atomic, capacity, tie,
                  tie_order, tie_pos, key_code, tie_bits, coff_bits, reset_freq_on_evict, lam, count_from, hits,
                  misses, hit_flag):
    """``lfu``, ``lrfu`` or ``least-stale``: residents of each partition kept sorted by ``(key, tie)``.

    For keys that change only on access, per-layer scope. At each unit the
    residents outside the unit keep their order; the members are sorted among
    themselves and merged with them from the top; the lowest ``|C ∪ U| - c``
    of the merged list leave. Members are sorted by ``least-stale`` in tie order
    (they share the newest ``(cycle, offset)``: a bitset over tie positions, as
    ``replay_lru`` orders its members), otherwise as the unit's hits in resident
    order (their keys rose in that order: lfu's count by one, lrfu's monotone
    update; an insertion sort checks it at no cost) merged with the misses
    (insertion sort: a unit is small). Only keys move; a block is found back from
    its tie rank (the key's low bits, or the tie column for ``lrfu``), and the
    merges are branch-free over lists that start with a sentinel. ``O(c + |U|)``
    per unit in short loops over contiguous int64: the fit for event-atomic units
    per layer, where a unit is a large share of the quota.

    ``tie_order[l, j]`` is the block of layer ``l`` with the ``j``-th lowest tie
    rank and ``tie_pos[b]`` the inverse (as for ``replay_lru``); other parameters
    and the keys are those of :func:`replay_ranked`.
    """
    n_blocks = n_layers * n_experts
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_parts = capacity.shape[0]
    max_unit = _max_unit(offsets, atomic)
    width = _slots(capacity, n_blocks) + max_unit + 1
    two = key_code == KEY_LRFU                          # the tie rank in its own column
    low = np.int64(-(2**62))                            # sentinel key, below every key (keys are >= 0)
    sk = np.full((n_parts, width), low, dtype=np.int64)  # residents' keys, ascending (key, tie) from index 1
    st = np.full((n_parts, width if two else 1), -1, dtype=np.int64)
    tmask = (np.int64(1) << tie_bits) - 1
    tinv = np.zeros(max(tmask + 1, n_blocks + 1) if not two else n_blocks + 1, dtype=np.int64)
    for b in range(n_blocks):
        tinv[tie[b]] = b                                 # the block of each tie rank
    size = np.zeros(n_parts, dtype=np.int64)
    state = np.zeros(n_blocks, dtype=np.int64)           # 1: resident, 2: resident and in the current unit
    freq = np.zeros(n_blocks, dtype=np.int64)
    crf = np.full(n_blocks, -np.inf, dtype=np.float64)
    crf_bits = crf.view(np.int64)
    crf_s = np.zeros(n_blocks, dtype=np.float64)
    crf_u = np.zeros(n_blocks, dtype=np.float64)
    lunits = np.zeros(n_layers, dtype=np.int64)
    m1 = max_unit + 1
    mk = np.full(m1, low, dtype=np.int64)               # the unit's members, sorted, from index 1
    mt = np.full(m1, -1, dtype=np.int64)
    hk = np.full(m1 + width, low, dtype=np.int64)       # its hits in resident order (from index 1)
    ht = np.full(m1 + width, -1, dtype=np.int64)
    xk = np.full(m1, low, dtype=np.int64)               # its misses, sorted (from index 1)
    xt = np.full(m1, -1, dtype=np.int64)
    newkey = np.empty(n_blocks, dtype=np.int64)          # a hit's key at this unit
    n_words = (n_experts + 63) // 64
    bits = np.zeros(n_words, dtype=np.uint64)
    everything = n_blocks if global_scope else n_experts
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
            if key_code == KEY_LEAST_STALE:
                stale = ((cycle << coff_bits) | (t - cycle_start)) << tie_bits
            elif key_code == KEY_LRFU:
                now = float(lunits[layer])
            t += 1
            lunits[layer] += 1
            n_hit = 0
            n_miss = 0
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                tb = np.int64(0)
                if key_code == KEY_LFU:
                    f = freq[b] + 1
                    freq[b] = f
                    key = (f << tie_bits) | tie[b]
                elif key_code == KEY_LEAST_STALE:
                    key = stale | tie[b]
                    tp = tie_pos[b]
                    bits[tp >> 6] |= np.uint64(1) << np.uint64(tp & 63)
                else:
                    crf_s[b] = crf_update(crf_s[b], crf_u[b], now, lam)
                    crf_u[b] = now
                    crf[b] = crf_key(crf_s[b], now, lam)
                    key = crf_bits[b]
                    tb = tie[b]
                if state[b]:           # a hit: its new key joins the members in resident order below
                    state[b] = 2
                    newkey[b] = key
                    n_hit += 1
                    if record:
                        hit_flag[a] = 1
                    continue
                n_miss += 1
                if key_code == KEY_LEAST_STALE:
                    continue
                j = n_miss              # a miss: insertion into the sorted misses
                if two:
                    while _below(key, tb, xk[j - 1], xt[j - 1]):
                        xk[j] = xk[j - 1]
                        xt[j] = xt[j - 1]
                        j -= 1
                    xt[j] = tb
                else:
                    while key < xk[j - 1]:
                        xk[j] = xk[j - 1]
                        j -= 1
                xk[j] = key
            if counted:
                hits[layer] += n_hit
                misses[layer] += n_miss
            n_mem = n_hit + n_miss
            if cap >= everything:      # nothing ever leaves this partition: membership is all it needs
                for a in range(a_lo, a_hi):
                    state[base + expert[a]] = 1
                if key_code == KEY_LEAST_STALE:
                    for w in range(n_words):
                        bits[w] = 0
                continue
            # residents outside the unit keep their order; the unit's residents drop out (branch-free)
            r = size[p]
            if n_hit:
                w = 1
                n_h = 1
                for j in range(1, r + 1):
                    k = sk[p, j]
                    tb = st[p, j] if two else k & tmask
                    q = tinv[tb]
                    s = state[q]
                    sk[p, w] = k
                    if two:
                        st[p, w] = tb
                    w += s == 1
                    if key_code != KEY_LEAST_STALE:
                        hk[n_h] = newkey[q]
                        if two:
                            ht[n_h] = tb
                        n_h += s == 2
                r = w - 1
                if key_code != KEY_LEAST_STALE:
                    # the hits' new keys, ascending (an insertion sort that finds them in order)
                    for h0 in range(2, n_hit + 1):
                        k = hk[h0]
                        tb = ht[h0]
                        h = h0
                        if two:
                            while _below(k, tb, hk[h - 1], ht[h - 1]):
                                hk[h] = hk[h - 1]
                                ht[h] = ht[h - 1]
                                h -= 1
                            ht[h] = tb
                        else:
                            while k < hk[h - 1]:
                                hk[h] = hk[h - 1]
                                h -= 1
                        hk[h] = k
            # the members, ascending, in mk[1..n_mem]
            if key_code == KEY_LEAST_STALE:
                d = 0
                for w in range(n_words):
                    x_ = bits[w]
                    bits[w] = 0
                    while x_:
                        b = tie_order[layer, (w << 6) + np.int64(_cttz(x_))]
                        x_ &= x_ - np.uint64(1)
                        d += 1
                        mk[d] = stale | tie[b]
            else:
                x = n_hit
                y = n_miss
                for d in range(n_mem, 0, -1):
                    if two:
                        tm = _below(hk[x], ht[x], xk[y], xt[y])
                        mt[d] = xt[y] if tm else ht[x]
                    else:
                        tm = hk[x] < xk[y]
                    mk[d] = xk[y] if tm else hk[x]
                    y -= tm
                    x -= 1 - tm
            n = r + n_mem
            n_go = max(n - cap, 0)
            # merge from the top into positions n .. n_go + 1 (branch-free); the lowest n_go are not written
            x = r
            y = n_mem
            for d in range(n, n_go, -1):
                if two:
                    tm = _below(sk[p, x], st[p, x], mk[y], mt[y])
                    st[p, d] = mt[y] if tm else st[p, x]
                else:
                    tm = sk[p, x] < mk[y]
                sk[p, d] = mk[y] if tm else sk[p, x]
                y -= tm
                x -= 1 - tm
            # members above y stay; residents 1..x and members 1..y leave
            for j in range(y + 1, n_mem + 1):
                state[tinv[mt[j] if two else mk[j] & tmask]] = 1
            for j in range(1, x + 1):
                q = tinv[st[p, j] if two else sk[p, j] & tmask]
                state[q] = 0
                if reset_freq_on_evict:
                    freq[q] = 0
            for j in range(1, y + 1):
                q = tinv[mt[j] if two else mk[j] & tmask]
                state[q] = 0
                if reset_freq_on_evict:
                    freq[q] = 0
            if n_go:               # shift the kept list down to position 1
                for d in range(1, n - n_go + 1):
                    sk[p, d] = sk[p, d + n_go]
                if two:
                    for d in range(1, n - n_go + 1):
                        st[p, d] = st[p, d + n_go]
            size[p] = n - n_go
