"""Bitset kernels for small per-layer caches (event-atomic replay, per-layer scope, N <= 1024).

Per-layer quotas are small (N is 8-1,024 experts) and an event touches a large
share of its layer's quota, so these loops keep each layer's state as bitsets
over *tie positions*: bit ``j`` of a layer's words stands for the block with
the ``j``-th lowest tie rank in that layer (``tie_pos`` of
:func:`expertcache.replay.engine._tie_order`). An event becomes one bitset
``E``; its hits are ``popcount(E & cache)``; lower tie rank = lower bit, so
"the lowest tie ranks leave first" is "clear the lowest set bits" (LLVM
``cttz`` / ``x & (x - 1)``).

They make exactly the decision of their list/heap counterparts in
:mod:`expertcache.replay._kernels` (the engine dispatches here only where they
apply; tests/test_fast_lru_belady.py compares them on random streams).
Global ``lfru`` replays in :mod:`._kernels_lfru_groups` (small event-atomic caches in :mod:`._kernels_lfru_slots`,
sequential units in :mod:`._kernels_lfru_cands`).
"""

from __future__ import annotations

import numpy as np

from .._bits import U as _U
from .._bits import popc as _popc
from .._jit import jit, jit_helper, jit_inline, jit_loop
from ._kernels import _cttz, _max_unit, crf_decay, crf_decays, crf_key
from ._kernels import _unlink as _unlink_list
from ._pages import Packed
from ._simd import (
    AGE32,
    HAS_BITALG,
    array_at,
    band16_1,
    band16_2,
    band16v_1,
    band16v_2,
    band_masks,
    band_pick32,
    below_mask,
    cut_mask1_32,
    cut_mask1_32_young,
    data_at,
    dyadic8_down,
    dyadic8_mid,
    dyadic8_up,
    keys8_32,
    lanes_below,
    lanes_eq,
    lrfu_cut1,
    lrfu_cut2,
    lrfu_pick32,
    pdep,
    sort_small,
    tie_bits1,
    tie_bits2,
    touch_cut_masks32,
    touch_lanes32,
    values_at32,
)

#: Largest per-layer universe the bitset kernels take (16 words of 64 bits).
MAX_BITS_EXPERTS = 1024
#: Most units (events; accesses where sequential) :func:`replay_lfru_bits` takes: its counts and last units are
#: float32, exact below ``2**24``.
MAX_LFRU_EVENTS = 1 << 24
#: Longest stream (events) :func:`replay_lrfu_bits` takes: its last units are int32.
MAX_LRFU_EVENTS = (1 << 31) - 2


@jit_inline
def _store_words(ev, e0, e1, n_words):
    """``ev[:n_words] = e0, e1`` for a bitset of one or two words built in registers."""
    ev[0] = e0
    if n_words == 2:
        ev[1] = e1


@jit
def _most_layer_events(ev_layer, n_layers):
    """The most events any one layer has (0 for none): one pass, where ``np.bincount`` first widened the layers
    to int64 (0.35 ms of a 32 ms per-layer lrfu replay of 10 M accesses)."""
    counts = np.zeros(max(n_layers, 1), dtype=np.int64)
    for i in range(ev_layer.shape[0]):
        counts[_U(ev_layer[i])] += 1
    most = 0
    for layer in range(counts.shape[0]):    # a loop, not ``counts.max()``: its first compile 0.6 s, 1.0-1.1 s with it
        most = max(most, counts[layer])     # (docs/performance.md, *Session 40*)
    return most


@jit_inline
def _add_bit2(e0, e1, tp):
    """The bitset of two words ``(e0, e1)`` with tie position ``tp`` (below 128) added: its bit masked into its word,
    no branch."""
    bit = np.uint64(1) << np.uint64(tp & 63)
    up = np.uint64(0) - np.uint64(tp >> 6)         # all ones in the second word
    return e0 | (bit & ~up), e1 | (bit & up)


@jit_inline
def _unit_bits(expert, lo, hi, base, tie_pos, ev, n_words):
    """Put the members ``expert[lo:hi]`` of a unit (block ``base + e``) in ``ev`` (tie positions). With one or two
    words the bitset is built in registers: two OR reductions, which LLVM vectorizes (gathers of the tie
    positions), where ``ev[w] |= bit`` was a read-modify-write per member through memory. ``lru`` 0.75-0.90 of its
    time on the benchmark stream (0.92-0.95 with ``NUMBA_LOOP_VECTORIZE=0``: the vector loop is most of the gain;
    docs/performance.md, *Longer streams*)."""
    one = np.uint64(1)
    if n_words <= 2:
        e0 = np.uint64(0)
        e1 = np.uint64(0)
        for a in range(lo, hi):
            e0, e1 = _add_bit2(e0, e1, tie_pos[_U(base + expert[_U(a)])])
        _store_words(ev, e0, e1, n_words)
    else:
        for w in range(n_words):
            ev[w] = np.uint64(0)
        for a in range(lo, hi):
            tp = tie_pos[_U(base + expert[_U(a)])]
            ev[_U(tp >> 6)] |= one << np.uint64(tp & 63)


@jit_inline
def _unit_bits_bitalg(expert, lo, hi, base, tie_pos, order, toff, ev, n_words):
    """:func:`_unit_bits` with AVX-512 BITALG (:data:`._simd.HAS_BITALG`): with one or two words the unit's bits
    over experts first (no table read per member: LLVM vectorizes the loop without gathers), then moved to tie
    positions by :data:`._simd.tie_bits2` from ``order[toff:]``, the layer's experts by tie position
    (:func:`tie_order_bytes`); :func:`_unit_bits` for more words."""
    if n_words <= 2:
        e0 = np.uint64(0)
        e1 = np.uint64(0)
        for a in range(lo, hi):                        # (bits over experts, not tie positions)
            e0, e1 = _add_bit2(e0, e1, np.int64(expert[_U(a)]))
        if n_words == 2:
            tie_bits2(e0, e1, order, toff, ev)
        else:
            tie_bits1(e0, e1, order, toff, ev)
    else:
        _unit_bits(expert, lo, hi, base, tie_pos, ev, n_words)


@jit_inline
def _unit_bits_no_order(expert, lo, hi, base, tie_pos, order, toff, ev, n_words):
    """:func:`_unit_bits`, with :func:`_unit_bits_bitalg`'s arguments (machines without BITALG)."""
    _unit_bits(expert, lo, hi, base, tie_pos, ev, n_words)


#: ``_unit_bits_ordered(expert, lo, hi, base, tie_pos, order, toff, ev, n_words)``: :func:`_unit_bits_bitalg`
#: where the machine has BITALG, else :func:`_unit_bits` (the per-layer lfru loop).
_unit_bits_ordered = _unit_bits_bitalg if HAS_BITALG else _unit_bits_no_order


def tie_order_bytes(tie_pos, n_layers, n_experts):
    """Each layer's experts by tie position as 128 bytes (``order[128 l + t]``: the expert at tie position ``t``;
    127 past the layer's experts, whose bit is never set), for :func:`_unit_bits_bitalg`; one zero byte for more
    than 128 experts (the loops then read tie positions).

    >>> tie_order_bytes(np.array([2, 0, 1, 1, 2, 0]), 2, 3)[[0, 1, 2, 3, 128, 129, 130, 131]].tolist()
    [1, 2, 0, 127, 2, 0, 1, 127]
    """
    if n_experts > 128:
        return np.zeros(1, dtype=np.uint8)
    order = np.full((n_layers, 128), 127, dtype=np.uint8)
    tp = np.asarray(tie_pos, dtype=np.int64).reshape(n_layers, n_experts)
    order[np.arange(n_layers)[:, None], tp] = np.arange(n_experts, dtype=np.uint8)[None, :]
    return order.reshape(-1)


@jit_inline
def _unit_hits(expert, lo, hi, base, tie_pos, ev, mem, layer, n_words, record, hit_flag, counted, hits, misses):
    """Put the members ``expert[lo:hi]`` of a unit of ``layer`` in ``ev`` (tie positions); its hits on ``mem[layer]``.

    Sets ``hit_flag`` on the hits when ``record``, and adds the unit's hits and misses to ``hits[layer]`` and
    ``misses[layer]`` when ``counted`` (past the warm-up). Shared by the bitset loops.
    """
    _unit_bits(expert, lo, hi, base, tie_pos, ev, n_words)
    n_hit = 0
    for w in range(n_words):
        n_hit += np.int64(_popc(ev[w] & mem[_U(layer), w]))
    _record_hits(expert, lo, hi, base, tie_pos, mem, layer, n_hit, record, hit_flag, counted, hits, misses)
    return n_hit


@jit_inline
def _record_hits(expert, lo, hi, base, tie_pos, mem, layer, n_hit, record, hit_flag, counted, hits, misses):
    """The end of a unit's hit count (``n_hit`` hits on ``mem[layer]``, not yet changed by the unit): its hit
    flags when ``record``, and its hits and misses added to ``hits[layer]`` / ``misses[layer]`` when ``counted``."""
    one = np.uint64(1)
    if record and n_hit:
        for a in range(lo, hi):
            tp = tie_pos[_U(base + expert[_U(a)])]
            if (mem[_U(layer), _U(tp >> 6)] >> np.uint64(tp & 63)) & one:
                hit_flag[_U(a)] = 1
    if counted:
        hits[_U(layer)] += n_hit
        misses[_U(layer)] += (hi - lo) - n_hit


#: :func:`_record_hits` as a call: the per-layer lfru and lrfu loops (inlined there: 1.08-1.10x their time;
#: :func:`_unit_hits` inlines it for lru and lfu).
_record_hits_call = jit_helper(_record_hits.py_func)


@jit_helper
def _unlink(k, layer, bhead, btail, bnext, bprev, free, n_free):
    """Unlink bucket ``k`` from ``layer``'s list (:func:`expertcache.replay._kernels._unlink`) and push it on the free
    stack; returns the new stack size."""
    _unlink_list(k, layer, bhead, btail, bnext, bprev)
    free[n_free] = k
    return n_free + 1


def replay_lru_bits(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                    hit_flag, direct=None):
    """Event-atomic, per-layer LRU on bitsets in tie-position space (the decision of ``replay_lru``).

    Residents of a layer sit in *recency buckets*: one bitset per unit clock
    that still holds residents, linked oldest -> newest. A unit's members
    share the newest clock, so they form the newest bucket whole; a hit only
    clears its bit in an older bucket (buckets are swept newest first, where
    hits are). Evictions take the oldest bucket whole (``cache &= ~bucket``) or,
    for the last part, its lowest tie positions. A unit larger than the cache
    keeps only its ``cap`` highest tie positions and evicts every other
    resident. Live buckets never outnumber residents, so a pool of
    ``sum(min(c_l, N) + 1)`` buckets suffices.

    Parameters
    ----------
    offsets, expert, ev_layer, n_experts, n_layers
        The stream's CSR arrays and shape (as for ``replay_lru``).
    capacity
        ``int64[L]`` per-layer quotas (any non-negative value).
    tie_pos
        ``int64[L*N]``: each block's position in its layer's ascending tie order.
    count_from
        Events before it are replayed but not counted (warm-up).
    hits, misses
        ``int64[L]`` counters, incremented.
    hit_flag
        ``uint8[n_access]`` set to 1 on hits, or empty (no flags).
    direct
        Each block's bucket kept in an array, so that a hit clears its bit in its own bucket, instead of the
        sweep from the newest bucket (which visits every bucket back to the oldest hit's, one pointer at a
        time: with few members a unit, a layer has about as many buckets as residents). True / False: in every
        layer; None: in the layers :func:`lru_direct` names.

    The state arrays are allocated here, in numpy, and the loop runs in
    :func:`_replay_lru_bits` (allocating inside a kernel costs compile time).
    """
    n_words = (n_experts + 63) // 64
    n_pool = 1 + int(np.minimum(capacity, n_experts).sum()) + n_layers
    tie_pos = tie_pos.astype(np.int32)     # a compact copy: the unit's gathers read 32-bit lanes and the
                                           # table takes a quarter of the level-1 cache, not all of it (0.95-0.98
                                           # of the time; int16, whose gathers are no narrower: 1.00)
    direct = lru_direct(offsets, capacity, n_experts) if direct is None else np.full(n_layers, bool(direct))
    _replay_lru_bits(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                     hit_flag, np.zeros((n_pool, n_words), dtype=np.uint64), np.zeros(n_pool, dtype=np.int64),
                     np.full(n_pool, -1, dtype=np.int64), np.full(n_pool, -1, dtype=np.int64),
                     np.arange(n_pool - 1, -1, -1, dtype=np.int64), np.full(n_layers, -1, dtype=np.int64),
                     np.full(n_layers, -1, dtype=np.int64), np.zeros(n_layers, dtype=np.int64),
                     np.zeros((n_layers, n_words), dtype=np.uint64), np.zeros(n_words, dtype=np.uint64),
                     np.zeros(n_layers * n_words * 64 if direct.any() else 0, dtype=np.int32), direct)


