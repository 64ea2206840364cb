"""numba kernel for event-atomic ``lru`` (and ``least-stale``) under global scope: the residents filed by event.

Under LRU every member of an event takes the newest clock, and residents leave oldest first, those of one event by
lower tie rank (``_kernels.replay_lru``'s decision: a recency list, members appended in ascending tie order). So the
residents are exactly the members of recent events not accessed since, and an event's still-resident members are a
set of its layer's tie positions. :func:`replay_lru_events` keeps, per event, that set as a bitset of ``W`` words
(``W = ceil(N / 64)``); a block's last event while resident (``-1``: not resident) says whether an access hits.
A hit files its block under the new event and leaves its old bit in place: a bit whose block's last event is
another is stale and is passed over when reached. Evictions take the lowest tie position of the oldest event that
still has a bit (``tzcnt``), moving on as events empty: a bit is only ever set in the current event, so the oldest
event with a bit never moves back, and every bit is read once. A unit's members past the quota leave from its own
lowest tie positions, as the list loop bypasses them. An access is a load, a store and a bit or'ed into a register
(one or two words; in memory past 128 experts), with no branch on its outcome.

The bitsets take ``8 W`` bytes per event: the engine runs this loop where they fit :data:`BYTES_PER_ACCESS` bytes
per union access (``fits``), else the list loop.
"""

from __future__ import annotations

import numpy as np

from .._bits import cttz
from .._jit import jit
from ._kernels_bits import _U

#: The bitsets' budget per union access (the stream itself is 6.8 bytes per access).
BYTES_PER_ACCESS = 2


def fits(n_events: int, n_access: int, n_experts: int) -> bool:
    """Whether :func:`replay_lru_events`'s bitsets (``8 * ceil(N / 64)`` bytes per event) stay within
    :data:`BYTES_PER_ACCESS` bytes per union access.

    >>> fits(124_800, 5_017_039, 128), fits(1_000, 1_000, 128)
    (True, False)
    """
    return 8 * ((n_experts + 63) // 64) * n_events <= BYTES_PER_ACCESS * max(n_access, 1)


@jit
def replay_lru_events(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_order, tie_pos, count_from,
                      hits, misses, hit_flag):
    """Event-atomic ``lru`` with one global pool of ``capacity[0]`` blocks (the decision of
    :func:`._kernels.replay_lru` under global scope).

    ``tie_order[l, j]`` is the block of layer ``l`` with the ``j``-th lowest tie rank, ``tie_pos[b]`` its inverse;
    ``hits`` / ``misses`` (per layer) count the events from ``count_from`` on; ``hit_flag`` (``uint8[n_access]``, or
    empty) takes every access's outcome.
    """
    n_events = offsets.shape[0] - 1
    n_words = (n_experts + 63) // 64
    cap = capacity[0]
    record = hit_flag.shape[0] > 0
    held = np.zeros(n_events * n_words, dtype=np.uint64)     # per event the members it filed (some since moved on)
    last = np.full(n_layers * n_experts, -1, dtype=np.int64)  # each block's event while resident, else -1
    one = np.uint64(1)
    size = 0
    oldest = 0
    for i in range(n_events):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        row = i * n_words
        n_hit = 0
        w0 = np.uint64(0)
        w1 = np.uint64(0)
        for a in range(lo, hi):
            b = _U(base + expert[_U(a)])
            tp = tie_pos[b]
            hit = last[b] >= 0
            n_hit += hit
            last[b] = i                    # its bit in an older event is now stale (skipped when reached)
            if record:
                hit_flag[_U(a)] = hit
            bit = one << np.uint64(tp & 63)
            if n_words <= 2:               # the event's bits in registers (a store per member: a chain)
                w0 |= bit if tp < 64 else np.uint64(0)
                w1 |= np.uint64(0) if tp < 64 else bit
            else:
                held[_U(row + (tp >> 6))] |= bit
        if n_words <= 2:
            held[row] = w0
            if n_words == 2:
                held[row + 1] = w1
        if i >= count_from:
            hits[layer] += n_hit
            misses[layer] += (hi - lo) - n_hit
        size += (hi - lo) - n_hit
        while size > cap:                  # the oldest event's lowest tie position leaves (this event's last)
            q = oldest * n_words
            w = 0
            while held[_U(q + w)] == 0:
                w += 1
                if w == n_words:
                    oldest += 1
                    q += n_words
                    w = 0
            x = held[_U(q + w)]            # the word's bits popped in a register, stored back once
            order = tie_order[ev_layer[oldest]]
            while x and size > cap:
                blk = _U(order[_U((w << 6) + np.int64(cttz(x)))])
                x &= x - one
                e = last[blk]
                fresh = e == oldest        # resident since that event (else accessed later: a stale bit); no
                last[blk] = -1 if fresh else e     # branch on it
                size -= fresh
            held[_U(q + w)] = x
