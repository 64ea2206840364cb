"""numba kernels of the replay engine. They trust their inputs: no validation, no I/O.

Every kernel walks the stream's CSR arrays directly (``offsets``, ``expert``,
``ev_layer``, ``ev_step``) and forms *units* on the fly: one unit per event
under event-atomic replay (``atomic=True``), one per access under sequential
replay. Block ids are ``layer * n_experts + expert``; the cache partition of a
unit is its layer, or 0 under global scope.

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

:func:`stack_depths` computes, in one pass, every access's depth in the
Mattson priority stack of a stack policy, from which the hits at every
capacity follow (a miss-ratio curve).
"""

from __future__ import annotations

import numpy as np

from .._bits import cttz as _cttz
from .._jit import jit, jit_helper
from .keys import (
    KEY_BELADY,
    KEY_BELADY_FORCED,
    KEY_LEAST_STALE,
    KEY_LFRU,
    KEY_LFU,
    KEY_LRFU,
    KEY_LRU,
)

#: Next-use sentinel: "never again" (next-use arrays are int32).
NEVER = np.int32(2**31 - 1)


@jit
def next_use(offsets, expert, ev_layer, n_experts, n_layers, atomic):
    """``int32[n_access]``: for each access, the index of the next unit holding the same block (or NEVER)."""
    n_events = offsets.shape[0] - 1
    out = np.empty(expert.shape[0], dtype=np.int32)
    seen = np.full(n_layers * n_experts, NEVER, dtype=np.int32)
    t = offsets[n_events] if not atomic else n_events
    for i in range(n_events - 1, -1, -1):
        base = ev_layer[i] * n_experts
        if atomic:
            t -= 1
        for a in range(offsets[i + 1] - 1, offsets[i] - 1, -1):
            if not atomic:
                t -= 1
            b = np.uint64(base + expert[np.uint64(a)])    # unsigned: no test for a negative wraparound
            out[np.uint64(a)] = seen[b]
            seen[b] = t
    return out


@jit_helper
def _key(code, b, t, is_miss, last, freq, nxt, cycle, coff, crf):
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
        return 1.0 if is_miss else 0.0, -np.int64(nxt[b])
    if code == KEY_LRFU:
        return crf[0, b], 0
    return 0.0, 0


@jit_helper
def _less(a, b, k1, k2, tie):
    """Whether block ``a`` ranks below block ``b`` (leaves first)."""
    if k1[a] != k1[b]:
        return k1[a] < k1[b]
    if k2[a] != k2[b]:
        return k2[a] < k2[b]
    return tie[a] < tie[b]


@jit_helper
def _sift(heap, p, i, n, pos, k1, k2, tie, max_heap):
    """Restore the heap property of ``heap[p, :n]`` around index ``i`` (up, then down).

    A min-heap (lowest rank on top) unless ``max_heap``.
    """
    b = heap[p, i]
    while i > 0:
        parent = (i - 1) >> 1
        q = heap[p, parent]
        if not (_less(q, b, k1, k2, tie) if max_heap else _less(b, q, k1, k2, tie)):
            break
        heap[p, i] = q
        pos[q] = i
        i = parent
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        c2 = child + 1
        if c2 < n:
            if max_heap:
                if _less(heap[p, child], heap[p, c2], k1, k2, tie):
                    child = c2
            elif _less(heap[p, c2], heap[p, child], k1, k2, tie):
                child = c2
        q = heap[p, child]
        if not (_less(b, q, k1, k2, tie) if max_heap else _less(q, b, k1, k2, tie)):
            break
        heap[p, i] = q
        pos[q] = i
        i = child
    heap[p, i] = b
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
def layer_totals(offsets, ev_layer, logical, n_layers, start):
    """Union and logical accesses per layer (``int64[n_layers]`` each) over events ``>= start``, in one pass and
    in integers, where two ``np.bincount`` with float weights (one over a ``np.diff`` of the offsets) took 2.6x
    the time: 0.30 ms against 0.80 ms at 10 M accesses (``python benchmarks/engine_totals.py``; docs/performance.md,
    *The engine's totals in one pass*)."""
    union = np.zeros(n_layers, dtype=np.int64)
    logi = np.zeros(n_layers, dtype=np.int64)
    n = ev_layer.shape[0]
    prev = offsets[start] if start < n else 0
    for i in range(start, n):
        layer = np.uint64(ev_layer[i])
        nxt = offsets[i + 1]
        union[layer] += nxt - prev
        prev = nxt
        logi[layer] += logical[i]
    return union, logi


