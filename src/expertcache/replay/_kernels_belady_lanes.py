"""Event-atomic, per-layer Belady on lanes of next uses (N <= 1,024; the decision of ``replay_belady``).

A layer's residents are a bitset over tie positions, as in :mod:`._kernels_bits`, and beside it a dense int32 array
holds, for each tie position, the next use (event index, or ``NEVER``) its block was given at its last access (from
:func:`expertcache.replay._kernels.next_use`, or a predictor's advice). Under Belady a block's key changes only
when it is accessed, so the array is written by the member loop and read whole at an overflow.

So do ``lru``'s and ``lfu``'s keys (the unit of a block's last access; its count, where counts persist): the same
loop, compiled once per key, replays them with each member's lane given its unit's key (:func:`replay_lru_lanes`) or
lowered by one (:func:`replay_lfu_lanes`), up to 128 experts a layer, where :func:`lru_lanes_pay` /
:func:`lfu_lanes_pay` say it beats their other loops (:func:`replay_lru_layers`, :func:`replay_lfu_layers`).

A unit that overflows its quota keeps the ``k`` candidates with the nearest next use and lets the ``e`` farthest go
(ties by tie position: the lowest leave first). It finds them in rounds from one end: each round is one vector
reduction over the layer's lanes (:data:`._simd.lanes_max128`: the farthest next use among the candidates left; or
:data:`._simd.lanes_min128`, the nearest), one compare (:data:`._simd.lanes_eq`: the group that holds it) and a
population count. A group that does not complete the count leaves (is kept) whole; the one that completes it is
split by tie position with ``pdep``. No branch per candidate: a unit takes as many rounds as groups it crosses. A
layer of at most 16 (64) experts reduces 16 (64) lanes; past 128, each pair of words keeps its extreme, found again
only where a round took blocks, and an overflow that both ends would take many rounds over is bracketed first by a
cut at a next use (:func:`_bracket`).

Which end: the far groups are mostly single blocks (rarely used experts), the near ones the blocks of the next few
events. The rounds run from the near end, keeping, where ``KEEP_GROUP * k < e * E`` (``E`` the stream's mean event:
the near groups taken to hold about ``E / KEEP_GROUP`` candidates each) and ``k`` is below ``KEEP_BOUND * e``, else
from the far end (the constants from timing both ends, ``benchmarks/belady_lanes.py --sides``). Either way a unit
takes at most ``KEEP_BOUND * e`` rounds, and ``e`` is at most its misses: no stream makes the loop take more than
``KEEP_BOUND`` rounds an access.

An overflow's decision is made after the next event's member loop unless that event is of the same layer (then
before it): the member loop's scalar stores into the next-use lanes and the vector loads of the same lines are
then an event apart, and the two events' work overlaps (0.82-0.96 of the time at batch 1 and 8 in a throwaway
measurement of the first version; docs/performance.md, *Session 48*).
"""

from __future__ import annotations

import numpy as np

from .._bits import U as _U
from .._jit import jit_helper, jit_inline, jit_loop
from ._kernels import NEVER
from ._kernels_bits import _popc, _record_hits, replay_lfu_bits, replay_lru_bits
from ._simd import (
    WIDE_VECTORS,
    lanes_eq,
    lanes_ge,
    lanes_max16,
    lanes_max64,
    lanes_max128,
    lanes_min16,
    lanes_min64,
    lanes_min128,
    pdep,
)

