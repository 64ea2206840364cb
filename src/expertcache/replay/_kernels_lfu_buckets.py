"""numba kernel for ``lfu`` under global scope: residents in count buckets, each a bitset over tie positions.

``lfu`` ranks a block by its access count (lower leaves first, equal counts by lower tie rank:
:func:`._kernels.replay_heap`'s order for ``KEY_LFU``). Under global scope one pool holds ``c`` of all ``L * N``
blocks, and the heap loop pays a sift of ``log c`` levels at every access (about 50 ns an access on the benchmark
stream, below libCacheSim's LFU). Here a block's count only rises by one at each of its accesses, so the residents
sit in one *bucket* per count present among them: a bitset over tie positions (``W`` words, and a summary word per
64 of them), so that the lowest resident, the one that leaves, is the lowest set bit of the lowest count's bucket (two
``tzcnt``), and an access moves its block from the bucket of its old count to that of its new one (two bit
flips). Counts with a bucket are themselves bits (``present``), so that the lowest count is found again, when its
bucket empties, by a scan of those bits from the old one.

Both semantics run one loop over units (an event, or one access): the unit's members are counted, a hit moves its
block up a bucket, every miss joins the bucket of its count, and while the pool holds more than ``c`` the lowest
leaves (a miss may be that block: it is not admitted); under ``reset_freq_on_evict`` a block that leaves forgets its
count. That is ``replay_heap``'s decision for ``KEY_LFU`` (the ``c`` best of ``C ∪ U`` by ``(count, tie)``), with
the same counts and hit flags (``tests/test_lfu_buckets.py``).

Buckets are slots of one array, taken from a free list when a count first has a resident and given back when its
last one leaves: at most ``min(c + largest unit, L N) + 1`` are in use at once. :func:`fits` bounds their memory;
the engine keeps the heap loop where they would not fit.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit_inline, jit_loop
from ._kernels import _cttz, _max_unit
from ._kernels_bits import _U

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


def replay_lfu_buckets(offsets, expert, ev_layer, n_experts, n_layers, atomic, capacity, tie_pos, reset_freq_on_evict,
                       count_from, hits, misses, hit_flag):
    """Global-scope ``lfu``: the decision of :func:`._kernels.replay_heap` with ``KEY_LFU``, its counts and hit
    flags. The state is allocated here and the loop runs in :func:`_replay_lfu_buckets` (compiled without the numba
    runtime: its helpers' array arguments then take no reference counts, which took four fifths of the time).

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
    _replay_lfu_buckets(offsets, expert, ev_layer, n_experts, bool(atomic), cap, tie_pos.astype(i32),
                        bool(reset_freq_on_evict), count_from, hits, misses, hit_flag,
                        np.zeros((n_slots, n_words), dtype=np.uint64),
                        np.zeros((n_slots, (n_words + 63) // 64), dtype=np.uint64), np.zeros(n_slots, dtype=i32),
                        np.arange(n_slots - 1, -1, -1, dtype=i32), np.full(n_events + 2, -1, dtype=i32),
                        np.zeros((n_events + 2 + 63) // 64, dtype=np.uint64), block_at, np.zeros(n_blocks, dtype=i32),
                        np.zeros(n_blocks, dtype=np.bool_), np.empty(max(max_unit, 1), dtype=np.int64))


@jit_loop
def _replay_lfu_buckets(offsets, expert, ev_layer, n_experts, atomic, cap, tie_pos, reset_freq_on_evict, count_from,
                        hits, misses, hit_flag, words, summ, cnt, free, slot_of, present, block_at, freq, res,
                        miss_buf):
    """The loop of :func:`replay_lfu_buckets`: ``words[s]`` / ``summ[s]`` bucket slot ``s``'s bits over tie
    positions and its summary (a bit per word), ``cnt[s]`` its residents, ``free`` a stack of free slots (all free
    at first), ``slot_of[f]`` the slot of count ``f`` (-1: none), ``present`` a bit per count with a slot,
    ``block_at[q]`` the block at tie position ``q``, ``freq`` / ``res`` each block's count and whether it is
    resident."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_free = free.shape[0]
    size = 0
    fmin = 0
    for i in range(n_events):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        counted = i >= count_from
        for u in range(1 if atomic else hi - lo):
            a_lo, a_hi = (lo, hi) if atomic else (lo + u, lo + u + 1)     # the event, or its u-th access
            n_miss = 0
            for a in range(a_lo, a_hi):
                b = base + expert[_U(a)]
                f = freq[_U(b)] + 1
                freq[_U(b)] = f
                if res[_U(b)]:                      # a hit: one bucket up
                    q = np.int64(tie_pos[_U(b)])
                    n_free = _remove(q, f - 1, slot_of, words, summ, cnt, free, n_free, present)
                    n_free = _add(q, f, slot_of, words, summ, cnt, free, n_free, present)
                    if f - 1 == fmin and slot_of[_U(fmin)] < 0:
                        fmin = _lowest_count(present, fmin)
                    if counted:
                        hits[_U(layer)] += 1
                    if record:
                        hit_flag[_U(a)] = 1
                else:
                    miss_buf[_U(n_miss)] = b
                    n_miss += 1
                    if counted:
                        misses[_U(layer)] += 1
            if size == 0:                           # (an empty pool has no lowest count)
                fmin = slot_of.shape[0]
            for k in range(n_miss):                 # every miss joins the pool ...
                b = miss_buf[_U(k)]
                f = freq[_U(b)]
                n_free = _add(np.int64(tie_pos[_U(b)]), f, slot_of, words, summ, cnt, free, n_free, present)
                res[_U(b)] = True
                fmin = min(fmin, f)
            size += n_miss
            while size > cap:                       # ... and the lowest (count, tie) leave, a miss among them
                q = _lowest_tie(slot_of[_U(fmin)], words, summ)
                v = block_at[_U(q)]
                n_free = _remove(q, fmin, slot_of, words, summ, cnt, free, n_free, present)
                res[_U(v)] = False
                size -= 1
                if reset_freq_on_evict:
                    freq[_U(v)] = 0
                if slot_of[_U(fmin)] < 0 and size > 0:
                    fmin = _lowest_count(present, fmin)