def block_counts(offsets, expert, ev_layer, n_experts, n_layers):
    """``int64[n_layers * n_experts]``: the union accesses of every block ``layer * n_experts + expert``, in one
    pass over the members (``np.bincount`` over the stream's block ids first built those ids, 8 bytes an access):
    :func:`block_weights` with every access counted once.

    >>> block_counts(np.array([0, 2, 3]), np.array([0, 1, 1], np.int16), np.array([0, 1], np.int32), 2, 2).tolist()
    [1, 1, 0, 1]
    """
    return block_weights(offsets, expert, ev_layer, n_experts, n_layers, _ONCE)


#: No weights: :func:`block_weights` counts each access once.
_ONCE = np.zeros(0, dtype=np.int64)


@jit
def block_weights(offsets, expert, ev_layer, n_experts, n_layers, weights):
    """Every block's union accesses, each counted ``weights[a]`` times (an integer array: a stream's multiplicities
    give every block's selections before deduplication), or once where ``weights`` is empty (:func:`block_counts`).

    >>> block_weights(np.array([0, 2, 3]), np.array([0, 1, 1], np.int16), np.array([0, 1], np.int32), 2, 2,
    ...               np.array([3, 1, 2], np.int32)).tolist()
    [3, 1, 0, 2]
    """
    counts = np.zeros(n_layers * n_experts, dtype=np.int64)
    once = weights.shape[0] == 0
    for i in range(ev_layer.shape[0]):
        base = np.int64(ev_layer[i]) * n_experts
        for a in range(offsets[i], offsets[i + 1]):
            counts[np.uint64(base + expert[np.uint64(a)])] += 1 if once else weights[np.uint64(a)]
    return counts


@jit
def replay_static(offsets, expert, ev_layer, n_experts, pinned, count_from, hits, hit_flag):
    """A pinned set's hits: an access hits where its block is pinned (``pinned``: ``uint8[n_blocks]``, 1 pinned),
    whatever the order of the accesses, so one pass serves every semantics. ``hits[l]`` gains layer ``l``'s hits
    of the events from ``count_from`` on; ``hit_flag`` (``uint8[n_access]``, or empty) takes every access's
    outcome, warm-up included.

    >>> h = np.zeros(2, np.int64)
    >>> replay_static(np.array([0, 2, 3]), np.array([0, 1, 1], np.int16), np.array([0, 1], np.int32), 2,
    ...               np.array([0, 1, 0, 1], np.uint8), 0, h, np.zeros(0, np.uint8)); h.tolist()
    [1, 1]
    """
    record = hit_flag.shape[0] > 0
    for i in range(ev_layer.shape[0]):
        layer = ev_layer[i]
        base = np.int64(layer) * n_experts
        n_hit = 0
        for a in range(offsets[i], offsets[i + 1]):
            p = pinned[np.uint64(base + expert[a])]
            n_hit += np.int64(p)
            if record:
                hit_flag[a] = p
        if i >= count_from:
            hits[np.uint64(layer)] += n_hit


@jit
def _policy_state(n_blocks):
    """Fresh per-block policy state: last clock, frequency, next use, cycle, offset in cycle, and LRFU's
    ``(key, CRF at the last access, layer unit of the last access)`` as the rows of one ``float64[3, n]``."""
    crf = np.zeros((3, n_blocks), dtype=np.float64)
    crf[0] = -np.inf
    return (np.full(n_blocks, -1, dtype=np.int64), np.zeros(n_blocks, dtype=np.int64),
            np.full(n_blocks, NEVER, dtype=np.int32), np.full(n_blocks, -1, dtype=np.int64),
            np.zeros(n_blocks, dtype=np.int64), crf)


#: ``crf_decay(lam, g)`` is 0.0 where ``lam * g`` reaches it (``2**-1076`` rounds to 0).
LRFU_DECAY_ZERO = 1076.0


@jit_helper
def crf_decay(lam, gap):
    """``2**(-lam * gap)``: the factor by which LRFU's CRF decays over ``gap`` units of a layer.

    This function, :func:`crf_update` and :func:`crf_key` are the float expressions of LRFU in every engine
    (replay kernels, proactive replay, the executor's controller): one definition, so that they agree bit
    for bit (docs/semantics.md).
    """
    return 2.0 ** (-lam * float(gap))


@jit_helper
def crf_update(s, u_last, u, lam):
    """A block's CRF after an access at layer unit ``u``: ``1 + s * 2**(-lam * (u - u_last))`` where ``s > 0``
    is its CRF at its previous access (layer unit ``u_last``), 1 at its first access (``s == 0``)."""
    if s > 0.0:
        return 1.0 + s * crf_decay(lam, u - u_last)
    return 1.0


