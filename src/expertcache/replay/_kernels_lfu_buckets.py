"""numba kernel for ``lfu`` under global scope: residents in count buckets, each a bitset over tie positions.

``lfu`` ranks a block by its access count (lower leaves first, equal counts by lower tie rank:
:func:`._kernels.replay_heap`'s order for ``KEY_LFU``). Under global scope one pool holds ``c`` of all ``L * N``
blocks, and the heap loop pays a sift of ``log c`` levels at every access (about 50 ns an access on the benchmark
stream, below libCacheSim's LFU). Here the residents sit in *buckets* by count: each a bitset over tie positions
(``W`` words, and a summary word per 64 of them), so that the lowest tie position of the lowest bucket is two
``tzcnt`` away. Counts with a bucket are themselves bits (``present``), so that the lowest bucket is found again, when
it empties, by a scan of those bits from the old one.

A block's bucket is the count it had when it joined, or lower: a hit only raises the count, and the block moves up
when it comes lowest. Every resident's count is at least its bucket's, so the lowest bucket holds every resident of
the lowest count; the one of those with the lowest tie position leaves, and a block met there whose count rose is
moved to its count's bucket instead (at most once a hit: a hit costs two loads and a store, where moving the block
cost two read-modify-writes of bucket words, often outside the cache). A miss whose count is below the lowest
bucket, or equal to it with a lower tie position than its lowest, while the pool holds at least ``c``, is below every
resident: it leaves at once, without joining (most misses of the benchmark stream: the pool's residents have
counts that a block new to it has not reached).

Each semantics has a loop over its units (an event: :func:`_replay_lfu_buckets`; one access: :func:`_replay_lfu_units`,
or :func:`_replay_lfu_units_reset` under ``reset_freq_on_evict``): the unit's members are counted (no branch on a hit),
every miss joins the bucket of its count or leaves at once, and while the pool holds more than ``c`` the lowest leaves
(a miss may be that block: it is not admitted); under ``reset_freq_on_evict`` a block that leaves forgets its count.
That is ``replay_heap``'s decision for ``KEY_LFU`` (the ``c`` best of ``C ∪ U`` by ``(count, tie)``), with the same
counts and hit flags (``tests/test_lfu_buckets.py``).

Buckets are slots of one array, taken from a free list when a count first has a resident and given back when its
last one leaves: at most ``min(c + largest unit, L N) + 1`` are in use at once. :func:`fits` bounds their memory;
the engine keeps the heap loop where they would not fit.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit_inline, jit_loop
from ._kernels import _cttz, _max_unit
from ._kernels_bits import _U
from ._kernels_seq import _count

#: The most words (8 bytes each) the bucket bitsets may take: 64 MiB.
MAX_WORDS = 1 << 23


def fits(n_blocks: int, capacity: int, max_unit: int) -> bool:
    """Whether the bucket bitsets of a pool of ``capacity`` over ``n_blocks`` blocks, units of at most ``max_unit``
    members, stay within :data:`MAX_WORDS`."""
    n_words = (n_blocks + 63) // 64
    return (min(capacity + max_unit, n_blocks) + 2) * (n_words + (n_words + 63) // 64) <= MAX_WORDS


@jit_inline
def _add(q, f, slot_of, words, summ, cnt, free, n_free, present):
    """The block at tie position ``q`` into the bucket of count ``f`` (a slot taken for it where the count had none):
    the new ``n_free``."""
    s = slot_of[_U(f)]
    if s < 0:
        n_free -= 1
        s = free[_U(n_free)]
        slot_of[_U(f)] = s
        present[_U(f >> 6)] |= np.uint64(1) << np.uint64(f & 63)
    w = q >> 6
    words[_U(s), _U(w)] |= np.uint64(1) << np.uint64(q & 63)
    summ[_U(s), _U(w >> 6)] |= np.uint64(1) << np.uint64(w & 63)
    cnt[_U(s)] += 1
    return n_free


@jit_inline
def _remove(q, f, slot_of, words, summ, cnt, free, n_free, present):
    """The block at tie position ``q`` out of the bucket of count ``f`` (its slot given back where it empties): the
    new ``n_free``."""
    s = slot_of[_U(f)]
    w = q >> 6
    x = words[_U(s), _U(w)] & ~(np.uint64(1) << np.uint64(q & 63))
    words[_U(s), _U(w)] = x
    if x == 0:
        summ[_U(s), _U(w >> 6)] &= ~(np.uint64(1) << np.uint64(w & 63))
    cnt[_U(s)] -= 1
    if cnt[_U(s)] == 0:
        slot_of[_U(f)] = -1
        free[_U(n_free)] = s
        n_free += 1
        present[_U(f >> 6)] &= ~(np.uint64(1) << np.uint64(f & 63))
    return n_free


@jit_inline
def _lowest_count(present, f):
    """The lowest count from ``f`` up that has a bucket (``present``'s length in bits where none has)."""
    w = f >> 6
    x = present[_U(w)] & (np.uint64(0xFFFFFFFFFFFFFFFF) << np.uint64(f & 63))
    while x == 0:
        w += 1
        if w >= present.shape[0]:
            return present.shape[0] << 6
        x = present[_U(w)]
    return (w << 6) + np.int64(_cttz(x))


@jit_inline
def _lowest_tie(s, words, summ):
    """The lowest tie position in bucket slot ``s`` (not empty)."""
    k = 0
    while summ[_U(s), _U(k)] == 0:
        k += 1
    w = (k << 6) + np.int64(_cttz(summ[_U(s), _U(k)]))
    return (w << 6) + np.int64(_cttz(words[_U(s), _U(w)]))


@jit_inline
def _evict(size, cap, fmin, reset_freq_on_evict, words, summ, cnt, free, n_free, slot_of, present, block_at, freq,
           res):
    """While the pool holds more than ``cap``, its lowest ``(count, tie)`` leaves: the lowest tie position of the
    lowest bucket, or, where its count rose since it joined that bucket, that block to its count's bucket first.
    Returns ``(size, fmin, n_free)``."""
    while size > cap:
        q = _lowest_tie(slot_of[_U(fmin)], words, summ)
        v = block_at[_U(q)]
        n_free = _remove(q, fmin, slot_of, words, summ, cnt, free, n_free, present)
        f = freq[_U(v)]
        if f == fmin:                               # its count: it leaves
            res[_U(v)] = False
            size -= 1
            if reset_freq_on_evict:
                freq[_U(v)] = 0
        else:                                       # hit since it joined the bucket: to its count's
            n_free = _add(q, f, slot_of, words, summ, cnt, free, n_free, present)
        if slot_of[_U(fmin)] < 0:
            fmin = _lowest_count(present, fmin) if size > 0 else slot_of.shape[0]
    return size, fmin, n_free


def replay_lfu_buckets(offsets, expert, ev_layer, n_experts, n_layers, atomic, capacity, tie_pos, reset_freq_on_evict,
                       count_from, hits, misses, hit_flag):
    """Global-scope ``lfu``: the decision of :func:`._kernels.replay_heap` with ``KEY_LFU``, its counts and hit
    flags. The state is allocated here and the loop runs in :func:`_replay_lfu_buckets` (event-atomic),
    :func:`_replay_lfu_units` or :func:`_replay_lfu_units_reset` (sequential), compiled without the numba runtime
    (their helpers' array arguments then take no reference counts, which took four fifths of the time).

    Parameters are those of :func:`._kernels.replay_heap` for one global partition (``capacity`` of one entry),
    with the tie order as ``tie_pos``: each block's position among all blocks by ascending tie rank (``0`` leaves
    first among equal counts), a permutation of ``0 .. L N - 1``.
    """
    n_blocks = n_layers * n_experts
    n_events = offsets.shape[0] - 1
    cap = min(int(capacity[0]), n_blocks)
    max_unit = int(_max_unit(offsets, atomic))
    n_words = (n_blocks + 63) // 64
    n_slots = min(cap + max_unit, n_blocks) + 2
    block_at = np.empty(n_blocks, dtype=np.int32)
    block_at[tie_pos] = np.arange(n_blocks, dtype=np.int32)
    i32 = np.int32                      # (blocks, counts and slots below 2**31: half the bytes, more of them cached)
    state = (np.zeros((n_slots, n_words), dtype=np.uint64), np.zeros((n_slots, (n_words + 63) // 64), dtype=np.uint64),
             np.zeros(n_slots, dtype=i32), np.arange(n_slots - 1, -1, -1, dtype=i32),
             np.full(n_events + 2, -1, dtype=i32), np.zeros((n_events + 2 + 63) // 64, dtype=np.uint64), block_at,
             np.zeros(n_blocks, dtype=i32), np.zeros(n_blocks, dtype=np.bool_))
    head = (offsets, expert, ev_layer, n_experts, cap, tie_pos.astype(i32))
    tail = (count_from, hits, misses, hit_flag, *state)
    if atomic:
        _replay_lfu_buckets(*head, bool(reset_freq_on_evict), *tail, np.empty(max(max_unit, 1), dtype=np.int64))
    elif reset_freq_on_evict:           # (counts and tie positions below 2**31: keys below 2**62, a hit's offset)
        _replay_lfu_units_reset(*head, *tail, max(n_blocks - 1, 1).bit_length())
    else:
        _replay_lfu_units(*head, *tail)


@jit_loop
def _replay_lfu_buckets(offsets, expert, ev_layer, n_experts, cap, tie_pos, reset_freq_on_evict, count_from, hits,
                        misses, hit_flag, words, summ, cnt, free, slot_of, present, block_at, freq, res, miss_buf):
    """The event-atomic loop of :func:`replay_lfu_buckets`: ``words[s]`` / ``summ[s]`` bucket slot ``s``'s bits
    over tie positions and its summary (a bit per word), ``cnt[s]`` its residents, ``free`` a stack of free slots
    (all free at first), ``slot_of[f]`` the slot of count ``f`` (-1: none), ``present`` a bit per count with a slot,
    ``block_at[q]`` the block at tie position ``q``, ``freq`` / ``res`` each block's count and whether it is
    resident (a resident's count is at least its bucket's); ``fmin`` the lowest bucket's count (``slot_of``'s length
    while the pool is empty)."""
    record = hit_flag.shape[0] > 0
    n_free = free.shape[0]
    size = 0
    fmin = slot_of.shape[0]
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        n_miss = 0
        for a in range(lo, hi):                     # no branch on the outcome (a hit's block stays in its bucket,
            b = base + expert[_U(a)]                # moved up when it comes lowest)
            f = freq[_U(b)] + 1
            freq[_U(b)] = f
            hit = res[_U(b)]
            miss_buf[_U(n_miss)] = b
            n_miss += 1 - np.int64(hit)
            if record:
                hit_flag[_U(a)] = hit
        _count(hits, misses, layer, hi - lo, hi - lo - n_miss, i >= count_from)
        for k in range(n_miss):                     # every miss joins the pool ...
            b = miss_buf[_U(k)]
            f = freq[_U(b)]
            q = np.int64(tie_pos[_U(b)])
            if size >= cap and (f < fmin or (f == fmin and q < _lowest_tie(slot_of[_U(fmin)], words, summ))):
                if reset_freq_on_evict:             # below every resident (at least c of them): it leaves at once
                    freq[_U(b)] = 0
                continue
            n_free = _add(q, f, slot_of, words, summ, cnt, free, n_free, present)
            res[_U(b)] = True
            fmin = min(fmin, f)
            size += 1
        size, fmin, n_free = _evict(size, cap, fmin, reset_freq_on_evict, words, summ, cnt, free, n_free, slot_of,
                                    present, block_at, freq, res)     # ... and the lowest leave, a miss among them


@jit_inline
def _join(b, q, f, size, cap, fmin, reset_freq_on_evict, words, summ, cnt, free, n_free, slot_of, present, block_at,
          freq, res):
    """A sequential miss (block ``b``, tie position ``q``, count ``f``) joins the pool, and the lowest leaves where it
    overflows: ``(size, fmin, n_free)``."""
    freq[_U(b)] = f
    n_free = _add(q, f, slot_of, words, summ, cnt, free, n_free, present)
    res[_U(b)] = True
    return _evict(size + 1, cap, min(fmin, f), reset_freq_on_evict, words, summ, cnt, free, n_free, slot_of, present,
                  block_at, freq, res)


@jit_loop
def _replay_lfu_units(offsets, expert, ev_layer, n_experts, cap, tie_pos, count_from, hits, misses, hit_flag, words,
                      summ, cnt, free, slot_of, present, block_at, freq, res):
    """The sequential loop of :func:`replay_lfu_buckets` with counts kept (one unit per access; its state as
    :func:`_replay_lfu_buckets`'). A hit, and a miss whose count is below ``thr`` (the lowest bucket's count while
    the pool is full, else 0: it leaves at once), take no branch on their outcome; a miss of the lowest count (rare)
    leaves at once where its tie position is below that bucket's lowest."""
    record = hit_flag.shape[0] > 0
    n_free = free.shape[0]
    size = 0
    fmin = slot_of.shape[0]
    thr = 0 if cap > 0 else fmin
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        n_hit = 0
        for a in range(lo, hi):
            b = base + expert[_U(a)]
            f = freq[_U(b)] + 1
            hit = res[_U(b)]
            freq[_U(b)] = f
            n_hit += np.int64(hit)
            if record:
                hit_flag[_U(a)] = hit
            if f - (np.int64(hit) << 40) < thr:     # a hit, or a miss below every resident: one compare
                continue
            q = np.int64(tie_pos[_U(b)])
            if size >= cap and f == fmin and q < _lowest_tie(slot_of[_U(fmin)], words, summ):
                continue                            # (below every resident of its count: it leaves at once)
            size, fmin, n_free = _join(b, q, f, size, cap, fmin, False, words, summ, cnt, free, n_free, slot_of,
                                       present, block_at, freq, res)
            thr = fmin if size >= cap else 0
        _count(hits, misses, layer, hi - lo, n_hit, i >= count_from)


@jit_loop
def _replay_lfu_units_reset(offsets, expert, ev_layer, n_experts, cap, tie_pos, count_from, hits, misses, hit_flag,
                            words, summ, cnt, free, slot_of, present, block_at, freq, res, tbits):
    """:func:`_replay_lfu_units` under ``reset_freq_on_evict``, where nearly every miss has the lowest count (a
    block that left forgot its count): the one compare is of the key ``count << tbits | tie position`` against
    ``thr``, that of the lowest tie position in the lowest bucket while the pool is full (else 0); the count is stored
    by a select (0 for a miss, which leaves at once; the count again where it joins). One loop for both, comparing the
    count alone, took 1.5-2.7x this loop's time under reset, and 1.2x :func:`_replay_lfu_units`' with counts kept
    (``python benchmarks/kernel_ab.py --kernel lfu-global-seq-in-cache``, ``--kernel lfu-global-seq``)."""
    record = hit_flag.shape[0] > 0
    n_free = free.shape[0]
    size = 0
    fmin = slot_of.shape[0]
    thr = 0 if cap > 0 else np.int64(1) << 62
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        n_hit = 0
        for a in range(lo, hi):
            b = base + expert[_U(a)]
            f = np.int64(freq[_U(b)] + 1)
            hit = res[_U(b)]
            q = np.int64(tie_pos[_U(b)])
            freq[_U(b)] = f if hit else 0
            n_hit += np.int64(hit)
            if record:
                hit_flag[_U(a)] = hit
            if ((f << tbits) | q) - (np.int64(hit) << 62) < thr:    # a hit, or a miss below every resident
                continue
            size, fmin, n_free = _join(b, q, f, size, cap, fmin, True, words, summ, cnt, free, n_free, slot_of,
                                       present, block_at, freq, res)
            if size >= cap:
                thr = (fmin << tbits) | _lowest_tie(slot_of[_U(fmin)], words, summ)
        _count(hits, misses, layer, hi - lo, n_hit, i >= count_from)
