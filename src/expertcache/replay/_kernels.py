"""numba kernels of the replay engine. They trust their inputs: no validation, no I/O.

The engine loop (:func:`replay_units`) owns the cache, the counters and the
retention decision; a policy contributes only a key (:func:`_key`), evaluated
for every candidate at a unit boundary. Larger keys are retained; ties fall
to the per-block tie rank.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit

#: Next-use sentinel: "never again".
NEVER = np.int64(1) << np.int64(62)

from .keys import KEY_BELADY, KEY_BELADY_FORCED, KEY_LEAST_STALE, KEY_LFRU, KEY_LFU, KEY_LRU  # noqa: E402


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
def _order(k1, k2, tie):
    """Indices sorting candidates ascending by (k1, k2, tie): the first ones go."""
    o = np.argsort(tie, kind="mergesort")
    o = o[np.argsort(k2[o], kind="mergesort")]
    return o[np.argsort(k1[o], kind="mergesort")]


@jit
def replay_units(unit_offsets, unit_block, unit_part, unit_layer, unit_cycle, unit_coff, access_next,
                 capacity, tie, n_blocks, key_code, reset_freq_on_evict, hits, misses):
    """Replay units against per-partition caches; accumulate ``hits``/``misses`` per partition.

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
    n_parts = capacity.shape[0]
    max_cap = 0
    for p in range(n_parts):
        if capacity[p] > max_cap:
            max_cap = capacity[p]
    max_unit = 0
    for u in range(n_units):
        if unit_offsets[u + 1] - unit_offsets[u] > max_unit:
            max_unit = unit_offsets[u + 1] - unit_offsets[u]
    slots = min(max_cap, n_blocks)
    res = np.empty((n_parts, max(slots, 1)), dtype=np.int64)
    n_res = np.zeros(n_parts, dtype=np.int64)
    in_cache = np.zeros(n_blocks, dtype=np.bool_)
    last = np.full(n_blocks, -1, dtype=np.int64)
    freq = np.zeros(n_blocks, dtype=np.int64)
    nxt = np.full(n_blocks, NEVER, dtype=np.int64)
    cycle = np.full(n_blocks, -1, dtype=np.int64)
    coff = np.zeros(n_blocks, dtype=np.int64)
    cand = np.empty(slots + max_unit, dtype=np.int64)
    k1 = np.empty(slots + max_unit, dtype=np.float64)
    k2 = np.empty(slots + max_unit, dtype=np.int64)
    kt = np.empty(slots + max_unit, dtype=np.int64)
    miss_buf = np.empty(max(max_unit, 1), dtype=np.int64)
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
            key1, key2 = _key(key_code, b, t, i >= r, last, freq, nxt, cycle, coff)
            k1[i] = key1
            k2[i] = key2
            kt[i] = tie[b]
        order = _order(k1[:n_cand], k2[:n_cand], kt[:n_cand])
        n_go = n_cand - cap
        for j in range(n_go):
            b = cand[order[j]]
            in_cache[b] = False
            if reset_freq_on_evict:
                freq[b] = 0
        for j in range(n_go, n_cand):
            b = cand[order[j]]
            in_cache[b] = True
            res[p, j - n_go] = b
        n_res[p] = cap