@jit_helper
def crf_key(s, u, lam):
    """LRFU's retention key ``log2(s) + lam * u`` of a block whose CRF at its last access (layer unit ``u``,
    a float) is ``s``: it ranks like the CRF at any common later time, and changes only on access."""
    return np.log2(s) + lam * u


@jit
def crf_decays(lam, n):
    """``crf_decay(lam, g)`` for ``g < n``: a table for the kernels' most frequent gaps."""
    out = np.empty(max(n, 1), dtype=np.float64)
    for g in range(out.shape[0]):
        out[g] = crf_decay(lam, g)
    return out


@jit_helper
def _slots(capacity, n_blocks):
    """Residents a partition can ever hold: the largest capacity, at most the universe."""
    slots = 0
    for p in range(capacity.shape[0]):
        slots = max(slots, min(capacity[p], n_blocks))
    return slots


@jit_helper
def _touch(b, t, a, access_next, cycle_now, coff_now, last, freq, nxt, cycle, coff, crf, lam, lclock):
    """Update the policy state of block ``b`` accessed by unit ``t`` (access index ``a``).

    With ``lam >= 0`` LRFU's CRF ``crf[1, b]`` (Lee et al.'s ``sum_i 2**(-lam * (u - tau_i))`` at the
    block's last access ``u = crf[2, b]``, over its access clocks ``tau_i``; ``lclock``: units of the
    block's layer so far) and its key ``crf[0, b]`` (:func:`crf_update`, :func:`crf_key`) are updated.
    """
    last[b] = t
    freq[b] += 1
    if access_next.shape[0]:
        nxt[b] = access_next[a]
    cycle[b] = cycle_now
    coff[b] = coff_now
    if lam >= 0.0:
        u = float(lclock)
        s = crf_update(crf[1, b], crf[2, b], u, lam)
        crf[1, b] = s
        crf[2, b] = u
        crf[0, b] = crf_key(s, u, lam)


@jit
def replay_heap(offsets, expert, ev_layer, ev_step, n_experts, n_layers, global_scope, atomic, access_next,
                capacity, tie, key_code, reset_freq_on_evict, lam, count_from, hits, misses, hit_flag):
    """Replay with residents in per-partition min-heaps (keys in ``keys.KEY_STABLE``).

    Parameters
    ----------
    offsets : int64[n_events + 1]
        CSR offsets of each event's members in ``expert``.
    expert : int16[n_access]
        Member expert ids, in access order (ascending, or permuted for sequential-random).
    ev_layer : int32[n_events]
        Layer of each event.
    ev_step : int64[n_events]
        Scheduler step of each event (non-decreasing).
    n_experts, n_layers : int
        ``N`` and ``L``.
    global_scope : bool
        One cache for all layers (partition 0) instead of one per layer.
    atomic : bool
        Event-atomic units (one per event) or sequential units (one per access).
    access_next : int32[n_access] or empty
        Next unit holding the same block (``NEVER`` if none); needed by Belady keys only.
    capacity : int64[n_parts]
        Blocks each partition may retain.
    tie : int64[n_blocks]
        Distinct tie ranks; the larger is retained among equal keys.
    key_code : int
        Policy key code.
    reset_freq_on_evict : bool
        LFU with in-cache counters: a block's count restarts when it leaves the cache.
    lam : float
        LRFU decay ``lambda`` (``F(x) = 2**(-lam*x)`` on the per-layer unit clock); ``< 0`` when unused.
    count_from : int
        Events before this index warm the cache but are not counted.
    hits, misses : int64[n_layers]
        Output counters per layer (accumulated), over events ``>= count_from``.
    hit_flag : uint8[n_access] or empty
        When not empty, set to 1 at every access that hit (warm-up events included).
    """
    n_blocks = n_layers * n_experts
    record = hit_flag.shape[0] > 0                  # per-access hit flags wanted (timing)
    n_events = offsets.shape[0] - 1
    n_parts = capacity.shape[0]
    max_unit = _max_unit(offsets, atomic)
    slots = _slots(capacity, n_blocks)
    heap = np.empty((n_parts, slots + max_unit), dtype=np.int64)
    size = np.zeros(n_parts, dtype=np.int64)
    pos = np.full(n_blocks, -1, dtype=np.int64)        # heap index of a resident, -1 if absent
    last, freq, nxt, cycle, coff, crf = _policy_state(n_blocks)
    lunits = np.zeros(n_layers, dtype=np.int64)          # units per layer so far: the LRFU clock
    k1 = np.zeros(n_blocks, dtype=np.float64)
    k2 = np.zeros(n_blocks, dtype=np.int64)
    miss_buf = np.empty(max_unit, dtype=np.int64)
    t = 0
    cur_step = -1
    cycle_start = 0
    for i in range(n_events):
        layer = ev_layer[i]
        p = 0 if global_scope else layer
        cap = capacity[p]
        base = layer * n_experts
        if ev_step[i] != cur_step:
            cur_step = ev_step[i]
            cycle_start = t
        lo = offsets[i]
        hi = offsets[i + 1]
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            n_miss = 0
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                _touch(b, t, a, access_next, cur_step, t - cycle_start, last, freq, nxt, cycle, coff, crf, lam,
                       lunits[layer])
                if pos[b] >= 0:
                    if i >= count_from:
                        hits[layer] += 1
                    if record:
                        hit_flag[a] = 1
                    k1[b], k2[b] = _key(key_code, b, t, False, last, freq, nxt, cycle, coff, crf)
                    _sift(heap, p, pos[b], size[p], pos, k1, k2, tie, False)
                else:
                    if i >= count_from:
                        misses[layer] += 1
                    miss_buf[n_miss] = b
                    n_miss += 1
            if n_miss:
                overflow = size[p] + n_miss > cap
                for j in range(n_miss):
                    b = miss_buf[j]
                    k1[b], k2[b] = _key(key_code, b, t, overflow, last, freq, nxt, cycle, coff, crf)
                    heap[p, size[p]] = b
                    pos[b] = size[p]
                    size[p] += 1
                    _sift(heap, p, size[p] - 1, size[p], pos, k1, k2, tie, False)
                if overflow:
                    for _ in range(size[p] - cap):
                        b = heap[p, 0]
                        pos[b] = -1
                        size[p] -= 1
                        if size[p] > 0:
                            heap[p, 0] = heap[p, size[p]]
                            _sift(heap, p, 0, size[p], pos, k1, k2, tie, False)
                        if reset_freq_on_evict:
                            freq[b] = 0
                    if key_code == KEY_BELADY_FORCED:
                        # admitted misses rejoin the residents' ranking (miss priority held for this unit only)
                        for j in range(n_miss):
                            b = miss_buf[j]
                            if pos[b] >= 0:
                                k1[b], k2[b] = _key(key_code, b, t, False, last, freq, nxt, cycle, coff, crf)
                                _sift(heap, p, pos[b], size[p], pos, k1, k2, tie, False)
            t += 1
            lunits[layer] += 1


