"""numba kernel of the sequential-random member order: numpy's per-event shuffle, without the Python loop.

``np.random.Generator.permutation(n)`` shuffles ``arange(n)`` by Fisher-Yates,
``for i in n-1 .. 1: swap(i, j)`` with ``j`` drawn uniformly in ``[0, i]`` by
masked rejection on the bit generator's 32-bit outputs (for PCG64: the low,
then the high half of each 64-bit output). :func:`shuffle_events` runs the same
generator and those draws, so the order equals the one the per-event
``seg[rng.permutation(len(seg))]`` loop gives for the same generator.

:func:`shuffle_range` runs it over a range of events from a carried state, so that ranges draw as one call does.

:func:`shuffled_replay` runs a sequential loop given by ranges (``_kernels_seq.*_seq_ranges``) over that order,
the next chunk of events shuffled on a second thread while the loop replays the chunk before (a shuffle before
the replay adds its whole time to it).
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .._bits import ctlz as _ctlz
from .._jit import jit, jit_inline
from ._kernels_bits import _U


@intrinsic
def _mulhi(typingctx, a, b):
    """The high 64 bits of the 128-bit product of two uint64 (LLVM ``i128`` multiply)."""
    sig = types.uint64(types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        i128 = ir.IntType(128)
        p = builder.mul(builder.zext(args[0], i128), builder.zext(args[1], i128))
        return builder.trunc(builder.lshr(p, ir.Constant(i128, 64)), ir.IntType(64))

    return sig, codegen


#: PCG64's 128-bit LCG multiplier (high, low 64 bits): numpy's ``PCG64``.
_MULT_HI = np.uint64(0x2360ED051FC65DA4)
_MULT_LO = np.uint64(0x4385DF649FCCF645)


def pcg64_words(bit_generator) -> np.ndarray:
    """A fresh numpy ``PCG64`` bit generator's state and increment as ``uint64[4]`` (state high, low, inc high,
    low), the input of :func:`shuffle_events`; refuses a generator with a buffered 32-bit half."""
    st = bit_generator.state
    if st["bit_generator"] != "PCG64" or st["has_uint32"]:
        raise ValueError("shuffle_events replays a PCG64 generator with no buffered 32-bit draw")
    m = (1 << 64) - 1
    x, inc = st["state"]["state"], st["state"]["inc"]
    return np.array([x >> 64, x & m, inc >> 64, inc & m], dtype=np.uint64)


@jit_inline
def _draw(expert, lo, i, shi, slo, ihi, ilo, out, half):
    """One pass of the shuffle of the event at ``lo``, at position ``i`` (``> 0``): a 32-bit draw of the PCG64
    generator (state ``shi``, ``slo``, increment ``ihi``, ``ilo``; ``out`` the 64-bit output whose high half is
    next where ``half``), masked to the smallest ``2**k - 1 >= i``; an accepted draw ``v <= i`` swaps positions
    ``i`` and ``v`` and moves to ``i - 1``, a rejected one swaps ``i`` with itself and stays (no branch depends on
    a draw). Returns ``(i, shi, slo, out, half)`` after it."""
    if half == 0:                 # a new 64-bit output: its low half now, its high half next
        nlo = slo * _MULT_LO
        nhi = _mulhi(slo, _MULT_LO) + slo * _MULT_HI + shi * _MULT_LO
        slo = nlo + ilo
        shi = nhi + ihi + np.uint64(slo < nlo)
        x = shi ^ slo
        r = shi >> np.uint64(58)
        out = (x >> r) | (x << ((np.uint64(64) - r) & np.uint64(63)))
        d = out & np.uint64(0xFFFFFFFF)
    else:
        d = out >> np.uint64(32)
    half ^= 1
    mask = np.uint64(0xFFFFFFFFFFFFFFFF) >> _ctlz(np.uint64(i))        # the smallest 2**k - 1 >= i
    v = np.int64(d & mask)
    acc = v <= i
    j = _U(lo + (v if acc else i))
    k = _U(lo + i)
    x0 = expert[k]
    expert[k] = expert[j]
    expert[j] = x0
    return i - np.int64(acc), shi, slo, out, half


@jit_inline
def _draw2(expert, lo, i, shi, slo, ihi, ilo):
    """Two passes of :func:`_draw` from one new 64-bit output (its low half, then its high half) at a position
    ``i >= 2``: the second draw is masked for both positions it may be at (``i`` after a rejection, ``i - 1`` after an
    acceptance) and the first draw's outcome selects, so that the chain from ``i`` to the next ``i`` holds two
    compares and no test of which half is next. Returns ``(i, shi, slo, out)``. The generator's step and the swaps
    are written out as in :func:`_draw`: as inlined helpers shared by the two, the shuffle took 1.07x the time
    (``python benchmarks/kernel_ab.py --kernel shuffle``)."""
    nlo = slo * _MULT_LO
    nhi = _mulhi(slo, _MULT_LO) + slo * _MULT_HI + shi * _MULT_LO
    slo = nlo + ilo
    shi = nhi + ihi + np.uint64(slo < nlo)
    x = shi ^ slo
    r = shi >> np.uint64(58)
    out = (x >> r) | (x << ((np.uint64(64) - r) & np.uint64(63)))
    m0 = np.uint64(0xFFFFFFFFFFFFFFFF) >> _ctlz(np.uint64(i))
    m1 = np.uint64(0xFFFFFFFFFFFFFFFF) >> _ctlz(np.uint64(i - 1))
    v1 = np.int64(out & m0 & np.uint64(0xFFFFFFFF))
    acc1 = v1 <= i
    i2 = i - np.int64(acc1)
    v2 = np.int64((out >> np.uint64(32)) & (m1 if acc1 else m0))
    acc2 = v2 <= i2
    j = _U(lo + (v1 if acc1 else i))
    k = _U(lo + i)
    x0 = expert[k]
    expert[k] = expert[j]
    expert[j] = x0
    j = _U(lo + (v2 if acc2 else i2))
    k = _U(lo + i2)
    x0 = expert[k]
    expert[k] = expert[j]
    expert[j] = x0
    return i2 - np.int64(acc2), shi, slo, out


@jit
def shuffle_events(offsets, expert, pcg):
    """Shuffle each event's members in place with the draws of the PCG64 generator ``pcg``.

    numpy's PCG64 (a 128-bit LCG, ``state = state * M + inc``, output ``rotr64(hi ^ lo, hi >> 58)`` of the
    new state) runs here, so the draws come from registers, not from a buffer numpy fills. The loop takes one
    32-bit draw per pass (the low half of an output, then its high half; :func:`_draw`): an accepted draw swaps
    position ``i`` with ``j`` and moves to ``i - 1``, a rejected one swaps ``i`` with itself and stays, so no
    branch depends on a draw (the rejection loop this replaces mispredicted on about a quarter of the draws;
    ``benchmarks/replay_throughput.py``'s sequential-random row: 10 -> 5 ns per access for the shuffle).

    Parameters
    ----------
    offsets : int64[n_events + 1]
        CSR offsets of the events.
    expert : int16[n_access]
        Member ids, shuffled in place per event.
    pcg : uint64[4]
        The generator's state and increment (:func:`pcg64_words`); not updated.
    """
    st = np.zeros(6, dtype=np.uint64)
    for q in range(4):    # not ``st[:4] = pcg``: a slice assignment also compiles numba's shape-mismatch message
        st[q] = pcg[q]    # (first compile 2.7 s with it, 0.8 s without: docs/performance.md, *Session 40*)
    shuffle_range(offsets, expert, st, 0, offsets.shape[0] - 1)


@jit
def shuffle_range(offsets, expert, st, e0, e1):
    """:func:`shuffle_events` for events ``e0 .. e1 - 1``, from and back into the state ``st`` (``uint64[6]``:
    the four words of :func:`pcg64_words`, the last 64-bit output and whether its high half is next), so that
    consecutive ranges draw as one call over all of them does."""
    shi, slo, ihi, ilo, out, half = st[0], st[1], st[2], st[3], st[4], np.int64(st[5])
    for e in range(e0, e1):
        lo = offsets[e]
        i = offsets[e + 1] - lo - 1
        if half == 1 and i > 0:   # the high half of the last output first
            i, shi, slo, out, half = _draw(expert, lo, i, shi, slo, ihi, ilo, out, half)
        while i >= 2:             # both halves of a new output, the second draw's position still above 0
            i, shi, slo, out = _draw2(expert, lo, i, shi, slo, ihi, ilo)
        while i > 0:
            i, shi, slo, out, half = _draw(expert, lo, i, shi, slo, ihi, ilo, out, half)
    st[0] = shi
    st[1] = slo
    st[4] = out
    st[5] = np.uint64(half)


#: Accesses from which :func:`shuffled_replay` shuffles on a second thread, and about how many a chunk holds (the
#: first an eighth of that: its shuffle runs before any replay). Chunks of ``2**18`` took 0.92-1.00 of the time of
#: chunks of ``2**16`` (sequential-random ``lru`` and ``lfu`` at rho 0.1-0.2: fewer hand-overs between the threads;
#: ``python benchmarks/random_order_costs.py --chunks 65536,262144``, docs/performance.md, *Session 66*).
THREAD_MIN_ACCESSES = 1 << 20
CHUNK_ACCESSES = 1 << 18


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform reports it, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def shuffled_replay(offsets, expert, pcg, run, threads: bool | None = None):
    """Each event's members shuffled as :func:`shuffle_events` shuffles them (into a new array; ``expert`` is left
    as it is), and replayed in that order by ``run(order, e0, e1)``, which replays events ``e0 .. e1 - 1`` and
    carries its state from one range to the next (``_kernels_seq.*_seq_ranges``). Returns the shuffled order.

    The shuffle (about 2.8 ns an access on the benchmark stream: a chain of dependent draws) would add its whole
    time to a replay that takes 3-20 ns an access. On a stream of at least :data:`THREAD_MIN_ACCESSES` accesses,
    where the process may run on more than one CPU (``threads`` None; True / False force it), a second thread copies
    and shuffles the stream chunk by chunk (about :data:`CHUNK_ACCESSES` accesses each), running ahead, while
    ``run`` replays each chunk once it is shuffled: the kernels release the GIL, and a chunk's replay waits only
    where the shuffle has not reached it (one task for the whole stream, not one a chunk, each handed to a woken
    thread: sequential-random ``lru`` 1.44x ascending where it read 1.70x at rho 0.2; docs/performance.md,
    *Session 39*). The chunks are replayed in order on one state, so the results do not depend on the chunks or
    the threads.
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    n_events = offsets.shape[0] - 1
    st = np.zeros(6, dtype=np.uint64)
    st[:4] = pcg
    order = np.empty_like(expert)
    n_acc = int(offsets[-1] - offsets[0]) if n_events > 0 else 0
    if threads is None:
        threads = n_acc >= THREAD_MIN_ACCESSES and _usable_cpus() > 1
    threads = bool(threads) and n_events > 0

    def shuffled(e0, e1):
        a, b = offsets[e0], offsets[e1]
        order[a:b] = expert[a:b]
        shuffle_range(offsets, order, st, e0, e1)

    if not threads:
        shuffled(0, n_events)
        run(order, 0, n_events)
        return order
    first = offsets[0] + max(CHUNK_ACCESSES // 8, 1)
    cuts = np.searchsorted(offsets, np.concatenate([[offsets[0], first], np.arange(first, offsets[-1],
                                                                                   CHUNK_ACCESSES)]), side="right")
    bounds = sorted({0, n_events, *np.minimum(cuts - 1, n_events).tolist()})
    n_chunks = len(bounds) - 1
    ready = [threading.Event() for _ in range(n_chunks)]
    done = [False] * n_chunks
    stop = threading.Event()      # the replay failed: the shuffle need not go on

    def shuffle_all():
        try:
            for k in range(n_chunks):
                if stop.is_set():
                    break
                shuffled(bounds[k], bounds[k + 1])
                done[k] = True
                ready[k].set()
        finally:                  # a failure wakes the replay, which then raises it
            for event in ready:
                event.set()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="expertcache-shuffle") as pool:
        ahead = pool.submit(shuffle_all)
        try:
            for k in range(n_chunks):
                ready[k].wait()
                if not done[k]:
                    ahead.result()
                    raise RuntimeError("the shuffle stopped before the end of the stream")
                run(order, bounds[k], bounds[k + 1])
        finally:
            stop.set()
        ahead.result()
    return order