#: Keep from the near end where ``KEEP_GROUP * k < e * E`` (``E``: the mean event; the near groups hold about
#: ``E / KEEP_GROUP`` candidates each).
KEEP_GROUP = 3.0
#: ... and ``k < KEEP_BOUND * e``: at most ``KEEP_BOUND`` rounds a leaving block.
KEEP_BOUND = 8
#: Past 128 experts, an overflow expected to take more than this many rounds from either end (``e`` from the far
#: end, ``KEEP_GROUP * k / E`` from the near one) is bracketed first by a cut at a next use (:func:`_bracket`).
BRACKET_ROUNDS = 2
#: What a member's lane is given (:func:`replay_belady_lanes`' ``keys``): its next use (Belady), its unit's key
#: (lru), its count negated (lfu).
NEXT_KEYS, UNIT_KEYS, COUNT_KEYS = 0, 1, 2
#: :func:`replay_lru_lanes`: rounds from the near end where fewer than this many stay per block that leaves.
LRU_KEEP_RATIO = 1.0
#: :func:`replay_lfu_lanes`: rounds from the near end where fewer than this many stay per block that leaves.
LFU_KEEP_RATIO = 1.0
#: :func:`lfu_lanes_pay`: layers of at most ``N`` experts take the lanes where the mean quota holds at least this many
#: mean events (``benchmarks/layer_lanes.py --policy lfu``, docs/performance.md, *Session 49*).
LFU_LANES_QUOTA = ((8, 0.0), (16, 0.9), (32, 2.0), (64, 3.0), (128, 5.0))
#: :data:`LFU_LANES_QUOTA` on machines without 512-bit vectors (:data:`._simd.WIDE_VECTORS`), where a reduction over
#: 64 or 128 lanes takes twice the vector instructions: on a Zen 3 core (AVX2) lanes / bit-sliced counts 1.21 / 1.13 /
#: 1.00-1.05 / 0.93 at 3.2 / 3.6 / 4.0 / 4.9 mean events for 64 experts, 1.12-1.27 at 5.4-6.5, 0.97-1.14 at 6.7-7.2,
#: 0.87-1.07 at 8.0 and 0.94 at 9.6 for 128 (``benchmarks/layer_lanes.py --policy lfu --shapes 48x128x8,16x64x8
#: --batches 1,2 --rhos 0.3,0.35,0.4,0.45,0.5,0.6,0.75 --pairs 7``; docs/performance.md, *Session 52*); fewer experts
#: as there.
LFU_LANES_QUOTA_AVX2 = ((8, 0.0), (16, 0.9), (32, 2.0), (64, 4.5), (128, 8.0))
#: :func:`lfu_lanes_pay`: ... and layers of at most 16 experts whose mean quota is at most this many blocks, at any
#: batch (``benchmarks/layer_lanes.py --policy lfu --shapes 32x16x2,40x16x4 --batches 1,2,4,8,16``: 0.47-0.67 of the
#: bit-sliced counts' time at rho 0.1, a quota of 1.6).
LFU_LANES_FEW = 2.0
#: :func:`lru_lanes_pay`: the lanes where the mean quota holds at least this many mean events (``benchmarks/
#: layer_lanes.py --shapes 48x128x8 --batches 1,16 --rhos 0.1,0.75 --pairs 5``: the lanes 0.77 of the buckets' time
#: at 1.60, batch 1 and rho 0.1; 1.03x at 1.56, batch 16 and rho 0.75, 1.36x in a first run; docs/performance.md,
#: *Session 49*).
LRU_LANES_QUOTA = 1.58
#: :data:`LRU_LANES_QUOTA` on machines without 512-bit vectors (:data:`._simd.WIDE_VECTORS`), for layers of more than
#: 16 experts: on a Zen 3 core (AVX2) lanes / buckets 1.05-1.33 at 1.6-2.2 mean events, 0.95-1.14 at 2.3-2.5 and
#: 0.83-0.96 at 2.7-3.2 but one cell (``benchmarks/layer_lanes.py --shapes 48x128x8,16x64x8,24x32x4 --batches 1,2,4
#: --rhos 0.2,0.25,0.3,0.35,0.4,0.5 --pairs 7``; docs/performance.md, *Session 52*). Layers of at most 16 experts, one
#: or two vectors, keep :data:`LRU_LANES_QUOTA`.
LRU_LANES_QUOTA_AVX2 = 2.6
#: :func:`lanes_pay`: layers of more than this many experts ...
WALK_EXPERTS = 128
#: ... whose mean quota is within this many mean events ...
WALK_QUOTA_EVENTS = (0.5, 1.5)
#: ... and at most this share of a layer, ...
WALK_RHO = 0.5
#: ... with mean events of at most this share of a layer replay on the walk of :mod:`._kernels_bits` instead.
WALK_EVENT_SHARE = 1 / 3


def lanes_pay(n_experts: int, capacity, mean_event: float) -> bool:
    """Whether the engine replays per-layer Belady here rather than on the walk of
    :func:`._kernels_bits.replay_belady_walk`: everywhere but in layers of more than :data:`WALK_EXPERTS` experts
    whose mean quota ``c`` is from ``WALK_QUOTA_EVENTS[0]`` up to ``WALK_QUOTA_EVENTS[1]`` mean events (``E``), at
    most :data:`WALK_RHO` of the layer, and ``E`` at most :data:`WALK_EVENT_SHARE` of it, where a unit's rounds run
    over several pairs of words and the walk was up to 1.3x faster (``benchmarks/belady_lanes.py``,
    docs/performance.md, *Session 48*).

    >>> lanes_pay(128, np.array([13, 13]), 40.0), lanes_pay(256, np.array([30]), 26.0), lanes_pay(256, [64], 26.0)
    (True, False, True)
    """
    c = float(np.mean(capacity)) if len(capacity) else 0.0
    walk = (n_experts > WALK_EXPERTS and WALK_QUOTA_EVENTS[0] * mean_event <= c < WALK_QUOTA_EVENTS[1] * mean_event
            and c <= WALK_RHO * n_experts and mean_event <= WALK_EVENT_SHARE * n_experts)
    return not walk