@jit
def replay_scan(offsets, expert, ev_layer, ev_step, n_experts, n_layers, global_scope, atomic, access_next,
                capacity, tie, key_code, reset_freq_on_evict, lam, count_from, hits, misses, hit_flag):
    """Replay re-ranking every candidate at each overflowing unit (any key; used for ``lfru``).

    Parameters are those of :func:`replay_heap`.
    """
    n_blocks = n_layers * n_experts
    record = hit_flag.shape[0] > 0                  # per-access hit flags wanted (timing)
    n_events = offsets.shape[0] - 1
    n_parts = capacity.shape[0]
    max_unit = _max_unit(offsets, atomic)
    slots = _slots(capacity, n_blocks)
    res = np.empty((n_parts, max(slots, 1)), dtype=np.int64)
    n_res = np.zeros(n_parts, dtype=np.int64)
    in_cache = np.zeros(n_blocks, dtype=np.bool_)
    last, freq, nxt, cycle, coff, crf = _policy_state(n_blocks)
    lunits = np.zeros(n_layers, dtype=np.int64)          # units per layer so far: the LRFU clock
    cand = np.empty(slots + max_unit, dtype=np.int64)
    sel = np.empty((1, slots + max_unit), dtype=np.int64)
    sel_pos = np.full(n_blocks, -1, dtype=np.int64)
    k1 = np.zeros(n_blocks, dtype=np.float64)
    k2 = np.zeros(n_blocks, dtype=np.int64)
    miss_buf = np.empty(max_unit, dtype=np.int64)
    t = 0
    cur_step = -1
    cycle_start = 0
    for i in range(n_events):
        layer = ev_layer[i]
        p = 0 if global_scope else layer
        cap = capacity[p]
        base = layer * n_experts
        if ev_step[i] != cur_step:
            cur_step = ev_step[i]
            cycle_start = t
        lo = offsets[i]
        hi = offsets[i + 1]
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            n_miss = 0
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                if in_cache[b]:
                    if i >= count_from:
                        hits[layer] += 1
                    if record:
                        hit_flag[a] = 1
                else:
                    if i >= count_from:
                        misses[layer] += 1
                    miss_buf[n_miss] = b
                    n_miss += 1
                _touch(b, t, a, access_next, cur_step, t - cycle_start, last, freq, nxt, cycle, coff, crf, lam,
                       lunits[layer])
            r = n_res[p]
            if n_miss and r + n_miss <= cap:
                for j in range(n_miss):
                    b = miss_buf[j]
                    res[p, r + j] = b
                    in_cache[b] = True
                n_res[p] = r + n_miss
            elif n_miss:
                n_cand = r + n_miss
                for j in range(r):
                    cand[j] = res[p, j]
                for j in range(n_miss):
                    cand[r + j] = miss_buf[j]
                for j in range(n_cand):
                    b = cand[j]
                    k1[b], k2[b] = _key(key_code, b, t, j >= r, last, freq, nxt, cycle, coff, crf)
                _scan_decide(cand, n_cand, cap, sel, sel_pos, k1, k2, tie, in_cache, res, p, freq,
                             reset_freq_on_evict)
                n_res[p] = cap
            t += 1
            lunits[layer] += 1


