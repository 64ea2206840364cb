"""numba kernel of the sequential-random member order: numpy's per-event shuffle, without the Python loop.

``np.random.Generator.permutation(n)`` shuffles ``arange(n)`` by Fisher-Yates,
``for i in n-1 .. 1: swap(i, j)`` with ``j`` drawn uniformly in ``[0, i]`` by
masked rejection on the bit generator's 32-bit outputs (for PCG64: the low,
then the high half of each 64-bit output). :func:`shuffle_events` runs the same
generator and those draws, so the order equals the one the per-event
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


@jit
def shuffle_events(offsets, expert, pcg):
    """Shuffle each event's members in place with the draws of the PCG64 generator ``pcg``.

    numpy's PCG64 (a 128-bit LCG, ``state = state * M + inc``, output ``rotr64(hi ^ lo, hi >> 58)`` of the
    new state) runs here, so the draws come from registers, not from a buffer numpy fills. The loop takes one
    32-bit draw per pass (the low half of an output, then its high half): an accepted draw swaps position
    ``i`` with ``j`` and moves to ``i - 1``, a rejected one swaps ``i`` with itself and stays, so no branch
    depends on a draw (the rejection loop this replaces mispredicted on about a quarter of the draws;
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
    n_events = offsets.shape[0] - 1
    all_ones = np.uint64(0xFFFFFFFFFFFFFFFF)
    low = np.uint64(0xFFFFFFFF)
    shi, slo, ihi, ilo = pcg[0], pcg[1], pcg[2], pcg[3]
    out = np.uint64(0)
    half = 0
    for e in range(n_events):
        lo = offsets[e]
        i = offsets[e + 1] - lo - 1
        while i > 0:
            if half == 0:                 # a new 64-bit output: its low half now, its high half next
                nlo = slo * _MULT_LO
                nhi = _mulhi(slo, _MULT_LO) + slo * _MULT_HI + shi * _MULT_LO
                slo = nlo + ilo
                shi = nhi + ihi + np.uint64(slo < nlo)
                x = shi ^ slo
                r = shi >> np.uint64(58)
                out = (x >> r) | (x << ((np.uint64(64) - r) & np.uint64(63)))
                d = out & low
            else:
                d = out >> np.uint64(32)
            half ^= 1
            mask = all_ones >> _ctlz(np.uint64(i))        # the smallest 2**k - 1 >= i
            v = np.int64(d & mask)
            acc = v <= i
            j = lo + (v if acc else i)
            x0 = expert[lo + i]
            expert[lo + i] = expert[j]
            expert[j] = x0
            i -= np.int64(acc)