def lru_lanes_pay(n_experts: int, capacity, mean_event: float) -> bool:
    """Whether the engine replays event-atomic per-layer ``lru`` on the lanes (:func:`replay_lru_lanes`) rather
    than in the recency buckets of :func:`._kernels_bits.replay_lru_bits`: layers of at most 128 experts whose
    mean quota is at least :data:`LRU_LANES_QUOTA` mean events (:data:`LRU_LANES_QUOTA_AVX2` past 16 experts on a
    machine without AVX-512).

    >>> lru_lanes_pay(128, np.array([51, 51]), 8.0), lru_lanes_pay(128, [13], 40.0), lru_lanes_pay(256, [192], 8.0)
    (True, False, False)
    """
    c = float(np.mean(capacity)) if len(capacity) else 0.0
    quota = LRU_LANES_QUOTA if WIDE_VECTORS or n_experts <= 16 else LRU_LANES_QUOTA_AVX2
    return n_experts <= 128 and c >= quota * mean_event


def lfu_lanes_pay(n_experts: int, capacity, mean_event: float) -> bool:
    """Whether the engine replays event-atomic per-layer ``lfu`` (counts that persist) on the lanes
    (:func:`replay_lfu_lanes`) rather than on the bit-sliced counts of :func:`._kernels_bits.replay_lfu_bits`: layers
    of at most 128 experts whose mean quota holds at least :data:`LFU_LANES_QUOTA` (:data:`LFU_LANES_QUOTA_AVX2` on a
    machine without AVX-512) mean events for their size (an overflow's rounds grow with the lanes it reduces; the
    bit-sliced selection with the planes of the counts), and layers of at most 16 whose mean quota is at most
    :data:`LFU_LANES_FEW` blocks (as many rounds from the near end).

    >>> lfu_lanes_pay(8, [1], 7.6), lfu_lanes_pay(128, [32], 8.0), lfu_lanes_pay(128, [96], 8.0)
    (True, False, True)
    >>> lfu_lanes_pay(16, [2, 1], 12.1), lfu_lanes_pay(16, [4], 12.1), lfu_lanes_pay(32, [2], 12.1)
    (True, False, False)
    """
    c = float(np.mean(capacity)) if len(capacity) else 0.0
    if n_experts <= 16 and c <= LFU_LANES_FEW:
        return True
    for most, quota in LFU_LANES_QUOTA if WIDE_VECTORS else LFU_LANES_QUOTA_AVX2:
        if n_experts <= most:
            return c >= quota * mean_event
    return False


@jit_inline
def _low_bits(k):
    """The ``k`` lowest bits of a word (``0 <= k <= 64``) set."""
    one = np.uint64(1)
    return ((one << np.uint64(k & 63)) - one) | (np.uint64(0) - np.uint64(k >> 6))


@jit_inline
def _extreme(NU, off, c0, c1, width, far):
    """The farthest (``far``) or the nearest next use of the ``width`` lanes from ``off`` (16, 64 or 128) whose bits
    ``c0``, ``c1`` hold."""
    if far:
        if width == 128:
            return lanes_max128(NU, off, c0, c1)
        return lanes_max64(NU, off, c0, c1) if width == 64 else lanes_max16(NU, off, c0, c1)
    if width == 128:
        return lanes_min128(NU, off, c0, c1)
    return lanes_min64(NU, off, c0, c1) if width == 64 else lanes_min16(NU, off, c0, c1)