@jit_helper
def _scan_decide(cand, n_cand, cap, sel, sel_pos, k1, k2, tie, in_cache, res, p, freq, reset_freq_on_evict):
    """The decision of a scan loop: of ``cand[:n_cand]`` (keys in ``k1, k2``) the ``n_cand - cap`` lowest leave.

    The leaving are found in a max-heap ``sel`` (top: the best of those leaving); the kept fill
    ``res[p, :cap]`` in candidate order and ``in_cache`` is updated. Shared by :func:`replay_scan` and the
    loops of policies registered from Python (``plugins.py``).
    """
    n_go = n_cand - cap
    n_sel = 0
    for j in range(n_cand):
        b = cand[j]
        if n_sel < n_go:
            sel[0, n_sel] = b
            sel_pos[b] = n_sel
            n_sel += 1
            _sift(sel, 0, n_sel - 1, n_sel, sel_pos, k1, k2, tie, True)
        elif _less(b, sel[0, 0], k1, k2, tie):
            sel_pos[sel[0, 0]] = -1
            sel[0, 0] = b
            sel_pos[b] = 0
            _sift(sel, 0, 0, n_sel, sel_pos, k1, k2, tie, True)
    kept = 0
    for j in range(n_cand):
        b = cand[j]
        if sel_pos[b] >= 0:
            sel_pos[b] = -1
            in_cache[b] = False
            if reset_freq_on_evict:
                freq[b] = 0
        else:
            in_cache[b] = True
            res[p, kept] = b
            kept += 1


