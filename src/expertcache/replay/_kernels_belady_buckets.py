"""numba kernels for ``belady`` and ``belady-forced`` under global scope: residents in buckets by next use.

Belady's key is a block's next use (the next event holding it; ``NEVER`` where none), the farthest leaving first and,
among equal next uses, the lower tie rank (:func:`._kernels.replay_belady`'s ``next_use << 23 | (2**23 - 1 - tie)``).
That heap loop sifted at every access and every eviction (about 40 ns an access on the benchmark stream). Next uses
are event indices, and the blocks whose next use is event ``u`` all belong to ``u``'s layer, so here:

* the residents whose next use is ``u`` form *bucket* ``u``: a bitset over the tie positions of ``u``'s layer (the
  lowest position is the lowest tie rank, which leaves first), ``W`` words an event;
* the events with a bucket are bits of a four-level bitmap (up to ``64**4`` events), so the farthest is three
  leading-zero counts away; the blocks never used again are one bitset over the tie positions of all blocks (with a
  summary word per 64 words), which leaves before any bucket;
* an event's resident members are exactly bucket ``i`` (their next use was this event), which is emptied, and every
  member joins the bucket of its next use; while the pool holds more than its capacity, the farthest resident
  leaves (under ``forced``, the event's misses join only after the others have left, or once none is left).

Under sequential semantics (one unit per access, :func:`replay_belady_units`) a unit's bucket holds at most its own
block, so the bitmap of units alone names the farthest resident (the unit's layer and expert).

The decision, the hit counts and the hit flags are those of ``replay_belady`` (``tests/test_belady_buckets.py``, and
the engine against the naive twin). The buckets take ``8 W`` bytes an event: the engine runs the event-atomic loop
where they fit :data:`MAX_BYTES`, the sequential one below ``64**4`` accesses (:func:`units_fit`), either where no
advice replaces the next uses.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit_inline, jit_loop
from ._kernels import NEVER, _cttz, _max_unit
from ._kernels_bits import _U
from ._kernels_order import _ctlz

#: The most bytes the buckets may take (else the heap loop runs).
MAX_BYTES = 64 << 20
#: Events the four-level bitmap of buckets holds.
MAX_EVENTS = 64 ** 4


def fits(n_events: int, n_experts: int) -> bool:
    """Whether the buckets of ``n_events`` events over ``n_experts`` tie positions fit :data:`MAX_BYTES`."""
    words = (int(n_experts) + 63) // 64
    return int(n_events) < MAX_EVENTS and int(n_events) * words * 8 <= MAX_BYTES


def replay_belady_units(offsets, expert, ev_layer, n_experts, n_layers, access_next, capacity, g_order, g_pos, forced,
                        count_from, hits, misses, hit_flag):
    """Sequential (one unit per access, in the order of ``expert``) ``belady`` or ``belady-forced`` with one global
    pool: the decision of :func:`._kernels.replay_belady` with ``global_scope`` and one unit per access. A unit's
    bucket holds at most its own block, so the bitmap of units alone says which resident's next use is farthest (its
    block: the unit's layer and expert); the blocks never used again as in :func:`replay_belady_buckets`, whose
    ``g_order`` / ``g_pos`` it takes too. Takes the bitmap's 1/8 byte and the layer's 2 bytes an access
    (:func:`units_fit`)."""
    acc_layer = np.repeat(np.asarray(ev_layer, dtype=np.int16), np.diff(offsets))
    _replay_belady_units(offsets, expert, ev_layer, n_experts, access_next, min(int(capacity[0]), n_layers * n_experts),
                         bool(forced), count_from, hits, misses, hit_flag, acc_layer,
                         *_pool_state(g_order, g_pos, int(offsets[-1])))


def _pool_state(g_order, g_pos, n_units: int) -> tuple:
    """The state both loops share: the block at each tie position among all blocks and each block's position (for
    the blocks never used again), the four levels of a bitmap over ``n_units`` units, the never-used-again bitset and
    its summary, and each block's residence."""
    n_blocks = g_pos.shape[0]
    g_words = (n_blocks + 63) // 64
    e = max(n_units, 1)
    return (np.ascontiguousarray(g_order, dtype=np.int64).ravel(), np.asarray(g_pos, dtype=np.int64),
            *(np.zeros((e + (1 << (6 * k)) - 1) >> (6 * k), np.uint64) for k in (1, 2, 3, 4)),
            np.zeros(g_words, np.uint64), np.zeros((g_words + 63) // 64, np.uint64), np.zeros(n_blocks, np.bool_))


def units_fit(n_access: int, n_layers: int) -> bool:
    """Whether :func:`replay_belady_units` takes a stream of ``n_access`` accesses: below ``64**4`` units, fewer
    than ``2**15`` layers."""
    return int(n_access) < MAX_EVENTS and int(n_layers) < (1 << 15)


def replay_belady_buckets(offsets, expert, ev_layer, n_experts, n_layers, access_next, capacity, order, tie_pos,
                          g_order, g_pos, forced, count_from, hits, misses, hit_flag):
    """Event-atomic ``belady`` (``forced`` false) or ``belady-forced`` with one global pool of ``capacity[0]``
    blocks: the decision of :func:`._kernels.replay_belady` with ``global_scope`` and ``atomic``. ``access_next`` is
    :func:`._kernels.next_use`'s for event-atomic units; ``order`` / ``tie_pos`` the blocks of each layer by ascending
    tie rank and each block's position there, ``g_order`` / ``g_pos`` the same among all blocks (the engine's
    ``_tie_order`` per layer and over one "layer" of all blocks). The state is allocated here and the loop runs in
    :func:`_replay_belady_buckets`."""
    n_events = offsets.shape[0] - 1
    cap = min(int(capacity[0]), n_layers * n_experts)
    _replay_belady_buckets(offsets, expert, ev_layer, n_experts, access_next, cap, np.asarray(order, dtype=np.int64),
                           np.asarray(tie_pos, dtype=np.int64), bool(forced), count_from, hits, misses, hit_flag,
                           np.zeros(max(n_events, 1) * ((n_experts + 63) // 64), np.uint64),
                           np.zeros(max(int(_max_unit(offsets, True)), 1), np.int64),
                           *_pool_state(g_order, g_pos, n_events))


@jit_inline
def _lzcnt_top(x):
    """The index of the highest set bit of the nonzero ``x`` (``63 - lzcnt``)."""
    return np.int64(63) - np.int64(_ctlz(x))


@jit_inline
def _mark(u, p0, p1, p2, p3):
    """Set event ``u``'s bit at every level of the bucket bitmap."""
    one = np.uint64(1)
    p0[_U(u >> 6)] |= one << np.uint64(u & 63)
    p1[_U(u >> 12)] |= one << np.uint64((u >> 6) & 63)
    p2[_U(u >> 18)] |= one << np.uint64((u >> 12) & 63)
    p3[_U(u >> 24)] |= one << np.uint64((u >> 18) & 63)


@jit_inline
def _unmark(u, p0, p1, p2, p3):
    """Clear event ``u``'s bit, and each level's bit above a word that empties."""
    one = np.uint64(1)
    w = _U(u >> 6)
    p0[w] &= ~(one << np.uint64(u & 63))
    if p0[w]:
        return
    w = _U(u >> 12)
    p1[w] &= ~(one << np.uint64((u >> 6) & 63))
    if p1[w]:
        return
    w = _U(u >> 18)
    p2[w] &= ~(one << np.uint64((u >> 12) & 63))
    if p2[w]:
        return
    p3[_U(u >> 24)] &= ~(one << np.uint64((u >> 18) & 63))


@jit_inline
def _farthest(p0, p1, p2, p3):
    """The highest event with a bucket, or -1."""
    for w3 in range(p3.shape[0] - 1, -1, -1):
        x = p3[w3]
        if x:
            i2 = (w3 << 6) + _lzcnt_top(x)
            i1 = (i2 << 6) + _lzcnt_top(p2[_U(i2)])
            i0 = (i1 << 6) + _lzcnt_top(p1[_U(i1)])
            return (i0 << 6) + _lzcnt_top(p0[_U(i0)])
    return np.int64(-1)


@jit_inline
def _never_join(b, g_pos, nv, nvs):
    """Resident block ``b``, never used again, into their bitset (its tie position among all blocks)."""
    one = np.uint64(1)
    q = g_pos[_U(b)]
    nv[_U(q >> 6)] |= one << np.uint64(q & 63)
    nvs[_U(q >> 12)] |= one << np.uint64((q >> 6) & 63)


@jit_inline
def _never_leave(g_order, nv, nvs):
    """Take the never-used-again resident of the lowest tie rank out of their bitset; its block, or -1 (none)."""
    one = np.uint64(1)
    for s in range(nvs.shape[0]):
        y = nvs[s]
        if y:
            w = (s << 6) + np.int64(_cttz(y))
            x = nv[_U(w)]
            q = (w << 6) + np.int64(_cttz(x))
            x &= x - one
            nv[_U(w)] = x
            if not x:
                nvs[_U(s)] = y & (y - one)
            return g_order[_U(q)]
    return np.int64(-1)


@jit_inline
def _join(b, nu, tie_pos, g_pos, n_words, bw, p0, p1, p2, p3, nv, nvs):
    """Resident block ``b`` into the bucket of its next use ``nu`` (or among the blocks never used again)."""
    one = np.uint64(1)
    if nu == NEVER:
        _never_join(b, g_pos, nv, nvs)
        return
    tp = tie_pos[_U(b)]
    bw[_U(nu * n_words + (tp >> 6))] |= one << np.uint64(tp & 63)
    if not (p0[_U(nu >> 6)] >> np.uint64(nu & 63)) & one:     # the bucket's first block
        _mark(nu, p0, p1, p2, p3)


@jit_inline
def _leave(ev_layer, n_words, order, g_order, bw, p0, p1, p2, p3, nv, nvs):
    """Take the farthest resident out of the buckets: the never-used-again block of the lowest tie rank, else the
    lowest tie position of the farthest bucket. Returns its block, or -1 where the buckets hold none."""
    one = np.uint64(1)
    v = _never_leave(g_order, nv, nvs)
    if v >= 0:
        return v
    u = _farthest(p0, p1, p2, p3)
    if u < 0:
        return np.int64(-1)
    o = u * n_words
    for w in range(n_words):
        x = bw[_U(o + w)]
        if x:
            tp = (w << 6) + np.int64(_cttz(x))
            x &= x - one
            bw[_U(o + w)] = x
            rest = x
            for r in range(w + 1, n_words):
                rest |= bw[_U(o + r)]
            if not rest:
                _unmark(u, p0, p1, p2, p3)
            return order[_U(ev_layer[_U(u)]), _U(tp)]
    return np.int64(-1)


@jit_inline
def _join_misses(miss_a, n_miss, base, expert, access_next, tie_pos, g_pos, n_words, bw, p0, p1, p2, p3, nv, nvs):
    """An event's misses (their accesses ``miss_a[:n_miss]``) into the buckets of their next uses (``forced``)."""
    for r in range(n_miss):
        a = miss_a[r]
        _join(base + expert[_U(a)], access_next[_U(a)], tie_pos, g_pos, n_words, bw, p0, p1, p2, p3, nv, nvs)


@jit_loop
def _replay_belady_buckets(offsets, expert, ev_layer, n_experts, access_next, cap, order, tie_pos, forced,
                           count_from, hits, misses, hit_flag, bw, miss_a, g_order, g_pos, p0, p1, p2, p3, nv, nvs,
                           res):
    """The loop of :func:`replay_belady_buckets`: ``bw[u * W:(u + 1) * W]`` bucket ``u`` (``W`` words over its
    layer's tie positions), ``p0`` .. ``p3`` the levels of the events with a bucket, ``nv`` / ``nvs`` the blocks
    never used again (bits over all blocks' tie positions) and a summary bit per word, ``res`` each block's
    residence, ``miss_a`` the event's misses (their accesses)."""
    record = hit_flag.shape[0] > 0
    n_words = (n_experts + 63) // 64
    size = 0
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        o = _U(i * n_words)                # the resident members' bucket: this event's, emptied (they join again)
        any_set = False
        for w in range(n_words):
            any_set |= bw[o + _U(w)] != np.uint64(0)
            bw[o + _U(w)] = np.uint64(0)
        if any_set:
            _unmark(i, p0, p1, p2, p3)
        n_miss = 0
        for a in range(lo, hi):            # every member to the bucket of its next use (misses later, if forced)
            b = _U(base + expert[_U(a)])
            if res[b]:
                if record:
                    hit_flag[_U(a)] = 1
            else:
                miss_a[n_miss] = a
                n_miss += 1
                res[b] = True
                if forced:
                    continue
            _join(b, access_next[_U(a)], tie_pos, g_pos, n_words, bw, p0, p1, p2, p3, nv, nvs)
        if i >= count_from:
            hits[layer] += (hi - lo) - n_miss
            misses[layer] += n_miss
        size += n_miss
        joined = not forced
        while size > cap:
            v = _leave(ev_layer, n_words, order, g_order, bw, p0, p1, p2, p3, nv, nvs)
            if v >= 0:
                res[_U(v)] = False
                size -= 1
            elif joined:
                break
            else:                          # (forced: only the event's misses are left to leave)
                _join_misses(miss_a, n_miss, base, expert, access_next, tie_pos, g_pos, n_words, bw, p0, p1, p2, p3,
                             nv, nvs)
                joined = True
        if not joined:
            _join_misses(miss_a, n_miss, base, expert, access_next, tie_pos, g_pos, n_words, bw, p0, p1, p2, p3, nv,
                         nvs)


@jit_loop
def _replay_belady_units(offsets, expert, ev_layer, n_experts, access_next, cap, forced, count_from, hits, misses,
                         hit_flag, acc_layer, g_order, g_pos, p0, p1, p2, p3, nv, nvs, res):
    """The loop of :func:`replay_belady_units`: ``p0`` .. ``p3`` the units whose block is resident with that next
    use, ``acc_layer`` each access's layer, ``nv`` / ``nvs`` and ``res`` as :func:`_replay_belady_buckets`'s."""
    record = hit_flag.shape[0] > 0
    size = 0
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        n_hit = 0
        for a in range(lo, hi):
            b = _U(base + expert[_U(a)])
            nu = access_next[_U(a)]
            if res[b]:                 # a hit: its next use was this access
                n_hit += 1
                if record:
                    hit_flag[_U(a)] = 1
                _unmark(a, p0, p1, p2, p3)
            else:
                if forced and size >= cap:     # the farthest other resident leaves first
                    if _units_leave(n_experts, expert, acc_layer, g_order, p0, p1, p2, p3, nv, nvs, res) < 0:
                        continue               # none (a quota of 0): the block leaves at once
                    size -= 1
                res[b] = True
                size += 1
            if nu == NEVER:
                _never_join(b, g_pos, nv, nvs)
            else:
                _mark(nu, p0, p1, p2, p3)
            if size > cap:             # (not forced) the farthest of the residents and the block leaves
                _units_leave(n_experts, expert, acc_layer, g_order, p0, p1, p2, p3, nv, nvs, res)
                size -= 1
        if i >= count_from:
            hits[layer] += n_hit
            misses[layer] += (hi - lo) - n_hit


@jit_inline
def _units_leave(n_experts, expert, acc_layer, g_order, p0, p1, p2, p3, nv, nvs, res):
    """The farthest resident leaves (:func:`replay_belady_units`): its block, or -1 where none is resident."""
    v = _never_leave(g_order, nv, nvs)
    if v < 0:
        u = _farthest(p0, p1, p2, p3)
        if u < 0:
            return np.int64(-1)
        _unmark(u, p0, p1, p2, p3)
        v = np.int64(acc_layer[_U(u)]) * n_experts + expert[_U(u)]
    res[_U(v)] = False
    return v