@jit_inline
def _take(NU, pbase, n, far, cw, gw, kw, px, out, n_words):
    """Of the blocks in ``cw`` (next uses ``NU[pbase + j]`` for tie position ``j``; consumed), the ``n`` with the
    farthest next use, ties by lower tie position (``far``), or the ``n`` with the nearest, ties by higher tie
    position, into ``out``; ``0 < n <`` their count. Each round takes the group of the farthest (nearest) next use
    among the blocks left whole (into ``kw``), but the one that completes ``n``, split by tie position. The extreme of
    each pair of words is kept in ``px`` and found again only in the pairs a round took blocks from. Returns the next
    use of the last group. ``gw``: scratch words."""
    n_pairs = n_words >> 1
    for w in range(n_words):
        kw[_U(w)] = np.uint64(0)
    for p in range(n_pairs):
        px[_U(p)] = _extreme(NU, pbase + (p << 7), cw[_U(2 * p)], cw[_U(2 * p + 1)], 128, far)
    x = np.int64(0)
    for _ in range(n_words * 64):      # a round takes at least one block: at most this many
        x = px[0]
        for p in range(1, n_pairs):
            x = max(x, px[_U(p)]) if far else min(x, px[_U(p)])
        g = 0
        for p in range(n_pairs):
            g0 = np.uint64(0)
            g1 = np.uint64(0)
            if px[_U(p)] == x:
                g0 = lanes_eq(NU, pbase + (p << 7), x) & cw[_U(2 * p)]
                g1 = lanes_eq(NU, pbase + (p << 7) + 64, x) & cw[_U(2 * p + 1)]
            gw[_U(2 * p)] = g0
            gw[_U(2 * p + 1)] = g1
            g += np.int64(_popc(g0)) + np.int64(_popc(g1))
        if g >= n:                     # the group completes the count: its d lowest tie positions leave
            d = n if far else g - n
            for w in range(n_words):
                t = min(d, np.int64(_popc(gw[_U(w)])))
                o = pdep(_low_bits(t), gw[_U(w)])
                out[_U(w)] = kw[_U(w)] | (o if far else gw[_U(w)] & ~o)
                d -= t
            return x
        for p in range(n_pairs):
            if px[_U(p)] == x:
                for w in range(2 * p, 2 * p + 2):
                    cw[_U(w)] &= ~gw[_U(w)]
                    kw[_U(w)] |= gw[_U(w)]
                px[_U(p)] = _extreme(NU, pbase + (p << 7), cw[_U(2 * p)], cw[_U(2 * p + 1)], 128, far)
        n -= g
    return x


@jit_inline
def _rounds2(mem, NU, layer, pbase, n, far, cw, width):
    """:func:`_rounds` of a layer of at most 128 blocks, two words, its lanes ``width`` (16, 64 or 128) from
    ``pbase``: one reduction a round (``cw``: four scratch words, the blocks left and those taken)."""
    cw[0] = mem[_U(layer), 0]
    cw[1] = mem[_U(layer), 1]
    cw[2] = np.uint64(0)
    cw[3] = np.uint64(0)
    for _ in range(128):
        c0 = cw[0]
        c1 = cw[1]
        x = _extreme(NU, pbase, c0, c1, width, far)
        g0 = lanes_eq(NU, pbase, x) & c0
        g1 = lanes_eq(NU, pbase + 64, x) & c1 if width == 128 else np.uint64(0)
        p0 = np.int64(_popc(g0))
        g = p0 + np.int64(_popc(g1))
        if g >= n:                     # the group completes the count: its d lowest tie positions leave
            d = n if far else g - n
            t = min(d, p0)
            o0 = pdep(_low_bits(t), g0)
            o1 = pdep(_low_bits(d - t), g1)
            mem[_U(layer), 0] = c0 & ~o0 if far else cw[2] | (g0 & ~o0)
            mem[_U(layer), 1] = c1 & ~o1 if far else cw[3] | (g1 & ~o1)
            return
        cw[0] = c0 & ~g0
        cw[1] = c1 & ~g1
        cw[2] |= g0
        cw[3] |= g1
        n -= g


@jit_helper
def _leave_far2(mem, NU, layer, pbase, e, cw, width):
    """:func:`_rounds2` from the far end (the end a constant: each end compiled on its own took 0.90-0.91 of the time
    of one loop testing which end, 48 x 128 at batch 1, ``benchmarks/belady_lanes.py``)."""
    _rounds2(mem, NU, layer, pbase, e, True, cw, width)


@jit_helper
def _keep_near2(mem, NU, layer, pbase, k, cw, width):
    """:func:`_rounds2` from the near end."""
    _rounds2(mem, NU, layer, pbase, k, False, cw, width)


@jit_helper
def _take_far(NU, pbase, n, cw, gw, kw, px, out, n_words):
    """:func:`_take` from the far end (the end a constant in each compiled helper)."""
    return _take(NU, pbase, n, True, cw, gw, kw, px, out, n_words)


@jit_helper
def _take_near(NU, pbase, n, cw, gw, kw, px, out, n_words):
    """:func:`_take` from the near end."""
    return _take(NU, pbase, n, False, cw, gw, kw, px, out, n_words)