@jit
def stack_depths(offsets, expert, ev_layer, ev_step, n_experts, n_layers, global_scope, atomic, access_next,
                 depth_cap, tie, key_code, lam, hist):
    """One pass over a stack policy: histogram of every access's depth in the priority stack.

    For a policy whose ranking of blocks at each unit boundary does not depend
    on the capacity (lru, least-stale, lfu and lfru with persistent counters,
    belady; fixed tie ranks), the caches of all capacities are nested: the
    cache of capacity ``c`` holds the first ``c`` blocks of one stack per
    partition (Mattson et al., 1970). An access at depth ``d`` hits exactly the
    capacities ``c > d``. After each unit the new stack is rebuilt greedily:
    the first ``c`` entries are the best ``c`` of (old first ``c``) ∪ U, taken
    one at a time from a max-heap pool that receives old entries in order.

    Parameters are those of :func:`replay_heap`, except
    depth_cap : int
        Stacks are kept to this depth (the largest capacity of interest);
        deeper accesses count as depth ``depth_cap``.
    hist : int64[n_layers, depth_cap + 1]
        Output: ``hist[l, d]`` accesses of layer ``l`` at depth ``d`` (accumulated).
    """
    n_blocks = n_layers * n_experts
    n_events = offsets.shape[0] - 1
    n_parts = 1 if global_scope else n_layers
    max_unit = _max_unit(offsets, atomic)
    dcap = max(depth_cap, 1)
    stack = np.empty((n_parts, dcap), dtype=np.int64)
    new_stack = np.empty(dcap, dtype=np.int64)
    size = np.zeros(n_parts, dtype=np.int64)
    depth = np.full(n_blocks, -1, dtype=np.int64)       # position in its partition's stack, -1 if deeper/unseen
    member = np.zeros(n_blocks, dtype=np.bool_)
    pool = np.empty((1, max_unit + dcap + 1), dtype=np.int64)
    pool_pos = np.full(n_blocks, -1, dtype=np.int64)
    last, freq, nxt, cycle, coff, crf = _policy_state(n_blocks)
    lunits = np.zeros(n_layers, dtype=np.int64)          # units per layer so far: the LRFU clock
    k1 = np.zeros(n_blocks, dtype=np.float64)
    k2 = np.zeros(n_blocks, dtype=np.int64)
    t = 0
    cur_step = -1
    cycle_start = 0
    for i in range(n_events):
        layer = ev_layer[i]
        p = 0 if global_scope else layer
        base = layer * n_experts
        if ev_step[i] != cur_step:
            cur_step = ev_step[i]
            cycle_start = t
        lo = offsets[i]
        hi = offsets[i + 1]
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            # 1. depths against the stack at the unit's start; the deepest member bounds the rebuild
            deepest = -1
            n_pool = 0
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                d = depth[b]
                if d < 0:
                    hist[layer, depth_cap] += 1
                    deepest = size[p]          # a block from below the stack: everything shifts
                else:
                    hist[layer, d] += 1
                    if d > deepest and deepest < size[p]:
                        deepest = d
                _touch(b, t, a, access_next, cur_step, t - cycle_start, last, freq, nxt, cycle, coff, crf, lam,
                       lunits[layer])
                member[b] = True
            if depth_cap == 0:
                for a in range(a_lo, a_hi):
                    member[base + expert[a]] = False
                t += 1
                lunits[layer] += 1
                continue
            # 2. pool <- members, with their keys at this boundary
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                k1[b], k2[b] = _key(key_code, b, t, False, last, freq, nxt, cycle, coff, crf)
                pool[0, n_pool] = b
                pool_pos[b] = n_pool
                n_pool += 1
                _sift(pool, 0, n_pool - 1, n_pool, pool_pos, k1, k2, tie, True)
            # 3. rebuild positions 0..: push old entry c (non-members), pop the best
            old = size[p]
            grows = deepest >= old       # some member came from below the stack
            limit = min(dcap, old + (a_hi - a_lo)) if grows else deepest + 1
            n_new = 0
            for c in range(limit):
                if c < old:
                    q = stack[p, c]
                    if not member[q]:
                        k1[q], k2[q] = _key(key_code, q, t, False, last, freq, nxt, cycle, coff, crf)
                        pool[0, n_pool] = q
                        pool_pos[q] = n_pool
                        n_pool += 1
                        _sift(pool, 0, n_pool - 1, n_pool, pool_pos, k1, k2, tie, True)
                if n_pool == 0:
                    break
                top = pool[0, 0]
                n_pool -= 1
                if n_pool > 0:
                    pool[0, 0] = pool[0, n_pool]
                    _sift(pool, 0, 0, n_pool, pool_pos, k1, k2, tie, True)
                pool_pos[top] = -1
                new_stack[n_new] = top
                n_new += 1
            # whatever is left in the pool fell below the kept depth
            for j in range(n_pool):
                q = pool[0, j]
                pool_pos[q] = -1
                depth[q] = -1
            for c in range(n_new):
                q = new_stack[c]
                stack[p, c] = q
                depth[q] = c
            if grows:
                size[p] = n_new
            for a in range(a_lo, a_hi):
                member[base + expert[a]] = False
            t += 1
            lunits[layer] += 1


@jit
def replay_lru(offsets, expert, ev_layer, n_experts, n_layers, global_scope, atomic, capacity, tie_order,
               tie_pos, count_from, hits, misses, hit_flag):
    """LRU with residents in per-partition recency lists (a dedicated loop for the commonest policy).

    The same decision as :func:`replay_heap` with the LRU key: members of a
    unit share the newest clock, so they join the tail of the list in
    ascending tie order (read off a bitset indexed by tie position); evictions
    leave from the head (oldest clock, lowest tie rank). ``tie_order[l, j]`` is
    the block of layer ``l`` with the ``j``-th lowest tie rank and
    ``tie_pos[b]`` the inverse. Other parameters are those of :func:`replay_heap`.
    """
    n_blocks = n_layers * n_experts
    record = hit_flag.shape[0] > 0                  # per-access hit flags wanted (timing)
    n_events = offsets.shape[0] - 1
    n_parts = capacity.shape[0]
    n_words = (n_experts + 63) // 64
    nxt = np.full(n_blocks, -1, dtype=np.int64)      # towards the tail (newer)
    prv = np.full(n_blocks, -1, dtype=np.int64)      # towards the head (older)
    head = np.full(n_parts, -1, dtype=np.int64)
    tail = np.full(n_parts, -1, dtype=np.int64)
    size = np.zeros(n_parts, dtype=np.int64)
    in_cache = np.zeros(n_blocks, dtype=np.bool_)
    bits = np.zeros(n_words, dtype=np.uint64)
    for i in range(n_events):
        layer = ev_layer[i]
        p = 0 if global_scope else layer
        cap = capacity[p]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            n_hit = 0
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                if in_cache[b]:
                    n_hit += 1
                    if record:
                        hit_flag[a] = 1
                    _unlink(b, p, head, tail, nxt, prv)       # the member rejoins at the tail below
                    size[p] -= 1
                if atomic:
                    tp = tie_pos[b]
                    bits[tp >> 6] |= np.uint64(1) << np.uint64(tp & 63)
            n_mem = a_hi - a_lo
            if i >= count_from:
                hits[layer] += n_hit
                misses[layer] += n_mem - n_hit
            # residents outside the unit that must go: the oldest first
            keep_old = max(cap - n_mem, 0)
            while size[p] > keep_old:
                b = head[p]
                head[p] = nxt[b]
                if head[p] >= 0:
                    prv[head[p]] = -1
                else:
                    tail[p] = -1
                in_cache[b] = False
                size[p] -= 1
            # members join the tail in ascending tie order; only the best `cap` of them stay
            n_drop = max(n_mem - cap, 0)
            if not atomic:
                b = base + expert[a_lo]
                if n_drop:
                    in_cache[b] = False
                else:
                    _append(b, p, head, tail, nxt, prv)
                    in_cache[b] = True
                    size[p] += 1
                continue
            seen = 0
            for w in range(n_words):
                x = bits[w]
                bits[w] = 0
                while x:
                    b = tie_order[layer, (w << 6) + np.int64(_cttz(x))]
                    x &= x - np.uint64(1)
                    seen += 1
                    if seen <= n_drop:
                        in_cache[b] = False
                    else:
                        _append(b, p, head, tail, nxt, prv)
                        in_cache[b] = True
                        size[p] += 1