#: :func:`replay_lru_bits` keeps each block's bucket (``direct``) in the layers whose quota is more than
#: ``LRU_DIRECT_QUOTA + LRU_DIRECT_SLOPE * W`` members of a mean event (``W`` the words of a layer's bitset). Measured
#: by ``benchmarks/lru_direct.py`` on shapes from 32 x 8 (top-2) to 96 x 1024 at batch 1-8: the sweep was the faster
#: below about 2-3 mean events per quota at one or two words, 4-5 at 4, 7-8 at 8 and 9-13 at 16 (docs/performance.md,
#: *Session 47*).
LRU_DIRECT_QUOTA = 2.0
LRU_DIRECT_SLOPE = 0.6


def lru_direct(offsets, capacity, n_experts: int = 128) -> np.ndarray:
    """The layers in which :func:`replay_lru_bits` keeps each block's bucket on a stream of these event offsets
    and these quotas (``n_experts`` a layer): those whose quota is more than :data:`LRU_DIRECT_QUOTA` plus
    :data:`LRU_DIRECT_SLOPE` times the words of a layer's bitset members of a mean event (bool per layer). There a layer
    holds many buckets of a few residents each, and the sweep for a unit's hits visits most.

    >>> lru_direct(np.array([0, 8, 16]), np.array([13, 51])).tolist(), lru_direct(np.array([0]), np.array([9])).tolist()
    ([False, True], [False])
    >>> lru_direct(np.array([0, 8, 16]), np.array([54, 55]), 512).tolist()
    [False, True]
    """
    n = offsets.shape[0] - 1
    mean = int(offsets[-1] - offsets[0]) / n if n > 0 else np.inf
    return np.asarray(capacity) > (LRU_DIRECT_QUOTA + LRU_DIRECT_SLOPE * ((n_experts + 63) // 64)) * mean


@jit_loop
def _replay_lru_bits(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                     hit_flag, bbits, bcnt, bnext, bprev, free, bhead, btail, size, mem, ev, bk, direct):
    """The loop of :func:`replay_lru_bits`; ``free`` starts as a full stack of bucket ids, the rest empty; in the
    layers ``l`` where ``direct[l]``, ``bk[l * 64 W + j]`` is the bucket of tie position ``j`` while it is resident."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_words = (n_experts + 63) // 64
    one = np.uint64(1)
    zero = np.uint64(0)
    n_free = free.shape[0]
    for i in range(n_events):
        layer = ev_layer[i]
        cap = capacity[layer]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        n_mem = hi - lo
        n_hit = _unit_hits(expert, lo, hi, base, tie_pos, ev, mem, layer, n_words, record, hit_flag, i >= count_from,
                           hits, misses)
        if cap == 0 or n_mem == 0:
            continue
        if n_mem >= cap:
            # every other resident leaves; the members with the cap highest tie positions stay
            k = bhead[layer]
            while k >= 0:
                free[n_free] = k
                n_free += 1
                k = bnext[k]
            bhead[layer] = -1
            btail[layer] = -1
            drop = n_mem - cap
            for w in range(n_words):
                if drop == 0:
                    break
                x = ev[w]
                pc = np.int64(_popc(x))
                if pc <= drop:
                    ev[w] = zero
                    drop -= pc
                else:
                    while drop:
                        x &= x - one
                        drop -= 1
                    ev[w] = x
            for w in range(n_words):
                mem[layer, w] = ev[w]
            kept = cap
        else:
            if direct[layer]:          # hits leave their (older) buckets, each found from its block
                for w in range(n_words):
                    x = ev[w] & mem[layer, w]
                    o = (layer * n_words + w) << 6
                    while x:
                        y = x & (x - one)
                        k = bk[_U(o + np.int64(_cttz(x)))]
                        bbits[k, w] ^= x ^ y
                        bcnt[k] -= 1
                        if bcnt[k] == 0:
                            n_free = _unlink(k, layer, bhead, btail, bnext, bprev, free, n_free)
                        x = y
            else:                      # hits leave their (older) buckets: sweep newest first until all are found
                rem = n_hit
                k = btail[layer]
                while rem:
                    q = bprev[k]
                    c = 0
                    for w in range(n_words):
                        x = bbits[k, w] & ev[w]
                        if x:
                            bbits[k, w] ^= x
                            c += np.int64(_popc(x))
                    if c:
                        rem -= c
                        bcnt[k] -= c
                        if bcnt[k] == 0:
                            n_free = _unlink(k, layer, bhead, btail, bnext, bprev, free, n_free)
                    k = q
            # residents outside the unit beyond cap - n_mem leave: oldest bucket first, lowest tie positions
            need = size[layer] - n_hit - (cap - n_mem)
            while need > 0:
                k = bhead[layer]
                if bcnt[k] <= need:
                    for w in range(n_words):
                        mem[layer, w] &= ~bbits[k, w]
                    need -= bcnt[k]
                    n_free = _unlink(k, layer, bhead, btail, bnext, bprev, free, n_free)
                else:
                    bcnt[k] -= need
                    for w in range(n_words):
                        x = bbits[k, w]
                        while x and need:
                            y = x & (x - one)
                            mem[layer, w] ^= x ^ y
                            x = y
                            need -= 1
                        bbits[k, w] = x
            for w in range(n_words):
                mem[layer, w] |= ev[w]
            kept = n_mem
        # the unit's members form the newest bucket
        n_free -= 1
        k = free[n_free]
        for w in range(n_words):
            bbits[k, w] = ev[w]
        if direct[layer]:
            for w in range(n_words):
                x = ev[w]
                o = (layer * n_words + w) << 6
                while x:
                    bk[_U(o + np.int64(_cttz(x)))] = k
                    x &= x - one
        bcnt[k] = kept
        bnext[k] = -1
        bprev[k] = btail[layer]
        if btail[layer] >= 0:
            bnext[btail[layer]] = k
        else:
            bhead[layer] = k
        btail[layer] = k
        size[layer] = min(size[layer] - n_hit, cap - n_mem) + n_mem if n_mem < cap else cap


@jit_helper
def _evict_lowest(cand, src, n_words, need):
    """Clear from ``cand`` the ``need`` lowest set bits of ``src`` (``src`` is consumed)."""
    one = np.uint64(1)
    for w in range(n_words):
        y = src[w]
        while y and need:
            z = y & (y - one)
            cand[w] &= ~(y ^ z)
            y = z
            need -= 1
        if need == 0:
            return


@jit_helper
def _evict_farthest(cand, e, dead, ebits, row, n_words, unseen, grp):
    """Clear, in ``cand``, the ``e`` candidates (``0 < e < |cand|``) whose next use is farthest; return rows walked.

    Ties (the same next unit, or never again) leave by lower tie position,
    the order of ``replay_belady``'s keys. Candidates in ``dead`` (never
    accessed again) go first. The others are found by walking this layer's
    future events, bitset rows ``row, row + 1, ...`` of ``ebits``: a
    candidate's next use is the first future event holding it, so once at most
    ``e`` candidates are still unseen, those are the farthest, and the rest of
    the ``e`` are the lowest tie positions of the group first seen at that
    event. Every candidate not in ``dead`` occurs again, so the walk stops
    within the layer's events. ``unseen`` and ``grp`` are scratch bitsets.
    """
    n_never = 0
    for w in range(n_words):
        grp[w] = cand[w] & dead[w]
        n_never += np.int64(_popc(grp[w]))
    if n_never >= e:
        _evict_lowest(cand, grp, n_words, e)
        return 0
    n_left = 0
    for w in range(n_words):
        cand[w] &= ~grp[w]
        unseen[w] = cand[w]
        n_left += np.int64(_popc(unseen[w]))
    e -= n_never
    start = row
    while True:
        base = row * n_words
        g = 0
        for w in range(n_words):
            grp[w] = unseen[w] & ebits[base + w]
            g += np.int64(_popc(grp[w]))
        if n_left - g <= e:
            for w in range(n_words):
                cand[w] &= ~(unseen[w] & ~grp[w])
            _evict_lowest(cand, grp, n_words, e - (n_left - g))
            return row - start + 1
        for w in range(n_words):
            unseen[w] &= ~grp[w]
        n_left -= g
        row += 1


def event_bitsets(offsets, expert, ev_layer, n_experts, n_layers, tie_pos):
    """Each event's members as a bitset over tie positions, rows in layer-major order; and when blocks die.

    Returns ``ebits, row, dies, dies_next``: ``ebits[r*W : (r+1)*W]``
    (``W = ceil(N/64)`` words) is row ``r``; ``row[i]`` is event ``i``'s row,
    and the events of one layer occupy consecutive rows in stream order (so a
    layer's future events follow its current row). The blocks last accessed
    by event ``i`` form a linked list of layer-offset tie positions
    ``layer*N + tie_pos``: ``dies[i]`` is the first (-1: none), ``dies_next[p]``
    the one after ``p``.
    """
    n_events = offsets.shape[0] - 1
    n_words = (n_experts + 63) // 64
    ebits = np.zeros(n_events * n_words, dtype=np.uint64)
    row = np.empty(n_events, dtype=np.int64)
    dies = np.full(n_events, -1, dtype=np.int32)
    dies_next = np.full(n_layers * n_experts, -1, dtype=np.int32)
    _event_bitsets(offsets, expert, ev_layer, n_experts, n_layers, tie_pos, np.zeros(n_layers + 1, dtype=np.int64),
                   np.full(n_layers * n_experts, -1, dtype=np.int64), ebits, row, dies, dies_next)
    return ebits, row, dies, dies_next


@jit
def _event_bitsets(offsets, expert, ev_layer, n_experts, n_layers, tie_pos, start, last, ebits, row, dies,
                   dies_next):
    """The loop of :func:`event_bitsets` (``start`` zeros, ``last``, ``dies``, ``dies_next`` -1, ``ebits`` 0)."""
    n_events = offsets.shape[0] - 1
    n_words = (n_experts + 63) // 64
    for i in range(n_events):
        start[ev_layer[i] + 1] += 1
    for layer in range(n_layers):
        start[layer + 1] += start[layer]
    one = np.uint64(1)
    for i in range(n_events):
        layer = ev_layer[i]
        r = start[layer]
        start[layer] = r + 1
        row[i] = r
        base = layer * n_experts
        r *= n_words
        for a in range(offsets[i], offsets[i + 1]):
            tp = tie_pos[base + expert[a]]
            ebits[r + (tp >> 6)] |= one << np.uint64(tp & 63)
            last[base + tp] = i
    for p in range(n_layers * n_experts):
        if last[p] >= 0:
            dies_next[p] = dies[last[p]]
            dies[last[p]] = p


def replay_belady_walk(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, forced, count_from,
                       hits, misses, hit_flag, budget=-1, bitsets=None):
    """Event-atomic, per-layer Belady / Belady-forced-admit without next-use keys (the decision of ``replay_belady``).

    Each layer's residents are a bitset over tie positions and every event a
    precomputed bitset (:func:`event_bitsets`): hits are ``popcount(E & C)``,
    and a unit that overflows evicts its ``e`` farthest-next-use candidates
    by walking the layer's future event bitsets (:func:`_evict_farthest`), so
    no per-access next-use array is built and the main loop has no per-access
    work. Belady's candidates are ``C ∪ U`` (bypass allowed); under ``forced``
    the unit's misses rank below every resident. Parameters as
    :func:`replay_lru_bits`.

    The engine replays Belady here where :func:`._kernels_belady_lanes.lanes_pay` says so (large layers whose quota
    is a few mean events); elsewhere on the lanes of next uses of :mod:`._kernels_belady_lanes`.

    The walks are short on real routing (a kept expert recurs within a few
    events) but a crafted stream can make each one run to the far end of its
    layer. ``budget`` (default ``32 * n_events + 65,536``) bounds the event
    rows walked in all: past it the replay stops and returns ``False`` (the
    counters and hit flags are then partial; the caller re-runs the heap loop,
    whose cost does not depend on the input's shape). ``True`` when it finished. ``bitsets``: the result of
    :func:`event_bitsets` for these arguments, when the caller holds it (it is read, not written).
    """
    n_words = (n_experts + 63) // 64
    if budget < 0:
        budget = 32 * (offsets.shape[0] - 1) + 65536
    ebits, row, dies, dies_next = bitsets if bitsets is not None else event_bitsets(offsets, expert, ev_layer,
                                                                                    n_experts, n_layers, tie_pos)
    return _replay_belady_walk(budget, offsets, expert, ev_layer, n_experts, capacity, tie_pos, forced, count_from, hits, misses,
                        hit_flag, ebits, row, dies, dies_next, np.zeros(n_layers, dtype=np.int64),
                        np.zeros((n_layers, n_words), dtype=np.uint64), np.zeros((n_layers, n_words), dtype=np.uint64),
                        np.zeros((4, n_words), dtype=np.uint64))


@jit
def _replay_belady_walk(budget, offsets, expert, ev_layer, n_experts, capacity, tie_pos, forced, count_from, hits,
                        misses, hit_flag, ebits, row, dies, dies_next, size, mem, dead, scratch):
    """The loop of :func:`replay_belady_walk` (``size``, ``mem``, ``dead`` zeros; ``scratch``: 4 bitsets).

    Returns whether it finished within ``budget`` walked rows.
    """
    walked = 0
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_words = (n_experts + 63) // 64
    one = np.uint64(1)
    cand = scratch[0]
    miss = scratch[1]
    unseen = scratch[2]
    grp = scratch[3]
    for i in range(n_events):
        layer = ev_layer[i]
        cap = capacity[layer]
        r = row[i] * n_words
        n_mem = offsets[i + 1] - offsets[i]
        n_miss = 0
        for w in range(n_words):
            miss[w] = ebits[r + w] & ~mem[layer, w]
            n_miss += np.int64(_popc(miss[w]))
        if record and n_miss < n_mem:
            base = layer * n_experts
            for a in range(offsets[i], offsets[i + 1]):
                tp = tie_pos[base + expert[a]]
                if (mem[layer, tp >> 6] >> np.uint64(tp & 63)) & one:
                    hit_flag[a] = 1
        if i >= count_from:
            hits[layer] += n_mem - n_miss
            misses[layer] += n_miss
        p = dies[i]
        while p >= 0:                                       # members accessed for the last time
            j = p - layer * n_experts
            dead[layer, j >> 6] |= one << np.uint64(j & 63)
            p = dies_next[p]
        if n_miss == 0 or cap == 0:
            continue
        total = size[layer] + n_miss
        if total <= cap:
            for w in range(n_words):
                mem[layer, w] |= miss[w]
            size[layer] = total
            continue
        e = total - cap
        nxt = row[i] + 1
        if not forced:
            for w in range(n_words):
                cand[w] = mem[layer, w] | miss[w]
            walked += _evict_farthest(cand, e, dead[layer], ebits, nxt, n_words, unseen, grp)
            for w in range(n_words):
                mem[layer, w] = cand[w]
        elif e < size[layer]:
            # forced: the unit's misses stay; e of the residents (hits included) leave
            for w in range(n_words):
                cand[w] = mem[layer, w]
            walked += _evict_farthest(cand, e, dead[layer], ebits, nxt, n_words, unseen, grp)
            for w in range(n_words):
                mem[layer, w] = cand[w] | miss[w]
        else:
            # forced: every resident leaves, and the misses farthest in the future beyond cap
            for w in range(n_words):
                cand[w] = miss[w]
            walked += _evict_farthest(cand, e - size[layer], dead[layer], ebits, nxt, n_words, unseen, grp)
            for w in range(n_words):
                mem[layer, w] = cand[w]
        size[layer] = cap
        if walked > budget:
            return False
    return True



@jit_helper
def _kth_lowest(a, b, n, m):
    """The ``m``-th lowest value of ``a[:n]`` (``1 <= m <= n``), values repeated or not; ``a`` and ``b`` are scratch.

    A quickselect whose partition has no data-dependent branch: each pass writes every value to both ends of the
    other buffer and advances the end its comparison with the pivot (a median of three) names, so a pass costs
    the same whatever the values (a partition with branches mispredicts about every other comparison). The
    values equal to the pivot are counted apart, so every pass shrinks the range; at most 4 values left are
    finished by counting ranks. The lowest two and the highest two ranks (a unit evicting one or two blocks, a
    cut holding one or two more than leave) take one or two reduction passes instead.
    """
    if m <= 2 or m >= n - 1:
        lo = a[0]
        hi = a[0]
        for q in range(1, n):
            lo = min(lo, a[q])
            hi = max(hi, a[q])
        if m == 1:
            return lo
        if m == n:
            return hi
        low = m == 2
        v = lo if low else hi
        c = 0
        for q in range(n):
            c += a[q] == v
        if c >= 2:
            return v
        w = hi if low else lo          # the next value past v, inward
        for q in range(n):
            x = a[q]
            if low:
                w = min(w, x) if x > v else w
            else:
                w = max(w, x) if x < v else w
        return w
    s0 = 0
    src = a
    dst = b
    while n > 4:
        x0 = src[_U(s0)]
        x1 = src[_U(s0 + (n >> 1))]
        x2 = src[_U(s0 + n - 1)]
        if x0 > x1:
            x0, x1 = x1, x0
        if x1 > x2:
            x1 = x2
            if x0 > x1:
                x1 = x0
        p = x1
        nl = 0
        ng = 0
        for q in range(s0, s0 + n):    # (unsigned indices: no negative-index wraparound per store)
            x = src[_U(q)]
            dst[_U(nl)] = x
            dst[_U(n - 1 - ng)] = x
            nl += x < p
            ng += x > p
        if m <= nl:
            s0 = 0
            n = nl
        elif m <= n - ng:
            return p
        else:
            m -= n - ng
            s0 = n - ng
            n = ng
        src, dst = dst, src
    v = src[s0]
    for q in range(s0, s0 + n):
        x = src[q]
        lt = 0
        le = 0
        for r in range(s0, s0 + n):
            y = src[r]
            lt += y < x
            le += y <= x
        if lt < m <= le:
            v = x
    return v


@jit_inline
def _admit(mem, ev, size, layer, n_words, n_new, cap):
    """Admit the unit ``ev`` into ``mem[layer]`` when its ``n_new`` misses fit ``cap`` (returns 0); otherwise leave
    the cache as it is and return how many of ``C ∪ U`` must leave."""
    n = size[_U(layer)] + n_new
    if n <= cap:
        for w in range(n_words):
            mem[_U(layer), w] |= ev[w]
        size[_U(layer)] = n
        return 0
    return n - cap


@jit_helper
def _positions(mem, layer, n_words, cpos):
    """Write the set tie positions of ``mem[layer]`` into ``cpos``, ascending; return how many."""
    one = np.uint64(1)
    k = 0
    for w in range(n_words):
        x = mem[layer, w]
        while x:
            cpos[k] = (w << 6) + np.int64(_cttz(x))
            x &= x - one
            k += 1
    return k


@jit_helper
def _evict_ranked(mem, layer, ckey, cpos, k, m, v):
    """Clear from ``mem[layer]`` the candidates ``cpos[:k]`` (ascending tie positions) whose key ``ckey`` is below
    ``v``, the ``m``-th lowest, and of those equal to it the lowest tie positions: ``m`` in all."""
    n_less = 0
    for q in range(k):
        n_less += ckey[q] < v
    eq = m - n_less
    for q in range(k):
        c = ckey[q]
        e = (c == v) & (eq > 0)
        eq -= e
        j = cpos[q]
        mem[layer, j >> 6] ^= np.uint64((c < v) | e) << np.uint64(j & 63)


def replay_lfu_bits(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, reset_freq_on_evict,
                    count_from, hits, misses, hit_flag):
    """Event-atomic, per-layer LFU on bitsets in tie-position space (the decision of ``_kernels_ranked``'s lfu).

    The key of a block is ``(count, tie rank)``, its count taken after the unit's own accesses; at each unit
    the lowest ``m = |C ∪ U| - c`` keys of the residents and the unit's members leave. A layer's residents are a
    bitset over tie positions, and so are its counts: *bit-sliced*, plane ``p`` holding bit ``p`` of every
    tie position's count. A unit adds one to its members' counts as a bitset addition (the unit's bitset is
    the carry into plane 0; a few word operations per plane in use), and the ``m`` leaving blocks are found
    by a radix selection over the planes, highest first: within the group still undecided (at first
    ``C ∪ U``), the blocks whose bit is 0 rank below those whose bit is 1, so either the 0s hold the ``m``
    (the group narrows to them) or they all leave and the 1s are narrowed to the rest. The last group shares
    one count, and its lowest tie positions (lowest bits: tie position order is tie rank order within a layer)
    leave. No step depends on the number of candidates, and no key is packed or compared.
    ``reset_freq_on_evict`` (in-cache counters) clears a leaving block's count in every plane.
    ``python benchmarks/replay_throughput.py``: about 1.5x lru's time per access (the cut-and-quickselect loop
    it replaces was about 3x, the sorted-residents loop before it about 7x).

    Parameters are those of :func:`replay_lru_bits`; counts persist across evictions unless
    ``reset_freq_on_evict``. The state arrays are allocated here and the loop runs in :func:`_replay_lfu_bits`.
    """
    n_words = (n_experts + 63) // 64
    n_planes = max(1, int(_most_layer_events(ev_layer, n_layers)).bit_length())   # a count never exceeds its
                                                                                    # layer's units
    tie_pos = tie_pos.astype(np.int32)     # as replay_lru_bits (0.98 of the time; lfru's loop: 1.00, left)
    _replay_lfu_bits(offsets, expert, ev_layer, n_experts, capacity, tie_pos, reset_freq_on_evict, count_from,
                     hits, misses, hit_flag, np.zeros(n_layers, dtype=np.int64),
                     np.zeros((n_layers, n_words), dtype=np.uint64), np.zeros(n_words, dtype=np.uint64),
                     np.zeros((n_layers, n_planes, n_words), dtype=np.uint64), np.zeros(n_layers, dtype=np.int64),
                     np.zeros(max(n_words, 8), dtype=np.uint64), np.zeros(max(n_words, 8), dtype=np.uint64))


@jit_helper
def _radix2(pp, t, n_words, g0, g1, rem):
    """The radix selection of :func:`_replay_lfu_bits` over one or two words (a second word of 0 where there is one):
    ``pp`` the layer's planes (:func:`._simd.data_at`), ``t`` of them in use, ``g0`` / ``g1`` the group (C ∪ U),
    ``rem`` the blocks to leave; returns the words that leave surely, the group left at the last count, and how many
    of it leave (its lowest tie positions). A function of its own, which LLVM leaves a call: inlined into the loop,
    it kept ``rem`` and the planes' base on the stack, a store and a load per plane on the selection's chain (the
    loop in 0.95-0.96 of its time without them on the AMD core; docs/performance.md, *Session 32*)."""
    P = array_at(pp, t * n_words)
    zero = np.uint64(0)
    w1 = n_words - 1
    o0 = zero
    o1 = zero
    for p in range(t - 1, -1, -1):
        b0 = P[_U(p * n_words)]
        b1 = P[_U(p * n_words + w1)]
        z0 = g0 & ~b0
        z1 = g1 & ~b1
        zc = np.int64(_popc(z0)) + np.int64(_popc(z1))
        keep = below_mask(zc, rem)                  # all the 0s leave (zc < rem); as a select, LLVM
                                                    # made it a branch per plane (0.89-0.93 the time)
        o0 |= z0 & keep
        o1 |= z1 & keep
        g0 = (g0 & b0 & keep) | (z0 & ~keep)
        g1 = (g1 & b1 & keep) | (z1 & ~keep)
        rem -= zc & np.int64(keep)
    return o0, o1, g0, g1, rem


@jit_helper
def _radix8(pp, t, n_words, grp, out, rem):
    """The radix selection of :func:`_radix2` over four to eight words, each in a register: ``grp[:8]`` the group
    (C ∪ U; the words past ``n_words`` 0, and a plane's last word read in their place), ``rem`` the blocks to leave;
    writes the words that leave surely to ``out[:8]`` and the group left at the last count to ``grp[:8]``, and returns
    how many of it leave. The loop over words it replaces stored the group a word at a time and loaded it back as
    vectors for the next plane's count, a load that waited for the stores (docs/performance.md, *Session 61*)."""
    P = array_at(pp, t * n_words)
    zero = np.uint64(0)
    w1 = n_words - 1
    i2, i3, i4, i5, i6, i7 = min(2, w1), min(3, w1), min(4, w1), min(5, w1), min(6, w1), min(7, w1)
    g0, g1, g2, g3, g4, g5, g6, g7 = grp[0], grp[1], grp[2], grp[3], grp[4], grp[5], grp[6], grp[7]
    o0 = o1 = o2 = o3 = o4 = o5 = o6 = o7 = zero
    for p in range(t - 1, -1, -1):
        q = p * n_words
        b0, b1, b2, b3 = P[_U(q)], P[_U(q + 1)], P[_U(q + i2)], P[_U(q + i3)]
        b4, b5, b6, b7 = P[_U(q + i4)], P[_U(q + i5)], P[_U(q + i6)], P[_U(q + i7)]
        z0, z1, z2, z3 = g0 & ~b0, g1 & ~b1, g2 & ~b2, g3 & ~b3
        z4, z5, z6, z7 = g4 & ~b4, g5 & ~b5, g6 & ~b6, g7 & ~b7
        zc = (np.int64(_popc(z0)) + np.int64(_popc(z1)) + np.int64(_popc(z2)) + np.int64(_popc(z3))
              + np.int64(_popc(z4)) + np.int64(_popc(z5)) + np.int64(_popc(z6)) + np.int64(_popc(z7)))
        keep = below_mask(zc, rem)                  # all the 0s leave (zc < rem)
        o0 |= z0 & keep
        o1 |= z1 & keep
        o2 |= z2 & keep
        o3 |= z3 & keep
        o4 |= z4 & keep
        o5 |= z5 & keep
        o6 |= z6 & keep
        o7 |= z7 & keep
        g0 = (g0 & b0 & keep) | (z0 & ~keep)
        g1 = (g1 & b1 & keep) | (z1 & ~keep)
        g2 = (g2 & b2 & keep) | (z2 & ~keep)
        g3 = (g3 & b3 & keep) | (z3 & ~keep)
        g4 = (g4 & b4 & keep) | (z4 & ~keep)
        g5 = (g5 & b5 & keep) | (z5 & ~keep)
        g6 = (g6 & b6 & keep) | (z6 & ~keep)
        g7 = (g7 & b7 & keep) | (z7 & ~keep)
        rem -= zc & np.int64(keep)
    out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7] = o0, o1, o2, o3, o4, o5, o6, o7
    grp[0], grp[1], grp[2], grp[3], grp[4], grp[5], grp[6], grp[7] = g0, g1, g2, g3, g4, g5, g6, g7
    return rem


@jit_loop
def _replay_lfu_bits(offsets, expert, ev_layer, n_experts, capacity, tie_pos, reset_freq_on_evict, count_from,
                     hits, misses, hit_flag, size, mem, ev, planes, top, grp, out):
    """The loop of :func:`replay_lfu_bits`; ``planes[l, p]`` is bit ``p`` of layer ``l``'s counts (over tie
    positions), ``top[l]`` the number of its planes in use."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_words = (n_experts + 63) // 64
    n_planes = planes.shape[1]
    one = np.uint64(1)
    zero = np.uint64(0)
    for i in range(n_events):
        layer = ev_layer[i]
        cap = capacity[layer]
        lo = offsets[i]
        hi = offsets[i + 1]
        n_mem = hi - lo
        n_hit = _unit_hits(expert, lo, hi, layer * n_experts, tie_pos, ev, mem, layer, n_words, record, hit_flag,
                           i >= count_from, hits, misses)
        t = top[layer]
        grow = False
        for w in range(n_words):          # counts += 1 on the unit's members: the unit is the carry (in
            c = ev[w]                     # registers for two words measured 1.02-1.03x the time)
            for p in range(t):
                x = planes[layer, p, w]
                planes[layer, p, w] = x ^ c
                c &= x
            if c and t < n_planes:
                planes[layer, t, w] = c
                grow = True
        if grow:
            top[layer] = t + 1
            t += 1
        if cap == 0 or n_mem == 0:
            if cap == 0 and reset_freq_on_evict:     # every member leaves at once
                for w in range(n_words):
                    for p in range(t):
                        planes[layer, p, w] &= ~ev[w]
            continue
        m = _admit(mem, ev, size, layer, n_words, n_mem - n_hit, cap)
        if m == 0:
            continue
        # C ∪ U overflows: the m lowest keys leave. Radix selection over the count planes, highest first.
        if n_words <= 2:               # in registers, branch-free (the loops over words and a branch on `take`
            w1 = n_words - 1           # per plane mispredicted); a second word of 0 when there is one
            g0 = mem[layer, 0] | ev[0]
            g1 = (mem[layer, w1] | ev[w1]) if w1 else zero
            o0, o1, g0, g1, rem = _radix2(data_at(planes, layer * n_planes * n_words), t, n_words, g0, g1, m)
            _store_words(grp, g0, g1, n_words)
            _store_words(out, o0, o1, n_words)
        elif 4 <= n_words <= 8:        # each word in a register (_radix8); the words past the layer's are 0
            for w in range(n_words):
                grp[w] = mem[layer, w] | ev[w]
            rem = _radix8(data_at(planes, layer * n_planes * n_words), t, n_words, grp, out, m)
        else:
            for w in range(n_words):
                grp[w] = mem[layer, w] | ev[w]
                out[w] = zero
            rem = m
            for p in range(t - 1, -1, -1):
                zc = 0
                for w in range(n_words):
                    zc += np.int64(_popc(grp[w] & ~planes[layer, p, w]))
                keep = below_mask(zc, rem)    # all the 0s leave (zc < rem); the rest among the 1s
                for w in range(n_words):
                    b = planes[layer, p, w]
                    z = grp[w] & ~b
                    out[w] |= z & keep
                    grp[w] = (grp[w] & b & keep) | (z & ~keep)
                rem -= zc & np.int64(keep)
        for w in range(n_words):          # one count left in the group: its lowest tie positions (the rem
            x = grp[w]                    # lowest bits, deposited; a loop over the bits measured 1.02x)
            k = min(rem, np.int64(_popc(x)))
            out[w] |= pdep((one << np.uint64(k)) - one if k < 64 else ~zero, x)
            rem -= k
            mem[layer, w] = (mem[layer, w] | ev[w]) & ~out[w]
            if reset_freq_on_evict:
                for p in range(t):
                    planes[layer, p, w] &= ~out[w]
        size[layer] = cap


def replay_lfru_bits(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                     hit_flag, old_age=AGE32, sequential=False, pages=None, max_moves=None):
    """Per-layer ``lfru`` on bitsets in tie-position space (the decision of ``replay_select``): event-atomic, or
    with ``sequential`` one unit per access (its clock the access index; members in the stream's order).

    The key of a block is ``freq / (t - last + 1)`` (``t`` the unit, ``last`` its last unit, ``freq`` its
    persistent count after the unit's own accesses), evaluated by the float expression of ``replay_scan``; ties
    leave by lower tie rank. A layer's residents are a bitset over tie positions, and its counts and last units
    are dense float32 arrays in tie-position order (integers below ``2**24``, exact), so that 64 blocks are
    compared at once, 16 to a 512-bit vector (:mod:`._simd`). When
    ``C ∪ U`` overflows the quota, one vector pass over the layer's lanes adds one to the members' counts, sets
    their last unit and gives two bitsets, the blocks whose
    key is at most a low cut ``theta0`` (which all leave) and at most a high cut ``theta1`` (beyond which all
    stay); a unit that fits touches its members the same way without the cuts (one word at a time up to two
    words, a loop over the members beyond). The ``need = m - |below theta0|`` lowest keys of the *band* between
    the two cuts (``m = |C ∪ U| - c``) are found exactly: a band of up to 16 (most) by counting each key's rank
    in registers (:func:`._simd.band_pick32`, its counts and last units compressed from their lanes), one of up
    to 64 by sorting its keys with a bitonic network, a larger band by ranking every block of ``C ∪ U``; a band of
    more than 16 is first narrowed by cuts of 8 significant bits between its two (:func:`_narrow`); the
    keys below the ``need``-th, and of those equal to it the lowest tie positions, leave with the low cut's
    blocks. The cuts have 8 significant bits (:func:`._simd.dyadic8_down`,
    ``dyadic8_up``), so ``freq <= theta * age`` is exact in float32 for every age below ``old_age`` (at most
    :data:`._simd.AGE32` = ``2**16``: the product has at most 24 significant bits) and holds exactly when the
    float64 key is at most ``theta`` (a key ``f / a`` other than the cut differs from it by more than float64
    rounds); the pass marks the lanes of older blocks, which are tested in float64 (exact; nearly never any).
    Streams of ``2**24`` units (events; accesses where ``sequential``) or more take ``replay_select``. The next
    cuts of the layer are a running mean of its ``need``-th keys (:data:`_LFRU_CENTRE_RATE`) times 0.85 and 1.2
    (their square roots where its quota holds more than :data:`_LFRU_WIDE_CAP` blocks),
    kept apart for units with more members than the quota and for the others (with more, the ``need``-th key is
    most often a member's count over an age of 1; with fewer, another block's count over an age of a step or more:
    at rho 0.3 on the benchmark stream the two alternate, and one pair of cuts moved 1.25 times per overflow, a
    pair for each 0.39 in ``benchmarks/lfru_cut_model.py``; docs/performance.md, *Session 33*). A cut that holds too
    many or too few blocks becomes the other cut, and a cut 1.5x further out is ranked alone, the factor squared at each
    further step: a band just past a cut stays narrow. Within 12 such steps a cut reaches 0 or ``inf``, which bound
    ``m`` whatever the keys; after :data:`_LFRU_MAX_MOVES` (or ``max_moves``, lower in tests) the overflow ranks every
    block of ``C ∪ U`` instead, so that counts that disagree with the bitsets (no stream makes them) could give a
    wrong decision, never a loop without end. Parameters are those of :func:`replay_lru_bits`, ``old_age``
    (lower in tests, to reach the float64 test), ``sequential``, ``pages``, the allocator of the state arrays
    (:class:`._pages.Packed` by default; ``benchmarks/placement.py`` passes others), and ``max_moves``. The state
    arrays are allocated here and the loop runs in :func:`_replay_lfru_bits`.
    """
    n_words = (n_experts + 63) // 64
    npad = n_words * 64
    width = max(min(int(capacity.max()) + int(_max_unit(offsets, True)), n_experts) + 1, 64)   # |C ∪ U| at most
    pa = Packed() if pages is None else pages      # no list across a page boundary (_pages)
    thr = pa((n_layers, 6), np.float64, 0)     # per regime: cuts (0, 1 / 2, 3) and centre (4 / 5; 0: none)
    thr[:, 1:4:2] = np.inf             # the first overflow of a layer (in either regime) ranks every block of C ∪ U
    if not HAS_BITALG:                 # the unit's bits by gathers of 32-bit lanes, as lru's and lfu's
        tie_pos = tie_pos.astype(np.int32)     # (0.97-0.99 of the time of 64-bit lanes on an AVX2 core)
    _replay_lfru_bits(offsets, expert, ev_layer, n_experts, capacity, tie_pos, count_from, hits, misses, hit_flag,
                      pa(n_layers, np.int64, 0), pa((n_layers, n_words), np.uint64, 0), pa(n_words, np.uint64, 0),
                      pa(n_words, np.uint64, 0), pa(n_words, np.uint64, 0), pa(n_words, np.uint64, 0),
                      pa(n_words, np.uint64, 0),
                      pa(4, np.uint64, 0), pa(n_layers * npad, np.float32, 0), pa(n_layers * npad, np.float32, 0),
                      thr, pa(width, np.int64), pa(width + 8, np.float64), pa(width, np.float64),
                      pa(width, np.float64), pa(width, np.float64), np.float32(min(float(old_age), AGE32)),
                      pa(128, np.float32, 0), pa(128, np.float32, 0), bool(sequential),
                      tie_order_bytes(tie_pos, n_layers, n_experts),
                      _LFRU_MAX_MOVES if max_moves is None else max(int(max_moves), 0))


#: The next cuts of a layer, as factors of its last ``need``-th key (``_replay_lfru_bits``). Measured again once
#: the band was compressed (session 20): 0.85 / 1.2 take 0.88 / 1.00 / 1.00 / 1.02 / 0.92 of the time of 0.75 /
#: 1.4 at rho 0.1 / 0.2 / 0.3 / 0.4 / 0.75 (0.8 / 1.3: 0.95 / 0.99 / 0.99 / 1.00 / 0.95; 0.9 / 1.12: 1.03-1.09
#: at rho 0.2-0.4; 0.7 / 1.5: 1.03-1.07; docs/performance.md).
_LFRU_CUT_LOW = 0.85
_LFRU_CUT_HIGH = 1.2
#: A layer whose quota holds more than this many blocks takes its next cuts at the square roots of those factors
#: (half as far from the centre in key space): the band between the cuts holds about as many blocks as lie near the
#: centre, which grows with the quota. On 48 x 512 at batch 8 the usual cuts' band held 20-27 blocks at rho 0.25-0.75
#: (quotas of 128-384), narrowed (:func:`_narrow`) after 76-97% of the overflows; ``kernel_ab --kernel lfru --experts
#: 512`` 0.95 / 0.90 / 0.88 of the time at rho 0.25 / 0.4 / 0.75 (factors to the power 0.35: 0.98 / 0.91 / 0.88, 0.7:
#: 0.95 / 0.94 / 0.93; at rho 0.1, a quota of 52, these closer cuts took 1.03 of the usual ones' time), ``--experts
#: 256`` 1.01 / 0.96 at rho 0.4 / 0.75 (quotas of 102 / 192); quotas of 96 or fewer (every rho up to 0.75 at 128
#: experts) keep the usual ones (docs/performance.md, *Session 61*).
_LFRU_WIDE_CAP = 96
_LFRU_CUT_LOW_WIDE = _LFRU_CUT_LOW ** 0.5
_LFRU_CUT_HIGH_WIDE = _LFRU_CUT_HIGH ** 0.5
#: The first step by which a cut on the wrong side moves out (``_replay_lfru_bits``), squared at each further step.
_LFRU_STEP = 1.5
#: A band of more blocks than this between the two cuts of ``_replay_lfru_bits`` is narrowed first (:func:`_narrow`).
_LFRU_NARROW = 16
#: Moves of a cut after which an overflow ranks every block of ``C ∪ U`` (``_replay_lfru_bits``): from any finite
#: positive cut, 12 steps of 1.5 squared each reach 0 (``dyadic8_down`` past float64's least normal) or ``inf``.
_LFRU_MAX_MOVES = 64
#: A layer's centre (per regime) moves this share of the way to each ``need``-th key it ranks: on the benchmark
#: stream the keys scatter around a level that moves slowly (rho 0.1-0.4), and a running mean places the next cuts
#: better than the last key did (moved cuts per overflow 0.088 / 0.308 / 0.330 / 0.501 -> 0.034 / 0.186 / 0.215 /
#: 0.373 at rho 0.1 / 0.2 / 0.3 / 0.4, 0.119 -> 0.158 at 0.75, where they follow a trend: an instrumented copy).
#: kernel_ab --kernel lfru against the last key: 0.995 / 0.973 / 0.980 / 0.971 / 1.020 (docs/performance.md,
#: *Session 33*). With one unit per access (``sequential``) the loop keeps the last key: the running mean took
#: 1.18-1.30x its time there at rho 0.1-0.3.
_LFRU_CENTRE_RATE = 0.25


@jit_inline
def _band_leave(ckey, v, need, nb):
    """The lanes of the band ``ckey[:nb]`` (``nb <= 64``; lanes past it ignored) that leave when ``need`` of them
    do and ``v`` is the ``need``-th lowest key: those below ``v`` and, of those equal to it, the first in band
    order (the lowest tie positions), as bits."""
    live = lanes_below(nb)
    lt, eqm = band_masks(ckey, v, nb)
    below = lt & live
    eq = need - np.int64(_popc(below))
    first = (np.uint64(1) << np.uint64(eq)) - np.uint64(1) if eq < 64 else ~np.uint64(0)   # no shift by 64
    return below | pdep(first, eqm & live)


@jit_helper
def _settle(sure, maybe, F, Lst, off, th, t1):
    """The lanes ``off .. off+63`` below the cut ``th``: ``sure``, and of ``maybe`` (lanes the float32 pass did not
    decide: too old for its products) those whose float64 test ``F <= th * (t1 - L)`` holds (exact: ``th`` has 8
    significant bits, counts and ages are below ``2**24``; nearly always none to test). Shared with the global
    slots loop (:mod:`._kernels_lfru_slots`)."""
    x = maybe & ~sure
    while x:
        r = np.int64(_cttz(x))
        x &= x - np.uint64(1)
        j = _U(off + r)
        if np.float64(F[j]) <= th * (t1 - np.float64(Lst[j])):
            sure |= np.uint64(1) << np.uint64(r)
    return sure


@jit_helper
def _cut1(SF, SL, off, lim, th, t1, t32, old_age, young, w4):
    """The live lanes (``lim``) of ``off .. off+63`` below the cut ``th``: the float32 pass (``t32`` the float32
    ``t1``), and where ``young`` is false the float64 test on the lanes ``old_age`` or older (:func:`_settle`).
    A moved cut of the per-layer lfru loop and of the global slots loop."""
    if young:
        cut_mask1_32_young(SF, SL, off, np.float32(th), t32, w4)
        return w4[0] & lim
    cut_mask1_32(SF, SL, off, np.float32(th), t32, old_age, w4)
    u = w4[1] & lim
    return _settle(w4[0] & lim & ~u, u, SF, SL, off, th, t1)


@jit_helper
def _recut(moved, kept, F, Lst, pbase, th, t1, cu, n_words, old_age, w4):
    """A cut of :func:`_replay_lfru_bits` moved to ``th``: its old bits become the other cut's (``kept``), its
    new ones over ``C ∪ U`` (``cu``) are ranked alone into ``moved`` (``w4`` a scratch of two words); returns how
    many."""
    c = 0
    t32 = np.float32(t1)
    for w in range(n_words):
        kept[w] = moved[w]
        moved[w] = _cut1(F, Lst, pbase + (w << 6), cu[w], th, t1, t32, old_age, False, w4)
        c += np.int64(_popc(moved[w]))
    return c


@jit_helper
def _narrow(low, high, mid, F, Lst, pbase, th0, th1, t1, c0, c1, m, n_words, old_age, w4):
    """Cuts ``th0`` / ``th1`` of :func:`_replay_lfru_bits` holding ``c0 < m < c1`` blocks (``low`` / ``high``), moved
    towards each other while the band between holds more than :data:`_LFRU_NARROW`: a cut of 8 significant bits
    between them (:func:`dyadic8_mid`) ranks the band's blocks alone (``mid``) and becomes the low cut where it holds at
    most ``m``, else the high one; it stops where no such cut lies between them. Returns ``(th0, th1, c0, c1)``."""
    t32 = np.float32(t1)
    while c1 - c0 > _LFRU_NARROW:
        tm = dyadic8_mid(th0, th1)
        if tm == th0:
            break
        c = c0
        for w in range(n_words):
            mid[w] = _cut1(F, Lst, pbase + (w << 6), high[w] & ~low[w], tm, t1, t32, old_age, False, w4)
            c += np.int64(_popc(mid[w]))
        if c <= m:
            for w in range(n_words):
                low[w] |= mid[w]
            th0 = tm
            c0 = c
        else:
            for w in range(n_words):
                high[w] = low[w] | mid[w]
            th1 = tm
            c1 = c
    return th0, th1, c0, c1


@jit_loop
def _replay_lfru_bits(offsets, expert, ev_layer, n_experts, capacity, tie_pos, count_from, hits, misses, hit_flag,
                      size, mem, ev, cu, low, high, mid, w2, F, Lst, thr, cpos, ckey, sel, sel2, fb, old_age, bF32,
                      bL32, sequential, order, max_moves):
    """The loop of :func:`replay_lfru_bits`; ``F`` / ``Lst`` ``[l * 64 W + j]``: count / last unit of layer
    ``l``'s tie position ``j`` (float32); bitsets: ``ev`` the unit, ``cu`` ``C ∪ U``, ``low`` / ``high`` below the
    cuts; ``old_age``: lanes at least that old are decided in float64; ``sequential``: one unit per access;
    ``order``: each layer's experts by tie position (:func:`tie_order_bytes`), for the unit's bits where the machine
    has BITALG (:func:`_unit_bits_bitalg`: 0.92-0.93 of the time on the AMD core, where the gathers of 64-bit tie
    positions took about 10% of the samples; the lru and lfu loops, whose gathers read 32-bit tie positions, took
    1.07-1.19 of theirs with it and keep the gathers; docs/performance.md, *Session 31*)."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_words = (n_experts + 63) // 64
    npad = n_words * 64
    zero = np.uint64(0)
    k0 = offsets[0] if sequential else 0
    i = 0
    for k in range(k0, offsets[n_events] if sequential else n_events):
        if sequential:                 # one unit per access: the unit clock is the access index
            while offsets[i + 1] <= k:
                i += 1
            lo = k
            hi = k + 1
        else:                          # one unit per event: the unit clock is the event index
            i = k
            lo = offsets[i]
            hi = offsets[i + 1]
        layer = ev_layer[i]
        ul = _U(layer)
        cap = capacity[ul]
        base = layer * n_experts
        pbase = layer * npad
        n_mem = hi - lo
        fi = float(k - k0)
        _unit_bits_ordered(expert, lo, hi, base, tie_pos, order, layer * 128, ev, n_words)
        n_hit = 0
        for w in range(n_words):
            n_hit += np.int64(_popc(ev[w] & mem[ul, w]))
        _record_hits_call(expert, lo, hi, base, tie_pos, mem, layer, n_hit, record, hit_flag, i >= count_from,
                          hits, misses)
        m = 0
        if cap > 0 and n_mem > 0:
            m = _admit(mem, ev, size, layer, n_words, n_mem - n_hit, cap)
        if m == 0:                     # no ranking: the members' counts and last units alone
            if n_words <= 2:
                for w in range(n_words):
                    touch_lanes32(F, Lst, pbase + (w << 6), ev[w], np.float32(fi))
            else:
                for a in range(lo, hi):
                    j = _U(pbase + tie_pos[_U(base + expert[_U(a)])])
                    F[j] += 1.0
                    Lst[j] = fi
            continue
        t1 = fi + 1.0                  # age = t1 - last
        rg = 2 if n_mem > cap else 0   # the regime: more members than the quota (the need-th key among
        th0 = thr[ul, rg]              # theirs, counts over an age of 1) or not (most often among the others',
        th1 = thr[ul, rg + 1]          # counts over ages of a step or more); cuts kept for each
        c0 = 0
        c1 = 0
        for w in range(n_words):       # the members' accesses and the two cuts over C ∪ U, one pass
            x = mem[ul, w] | ev[w]
            cu[w] = x
            off = pbase + (w << 6)
            touch_cut_masks32(F, Lst, off, ev[w], np.float32(fi), np.float32(th0), np.float32(th1), np.float32(t1),
                              old_age, w2)
            lw = w2[0] & x
            hw = w2[1] & x
            old = w2[2] & x
            if old:                    # blocks idle for 2**16 units: the float64 test
                lw = _settle(lw & ~old, old, F, Lst, off, th0, t1)
                hw = _settle(hw & ~old, old, F, Lst, off, th1, t1)
            low[w] = lw
            high[w] = hw
            c0 += np.int64(_popc(low[w]))
            c1 += np.int64(_popc(high[w]))
        g = _LFRU_STEP                 # a cut on the wrong side: it becomes the other cut, and a cut g times
        moves = 0                      # further out is ranked alone, g squared at each step (a first step of 4:
        bound = False                  # bands of 17-64 after 22% of the overflows at rho 0.2, none at 1.5)
        while c0 > m or c1 < m:
            if moves >= max_moves:     # past the bound (never reached where the counts agree with the bits):
                c0 = 0                 # every block of C ∪ U ranked below, as for a wide band
                c1 = m + 65
                bound = True
                break
            moves += 1
            if c0 > m:
                th1 = th0
                th0 = dyadic8_down(th0 / g)
                c1 = c0
                c0 = _recut(low, high, F, Lst, pbase, th0, t1, cu, n_words, old_age, w2)
            else:                      # fewer than leave sit below the high cut
                th0 = th1
                th1 = dyadic8_up(th1 * g) if th1 > 0.0 else np.inf
                c0 = c1
                c1 = _recut(high, low, F, Lst, pbase, th1, t1, cu, n_words, old_age, w2)
            g *= g
        if c1 - c0 > _LFRU_NARROW and c0 < m < c1 and 0.0 < th0 and th1 < np.inf and not bound:
            th0, th1, c0, c1 = _narrow(low, high, mid, F, Lst, pbase, th0, th1, t1, c0, c1, m, n_words, old_age, w2)
        need = m - c0
        nb = c1 - c0
        v = th0
        if need > 0 and nb <= 16 and n_words == 2:  # the band's counts and last units, built in registers and
                                       # stored once, so band_pick32's loads are forwarded (with AVX-512 VBMI2;
                                       # 0.95-0.97 of the time on the AMD core, docs/performance.md, *Session 31*)
            band16_2(F, Lst, pbase, high[0] & ~low[0], high[1] & ~low[1], bF32, bL32)
        elif need > 0 and nb <= 16 and n_words == 1:
            band16_1(F, Lst, pbase, high[0] & ~low[0], zero, bF32, bL32)
        elif need > 0 and nb <= 64:    # compressed from their words
            q = 0
            for w in range(n_words):
                x = high[w] & ~low[w]
                o = pbase + (w << 6)
                values_at32(F, o, x, bF32, q)
                q = values_at32(Lst, o, x, bL32, q)
        if need == 0:
            for w in range(n_words):
                mem[ul, w] = cu[w] & ~low[w]
        elif nb <= 16:                 # a narrow band (85% of the overflows at rho 0.2): ranked in registers
            band_pick32(bF32, bL32, t1, nb, need, w2, ckey)
            v = ckey[_U(_cttz(w2[1]))]
            leave = w2[0]
            for w in range(n_words):
                x = high[w] & ~low[w]
                mem[ul, w] = cu[w] & ~(low[w] | pdep(leave, x))
                c = _popc(x)
                leave = (leave >> c) if c < 64 else zero
        elif nb <= 64:                 # a 32- or 64-lane network: a band of 17-64 (under 1% of the overflows at
                                       # rho 0.2, 5% at 0.3)
            for c in range(0, nb, 8):  # its keys divided 8 at a time (a division per key in a loop over the
                keys8_32(bF32, bL32, t1, c, ckey)           # band's bits: 1.01x the time at rho 0.2)
            sort_small(ckey, nb, sel)
            v = sel[need - 1]
            leave = _band_leave(ckey, v, need, nb)      # band indices that leave
            for w in range(n_words):
                x = high[w] & ~low[w]
                mem[ul, w] = cu[w] & ~(low[w] | pdep(leave, x))
                c = _popc(x)
                leave = (leave >> c) if c < 64 else zero
        else:                          # a wide band: every block of C ∪ U
            for w in range(n_words):
                mem[ul, w] = cu[w]
            k = _positions(mem, layer, n_words, cpos)
            for q in range(k):
                j = _U(pbase + cpos[q])
                c = np.float64(F[j]) / (t1 - np.float64(Lst[j]))
                sel2[q] = c
                sel[q] = c
            v = _kth_lowest(sel, fb, k, m)
            _evict_ranked(mem, layer, sel2, cpos, k, m, v)
        size[ul] = cap
        c = thr[ul, 4 + (rg >> 1)]     # the regime's centre: a running mean of its need-th keys
        if c == 0.0 or not v < np.inf:
            c = v
        elif need > 0:                 # (with none to rank, v is the low cut, not a key: the centre stays)
            c += (1.0 if sequential else _LFRU_CENTRE_RATE) * (v - c)      # (one unit per access: the last key)
        thr[ul, 4 + (rg >> 1)] = c
        wide = cap > _LFRU_WIDE_CAP    # (more residents near the centre: closer cuts)
        thr[ul, rg] = dyadic8_down((_LFRU_CUT_LOW_WIDE if wide else _LFRU_CUT_LOW) * c)
        thr[ul, rg + 1] = dyadic8_up((_LFRU_CUT_HIGH_WIDE if wide else _LFRU_CUT_HIGH) * c)


#: Largest table of decays :func:`replay_lrfu_bits` builds (a layer with more units computes the longer gaps'
#: decays one by one); also the longest table of its value scales.
_LRFU_DECAYS = 1 << 16
#: A layer's values span at most ``2**_LRFU_SPAN`` above its base before the base moves: float32 values reach
#: ``2**127``, and a CRF is at most the number of accesses (``2**31``).
_LRFU_SPAN = 90.0
#: Values below it become 0 when a base moves (they stay normal floats, whose relative error is bounded).
_LRFU_TINY = 2.0 ** -110
#: The lowest positive cut: every value that became 0 lies surely below it.
_LRFU_FLOOR = 2.0 ** -100
#: Added to a layer's margin for the float32 values: a value's rounding to float32 and a bound's (``2**-24``
#: relative each), with room to spare.
_LRFU_MARGIN32 = 2.0 ** -21
#: Factors of the outer and inner lrfu cuts around a layer's centre (:data:`_LRFU_CENTRE_RATE`): the key-space
#: cuts ``∓0.25`` / ``∓0.08`` around it (inner ``∓0.1``: no change; ``∓0.06``: 1.00-1.015x the time).
_LRFU_CUT_FACTORS = tuple(2.0 ** e for e in (-0.25, -0.08, 0.08, 0.25))
#: The least factors by which a moved outer cut steps away from its inner one (the key-space step 1e-3).
_LRFU_MIN_STEP_DOWN = 2.0 ** -0.001
_LRFU_MIN_STEP_UP = 2.0 ** 0.001
#: A band of more than 64 blocks between the cuts of :func:`replay_lrfu_bits` is narrowed by at most this many cuts
#: between them (:func:`_lrfu_narrow`) before every block of ``C ∪ U`` is ranked by exact keys.
_LRFU_NARROW_PASSES = 8
#: Moves of an outer cut after which an overflow of :func:`replay_lrfu_bits` ranks every block of ``C ∪ U``: the log of
#: a cut's distance from the inner one grows 5x a step from at least 0.004 (the least step, to the fourth), so a
#: cut reaches 0 (below ``_LRFU_FLOOR``) within 6 steps and ``inf`` within 10, whatever the finite values.
_LRFU_MAX_MOVES = 64
#: A layer's centre moves this share of the way to each leaving value (relative to its unit's scale): the leaving
#: values scatter around a level that moves slowly, with little to follow from one overflow of a layer to the next,
#: so a running mean places the next cuts better than the last value did. Measured with ``kernel_ab --kernel lrfu``
#: against the last value (1.0): 0.25 took 0.992 / 0.980 / 0.978 / 0.970 of the time at rho 0.1 / 0.2 / 0.3 / 0.5,
#: 0.125 1.002 / 0.987 / 0.983 / 0.974 (docs/performance.md, *Session 33*).
_LRFU_CENTRE_RATE = 0.25
#: Units of at most this many members (a layer of one or two words, every gap in the decay table: batch 1 of a
#: top-8 model) have their bitset built in two registers by the member loop, larger ones by one vector compare of
#: the last units after it. The compare waits for the loop's stores; the registers' five operations a member cost
#: more than that wait at the benchmark's batch 8 (40 members: 1.10x the time), less at batch 1:
#: ``kernel_ab --kernel lrfu --batch 1`` 0.92-0.96 of the time at rho 0.1-0.75, against 0.99-1.00 with this at 0 (the
#: path compiled, never taken). 12 keeps batch 2's units (13-16 members) off it: at 16 they straddle it, and the
#: branch mispredicted (docs/performance.md, *Session 61*).
_LRFU_FEW_MEMBERS = 12


def replay_lrfu_bits(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, lam, count_from, hits,
                     misses, hit_flag, pages=None, max_moves=None):
    """Event-atomic, per-layer ``lrfu`` on bitsets in tie-position space (the decision of ``replay_heap``'s lrfu).

    A block's CRF is kept at its last access, ``S = 1 + S * 2**(-lam * gap)`` (``gap`` in units of its layer),
    and its key is ``log2(S) + lam * u`` (``u`` the layer unit of that access): the float expressions of
    :func:`expertcache.replay._kernels.crf_update` and ``crf_key``; keys change only on access, ties leave by
    lower tie rank. A layer's residents are a bitset over tie positions; ``S``, ``u`` and a *value* are dense
    arrays in tie-position order (``u`` int32: streams of fewer than :data:`MAX_LRFU_EVENTS` events), updated
    by the member loop (the decay from a table of :func:`expertcache.replay._kernels.crf_decays`). The unit's
    bitset is one vector compare of the last units after that loop, or, for a unit of at most
    :data:`_LRFU_FEW_MEMBERS` members on a layer of one or two words, built in registers by the loop.

    The value is ``V = S * 2**(lam * (u - R))`` for a base unit ``R`` of the layer, kept as float32:
    ``2**(key - lam R)``, so it ranks like the key, and costs one multiplication per access (the scale
    ``2**(lam (u - R))`` of a unit comes from a table) where a key would take a logarithm. When ``lam (u - R)``
    would pass 90 the base moves to the unit and every value of the layer is computed again from its CRF and
    last unit, ``S * 2**(-lam (R - u))`` (values below ``2**-110`` become 0; so a value is one float64 product
    rounded once to float32, never a chain of roundings). A value's relative error against
    ``2**(key - lam R)``, and the key's own rounding, stay below a margin ``delta`` (a bound that grows with the
    clock, plus ``2**-21`` for float32); so two blocks whose values differ by more than ``delta`` rank as their
    keys do, and the exact key (:func:`expertcache.replay._kernels.crf_key`) is computed only where values are
    closer.

    When ``C ∪ U`` overflows the quota, one vector pass (:func:`._simd.lrfu_cut2`) ranks every block of the layer
    against the two inner of four cuts around the layer's centre (closer to it after a band wider than 64 was narrowed:
    :func:`_lrfu_narrow`, :func:`_lrfu_spread`), a running mean of its leaving values (relative to the unit's scale):
    the blocks surely (value at most ``cut (1 - delta)``) and maybe (``cut (1 + delta)``) below each; a block between
    the two is placed by its exact key against the cut's key, ``log2(cut) + lam R``, so that each cut splits the blocks
    exactly as the keys do. Where the inner low cut holds more than ``m = |C ∪ U| - c`` (the inner high one fewer), the
    outer cut below (above) is ranked the same way, moved out until it holds at most (at least) ``m``. The blocks below
    the highest ranked cut holding at most ``m`` leave, those above the lowest ranked cut holding at least ``m`` stay,
    and the ``need`` lowest of the band between are found by ranking its values in registers (up to 16, listed by
    :data:`._simd.band16v_2`, ranked by :func:`._simd.lrfu_pick32`, ties to the lower tie position) or sorting them with
    a bitonic network: exact unless the ``need``-th and the next lie within ``3 delta`` (or the next is below the lowest
    cut, where 0 stands for every value too small to hold), in which case the band's exact keys are sorted (the keys
    below the ``need``-th, and of those equal to it the lowest tie positions, leave). A band wider than 64 is first
    narrowed by up to :data:`_LRFU_NARROW_PASSES` cuts between its two (:func:`_lrfu_narrow`), its exact keys sorted
    where it falls to 64; one that does not takes every block of ``C ∪ U`` with exact keys, as does an overflow whose
    outer cut has moved :data:`_LRFU_MAX_MOVES` times (or ``max_moves``, lower in tests) without enclosing the ``m``-th
    value: a finite cut reaches 0 or ``inf`` within a few steps, so only values that disagree with their keys (NaN; no
    stream makes them) get there, and the loop's time stays bounded whatever its state. Parameters are those of
    :func:`replay_lru_bits`, ``lam`` (``lrfu_lambda``), ``pages``, the allocator of the state arrays
    (:class:`._pages.Packed` by default; ``benchmarks/placement.py`` passes others), and ``max_moves``. The state arrays
    are allocated here and the loop runs in :func:`_replay_lrfu_bits`.
    """
    if offsets.shape[0] > MAX_LRFU_EVENTS:
        raise ValueError(f"{offsets.shape[0] - 1} events: this loop keeps last units as int32, so at most "
                         f"{MAX_LRFU_EVENTS - 1}")
    n_words = (n_experts + 63) // 64
    npad = n_words * 64
    width = max(min(int(capacity.max()) + int(_max_unit(offsets, True)), n_experts) + 1, 64)   # |C ∪ U| at most
    n_units = int(_most_layer_events(ev_layer, n_layers))
    lam = float(lam)
    n_scale = min(n_units + 1, _LRFU_DECAYS)
    if lam > 0.0:
        n_scale = min(n_scale, int(_LRFU_SPAN / lam) + 1)             # lam * (n_scale - 1) <= _LRFU_SPAN
    tie_pos = tie_pos.astype(np.int16)     # a compact copy (below MAX_BITS_EXPERTS), read one member at a
                                           # time: 0.97-0.98 of the time (int32: 0.99), with int32 last units
                                           # (PL) 0.93 (PL alone 0.95-0.96): the layer's lines halved
    pa = Packed() if pages is None else pages      # no list across a page boundary (_pages)
    centre = pa(n_layers, np.float64, 0)   # 0: the first overflow of a layer ranks all of C ∪ U
    decays = crf_decays(lam, min(n_units + 1, _LRFU_DECAYS))     # P, and reversed Pr
    _replay_lrfu_bits(offsets, expert, ev_layer, n_experts, capacity, tie_pos, lam, count_from, hits, misses,
                      hit_flag, pa(n_layers, np.int64, 0), pa((n_layers, n_words), np.uint64, 0),
                      pa(n_words, np.uint64, 0), pa(n_words, np.uint64, 0), pa((4, n_words), np.uint64, 0),
                      pa(4, np.uint64, 0), pa(n_layers * npad, np.float64, 0), pa(n_layers * npad, np.int32, -1),
                      pa(n_layers * npad, np.float32, 0), pa(n_layers, np.int64, 0), pa(n_layers, np.int64, 0),
                      pa.copy(decays),
                      pa.copy(2.0 ** (lam * np.arange(n_scale, dtype=np.float64))), centre, pa(4, np.float64),
                      pa(8, np.float32), pa(width, np.int64), pa(width + 64, np.float64), pa(width, np.float64),
                      pa(width, np.float64), pa(width, np.float64), pa(4, np.int64, 0), n_units < _LRFU_DECAYS,
                      pa(width + 64, np.float32), pa.copy(lrfu_lanes(tie_pos, n_layers, n_experts)),
                      pa.copy(np.ascontiguousarray(decays[::-1])),
                      _LRFU_MAX_MOVES if max_moves is None else max(int(max_moves), 0),
                      pa.copy(np.tile(np.array(_LRFU_CUT_FACTORS), (n_layers, 1))), pa(n_layers, np.float64, 1.0))


def lrfu_lanes(tie_pos, n_layers, n_experts):
    """Each block's lane in :func:`replay_lrfu_bits`'s dense arrays: its layer's first lane (``64 W`` lanes a
    layer, ``W`` the words of its bitset) plus its tie position. int16 where every lane is below ``2**15`` (the
    table is read once per member: half the lines of int32), else int32.

    >>> lrfu_lanes(np.array([1, 0, 2, 0, 2, 1]), 2, 3).tolist(), lrfu_lanes(np.zeros(600), 600, 1).dtype.name
    ([1, 0, 2, 64, 66, 65], 'int32')
    """
    npad = (n_experts + 63) // 64 * 64
    lane = (np.arange(n_layers * n_experts, dtype=np.int64) // n_experts) * npad + np.asarray(tie_pos, np.int64)
    return lane.astype(np.int16 if n_layers * npad <= 2**15 else np.int32)


@jit_helper
def _lrfu_key(S, PL, j, lam):
    """The exact key of dense lane ``j`` (:func:`expertcache.replay._kernels.crf_key` of its CRF and unit)."""
    return crf_key(S[_U(j)], float(PL[_U(j)]), lam)


@jit_inline
def _lrfu_decay(P, lam, gap):
    """The decay ``2**(-lam * gap)`` of a gap of ``gap`` units: from the table ``P`` where it holds it."""
    return P[_U(gap)] if gap < P.shape[0] else crf_decay(lam, gap)


@jit_helper
def _lrfu_margin(u, lam):
    """The relative margin ``delta`` of a layer's values at its unit ``u``: a value's error against
    ``2**(key - lam R)`` (its CRF's rounding, its scale's or decay's) and the key's own rounding (bounds that grow
    with the clock), and :data:`_LRFU_MARGIN32` for float32 (the value's rounding, a bound's)."""
    fu = float(u)
    return 1e-9 + (fu * (1.0 / 256.0) + lam * fu + 4096.0) * 2.0 ** -44 + _LRFU_MARGIN32


@jit_helper
def _lrfu_set_cut(th, thv, q, t, delta):
    """Cut ``q`` at value ``t`` (a positive one below :data:`_LRFU_FLOOR` raised to it; a negative one holds no
    block, ``inf`` every block): ``th[q] = t``, ``thv[2q]`` / ``thv[2q + 1]`` its sure / maybe bounds as float32
    (their rounding within the margin ``delta``; one past float32's range is ``inf``, above every value)."""
    if 0.0 <= t < _LRFU_FLOOR:
        t = _LRFU_FLOOR
    th[q] = t
    thv[2 * q] = np.float32(t * (1.0 - delta))
    thv[2 * q + 1] = np.float32(t * (1.0 + delta))


@jit_inline
def lrfu_cut_word(V, o, thv, w8, qa, qb, x):
    """The 64 float32 values ``V[o:o+64]`` of the lanes ``x`` against cuts ``qa`` and ``qb`` (one where they are
    equal; bounds ``thv``, :func:`_lrfu_set_cut`): ``(sa, sb, ua, ub)``, the lanes surely at most each cut and those
    within its margin (:func:`._simd.lrfu_cut2`). Shared with the global slots loop (:mod:`._kernels_lrfu_slots`)."""
    if qa == qb:
        lrfu_cut1(V, o, thv, w8, qa)
        w8[2] = w8[0]
        w8[3] = w8[1]
    else:
        lrfu_cut2(V, o, thv, w8, qa, qb)
    return w8[0] & x, w8[2] & x, w8[1] & ~w8[0] & x, w8[3] & ~w8[2] & x


@jit_inline
def lrfu_place(c, bit, ua, ub, sa, sb, th, qa, qb, lam_r):
    """A lane ``bit`` within the margin of cut ``qa`` (``ua``) or ``qb`` (``ub``), placed by its exact key ``c``
    against the cut's key ``log2(th[q]) + lam_r``: ``(sa, sb)`` with its bit where it is at most the key."""
    if ua & bit and c <= np.log2(th[qa]) + lam_r:
        sa |= bit
    if ub & bit and c <= np.log2(th[qb]) + lam_r:
        sb |= bit
    return sa, sb


@jit_inline
def lrfu_rank_band(band, nb, need, w8, ckey, sel):
    """The band's float32 values ``band[:nb]`` (``need < nb <= 64``) ranked: ``(v, nxt, leave)``, the ``need``-th
    value and the next and, up to 16 values, the ``need`` lowest lanes as bits, ranked in registers
    (:func:`._simd.lrfu_pick32`, ties to the lower lane); past 16, ``leave`` is 0, ``ckey`` holds the values and
    ``sel`` them sorted by a network. Shared with the global slots loop (:mod:`._kernels_lrfu_slots`)."""
    if nb <= 16:
        lrfu_pick32(band, nb, need, w8)
        return np.float64(band[_U(_cttz(w8[1]))]), np.float64(band[_U(_cttz(w8[2]))]), w8[0]
    for r in range(nb):
        ckey[_U(r)] = np.float64(band[_U(r)])
    sort_small(ckey, nb, sel)
    return sel[need - 1], sel[need], np.uint64(0)


@jit_helper
def _lrfu_cut_pass(V, S, PL, pbase, lam, lam_r, cu, n_words, th, thv, w8, msk, qa, qb, cnt):
    """Cuts ``qa`` and ``qb`` (one cut where they are equal) over ``C ∪ U`` (``cu``): ``msk[q]`` the blocks whose
    key is at most the cut's key ``log2(th[q]) + lam_r``, ``cnt[q]`` how many. The values place a block surely
    (:func:`._simd.lrfu_cut2`); one within the margin is placed by its exact key."""
    one = np.uint64(1)
    ca = 0
    cb = 0
    for w in range(n_words):
        o = pbase + (w << 6)
        sa, sb, ua, ub = lrfu_cut_word(V, o, thv, w8, qa, qb, cu[w])
        un = ua | ub
        while un:                      # a value within the margin of a cut (rare): the exact keys decide
            j = np.int64(_cttz(un))
            un &= un - one
            sa, sb = lrfu_place(_lrfu_key(S, PL, o + j, lam), one << _U(j), ua, ub, sa, sb, th, qa, qb, lam_r)
        msk[qa, w] = sa
        msk[qb, w] = sb
        ca += np.int64(_popc(sa))
        cb += np.int64(_popc(sb))
    cnt[qa] = ca
    cnt[qb] = cb


@jit_helper
def _lrfu_band_exact(S, PL, pbase, lam, msk, a, b, n_words, ckey, sel, need, nb):
    """The band between cuts ``a`` and ``b`` of :func:`_replay_lrfu_bits` (``nb`` blocks, at most 64) ranked by exact
    keys (:func:`_lrfu_key`): ``(the need-th key, the band indices that leave as bits)``."""
    one = np.uint64(1)
    q = 0
    for w in range(n_words):
        x = msk[b, w] & ~msk[a, w]
        o = pbase + (w << 6)
        while x:
            ckey[q] = _lrfu_key(S, PL, o + np.int64(_cttz(x)), lam)
            x &= x - one
            q += 1
    sort_small(ckey, nb, sel)
    k = sel[need - 1]
    return k, _band_leave(ckey, k, need, nb)


@jit_inline
def _lrfu_leave_band(mem, layer, cu, msk, a, b, leave, n_words):
    """A layer's residents after an overflow of :func:`_replay_lrfu_bits`: ``C ∪ U`` less the blocks below cut ``a``
    and the band's blocks (between cuts ``a`` and ``b``) that ``leave`` names by band index."""
    for w in range(n_words):
        x = msk[b, w] & ~msk[a, w]
        mem[layer, w] = cu[w] & ~(msk[a, w] | pdep(leave, x))
        c = _popc(x)
        leave = (leave >> c) if c < 64 else np.uint64(0)


@jit_helper
def _lrfu_spread(fac, spread, ul, by):
    """Layer ``ul``'s cut factors (``fac[ul]``: :data:`_LRFU_CUT_FACTORS` to the power ``spread[ul]``) with its spread
    times ``by``, at most 1."""
    x = min(spread[ul] * by, 1.0)
    spread[ul] = x
    for q in range(4):
        fac[ul, q] = _LRFU_CUT_FACTORS[q] ** x


@jit_helper
def _lrfu_narrow(V, S, PL, pbase, lam, lam_r, cu, n_words, th, thv, w8, msk, cnt, a, b, m, delta):
    """Cuts ``a`` / ``b`` of :func:`_replay_lrfu_bits` holding ``cnt[a] < m < cnt[b]`` blocks, more than 64 apart,
    moved towards each other at most :data:`_LRFU_NARROW_PASSES` times: a cut at the geometric mean of theirs, in one
    of the two cut places they leave free, ranked over ``C ∪ U`` (:func:`_lrfu_cut_pass`), becomes the low cut where
    it holds at most ``m``, else the high one. True where the band between is then at most 64, the cuts' places in
    ``w8[0]`` / ``w8[1]``."""
    for _ in range(_LRFU_NARROW_PASSES):
        t = np.sqrt(th[a] * th[b])
        if not th[a] < t < th[b]:
            break
        q = 0
        while q == a or q == b:
            q += 1
        _lrfu_set_cut(th, thv, q, t, delta)
        _lrfu_cut_pass(V, S, PL, pbase, lam, lam_r, cu, n_words, th, thv, w8, msk, q, q, cnt)
        if cnt[q] <= m:
            a = q
        else:
            b = q
        if cnt[b] - cnt[a] <= 64:
            w8[0] = np.uint64(a)
            w8[1] = np.uint64(b)
            return True
    return False


@jit_inline
def _lrfu_overflow(mem, size, layer, cap, m, u, qu, lam, ubase, centre, fac, spread, th, thv, cu, ev, msk, w8, cnt, V,
                   S, PL, ckey, sel, sel2, fb, band, cpos, max_moves):
    """An overflow of layer ``layer`` in :func:`_replay_lrfu_bits` (and in the sequential prototype of
    ``benchmarks/lrfu_seq_selection.py``): ``m`` blocks of ``C ∪ U`` (``mem[layer] | ev``) leave, the ``m`` lowest
    ``(key, tie position)``, found by the cuts around the layer's centre (at unit ``u``, whose scale is ``qu``), its
    band ranked by values or exact keys as :func:`replay_lrfu_bits` describes; the layer's size becomes ``cap`` and
    its centre moves towards the leaving value (29 parameters: a call of more than 30 is built as a tuple, which numba
    does not inline)."""
    zero = np.uint64(0)
    ul = _U(layer)
    n_words = mem.shape[1]
    pbase = layer * (n_words * 64)
    lam_r = lam * float(ubase[ul])
    delta = _lrfu_margin(u, lam)
    cv = centre[ul] * qu
    if cv > 0.0:
        for q in range(4):
            _lrfu_set_cut(th, thv, q, cv * fac[ul, q], delta)
    else:                          # no centre: every block of C ∪ U is ranked
        _lrfu_set_cut(th, thv, 0, -1.0, delta)
        _lrfu_set_cut(th, thv, 1, -1.0, delta)
        _lrfu_set_cut(th, thv, 2, np.inf, delta)
        _lrfu_set_cut(th, thv, 3, np.inf, delta)
    for w in range(n_words):
        cu[w] = mem[layer, w] | ev[w]
    _lrfu_cut_pass(V, S, PL, pbase, lam, lam_r, cu, n_words, th, thv, w8, msk, 1, 2, cnt)
    a = 1                          # the inner cuts, and an outer one only where an inner one does not do
    b = 2
    moves = 0
    if cnt[1] > m:                 # more than leave sit below the inner low cut: the outer one, moved down
        a = 0                      # until it holds at most m (the log of its distance grows 5x a step);
        b = 1                      # the inner low cut bounds the band from above (narrower than cut 2)
        while moves < max_moves:
            _lrfu_cut_pass(V, S, PL, pbase, lam, lam_r, cu, n_words, th, thv, w8, msk, 0, 0, cnt)
            if cnt[0] <= m:
                break
            r = min(th[0] / th[1], _LRFU_MIN_STEP_DOWN)
            t = th[0] * (r * r) * (r * r)
            _lrfu_set_cut(th, thv, 0, t if t >= _LRFU_FLOOR else -1.0, delta)
            moves += 1
    elif cnt[2] < m:               # fewer than leave sit below the inner high cut: the outer one, moved up;
        a = 2                      # the inner high cut bounds the band from below
        b = 3
        while moves < max_moves:
            _lrfu_cut_pass(V, S, PL, pbase, lam, lam_r, cu, n_words, th, thv, w8, msk, 3, 3, cnt)
            if cnt[3] >= m:
                break
            r = max(th[3] / th[2], _LRFU_MIN_STEP_UP)
            _lrfu_set_cut(th, thv, 3, th[3] * (r * r) * (r * r), delta)
            moves += 1
    c_lo = cnt[a]
    c_hi = cnt[b]
    need = m - c_lo
    nb = c_hi - c_lo
    bound = a != 1 and moves >= max_moves
    if bound:                      # an outer cut that never enclosed the m-th value (values that disagree
        need = 1                   # with the keys, e.g. NaN: no stream makes them): every block of C ∪ U ranked
        nb = 65                    # by exact keys (the wide band's path), so that no state loops without end
    v = th[a]
    if need == 0:
        for w in range(n_words):
            mem[layer, w] = cu[w] & ~msk[a, w]
    elif need == nb:               # the whole band leaves: every block below cut b; the next cuts centre on it
        v = th[b]
        for w in range(n_words):
            mem[layer, w] = cu[w] & ~msk[b, w]
    elif nb <= 64:
        if nb <= 16 and n_words == 2:  # the band's values built in registers and stored once, so that
                                   # lrfu_pick32's load is forwarded (with AVX-512 VBMI2, as per-layer lfru's)
            band16v_2(V, pbase, msk[b, 0] & ~msk[a, 0], msk[b, 1] & ~msk[a, 1], band)
        elif nb <= 16 and n_words == 1:
            band16v_1(V, pbase, msk[b, 0] & ~msk[a, 0], zero, band)
        else:                      # compressed from their words
            q = 0
            for w in range(n_words):
                q = values_at32(V, pbase + (w << 6), msk[b, w] & ~msk[a, w], band, q)
        v, nxt, leave = lrfu_rank_band(band, nb, need, w8, ckey, sel)
        if nxt <= v * (1.0 + 3.0 * delta) or nxt < _LRFU_FLOOR:     # the need-th is not separated from the
            leave = _lrfu_band_exact(S, PL, pbase, lam, msk, a, b, n_words, ckey, sel, need, nb)[1]   # next
        elif nb > 16:
            leave = _band_leave(ckey, v, need, nb)
        _lrfu_leave_band(mem, layer, cu, msk, a, b, leave, n_words)
    elif not bound and 0.0 < th[a] and th[b] < np.inf and _lrfu_narrow(V, S, PL, pbase, lam, lam_r, cu, n_words,
                                                                        th, thv, w8, msk, cnt, a, b, m, delta):
        a = np.int64(w8[0])        # a wide band narrowed to at most 64 (_lrfu_narrow): exact keys of the band
        b = np.int64(w8[1])
        _lrfu_spread(fac, spread, ul, 0.25)     # (the layer's next cuts closer to its centre)
        need = m - cnt[a]
        v = th[a]
        if need == 0:
            for w in range(n_words):
                mem[layer, w] = cu[w] & ~msk[a, w]
        else:
            vk, leave = _lrfu_band_exact(S, PL, pbase, lam, msk, a, b, n_words, ckey, sel, need, cnt[b] - cnt[a])
            _lrfu_leave_band(mem, layer, cu, msk, a, b, leave, n_words)
            v = 2.0 ** (vk - lam_r)
    else:                          # a wide band: every block of C ∪ U, exact keys
        for w in range(n_words):
            mem[layer, w] = cu[w]
        k = _positions(mem, layer, n_words, cpos)
        for r in range(k):
            c = _lrfu_key(S, PL, pbase + cpos[r], lam)
            sel2[r] = c
            sel[r] = c
        vk = _kth_lowest(sel, fb, k, m)
        _evict_ranked(mem, layer, sel2, cpos, k, m, vk)
        v = 2.0 ** (vk - lam_r)
    if moves and spread[ul] < 1.0:  # an outer cut moved: the layer's next cuts further out again
        _lrfu_spread(fac, spread, ul, 2.0)
    size[layer] = cap
    x = v / qu if 0.0 < v < np.inf else 0.0     # the next cuts' centre, relative to the scale
    c = centre[ul]
    centre[ul] = x if x == 0.0 or c == 0.0 else c + _LRFU_CENTRE_RATE * (x - c)


@jit_loop
def _replay_lrfu_bits(offsets, expert, ev_layer, n_experts, capacity, tie_pos, lam, count_from, hits, misses,
                      hit_flag, size, mem, ev, cu, msk, w8, S, PL, V, lunits, ubase, P, scale, centre, th, thv, cpos,
                      ckey, sel, sel2, fb, cnt, whole, band, lane, Pr, max_moves, fac, spread):
    """The loop of :func:`replay_lrfu_bits`; ``S`` / ``PL`` / ``V`` ``[l * 64 W + j]``: CRF / layer unit of the
    last access / value (float32) of layer ``l``'s tie position ``j``; ``ubase[l]``: the layer's base unit;
    ``P[g] = 2**(-lam * g)``, ``Pr`` the same reversed (``Pr[len - 1 - g] = P[g]``); ``lane[b]``: block ``b``'s
    lane (:func:`lrfu_lanes`); ``scale[g] = 2**(lam * g)``; ``centre[l]``: the running mean of the layer's leaving
    values relative to the scale of their units (:data:`_LRFU_CENTRE_RATE`; 0: none), around which its next four
    cuts sit (:data:`_LRFU_CUT_FACTORS`: outer low, inner low, inner high, outer high; one value where four cuts
    took four stores an overflow: 0.99 of the time); ``th`` / ``thv``: the unit's cuts and their
    sure / maybe bounds; ``msk[q]`` / ``cnt[q]``: the blocks of ``C ∪ U`` below cut ``q`` / how many, for the cuts
    ranked at this unit; ``whole``: every layer's gaps fit the decay table ``P``; ``band``: the band's float32
    values; ``fac[l]`` / ``spread[l]``: layer ``l``'s four cut factors, :data:`_LRFU_CUT_FACTORS` to the power of its
    spread (1, quartered when a wide band of the layer was narrowed, doubled back at an outer cut's move:
    :func:`_lrfu_spread`)."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_words = (n_experts + 63) // 64
    npad = n_words * 64
    n_scale = scale.shape[0]
    one = np.uint64(1)
    zero = np.uint64(0)
    for i in range(n_events):
        layer = ev_layer[i]
        ul = _U(layer)
        cap = capacity[ul]
        base = layer * n_experts
        pbase = layer * npad
        lo = offsets[i]
        hi = offsets[i + 1]
        n_mem = hi - lo
        u = lunits[layer]
        lunits[layer] = u + 1
        g = u - ubase[ul]
        if g >= n_scale:               # the base moves to this unit: every value of the layer again from its
            for j in range(pbase, pbase + npad):           # CRF and last unit (one rounding to float32; a never
                x = S[j] * _lrfu_decay(P, lam, u - PL[j])   # used lane has S 0)
                V[j] = np.float32(x) if x >= _LRFU_TINY else np.float32(0.0)
            ubase[ul] = u
            g = 0
        qu = scale[g]
        if whole and n_words <= 2 and n_mem <= _LRFU_FEW_MEMBERS:
            Vu = Pr[Pr.shape[0] - 2 - u:]               # a small unit (batch 1): its bitset built in two
            e0 = zero                  # registers as its members are updated, so that no vector compare of the
            e1 = zero                  # last units waits for the loop's stores (_LRFU_FEW_MEMBERS)
            for a in range(lo, hi):
                j = _U(lane[_U(base + expert[_U(a)])])
                s = 1.0 + S[j] * Vu[_U(PL[j] + 1)]
                S[j] = s
                PL[j] = u
                V[j] = np.float32(s * qu)
                e0, e1 = _add_bit2(e0, e1, j & _U(npad - 1))     # its tie position (npad 64 or 128)
            _store_words(ev, e0, e1, n_words)
        elif whole and n_words <= 2:   # every gap is in the decay table: no test per member (one loop testing
                                       # `whole or g < n_pow` per member measured 1.12x the time)
            Vu = Pr[Pr.shape[0] - 2 - u:]               # Vu[PL + 1] = P[u - PL]: the decay read by the last
            for a in range(lo, hi):    # unit with no subtraction per member, and the lane from one table: 11
                                       # instructions a member where there were 14, 0.98 of the time on the
                                       # AMD core (docs/performance.md, *Session 31*)
                j = _U(lane[_U(base + expert[_U(a)])])   # the members' CRF, layer unit and value (a first
                s = 1.0 + S[j] * Vu[_U(PL[j] + 1)]        # access has S 0 and PL -1: its CRF is 1 + 0 * P[u + 1])
                S[j] = s
                PL[j] = u
                V[j] = np.float32(s * qu)
            for w in range(n_words):   # the unit's bitset: the lanes whose last unit is this one, one vector
                ev[w] = lanes_eq(PL, pbase + (w << 6), u)               # compare a word (`ev[w] |= bit` per
        elif whole:                    # member in the loop: a chain of read-modify-writes through memory, 1.02x
            for w in range(n_words):   # the time; built in registers, or by _unit_bits before it: 1.11-1.13x)
                ev[w] = zero
            for a in range(lo, hi):
                tp = tie_pos[_U(base + expert[_U(a)])]
                ev[_U(tp >> 6)] |= one << np.uint64(tp & 63)
                j = _U(pbase + tp)
                s = 1.0 + S[j] * P[_U(u - PL[j])]
                S[j] = s
                PL[j] = u
                V[j] = np.float32(s * qu)
        else:
            for w in range(n_words):
                ev[w] = zero
            for a in range(lo, hi):
                tp = tie_pos[_U(base + expert[_U(a)])]
                ev[_U(tp >> 6)] |= one << np.uint64(tp & 63)
                j = _U(pbase + tp)
                s = 1.0 + S[j] * _lrfu_decay(P, lam, u - PL[j])
                S[j] = s
                PL[j] = u
                V[j] = np.float32(s * qu)
        n_hit = 0
        for w in range(n_words):
            n_hit += np.int64(_popc(ev[w] & mem[ul, w]))
        _record_hits_call(expert, lo, hi, base, tie_pos, mem, layer, n_hit, record, hit_flag, i >= count_from,
                          hits, misses)
        if cap == 0 or n_mem == 0:
            continue
        m = _admit(mem, ev, size, layer, n_words, n_mem - n_hit, cap)
        if m == 0:
            continue
        _lrfu_overflow(mem, size, layer, cap, m, u, qu, lam, ubase, centre, fac, spread, th, thv, cu, ev, msk, w8, cnt,
                       V, S, PL, ckey, sel, sel2, fb, band, cpos, max_moves)