@jit_helper
def _bracket(mem, NU, layer, pbase, e, now, dist, cw, gw, kw, px, out, ge, n_words):
    """``e`` of ``mem[layer]`` leave, those with the farthest next use, bracketed by a cut at ``now + dist[layer]``:
    the ``c`` blocks whose next use is at least the cut (one compare a word) hold the ``e`` farthest where ``c > e``
    (taken from whichever end of them needs fewer, ``e`` or ``c - e``), else all leave and the ``e - c`` farthest of
    the rest, so a unit takes at most ``e`` rounds. The layer's next cut: the next use where this one's count ended."""
    t = min(now + dist[_U(layer)], np.int64(NEVER))
    c = 0
    for w in range(n_words):
        ge[_U(w)] = lanes_ge(NU, pbase + (w << 6), t) & mem[_U(layer), _U(w)]
        c += np.int64(_popc(ge[_U(w)]))
    if c == e:
        for w in range(n_words):
            mem[_U(layer), _U(w)] &= ~ge[_U(w)]
        return
    for w in range(n_words):
        cw[_U(w)] = ge[_U(w)] if c > e else mem[_U(layer), _U(w)] & ~ge[_U(w)]
    if c > 2 * e:                      # the e farthest of the cut's blocks leave
        x = _take_far(NU, pbase, e, cw, gw, kw, px, out, n_words)
        for w in range(n_words):
            mem[_U(layer), _U(w)] &= ~out[_U(w)]
        dist[_U(layer)] = x - now
    elif c > e:                        # the c - e nearest of them stay
        x = _take_near(NU, pbase, c - e, cw, gw, kw, px, out, n_words)
        for w in range(n_words):
            mem[_U(layer), _U(w)] &= ~(ge[_U(w)] & ~out[_U(w)])
        dist[_U(layer)] = x + 1 - now
    else:                              # all of them leave, and the e - c farthest of the rest
        x = _take_far(NU, pbase, e - c, cw, gw, kw, px, out, n_words)
        for w in range(n_words):
            mem[_U(layer), _U(w)] &= ~(ge[_U(w)] | out[_U(w)])
        dist[_U(layer)] = x - now


@jit_helper
def _decide_words(mem, NU, layer, pbase, e, k, near, bracket, now, dist, cw, gw, kw, px, out, ge, n_words):
    """A pending overflow of a layer of more than 128 experts: bracketed (:func:`_bracket`) where ``bracket`` and the
    layer has a cut, else in rounds from the near end (``k`` stay) where ``near``, else from the far end (``e``
    leave); either way the layer's next cut is set where the count ended."""
    if bracket and dist[_U(layer)] >= 0:
        _bracket(mem, NU, layer, pbase, e, now, dist, cw, gw, kw, px, out, ge, n_words)
        return
    for w in range(n_words):
        cw[_U(w)] = mem[_U(layer), _U(w)]
    if near:
        x = _take_near(NU, pbase, k, cw, gw, kw, px, out, n_words)
        for w in range(n_words):
            mem[_U(layer), _U(w)] = out[_U(w)]
        dist[_U(layer)] = x + 1 - now
    else:
        x = _take_far(NU, pbase, e, cw, gw, kw, px, out, n_words)
        for w in range(n_words):
            mem[_U(layer), _U(w)] &= ~out[_U(w)]
        dist[_U(layer)] = x - now


@jit_inline
def _decide(mem, NU, layer, pbase, e, k, near, bracket, now, dist, add, cw, gw, kw, px, out, ge, n_words, width):
    """A pending overflow of ``layer`` (at event ``now``): ``e`` of ``mem[layer]`` leave (``k`` stay), in rounds
    from the near end where ``near`` (bracketed past 128 experts where ``bracket``: :func:`_decide_words`); then the
    words ``add`` join (Belady-forced's misses)."""
    if n_words == 2 and near:
        _keep_near2(mem, NU, layer, pbase, k, cw, width)
    elif n_words == 2:
        _leave_far2(mem, NU, layer, pbase, e, cw, width)
    else:
        _decide_words(mem, NU, layer, pbase, e, k, near, bracket, now, dist, cw, gw, kw, px, out, ge, n_words)
    for w in range(n_words):
        mem[_U(layer), _U(w)] |= add[w]