@jit_helper
def _unlink(b, p, head, tail, nxt, prv):
    """Take block ``b`` out of partition ``p``'s list (:func:`_append`'s inverse)."""
    q = prv[b]
    r = nxt[b]
    if q >= 0:
        nxt[q] = r
    else:
        head[p] = r
    if r >= 0:
        prv[r] = q
    else:
        tail[p] = q


@jit_helper
def _append(b, p, head, tail, nxt, prv):
    """Link block ``b`` at the tail (newest end) of partition ``p``'s list."""
    nxt[b] = -1
    prv[b] = tail[p]
    if tail[p] >= 0:
        nxt[tail[p]] = b
    else:
        head[p] = b
    tail[p] = b


@jit
def stack_depths_lru(offsets, expert, ev_layer, n_experts, n_layers, global_scope, atomic, depth_cap,
                     tie_order, tie_pos, hist):
    """:func:`stack_depths` for LRU: the stack is the recency list itself.

    Each partition keeps every block it has seen in recency order (the list
    of :func:`replay_lru` with unbounded capacity); an access's depth is its
    distance from the newest end, found by walking from the tail until every
    member of the unit has been met (at most ``depth_cap`` steps).
    """
    n_blocks = n_layers * n_experts
    n_events = offsets.shape[0] - 1
    n_parts = 1 if global_scope else n_layers
    n_words = (n_experts + 63) // 64
    nxt = np.full(n_blocks, -1, dtype=np.int64)
    prv = np.full(n_blocks, -1, dtype=np.int64)
    head = np.full(n_parts, -1, dtype=np.int64)
    tail = np.full(n_parts, -1, dtype=np.int64)
    seen_block = np.zeros(n_blocks, dtype=np.bool_)
    member = np.zeros(n_blocks, dtype=np.bool_)
    bits = np.zeros(n_words, dtype=np.uint64)
    for i in range(n_events):
        layer = ev_layer[i]
        p = 0 if global_scope else layer
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            n_mem = a_hi - a_lo
            for a in range(a_lo, a_hi):
                member[base + expert[a]] = True
            # depths: walk from the newest end until all members are met or the cap is reached
            found = 0
            d = 0
            node = tail[p]
            while node >= 0 and found < n_mem and d < depth_cap:
                if member[node]:
                    hist[layer, d] += 1
                    found += 1
                node = prv[node]
                d += 1
            hist[layer, depth_cap] += n_mem - found
            # move every member to the newest end, in ascending tie order
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                member[b] = False
                if seen_block[b]:
                    _unlink(b, p, head, tail, nxt, prv)
                seen_block[b] = True
                if atomic:
                    tp = tie_pos[b]
                    bits[tp >> 6] |= np.uint64(1) << np.uint64(tp & 63)
                else:
                    _append(b, p, head, tail, nxt, prv)
            if atomic:
                for w in range(n_words):
                    x = bits[w]
                    bits[w] = 0
                    while x:
                        b = tie_order[layer, (w << 6) + np.int64(_cttz(x))]
                        x &= x - np.uint64(1)
                        _append(b, p, head, tail, nxt, prv)


