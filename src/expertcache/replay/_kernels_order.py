"""numba kernel of the sequential-random member order: numpy's per-event shuffle, without the Python loop.

``np.random.Generator.permutation(n)`` shuffles ``arange(n)`` by Fisher-Yates,
``for i in n-1 .. 1: swap(i, j)`` with ``j`` drawn uniformly in ``[0, i]`` by
masked rejection on the bit generator's 32-bit outputs (for PCG64: the low,
then the high half of each 64-bit output). :func:`shuffle_events` replays those
draws from the raw 64-bit outputs, so the order equals the one the per-event
``seg[rng.permutation(len(seg))]`` loop gives for the same generator.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .._jit import jit


@intrinsic
def _ctlz(typingctx, x):
    """Count leading zeros of a non-zero uint64 (LLVM ``ctlz``)."""
    sig = types.uint64(types.uint64)

    def codegen(context, builder, signature, args):
        return builder.ctlz(args[0], ir.Constant(ir.IntType(1), 1))

    return sig, codegen


@jit
def shuffle_events(offsets, expert, i0, raw, h0):
    """Shuffle each event's members in place, from event ``i0``, with draws from ``raw``.

    Parameters
    ----------
    offsets : int64[n_events + 1]
        CSR offsets of the events.
    expert : int16[n_access]
        Member ids, shuffled in place per event.
    i0 : int
        First event to shuffle.
    raw : uint64[m]
        The bit generator's next 64-bit outputs; 32-bit draw ``h`` is the low (``h`` even) or
        high half of ``raw[h // 2]``.
    h0 : int
        Index of the first unused 32-bit draw in ``raw``.

    Returns
    -------
    (int, int)
        The first event not shuffled (``n_events`` when done: ``raw`` ran out otherwise, and
        that event is untouched) and the index of its first draw in ``raw``.
    """
    n_events = offsets.shape[0] - 1
    n_half = 2 * raw.shape[0]
    h = h0
    all_ones = np.uint64(0xFFFFFFFFFFFFFFFF)
    max_n = 1
    for e in range(i0, n_events):
        max_n = max(max_n, offsets[e + 1] - offsets[e])
    swapped = np.empty(max_n, dtype=np.int64)      # this event's j per i, to undo a partial shuffle
    for e in range(i0, n_events):
        lo = offsets[e]
        n = offsets[e + 1] - lo
        start = h
        for i in range(n - 1, 0, -1):
            mask = all_ones >> _ctlz(np.uint64(i))        # the smallest 2**k - 1 >= i
            while True:
                if h >= n_half:   # out of draws: undo this event's swaps, resume here with more
                    for k in range(i + 1, n):
                        j = swapped[k]
                        x = expert[lo + k]
                        expert[lo + k] = expert[j]
                        expert[j] = x
                    return e, start
                v = (raw[h >> 1] >> np.uint64((h & 1) << 5)) & mask   # low half first, then high
                h += 1
                if v <= np.uint64(i):
                    break
            j = lo + np.int64(v)
            swapped[i] = j
            x = expert[lo + i]
            expert[lo + i] = expert[j]
            expert[j] = x
    return n_events, h