def replay_belady_lanes(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, access_next, forced,
                        count_from, hits, misses, hit_flag, keep_group=KEEP_GROUP, keep_bound=KEEP_BOUND,
                        bracket_rounds=BRACKET_ROUNDS, keys=NEXT_KEYS):
    """Event-atomic, per-layer Belady (``forced=False``: bypass admission) or Belady-forced-admit.

    ``access_next[a]``: the event of access ``a``'s block's next use (``NEVER`` for none; int32), as
    :func:`expertcache.replay._kernels.next_use` gives it or advice holds it. Belady's candidates are ``C ∪ U``;
    under ``forced`` the unit's misses rank below every resident (they stay, and ``e`` residents leave; where
    ``e`` is at least the residents, all of them leave and the misses farthest in the future beyond the quota).
    ``keep_group`` / ``keep_bound``: the choice of end (:data:`KEEP_GROUP`, :data:`KEEP_BOUND`; tests pass 0 and
    a large bound to keep from the near end always, or a bound of 0 to leave from the far end always).
    ``keys``: what a member's lane is given, its next use (:data:`NEXT_KEYS`), its unit's key (:data:`UNIT_KEYS`,
    :func:`replay_lru_lanes`) or its count, negated (:data:`COUNT_KEYS`, :func:`replay_lfu_lanes`; ``access_next``
    unread in both).
    Other parameters are those of :func:`._kernels_bits.replay_lru_bits`.
    """
    n_words = (n_experts + 127) // 128 * 2          # pairs of words: 128 lanes a reduction
    width = 16 if n_experts <= 16 else 64 if n_experts <= 64 else 128
    npad = width if n_experts <= 128 else n_words * 64
    mean_event = _mean_event(offsets)
    loop = (_replay_belady_lanes, _replay_lru_lanes, _replay_lfu_lanes)[keys]
    loop(offsets, expert, ev_layer, n_experts, capacity, tie_pos, access_next, bool(forced), count_from, hits, misses,
         hit_flag, np.zeros(n_layers, dtype=np.int64), np.zeros((n_layers, n_words), dtype=np.uint64),
         np.zeros(n_layers * npad + 128, dtype=np.int32), np.zeros((5, max(n_words, 4)), dtype=np.uint64),
         float(mean_event), float(keep_group), int(keep_bound), width, npad, np.zeros(n_words // 2, dtype=np.int64),
         float(bracket_rounds), np.full(n_layers, -1, dtype=np.int64), np.zeros((2, max(n_words, 4)), dtype=np.uint64))


def replay_lru_lanes(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                     hit_flag, keep_ratio=LRU_KEEP_RATIO):
    """Event-atomic, per-layer LRU on the same lanes (at most 128 experts a layer; fewer than ``2**31 - 1``
    events): each member's lane gets its unit's key ``n_events - i``, so that the nearest key is the most recent
    unit and the loop's ``C ∪ U`` keeps the ``c`` most recently used blocks, ties leaving by lower tie position
    (the decision of :func:`expertcache.replay._kernels.replay_lru`). A layer's hits cost one store each and no
    list is kept; an overflow takes rounds from the far end (the oldest units, few blocks each), or from the near
    end where fewer stay than ``keep_ratio`` times those that leave (the near groups are whole recent units).
    Parameters are those of :func:`._kernels_bits.replay_lru_bits`.
    """
    _keyed_lanes(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                 hit_flag, keep_ratio, UNIT_KEYS)


def replay_lfu_lanes(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                     hit_flag, keep_ratio=LFU_KEEP_RATIO):
    """Event-atomic, per-layer LFU (counts that persist across evictions) on the same lanes (at most 128 experts a
    layer; fewer than ``2**31 - 1`` events): each member's lane is one lower at each access (its count, negated,
    after the unit's own accesses), so that the loop's ``C ∪ U`` keeps the ``c`` highest counts, ties leaving by
    lower tie position (the decision of :func:`._kernels_bits.replay_lfu_bits`). An overflow takes rounds from the
    far end (the lowest counts), or from the near end where fewer stay than ``keep_ratio`` times those that leave.
    Parameters are those of :func:`._kernels_bits.replay_lru_bits`.
    """
    _keyed_lanes(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                 hit_flag, keep_ratio, COUNT_KEYS)


def _keyed_lanes(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                 hit_flag, keep_ratio, keys) -> None:
    """:func:`replay_lru_lanes` (``keys`` :data:`UNIT_KEYS`) or :func:`replay_lfu_lanes` (:data:`COUNT_KEYS`): the
    lanes' bounds checked, then the lanes loop with no next uses, Belady's admission of ``C ∪ U``, rounds from the
    near end where fewer than ``keep_ratio`` stay per block that leaves, and no bracket."""
    what = "lru" if keys == UNIT_KEYS else "lfu"
    if n_experts > 128:
        raise ValueError(f"{n_experts} experts a layer: the {what} lanes take at most 128")
    if offsets.shape[0] - 1 >= NEVER:
        raise ValueError(f"{offsets.shape[0] - 1} events: the {what} lanes keep int32 keys, so fewer than {NEVER}")
    replay_belady_lanes(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, np.zeros(0, np.int32),
                        False, count_from, hits, misses, hit_flag, float(keep_ratio) * _mean_event(offsets), 1 << 30,
                        1 << 30, keys=keys)


def replay_lru_layers(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                      hit_flag) -> None:
    """Event-atomic, per-layer ``lru`` as the engine replays it: on the lanes (:func:`replay_lru_lanes`) where
    :func:`lru_lanes_pay` says so, else in the recency buckets of :func:`._kernels_bits.replay_lru_bits` (up to
    :data:`._kernels_bits.MAX_BITS_EXPERTS` experts a layer). Parameters are those of that function."""
    if _lanes_fit(offsets, n_experts) and lru_lanes_pay(n_experts, capacity, _mean_event(offsets)):
        replay_lru_lanes(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                         hit_flag)
    else:
        replay_lru_bits(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                        hit_flag)


def replay_lfu_layers(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, reset_freq_on_evict,
                      count_from, hits, misses, hit_flag) -> None:
    """Event-atomic, per-layer ``lfu`` as the engine replays it: on the lanes (:func:`replay_lfu_lanes`) where
    counts persist and :func:`lfu_lanes_pay` says so, else on the bit-sliced counts of
    :func:`._kernels_bits.replay_lfu_bits` (whose parameters these are)."""
    if (not reset_freq_on_evict and _lanes_fit(offsets, n_experts)
            and lfu_lanes_pay(n_experts, capacity, _mean_event(offsets))):
        replay_lfu_lanes(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                         hit_flag)
    else:
        replay_lfu_bits(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, reset_freq_on_evict,
                        count_from, hits, misses, hit_flag)


def _lanes_fit(offsets, n_experts: int) -> bool:
    """Whether the lanes of unit keys or counts take a stream of these event offsets (the bounds
    :func:`_keyed_lanes` checks)."""
    return n_experts <= 128 and offsets.shape[0] - 1 < NEVER


def _mean_event(offsets) -> float:
    """The mean event (union accesses an event) of a stream of these event offsets."""
    return float(offsets[-1] - offsets[0]) / max(offsets.shape[0] - 1, 1)


@jit_loop
def _replay_belady_lanes(offsets, expert, ev_layer, n_experts, capacity, tie_pos, nxt, forced, count_from, hits,
                         misses, hit_flag, size, mem, NU, scratch, mean_event, keep_group, keep_bound, width, npad,
                         px, bracket_rounds, dist, scratch2):
    """The loop of :func:`replay_belady_lanes` (:func:`_lanes_loop`, next uses from ``nxt``)."""
    _lanes_loop(offsets, expert, ev_layer, n_experts, capacity, tie_pos, nxt, forced, count_from, hits, misses,
                hit_flag, size, mem, NU, scratch, mean_event, keep_group, keep_bound, width, npad, px, bracket_rounds,
                dist, scratch2, NEXT_KEYS)


@jit_loop
def _replay_lru_lanes(offsets, expert, ev_layer, n_experts, capacity, tie_pos, nxt, forced, count_from, hits,
                      misses, hit_flag, size, mem, NU, scratch, mean_event, keep_group, keep_bound, width, npad,
                      px, bracket_rounds, dist, scratch2):
    """The loop of :func:`replay_lru_lanes` (:func:`_lanes_loop`, unit keys; compiled on its own: one loop testing
    which key a member takes cost Belady 1.02-1.07x its time, ``benchmarks/kernel_ab.py --kernel belady-lanes``)."""
    _lanes_loop(offsets, expert, ev_layer, n_experts, capacity, tie_pos, nxt, forced, count_from, hits, misses,
                hit_flag, size, mem, NU, scratch, mean_event, keep_group, keep_bound, width, npad, px, bracket_rounds,
                dist, scratch2, UNIT_KEYS)


@jit_loop
def _replay_lfu_lanes(offsets, expert, ev_layer, n_experts, capacity, tie_pos, nxt, forced, count_from, hits,
                      misses, hit_flag, size, mem, NU, scratch, mean_event, keep_group, keep_bound, width, npad,
                      px, bracket_rounds, dist, scratch2):
    """The loop of :func:`replay_lfu_lanes` (:func:`_lanes_loop`, counts)."""
    _lanes_loop(offsets, expert, ev_layer, n_experts, capacity, tie_pos, nxt, forced, count_from, hits, misses,
                hit_flag, size, mem, NU, scratch, mean_event, keep_group, keep_bound, width, npad, px, bracket_rounds,
                dist, scratch2, COUNT_KEYS)


@jit_inline
def _member_key(NU, j, keys, key, nxt, a):
    """A member's lane ``j``: its next use ``nxt[a]``, the unit's ``key``, or one count more (``keys``)."""
    if keys == NEXT_KEYS:
        NU[j] = nxt[_U(a)]
    elif keys == UNIT_KEYS:
        NU[j] = key
    else:
        NU[j] -= np.int32(1)


@jit_inline
def _lanes_loop(offsets, expert, ev_layer, n_experts, capacity, tie_pos, nxt, forced, count_from, hits, misses,
                hit_flag, size, mem, NU, scratch, mean_event, keep_group, keep_bound, width, npad, px, bracket_rounds,
                dist, scratch2, keys):
    """The loop of all three: ``mem[l]`` layer ``l``'s residents (an even number of words), ``NU[l * 64 W + j]`` the
    key of its tie position ``j`` (``keys``: its next use, its last unit's key ``n_events - i``, or its count negated,
    one lower at each access); ``scratch``: the unit's misses, the pending overflow's words that join after it, and
    three scratch bitsets."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    n_words = mem.shape[1]
    one = np.uint64(1)
    zero = np.uint64(0)
    ev = scratch[0]
    add = scratch[1]
    cw = scratch[2]
    gw = scratch[3]
    kw = scratch[4]
    out = scratch2[0]
    ge = scratch2[1]
    pl = -1                            # the pending overflow: its layer (-1: none), how many leave and stay, its end
    pe = 0
    pk = 0
    pn = False
    pb = False
    pnow = 0
    for i in range(n_events):
        layer = ev_layer[i]
        if pl == layer:
            _decide(mem, NU, pl, pl * npad, pe, pk, pn, pb, pnow, dist, add, cw, gw, kw, px, out, ge, n_words, width)
            pl = -1
        cap = capacity[_U(layer)]
        base = layer * n_experts
        pbase = layer * npad
        lo = offsets[i]
        hi = offsets[i + 1]
        key = np.int32(n_events - i)   # UNIT_KEYS: the unit's key, nearer than every older unit's
        if n_words == 2:               # the unit's bits in registers (a store per member chains through memory)
            e0 = zero
            e1 = zero
            for a in range(lo, hi):
                tp = tie_pos[_U(base + expert[_U(a)])]
                bit = one << np.uint64(tp & 63)
                hm = zero - np.uint64(tp >> 6)
                e0 |= bit & ~hm
                e1 |= bit & hm
                _member_key(NU, _U(pbase + tp), keys, key, nxt, a)
            e0 &= ~mem[_U(layer), 0]
            e1 &= ~mem[_U(layer), 1]
            ev[0] = e0
            ev[1] = e1
            n_miss = np.int64(_popc(e0)) + np.int64(_popc(e1))
        else:
            for w in range(n_words):
                ev[w] = zero
            for a in range(lo, hi):
                tp = tie_pos[_U(base + expert[_U(a)])]
                ev[_U(tp >> 6)] |= one << np.uint64(tp & 63)
                _member_key(NU, _U(pbase + tp), keys, key, nxt, a)
            n_miss = 0
            for w in range(n_words):
                ev[w] &= ~mem[_U(layer), _U(w)]
                n_miss += np.int64(_popc(ev[w]))
        _record_hits(expert, lo, hi, base, tie_pos, mem, layer, hi - lo - n_miss, record, hit_flag, i >= count_from,
                     hits, misses)
        if pl >= 0:                    # the previous event's overflow (another layer's)
            _decide(mem, NU, pl, pl * npad, pe, pk, pn, pb, pnow, dist, add, cw, gw, kw, px, out, ge, n_words, width)
            pl = -1
        if n_miss == 0 or cap == 0:
            continue
        n_res = size[_U(layer)]
        total = n_res + n_miss
        if total <= cap:
            for w in range(n_words):
                mem[_U(layer), _U(w)] |= ev[w]
            size[_U(layer)] = total
            continue
        e = total - cap
        if not forced:                 # C ∪ U: e leave, cap stay
            for w in range(n_words):
                mem[_U(layer), _U(w)] |= ev[w]
                add[w] = zero
            k = cap
        elif e < n_res:                # forced: e residents leave (hits included), the misses join after
            for w in range(n_words):
                add[w] = ev[w]
            k = n_res - e
        else:                          # forced: every resident leaves, and the misses farthest beyond cap
            e -= n_res
            for w in range(n_words):
                mem[_U(layer), _U(w)] = ev[w]
                add[w] = zero
            k = cap
        size[_U(layer)] = cap
        if e > 0:                      # (none leave where the forced misses are exactly the quota)
            pl = layer
            pe = e
            pk = k
            pn = keep_group * k < e * mean_event and k < keep_bound * e
            pb = e > bracket_rounds and keep_group * k > bracket_rounds * mean_event
            pnow = i
    if pl >= 0:
        _decide(mem, NU, pl, pl * npad, pe, pk, pn, pb, pnow, dist, add, cw, gw, kw, px, out, ge, n_words, width)
