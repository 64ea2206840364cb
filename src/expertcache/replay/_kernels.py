"""numba kernels of the replay engine. They trust their inputs: no validation, no I/O.

The engine loop owns the cache, the counters and the retention decision; a
policy contributes only a key (:func:`_key`). At the end of each unit the
candidates ``C ∪ U`` are ranked by ``(key1, key2, tie)`` and the smallest
``|C ∪ U| - c`` leave (evicted residents or bypassed misses). Two loops make
the same decision:

* :func:`replay_heap` for keys that change only when their block is accessed
  (``keys.KEY_STABLE``): residents sit in a per-partition binary min-heap, so a
  unit costs ``O(|U| log c)``.
* :func:`replay_scan` for keys that drift with time (``lfru``): every candidate's
  key is re-evaluated at each overflowing unit, ``O(c)`` per unit.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit
from .keys import KEY_BELADY, KEY_BELADY_FORCED, KEY_LEAST_STALE, KEY_LFRU, KEY_LFU, KEY_LRU

#: Next-use sentinel: "never again".
NEVER = np.int64(1) << np.int64(62)


@jit
def next_use(unit_offsets, unit_block, n_blocks):
    """``int64[n_access]``: for each access, the index of the next unit holding the same block (or NEVER)."""
    n_units = unit_offsets.shape[0] - 1
    out = np.empty(unit_block.shape[0], dtype=np.int64)
    seen = np.full(n_blocks, NEVER, dtype=np.int64)
    for u in range(n_units - 1, -1, -1):
        for a in range(unit_offsets[u], unit_offsets[u + 1]):
            b = unit_block[a]
            out[a] = seen[b]
            seen[b] = u
    return out


@jit
def _key(code, b, t, is_miss, last, freq, nxt, cycle, coff):
    """The (primary, secondary) retention key of block ``b`` at the end of unit ``t``."""
    if code == KEY_LRU:
        return float(last[b]), 0
    if code == KEY_LEAST_STALE:
        return float(cycle[b]), coff[b]
    if code == KEY_LFU:
        return float(freq[b]), 0
    if code == KEY_LFRU:
        return freq[b] / float(t - last[b] + 1), 0
    if code == KEY_BELADY:
        return -float(nxt[b]), 0
    if code == KEY_BELADY_FORCED:  # misses of this unit first, then nearest next use
        return 1.0 if is_miss else 0.0, -nxt[b]
    return 0.0, 0


@jit
def _less(a, b, k1, k2, tie):
    """Whether block ``a`` ranks below block ``b`` (leaves first)."""
    if k1[a] != k1[b]:
        return k1[a] < k1[b]
    if k2[a] != k2[b]:
        return k2[a] < k2[b]
    return tie[a] < tie[b]


@jit
def _sift(heap, p, i, n, pos, k1, k2, tie):
    """Restore the min-heap property of ``heap[p, :n]`` around index ``i`` (up, then down)."""
    b = heap[p, i]
    while i > 0:
        parent = (i - 1) >> 1
        q = heap[p, parent]
        if not _less(b, q, k1, k2, tie):
            break
        heap[p, i] = q
        pos[q] = i
        i = parent
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and _less(heap[p, child + 1], heap[p, child], k1, k2, tie):
            child += 1
        q = heap[p, child]
        if not _less(q, b, k1, k2, tie):
            break
        heap[p, i] = q
        pos[q] = i
        i = child
    heap[p, i] = b
    pos[b] = i


@jit
def _max_sizes(unit_offsets, capacity, n_blocks):
    max_cap = 0
    for p in range(capacity.shape[0]):
        max_cap = max(max_cap, capacity[p])
    max_unit = 1
    for u in range(unit_offsets.shape[0] - 1):
        max_unit = max(max_unit, unit_offsets[u + 1] - unit_offsets[u])
    return min(max_cap, n_blocks), max_unit


@jit
def replay_heap(unit_offsets, unit_block, unit_part, unit_layer, unit_cycle, unit_coff, access_next,
                capacity, tie, n_blocks, key_code, reset_freq_on_evict, hits, misses):
    """Replay units with residents in per-partition min-heaps (keys in ``keys.KEY_STABLE``).

    Parameters
    ----------
    unit_offsets : int64[n_units + 1]
        CSR offsets of each unit's members in ``unit_block``.
    unit_block : int64[n_access]
        Global block ids, in access order.
    unit_part : int64[n_units]
        Cache partition of each unit (its layer, or 0 under global scope).
    unit_layer : int64[n_units]
        Layer of each unit: the index of the counters it adds to.
    unit_cycle, unit_coff : int64[n_units]
        Scheduler step of each unit and its offset inside that step.
    access_next : int64[n_access]
        Next unit holding the same block (``NEVER`` if none); only Belady keys read it.
    capacity : int64[n_parts]
        Blocks each partition may retain.
    tie : int64[n_blocks]
        Distinct tie ranks; the larger is retained among equal keys.
    key_code : int
        Policy key code.
    reset_freq_on_evict : bool
        LFU with in-cache counters: a block's count restarts when it leaves the cache.
    hits, misses : int64[n_layers]
        Output counters per layer (accumulated).
    """
    n_units = unit_offsets.shape[0] - 1
    slots, max_unit = _max_sizes(unit_offsets, capacity, n_blocks)
    heap = np.empty((capacity.shape[0], slots + max_unit), dtype=np.int64)
    size = np.zeros(capacity.shape[0], dtype=np.int64)
    pos = np.full(n_blocks, -1, dtype=np.int64)        # heap index of a resident, -1 if absent
    last = np.full(n_blocks, -1, dtype=np.int64)
    freq = np.zeros(n_blocks, dtype=np.int64)
    nxt = np.full(n_blocks, NEVER, dtype=np.int64)
    cycle = np.full(n_blocks, -1, dtype=np.int64)
    coff = np.zeros(n_blocks, dtype=np.int64)
    k1 = np.zeros(n_blocks, dtype=np.float64)
    k2 = np.zeros(n_blocks, dtype=np.int64)
    miss_buf = np.empty(max_unit, dtype=np.int64)
    for t in range(n_units):
        p = unit_part[t]
        cap = capacity[p]
        n_miss = 0
        for a in range(unit_offsets[t], unit_offsets[t + 1]):
            b = unit_block[a]
            last[b] = t
            freq[b] += 1
            nxt[b] = access_next[a]
            cycle[b] = unit_cycle[t]
            coff[b] = unit_coff[t]
            if pos[b] >= 0:
                hits[unit_layer[t]] += 1
                k1[b], k2[b] = _key(key_code, b, t, False, last, freq, nxt, cycle, coff)
                _sift(heap, p, pos[b], size[p], pos, k1, k2, tie)
            else:
                misses[unit_layer[t]] += 1
                miss_buf[n_miss] = b
                n_miss += 1
        if n_miss == 0:
            continue
        overflow = size[p] + n_miss > cap
        for i in range(n_miss):
            b = miss_buf[i]
            k1[b], k2[b] = _key(key_code, b, t, overflow, last, freq, nxt, cycle, coff)
            heap[p, size[p]] = b
            pos[b] = size[p]
            size[p] += 1
            _sift(heap, p, size[p] - 1, size[p], pos, k1, k2, tie)
        if not overflow:
            continue
        for _ in range(size[p] - cap):
            b = heap[p, 0]
            pos[b] = -1
            size[p] -= 1
            if size[p] > 0:
                heap[p, 0] = heap[p, size[p]]
                _sift(heap, p, 0, size[p], pos, k1, k2, tie)
            if reset_freq_on_evict:
                freq[b] = 0
        if key_code == KEY_BELADY_FORCED:
            # admitted misses rejoin the residents' ranking (their miss priority held for this unit only)
            for i in range(n_miss):
                b = miss_buf[i]
                if pos[b] >= 0:
                    k1[b], k2[b] = _key(key_code, b, t, False, last, freq, nxt, cycle, coff)
                    _sift(heap, p, pos[b], size[p], pos, k1, k2, tie)


@jit
def replay_scan(unit_offsets, unit_block, unit_part, unit_layer, unit_cycle, unit_coff, access_next,
                capacity, tie, n_blocks, key_code, reset_freq_on_evict, hits, misses):
    """Replay units re-ranking every candidate at each overflowing unit (any key; used for ``lfru``).

    Parameters are those of :func:`replay_heap`.
    """
    n_units = unit_offsets.shape[0] - 1
    n_parts = capacity.shape[0]
    slots, max_unit = _max_sizes(unit_offsets, capacity, n_blocks)
    res = np.empty((n_parts, max(slots, 1)), dtype=np.int64)
    n_res = np.zeros(n_parts, dtype=np.int64)
    in_cache = np.zeros(n_blocks, dtype=np.bool_)
    last = np.full(n_blocks, -1, dtype=np.int64)
    freq = np.zeros(n_blocks, dtype=np.int64)
    nxt = np.full(n_blocks, NEVER, dtype=np.int64)
    cycle = np.full(n_blocks, -1, dtype=np.int64)
    coff = np.zeros(n_blocks, dtype=np.int64)
    cand = np.empty(slots + max_unit, dtype=np.int64)
    k1 = np.zeros(n_blocks, dtype=np.float64)
    k2 = np.zeros(n_blocks, dtype=np.int64)
    miss_buf = np.empty(max_unit, dtype=np.int64)
    for t in range(n_units):
        p = unit_part[t]
        cap = capacity[p]
        n_miss = 0
        for a in range(unit_offsets[t], unit_offsets[t + 1]):
            b = unit_block[a]
            if in_cache[b]:
                hits[unit_layer[t]] += 1
            else:
                misses[unit_layer[t]] += 1
                miss_buf[n_miss] = b
                n_miss += 1
            last[b] = t
            freq[b] += 1
            nxt[b] = access_next[a]
            cycle[b] = unit_cycle[t]
            coff[b] = unit_coff[t]
        if n_miss == 0:
            continue
        r = n_res[p]
        if r + n_miss <= cap:
            for i in range(n_miss):
                b = miss_buf[i]
                res[p, r + i] = b
                in_cache[b] = True
            n_res[p] = r + n_miss
            continue
        n_cand = r + n_miss
        for i in range(r):
            cand[i] = res[p, i]
        for i in range(n_miss):
            cand[r + i] = miss_buf[i]
        for i in range(n_cand):
            b = cand[i]
            k1[b], k2[b] = _key(key_code, b, t, i >= r, last, freq, nxt, cycle, coff)
        n_go = n_cand - cap
        # selection: move the n_go lowest-ranked candidates to the front, one minimum at a time
        # when few leave (the common case), else a full sort
        if n_go <= 8:
            for j in range(n_go):
                m = j
                for i in range(j + 1, n_cand):
                    if _less(cand[i], cand[m], k1, k2, tie):
                        m = i
                cand[j], cand[m] = cand[m], cand[j]
        else:
            kk1 = np.empty(n_cand, dtype=np.float64)
            kk2 = np.empty(n_cand, dtype=np.int64)
            kt = np.empty(n_cand, dtype=np.int64)
            for i in range(n_cand):
                kk1[i] = k1[cand[i]]
                kk2[i] = k2[cand[i]]
                kt[i] = tie[cand[i]]
            o = np.argsort(kt, kind="mergesort")
            o = o[np.argsort(kk2[o], kind="mergesort")]
            o = o[np.argsort(kk1[o], kind="mergesort")]
            cand[:n_cand] = cand[:n_cand][o]
        for j in range(n_go):
            b = cand[j]
            in_cache[b] = False
            if reset_freq_on_evict:
                freq[b] = 0
        for j in range(n_go, n_cand):
            b = cand[j]
            in_cache[b] = True
            res[p, j - n_go] = b
        n_res[p] = cap