@jit_helper
def _up(heap, hk, p, i, b, key, pos):
    """8-ary max-heap: place block ``b`` with int64 ``key`` at index ``i`` of ``heap[p]``, sift up.

    ``hk`` holds each slot's key beside ``heap``, so comparisons read contiguous
    memory; eight children per node make it shallow (measured 1.5x over binary).
    """
    while i > 0:
        parent = (i - 1) >> 3
        if hk[p, parent] >= key:
            break
        q = heap[p, parent]
        heap[p, i] = q
        hk[p, i] = hk[p, parent]
        pos[q] = i
        i = parent
    heap[p, i] = b
    hk[p, i] = key
    pos[b] = i


@jit_helper
def _down(heap, hk, p, i, n, b, key, pos):
    """8-ary max-heap: place block ``b`` with ``key`` at index ``i`` of ``heap[p, :n]``, sift down."""
    while True:
        first = 8 * i + 1
        if first >= n:
            break
        child = first
        best = hk[p, first]
        for c in range(first + 1, min(first + 8, n)):
            if hk[p, c] > best:
                best = hk[p, c]
                child = c
        if best <= key:
            break
        q = heap[p, child]
        heap[p, i] = q
        hk[p, i] = hk[p, child]
        pos[q] = i
        i = child
    heap[p, i] = b
    hk[p, i] = key
    pos[b] = i


@jit
def next_use_heaps(capacity, n_blocks, max_unit, tie):
    """Empty per-partition 8-ary max-heaps (blocks and keys) and the tie part of each block's key.

    Returns ``heap, hk, size, pos, low`` with ``low[b] = 2**23 - 1 - tie[b]``, the low
    bits of an int64 key ``next_use << 23 | low`` (larger leaves first).
    """
    n_parts = capacity.shape[0]
    slots = _slots(capacity, n_blocks)
    heap = np.empty((n_parts, slots + max_unit), dtype=np.int64)
    hk = np.empty((n_parts, slots + max_unit), dtype=np.int64)
    size = np.zeros(n_parts, dtype=np.int64)
    pos = np.full(n_blocks, -1, dtype=np.int64)
    low = np.empty(n_blocks, dtype=np.int64)
    for b in range(n_blocks):
        low[b] = (1 << 23) - 1 - tie[b]
    return heap, hk, size, pos, low


@jit
def replay_belady(offsets, expert, ev_layer, n_experts, n_layers, global_scope, atomic, access_next, capacity,
                  tie, forced, count_from, hits, misses, hit_flag):
    """Belady (``forced=False``, bypass admission) or Belady-forced-admit, a dedicated loop.

    The same decision as :func:`replay_heap` with the Belady keys, on one int64
    per block: ``next_use << 23 | (2**23 - 1 - tie)``, larger leaves first (the
    farthest next use, then the lower tie rank; ``tie < 2**23``). Under
    ``forced`` the misses of the unit rank below every resident while the unit
    is decided. Residents sit in a max-heap per partition. Other parameters
    are those of :func:`replay_heap`.
    """
    record = hit_flag.shape[0] > 0                  # per-access hit flags wanted (timing)
    n_events = offsets.shape[0] - 1
    max_unit = _max_unit(offsets, atomic)
    heap, hk, size, pos, low = next_use_heaps(capacity, n_layers * n_experts, max_unit, tie)
    miss_buf = np.empty(max_unit, dtype=np.int64)
    forced_shift = np.int64(1) << np.int64(56)
    for i in range(n_events):
        layer = ev_layer[i]
        p = 0 if global_scope else layer
        cap = capacity[p]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            n_miss = 0
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                key = (np.int64(access_next[a]) << 23) | low[b]
                if pos[b] >= 0:
                    _up(heap, hk, p, pos[b], b, key, pos)   # its next use moved later: it rises
                    if record:
                        hit_flag[a] = 1
                else:
                    miss_buf[n_miss] = b
                    n_miss += 1
                    n = size[p]
                    size[p] = n + 1
                    _up(heap, hk, p, n, b, key - forced_shift if forced else key, pos)
            if i >= count_from:
                hits[layer] += (a_hi - a_lo) - n_miss
                misses[layer] += n_miss
            if n_miss == 0:
                continue
            while size[p] > cap:
                b = heap[p, 0]
                pos[b] = -1
                n = size[p] - 1
                size[p] = n
                if n > 0:
                    _down(heap, hk, p, 0, n, heap[p, n], hk[p, n], pos)
            if forced:
                for j in range(n_miss):
                    b = miss_buf[j]
                    if pos[b] >= 0:
                        _up(heap, hk, p, pos[b], b, hk[p, pos[b]] + forced_shift, pos)
