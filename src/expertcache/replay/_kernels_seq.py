"""Sequential ``lru`` and per-layer ``lfu``, ``lrfu`` and ``lfru``: one unit per access.

:func:`replay_lru_seq` keeps each layer's residents as ranks in a recency array where every quota is small beside the
stream's events (up to 64 and 4 times the mean event: :func:`lru_on_ranks`), an event replayed whole with no branch on
an access's outcome; otherwise, and for one global pool, in a recency list (``int32`` links). The other three keep
packed keys, below.

Under sequential semantics every access is its own unit, so a replay decides once per miss whether the
accessed block or one resident leaves: the lowest ``(key, tie)`` of the layer's residents and that block
(the decision of :func:`._kernels.replay_heap`, which keeps an 8-ary heap per layer). These loops keep a layer's
residents as one *packed key* per tie position (``64 W`` lanes a layer, ``W`` the words of its bitset, as
:mod:`._kernels_bits`): the key's bits above the low ``tbits`` and the tie position below them, so that the
smallest packed key names the block that leaves; a lane that holds no resident holds the largest integer of its
type. A hit rewrites its lane; a miss past the quota takes the layer's smallest packed key, a reduction over its
lanes that LLVM vectorizes (``lfu`` computes its packed keys in that reduction instead of keeping them).

* :func:`replay_lfu_seq`: the packed key is the count above the tie position, computed where needed: the loop keeps
  each block's count and whether it is resident, and per layer a bound at or below its residents' smallest packed
  key (a hit only raises a key). A hit, and a miss below the bound (the block leaves at once: nearly every miss),
  take no branch on the outcome: one compare, of the count against the bound's with counts kept, of the packed key
  under in-cache counters (where nearly every miss has the lowest count); any other miss finds the layer's smallest
  packed key by one vectorized pass over its blocks, which becomes the bound (:func:`_lfu_seq_miss`). 0.39-0.48 of
  the time of packed keys kept per tie position with the lowest count's residents as bits, its loop before session
  44 (0.59-0.60 with in-cache counters; ``python benchmarks/kernel_ab.py --kernel lfu-seq``, ``--kernel
  lfu-seq-in-cache``).
* :func:`replay_lrfu_seq`: where every quota is at most 64 and the stream's events are large (:func:`lrfu_on_ranks`),
  each layer's residents as ranks in key order, an event replayed whole (:mod:`._kernels_lrfu_ranks`). Otherwise
  the float32 value of :func:`._kernels_bits.replay_lrfu_bits` (``2**(key - lam R)``,
  ``R`` a base unit of the layer), its low bits replaced by a position. Where the quota fits 16, 32 or 64 slots
  (and a table holds every decay the stream needs), the layer's residents sit in slots and an event's layer's
  packed keys (the slot's index in the low bits) are held as one int32 vector in registers (:mod:`._vec`): a miss
  past the quota takes their smallest by one reduction, and it leaves where no other key lies within the margins
  (one compare). Larger quotas keep the keys over tie positions (the tie position in the low bits), the smallest
  and the next by passes in memory (the next smallest is the layer's smallest after the eviction: kept for its next
  miss). Otherwise the exact keys of the blocks within the margins decide.
* :func:`replay_lfru_seq`: ``lfru``'s key drifts with the clock, so it is computed afresh at each eviction, over
  the layer's residents in slots (its quota rounded up to 16) rather than its tie positions: ``count / age`` as the
  float32 product of the age and the count's reciprocal (no division), with the slot's index in its low bits, and
  the two smallest in one pass (:func:`lfru_lowest`). Where the slots are 16, 32 or 64 (48 taken as 64), the
  event's layer's reciprocal counts and last units are also held as two vectors in registers through its accesses,
  so that a pass does not wait for the stores of the access before it.

The ``lrfu`` and ``lfru`` loops run two events of different layers side by side (:func:`_paired`; the slot loops
while two layers' vectors fit the registers: ``lfru`` up to 32 slots with AVX-512 and 16 without, ``lrfu`` at every
width with it and up to 32 without): each event's accesses form one chain of dependent work, and two chains keep the
core busy where one waits. ``lru`` runs one event at a time, which measured faster on its lists
(:data:`_LFRU_PAIR_LANE_BITS`).

Each loop is also given by ranges of events (``lru_seq_ranges``, ``lfu_seq_ranges``, ``lrfu_seq_ranges``,
``lfru_seq_ranges``; :func:`_ranges`), its state carried from one range to the next, so that
:func:`._kernels_order.shuffled_replay` can shuffle the next chunk of a sequential-random order on another thread.

The engine sends sequential ``lru`` (either scope) and per-layer ``lfu``, ``lrfu`` and ``lfru`` here (``N <= 1024``
for the last three); the tests compare them with ``replay_lru`` / ``replay_heap`` / ``replay_scan``
(tests/test_fast_policies.py) and, through the engine, with the naive twin.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .._jit import jit, jit_helper, jit_inline, jit_loop
from . import _kernels_lrfu_ranks as KRK
from ._kernels import LRFU_DECAY_ZERO, _max_unit, crf_decays, crf_key
from ._kernels_bits import (
    _LRFU_DECAYS,
    _LRFU_SPAN,
    _LRFU_TINY,
    _U,
    _lrfu_decay,
    _lrfu_margin,
    _popc,
)
from ._kernels_ranked import _below
from ._simd import WIDE_VECTORS, _splat, f2u, u2f
from ._vec import (
    WIDTHS,
    Lanes,
    fold_two_lowest,
    icount_le,
    ifind,
    ikey_lowest,
    ilowest,
    iset_lowest,
    lane_bits,
    lowest_and_near,
    packed_lfru_keys,
    spread_min,
    vload,
    vlowest,
    vset,
    vset_lowest,
    vstore,
)

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)

#: The largest packed int32 key, a lane with no resident (NaN's bits in ``lrfu``: above every value and ``inf``).
_EMPTY32 = np.int32(2**31 - 1)
#: The bits of float32 ``_LRFU_TINY``: an ``lrfu`` value below it is kept as 0.
_TINY_BITS = np.int64(np.float32(_LRFU_TINY).view(np.int32))
#: Sequential ``lfu``'s bound of a layer that holds no resident (a quota of 0): above every packed key.
_LFU_NONE = np.int64(1) << 62
#: The most decays the slot loop of sequential ``lrfu`` tabulates (8 MiB): it runs where the table holds every gap
#: of the stream, or every gap before the decay is 0 (:func:`lrfu_seq_ranges`), so that no access calls ``pow``
#: (a call in the access path made LLVM keep the loop's vectors in memory).
_LRFU_SLOT_DECAYS = 1 << 20
#: Slot loops of up to ``2**_TP_LANE_BITS`` slots hold their slots' tie positions in registers and find an accessed
#: block's slot by one compare; 64 slots keep an array of each block's slot (the compare over four vectors, and the
#: registers they take, cost more than the array there: docs/performance.md, *Session 38*). Without AVX-512 (16
#: vector registers of 256 bits) 32 slots keep the array too: two layers' 32 packed keys and 32 tie positions, side
#: by side, took every register, and LLVM kept them on the stack (with the array: 0.85 / 0.78 / 0.77 of the time at
#: rho 0.15 / 0.2 / 0.25 on a Zen 3 core; docs/performance.md, *Session 55*).
_TP_LANE_BITS = 5 if WIDE_VECTORS else 4
#: The ``lrfu`` slot loop runs two events side by side up to ``2**_LRFU_PAIR_LANE_BITS`` slots: at every width with
#: AVX-512, up to 32 without it (two layers' 64 packed keys take all 16 registers of 256 bits: one event at a time
#: took 0.89 / 0.88 of the time at rho 0.3 / 0.4 on a Zen 3 core, at 32 slots 1.09-1.16x: docs/performance.md,
#: *Session 55*).
_LRFU_PAIR_LANE_BITS = 6 if WIDE_VECTORS else 5
#: Which loops run two events of different layers side by side (:func:`_pair`), as measured (docs/performance.md,
#: *Session 39*): the ``lrfu`` loops (one event at a time took 1.30x the slot loop's time at 16 or 32 slots, 1.20x
#: at 64 slots and rho 0.3), the ``lfru`` loop in memory, and the ``lfru`` slot loop up to
#: ``2**_LFRU_PAIR_LANE_BITS`` slots (one at a time: 1.52x / 1.06x at 16 / 32 slots, 0.85-0.96x at 64, where two
#: layers' reciprocal counts and last units, 16 vectors, and their keys do not fit the registers); without AVX-512 up
#: to 16 slots (at 32, two layers' vectors take all 16 registers of 256 bits: one event at a time took 0.84 / 0.84 /
#: 0.85 of the time at rho 0.15 / 0.2 / 0.25 on a Zen 3 core; docs/performance.md, *Session 55*). Per-layer ``lru``
#: runs one event at a time (0.84-0.89x the time of two side by side: the core overlaps consecutive events' list
#: moves on its own).
_LFRU_PAIR_LANE_BITS = 5 if WIDE_VECTORS else 4
#: The ``lfru`` slot loop of ``2**_LFRU_TP_FIRST_BITS`` slots or more reads an event's tie positions into a buffer
#: when the event begins, so that an access's count is one load after its member where it was two: without AVX-512,
#: 64 slots (two vectors of 64 lanes take all 16 registers of 256 bits and go through the stack, and each access
#: waits on more): 0.89 / 0.83 / 0.81 of the time at rho 0.3 / 0.4 / 0.5 on a Zen 3 core (at 16 slots, where
#: nothing goes through the stack, 1.075x; docs/performance.md, *Session 55*); with AVX-512 none (7: above every
#: width; the loop as before, not measured there).
_LFRU_TP_FIRST_BITS = 7 if WIDE_VECTORS else 6
#: The ``lfru`` slot loop of ``2**_LFRU_AHEAD_BITS`` slots or more, and the loop in memory, read the next access's
#: tie position and count before an access's decision (its own were read at the access before; an event's members are
#: distinct and the two events of a pair are of different layers, so no access changes the next one's count), so that
#: an access after a mispredicted branch (hit or miss: 16-36% hits at rho 0.2-0.3) need not wait for those loads.
#: With AVX-512 (``kernel_ab.py --kernel lfru-seq``, three runs): 0.96-0.97 / 0.90-0.92 / 0.84-0.87 / 0.85-0.93 of
#: the time at rho 0.2 / 0.3 / 0.4 / 0.5 (32 and 64 slots), 0.93-0.98 at rho 0.6-0.9 (in memory); at 16 slots (rho
#: 0.1, two events of 16 lanes side by side, 99% misses) 1.04-1.13x, so there both accesses' loads come at the top of
#: the step instead (0.93-0.96); docs/performance.md, *Session 65*; without AVX-512 not measured.
_LFRU_AHEAD_BITS = 5
#: The same for the ``lrfu`` slot loop: without AVX-512, 64 slots (one event at a time there,
#: :data:`_LRFU_PAIR_LANE_BITS`): 0.97 / 0.88 / 0.87 of the time at rho 0.3 / 0.4 / 0.5 on a Zen 3 core (at 32 slots
#: within the noise, at 16 1.01-1.03x; docs/performance.md, *Session 56*); with AVX-512 none (7).
_LRFU_TP_FIRST_BITS = 7 if WIDE_VECTORS else 6
#: Per-layer sequential ``lru`` runs on ranks (:func:`_replay_lru_seq_ranks`) where every layer's quota (at most
#: ``N``) is at most ``_LRU_RANKS_MAX`` (its resident ranks one 64-bit word of bits) and at most
#: ``_LRU_RANKS_PER_MEMBER`` times the stream's mean event (an event's list is rebuilt whole: with small events and a
#: large quota the list loop costs less). Measured with ``benchmarks/lru_ranks_shapes.py`` (docs/performance.md,
#: *Session 40*).
_LRU_RANKS_MAX = 64
_LRU_RANKS_PER_MEMBER = 4
#: Per-layer sequential ``lrfu`` runs on ranks (:mod:`._kernels_lrfu_ranks`) where the stream's mean event has at least
#: :data:`_LRFU_RANKS_MIN_EVENT` members, or at least :data:`_LRFU_RANKS_SMALL_EVENT` and every quota is at most
#: :data:`_LRFU_RANKS_PER_MEMBER` times it: with smaller events each event's list rebuilt costs more than the slot
#: loop's accesses (``python benchmarks/lrfu_ranks_shapes.py``, mean events of 8 / 14 / 20 / 25-110 members at batch
#: 1 / 2 / 3 / 4-64: 0.89-1.55x / 0.69-0.91x and 1.05-1.09x at quota 64 / 0.44-0.94x / 0.15-0.77x the slot loop's
#: time; docs/performance.md, *Session 64*).
_LRFU_RANKS_MIN_EVENT = 16
_LRFU_RANKS_SMALL_EVENT = 12
_LRFU_RANKS_PER_MEMBER = 4
#: A rank byte: the block is not resident / it is a member of the event being replayed (ranks are below 64).
_RANK_OUT = np.uint8(255)
_RANK_MEMBER = np.uint8(254)
#: Sequential ``lfu`` keeps its counts as int32 while every layer's accesses stay below this, else as int64 (its
#: packed keys are int64 either way).
LFU_COUNT32_MAX = 2**31 - 1


def _tie_bits(n_experts: int) -> int:
    """Bits of a tie position (``0 .. n_experts - 1``), at least 1."""
    return max(int(n_experts - 1).bit_length(), 1)


def _n_slots(capacity, n_experts: int) -> int:
    """Slots a layer's residents take in the slot loops of ``lrfu`` and ``lfru``: the largest quota (at most
    ``n_experts``) rounded up to 16, at least 16; 48 taken as 64, so that 16, 32 or 64 slots fit vectors
    (:data:`._vec.WIDTHS`)."""
    ns = max((min(int(capacity.max()) if capacity.shape[0] else 0, n_experts) + 15) // 16 * 16, 16)
    return 64 if ns == 48 else ns


@jit
def _most_layer_accesses(offsets, ev_layer, n_layers):
    """The most accesses any one layer has (its units under sequential semantics)."""
    n = np.zeros(n_layers, dtype=np.int64)
    for i in range(offsets.shape[0] - 1):
        n[ev_layer[i]] += offsets[i + 1] - offsets[i]
    most = 0
    for layer in range(n_layers):
        most = max(most, n[layer])
    return most


@jit_helper
def _smallest(rk, o, n, m):
    """The smallest of ``m`` and ``rk[o:o + n]`` (``n`` a multiple of 64): one vectorized reduction."""
    for q in range(o, o + n):
        x = rk[_U(q)]
        if x < m:
            m = x
    return m


@jit_helper
def _next_smallest(rk, o, n, m, empty):
    """The smallest of ``rk[o:o + n]`` above ``m`` (``empty`` where none is): one vectorized pass."""
    r = empty
    for q in range(o, o + n):
        x = rk[_U(q)]
        x = x if x > m else empty
        r = x if x < r else r
    return r


@jit_helper
def _paired(ev_layer, i, n_events):
    """Whether event ``i + 1`` exists and belongs to another layer than event ``i``: per-layer caches are
    independent, so the two events' accesses then run side by side (access ``k`` of one, then of the other), two
    chains of dependent work that the core overlaps, where one event's accesses form one chain."""
    return i + 1 < n_events and ev_layer[i + 1] != ev_layer[i]


@jit_inline
def _pair(offsets, ev_layer, capacity, i, n_events, side_by_side):
    """Events ``i`` and ``i + 1`` side by side where ``side_by_side`` and :func:`_paired` (else the second empty):
    ``(two, layer, quota, first access, accesses)`` of the first, then the same four of the second. The paired loops
    (``lrfu``, ``lfru``) each write the pair's access loop out around their own access function: one passed in as an
    argument would keep numba from caching the loop. A loop compiled with ``side_by_side`` a constant False runs one
    event at a time (LLVM drops the second event's code)."""
    la = ev_layer[i]
    lo = offsets[i]
    two = side_by_side and _paired(ev_layer, i, n_events)
    lb = ev_layer[i + 1] if two else la
    lob = offsets[i + 1]
    return (two, la, capacity[_U(la)], lo, offsets[i + 1] - lo, lb, capacity[_U(lb)], lob,
            offsets[i + 2] - lob if two else 0)


@jit_helper
def _count(hits, misses, layer, n, n_hit, counted):
    """An event's hits and misses into its layer's totals where it is past the warm-up."""
    if counted:
        hits[_U(layer)] += n_hit
        misses[_U(layer)] += n - n_hit


def _tp_first_buffer(offsets, ns: int, bits: int) -> np.ndarray:
    """The buffer a slot loop of ``ns`` slots reads an event's tie positions into when the event begins, from
    ``2**bits`` slots (:data:`_LFRU_TP_FIRST_BITS`, :data:`_LRFU_TP_FIRST_BITS`): as long as the widest event of the
    stream (so that ranges of it fit), one element where the loop does not read them first."""
    return np.zeros(int(_max_unit(offsets, True)) if ns >= 1 << bits else 1, np.int32)


@jit_inline
def _tie_position(tie_pos, base, expert, a):
    """The tie position of access ``a``'s block (block ``base + expert[a]``)."""
    return np.int64(tie_pos[_U(base + expert[_U(a)])])


@jit_inline
def _read_tie_positions(TP, tie_pos, base, expert, lo, n):
    """The tie positions of the members ``expert[lo:lo + n]`` (blocks ``base + e``) into ``TP[:n]``."""
    for k in range(n):
        TP[_U(k)] = _tie_position(tie_pos, base, expert, lo + k)


def _ranges(loop, offsets, ev_layer, head, count_from, tail):
    """A function ``run(order, e0, e1)`` that replays events ``e0 .. e1 - 1`` of the member order ``order`` by
    ``loop`` (called as ``loop(offsets, order, ev_layer, *head, count_from, *tail)`` on the range), its state in
    ``head`` / ``tail`` carried from one range to the next: ranges run in order give one call's counts and flags
    (two events side by side never span two ranges, which changes no decision)."""

    def run(order, e0, e1):
        if e1 > e0:
            loop(offsets[e0:e1 + 1], order, ev_layer[e0:e1], *head, count_from - e0, *tail)

    return run


def replay_lru_seq(offsets, expert, ev_layer, n_experts, n_layers, capacity, count_from, hits, misses, hit_flag,
                   global_scope=False):
    """Sequential (one unit per access, in the order of ``expert``) ``lru``: the decision of
    :func:`._kernels.replay_lru` with ``atomic`` false, with the same counts and hit flags.

    Per layer, where every quota is small beside the stream's events (:func:`lru_on_ranks`), each layer's residents
    are ranks in a recency array and an event is replayed whole, with no branch on an access's outcome
    (:func:`_replay_lru_seq_ranks`; 0.20-0.65x the list loop's time at rho 0.05-0.5 on the benchmark stream, in
    either member order: docs/performance.md, *Session 40*). Otherwise, and under global scope, each partition's
    residents (a layer's, or one global pool's) form a recency list (``int32`` links per block, the oldest at the
    head); a hit moves its block to the tail, a miss past the quota takes the head's place (a quota of 0 admits
    nothing). One event at a time: per layer, events side by side (two layers' chains of list moves) measured slower
    (:data:`_LFRU_PAIR_LANE_BITS`). Parameters are those of :func:`._kernels.replay_lru` without ``atomic`` and the
    tie order (one member a unit needs none). The lists or ranks are allocated here.
    """
    lru_seq_ranges(offsets, ev_layer, n_experts, n_layers, capacity, count_from, hits, misses, hit_flag,
                   global_scope)(expert, 0, offsets.shape[0] - 1)


def lru_seq_ranges(offsets, ev_layer, n_experts, n_layers, capacity, count_from, hits, misses, hit_flag,
                   global_scope=False, on_ranks=None):
    """:func:`replay_lru_seq` by ranges of events (:func:`_ranges`): its lists (or ranks) allocated here, empty.
    ``on_ranks`` True / False runs per-layer scope on ranks / on lists (ranks take quotas up to
    :data:`_LRU_RANKS_MAX`); None chooses by :func:`lru_on_ranks`."""
    n_blocks = n_layers * n_experts
    if on_ranks is None:
        on_ranks = lru_on_ranks(offsets, n_experts, capacity)
    elif on_ranks and capacity.shape[0] and min(int(capacity.max()), n_experts) > _LRU_RANKS_MAX:
        raise ValueError(f"sequential lru on ranks takes quotas up to {_LRU_RANKS_MAX}")
    if not global_scope and on_ranks:
        return _ranges(_replay_lru_seq_ranks, offsets, ev_layer, (n_experts, capacity), count_from,
                       (hits, misses, hit_flag, np.zeros(n_blocks, dtype=np.int16),
                        np.full(n_blocks, _RANK_OUT, dtype=np.uint8), np.zeros(n_layers, dtype=np.int64)))
    n_parts = 1 if global_scope else n_layers
    state = (np.full(n_blocks, -1, dtype=np.int32), np.full(n_blocks, -1, dtype=np.int32),
             np.full(n_parts, -1, dtype=np.int32), np.full(n_parts, -1, dtype=np.int32),
             np.zeros(n_parts, dtype=np.int64), np.zeros(n_blocks, dtype=np.bool_))
    return _ranges(_replay_lru_seq_global if global_scope else _replay_lru_seq, offsets, ev_layer,
                   (n_experts, capacity), count_from, (hits, misses, hit_flag, *state))


@jit_inline
def _lru_access(a, part, cap, base, expert, nxt, prv, head, tail, size, inc, record, hit_flag):
    """Access ``a`` of :func:`_replay_lru_seq` (partition ``part``, quota ``cap``, the block ``base`` plus the
    member's id): 1 where it hits. ``nxt`` / ``prv`` link each block towards the newer / older end of its
    partition's list (-1 at an end), ``head`` / ``tail`` the oldest / newest of each partition, ``inc`` whether a
    block is resident."""
    ul = _U(part)
    b = np.int32(base + expert[_U(a)])
    hit = inc[_U(b)]
    if hit:                                         # unlinked; it rejoins at the tail below
        q = prv[_U(b)]
        r = nxt[_U(b)]
        if q >= 0:
            nxt[_U(q)] = r
        else:
            head[ul] = r
        if r >= 0:
            prv[_U(r)] = q
        else:
            tail[ul] = q
        if record:
            hit_flag[_U(a)] = 1
    elif size[ul] >= cap:                           # the oldest leaves (where the quota admits any)
        if cap <= 0:
            return 0
        h = head[ul]
        hn = nxt[_U(h)]
        head[ul] = hn
        if hn >= 0:
            prv[_U(hn)] = -1
        else:
            tail[ul] = -1
        inc[_U(h)] = False
    else:
        size[ul] += 1
    t = tail[ul]                                    # the block joins as the newest (written out: _kernels._append,
    nxt[_U(b)] = -1                                 # signed indices and a call, took 1.07-1.30x the loop's time)
    prv[_U(b)] = t
    if t >= 0:
        nxt[_U(t)] = b
    else:
        head[ul] = b
    tail[ul] = b
    inc[_U(b)] = True
    return np.int64(hit)


@jit_inline
def _lru_event(i, part, cap, offsets, expert, ev_layer, n_experts, count_from, hits, misses, hit_flag, nxt, prv,
               head, tail, size, inc):
    """Event ``i`` of :func:`_replay_lru_seq` in partition ``part`` (quota ``cap``), its counts added."""
    record = hit_flag.shape[0] > 0
    layer = ev_layer[i]
    lo = offsets[i]
    n = offsets[i + 1] - lo
    n_hit = 0
    for k in range(n):
        n_hit += _lru_access(lo + k, part, cap, layer * n_experts, expert, nxt, prv, head, tail, size, inc, record,
                             hit_flag)
    _count(hits, misses, layer, n, n_hit, i >= count_from)


@jit_loop
def _replay_lru_seq(offsets, expert, ev_layer, n_experts, capacity, count_from, hits, misses, hit_flag, nxt, prv,
                    head, tail, size, inc):
    """The loop of :func:`replay_lru_seq` per layer: one event at a time (:data:`_LFRU_PAIR_LANE_BITS`)."""
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        _lru_event(i, layer, capacity[_U(layer)], offsets, expert, ev_layer, n_experts, count_from, hits, misses,
                   hit_flag, nxt, prv, head, tail, size, inc)


@jit_loop
def _replay_lru_seq_global(offsets, expert, ev_layer, n_experts, capacity, count_from, hits, misses, hit_flag, nxt,
                           prv, head, tail, size, inc):
    """The loop of :func:`replay_lru_seq` under global scope: one list (partition 0), one event at a time."""
    cap = capacity[0]
    for i in range(offsets.shape[0] - 1):
        _lru_event(i, 0, cap, offsets, expert, ev_layer, n_experts, count_from, hits, misses, hit_flag, nxt, prv,
                   head, tail, size, inc)


def lru_on_ranks(offsets, n_experts: int, capacity) -> bool:
    """Whether per-layer sequential ``lru`` runs on ranks (:func:`_replay_lru_seq_ranks`): every layer's quota, at most
    ``n_experts``, is at most :data:`_LRU_RANKS_MAX` and at most :data:`_LRU_RANKS_PER_MEMBER` times the stream's
    mean event."""
    n_events = offsets.shape[0] - 1
    if n_events <= 0 or capacity.shape[0] == 0:
        return True
    most = min(int(capacity.max()), n_experts)
    return most <= _LRU_RANKS_MAX and most * n_events <= _LRU_RANKS_PER_MEMBER * int(offsets[-1] - offsets[0])


@jit_inline
def _rank_hit(i, r, m, c):
    """The ``i``-th access of an event (from 0) to a block of rank ``r`` at the event's start (``_RANK_OUT``: not
    resident), quota ``c``, the ranks of the earlier members that were held as the bits of ``m``: ``(hit, held, m``
    with ``r``'s bit set where held``)``. It hits where ``i + r - below < c``, ``below`` the bits of ``m`` under ``r``;
    no branch on the outcome (a rank not held is masked to any bit: the access misses either way)."""
    held = r < _LRU_RANKS_MAX
    rr = r & (_LRU_RANKS_MAX - 1)
    below = np.int64(_popc(m & ((np.uint64(1) << np.uint64(rr)) - np.uint64(1))))
    hit = held & (i + rr - below < c)
    return hit, held, m | ((np.uint64(1) << np.uint64(rr)) & (np.uint64(0) - np.uint64(held)))


@jit_inline
def _rank_front(P, rank, base, expert, lo, n, k_end):
    """The event's last ``k_end`` members (of ``n`` from ``lo``), newest first, into the list's first places."""
    for k in range(k_end):
        x = expert[_U(lo + n - 1 - k)]
        P[_U(base + k)] = x
        rank[_U(base + x)] = np.uint8(k)


@jit_loop
def _replay_lru_seq_ranks(offsets, expert, ev_layer, n_experts, capacity, count_from, hits, misses, hit_flag, P,
                          rank, size):
    """:func:`replay_lru_seq` per layer, an event at a time and no branch on an access's outcome (quotas up to
    :data:`_LRU_RANKS_MAX`: :func:`lru_on_ranks`). ``P[l N : l N + size[l]]`` is layer ``l``'s recency list, newest
    first (its members' ids), ``rank[l N + e]`` the position of its expert ``e`` there (``_RANK_OUT``: not resident).

    An event's members are distinct, and each access moves its block to the front: before the event's ``i``-th
    access (from 0) the list is the ``i`` members before it, newest first, then the list at the event's start less
    those of them it held, cut at the quota ``c``. So that access hits where its block's rank ``r`` at the start
    satisfies ``i + r - below < c``, ``below`` the earlier members whose rank at the start was lower than ``r``
    (:func:`_rank_hit`). After the event the list is its last ``c`` members, newest first, where it has at least
    ``c``; else all of them, then the list at its start less its members, cut at ``c`` (one pass from the back, each
    kept entry moved up by the members that joined less those that left from before it; a member's rank byte reads
    ``_RANK_MEMBER`` meanwhile). Only the first ``c`` accesses of an event can hit (the ``i`` before them are already
    ``c``)."""
    record = hit_flag.shape[0] > 0
    for e in range(offsets.shape[0] - 1):
        layer = ev_layer[e]
        ul = _U(layer)
        c = min(capacity[ul], n_experts)
        lo = offsets[e]
        n = offsets[e + 1] - lo
        base = layer * n_experts
        s = size[ul]
        m = np.uint64(0)
        n_hit = 0
        if n >= c:                                  # the list becomes the event's last c members
            for i in range(c):
                a = lo + i
                hit, _, m = _rank_hit(i, np.int64(rank[_U(base + expert[_U(a)])]), m, c)
                n_hit += hit
                if record:
                    hit_flag[_U(a)] = hit
            for p in range(s):
                rank[_U(base + P[_U(base + p)])] = _RANK_OUT
            _rank_front(P, rank, base, expert, lo, n, c)
            size[ul] = c
        else:
            held_n = 0
            for i in range(n):
                a = lo + i
                b = _U(base + expert[_U(a)])
                hit, held, m = _rank_hit(i, np.int64(rank[b]), m, c)
                rank[b] = _RANK_MEMBER
                held_n += held
                n_hit += hit
                if record:
                    hit_flag[_U(a)] = hit
            w = n + s - held_n - 1                  # where the oldest entry kept goes
            for p in range(s - 1, -1, -1):          # (w >= p: each entry is read before its place is written)
                x = P[_U(base + p)]
                kept = rank[_U(base + x)] != _RANK_MEMBER
                P[_U(base + w)] = x
                rank[_U(base + x)] = (np.uint8(w) if w < c else _RANK_OUT) if kept else _RANK_MEMBER
                w -= kept
            _rank_front(P, rank, base, expert, lo, n, n)
            size[ul] = min(c, n + s - held_n)
        _count(hits, misses, layer, n, n_hit, e >= count_from)


def replay_lfu_seq(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, reset_freq_on_evict,
                   count_from, hits, misses, hit_flag):
    """Sequential (one unit per access, in the order of ``expert``), per-layer ``lfu``: the decision of
    :func:`._kernels.replay_heap`.

    A block's count rises at each of its accesses (back to 0 when it leaves, under ``reset_freq_on_evict``); the
    lowest ``(count, tie)`` of a layer's residents and the accessed block leaves. Parameters are those of
    :func:`._kernels_bits.replay_lfu_bits`; ``expert`` in access order (ascending per event, or shuffled for
    sequential-random). Counts and residents are allocated here.
    """
    lfu_seq_ranges(offsets, ev_layer, n_experts, n_layers, capacity, tie_pos, reset_freq_on_evict, count_from, hits,
                   misses, hit_flag)(expert, 0, offsets.shape[0] - 1)


def lfu_seq_ranges(offsets, ev_layer, n_experts, n_layers, capacity, tie_pos, reset_freq_on_evict, count_from, hits,
                   misses, hit_flag):
    """:func:`replay_lfu_seq` by ranges of events (:func:`_ranges`): its counts, residents and bounds allocated
    here (:func:`_replay_lfu_seq`, or :func:`_replay_lfu_seq_reset` under ``reset_freq_on_evict``)."""
    n_blocks = n_layers * n_experts
    tbits = _tie_bits(n_experts)
    most = int(_most_layer_accesses(offsets, ev_layer, n_layers))
    caps = np.minimum(np.asarray(capacity, dtype=np.int64), n_experts)
    order = np.empty(n_blocks, dtype=np.int32)         # the expert at each (layer, tie position)
    tp = np.asarray(tie_pos, dtype=np.int64)
    order[(np.arange(n_blocks) // max(n_experts, 1)) * n_experts + tp] = np.arange(n_blocks) % max(n_experts, 1)
    low = np.where(caps > 0, 0, _LFU_NONE).astype(np.int64)    # a quota of 0: every miss leaves at once
    loop = _replay_lfu_seq_reset if reset_freq_on_evict else _replay_lfu_seq
    return _ranges(loop, offsets, ev_layer, (n_experts, caps, tp.astype(np.int32), order, tbits), count_from,
                   (hits, misses, hit_flag, np.zeros(n_blocks, dtype=np.int64 if most >= LFU_COUNT32_MAX else np.int32),
                    np.zeros(n_blocks, dtype=np.bool_), np.zeros(n_layers, dtype=np.int64), low))


@jit_helper
def _lfu_lowest_key(cnt, res, tie_pos, base, n, tbits):
    """The smallest packed key ``count << tbits | tie position`` of the layer's residents (blocks ``base .. base + n
    - 1``; :data:`_LFU_NONE` where none is): one vectorized pass."""
    m = _LFU_NONE
    for e in range(base, base + n):
        k = (np.int64(cnt[_U(e)]) << tbits) | np.int64(tie_pos[_U(e)])
        k = k if res[_U(e)] else _LFU_NONE
        m = k if k < m else m
    return m


@jit_helper
def _lfu_seq_miss(b, f, layer, base, n, cap, tie_pos, order, tbits, reset, cnt, res, size, low):
    """A miss of block ``b`` (count ``f``, this access's included) that may join: the layer fills, or its key is at
    least ``low[layer]``, a bound below every resident's key. Where the layer is full, the smallest key of its
    residents (one pass) leaves, or the block does where it is lower; ``low[layer]`` becomes that key (the keys of
    the residents after it are above it, and a hit only raises a key). Under ``reset`` the count is stored again
    where the block joins (the loop stored 0) and forgotten where a resident leaves."""
    ul = _U(layer)
    if size[ul] < cap:                              # the layer fills
        res[_U(b)] = True
        if reset:
            cnt[_U(b)] = f
        size[ul] += 1
        if size[ul] == cap:
            low[ul] = _lfu_lowest_key(cnt, res, tie_pos, base, n, tbits)
        return
    k = (np.int64(f) << tbits) | np.int64(tie_pos[_U(b)])
    if k < low[ul]:                                 # below the bound: it leaves at once
        return
    m = _lfu_lowest_key(cnt, res, tie_pos, base, n, tbits)
    low[ul] = m
    if k < m:
        return
    v = _U(base + order[_U(base + (m & ((1 << tbits) - 1)))])
    res[v] = False
    if reset:
        cnt[v] = 0
        cnt[_U(b)] = f
    res[_U(b)] = True


@jit_loop
def _replay_lfu_seq(offsets, expert, ev_layer, n_experts, capacity, tie_pos, order, tbits, count_from, hits, misses,
                    hit_flag, cnt, res, size, low):
    """The loop of :func:`replay_lfu_seq` with counts kept: ``cnt`` / ``res`` each block's count and whether it is
    resident, ``size[l]`` layer ``l``'s residents, ``low[l]`` a bound at or below the smallest packed key
    ``count << tbits | tie position`` of its residents (0 while it fills; :data:`_LFU_NONE` for a quota of 0). A hit,
    and a miss whose count is below the bound's (it leaves at once: nearly every miss), take no branch on the
    outcome: one compare; the rest go to :func:`_lfu_seq_miss`. One event at a time (:func:`_paired` measured no
    faster, docs/performance.md, *Session 34*)."""
    record = hit_flag.shape[0] > 0
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        ul = _U(layer)
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        t = low[ul] >> tbits
        n_hit = 0
        for a in range(lo, hi):
            b = base + expert[_U(a)]
            f = cnt[_U(b)] + 1
            hit = res[_U(b)]
            cnt[_U(b)] = f
            n_hit += np.int64(hit)
            if record:
                hit_flag[_U(a)] = hit
            if np.int64(f) - (np.int64(hit) << 40) < t:     # a hit, or a miss below every resident
                continue
            _lfu_seq_miss(b, f, layer, base, n_experts, capacity[ul], tie_pos, order, tbits, False, cnt, res, size,
                          low)
            t = low[ul] >> tbits
        _count(hits, misses, layer, hi - lo, n_hit, i >= count_from)


@jit_loop
def _replay_lfu_seq_reset(offsets, expert, ev_layer, n_experts, capacity, tie_pos, order, tbits, count_from, hits,
                          misses, hit_flag, cnt, res, size, low):
    """:func:`_replay_lfu_seq` under ``reset_freq_on_evict``, where nearly every miss has the lowest count (a block
    that left forgot its count): the one compare is of the packed key against the bound, the count stored by a
    select (0 for a miss; :func:`_lfu_seq_miss` stores it again where the block joins)."""
    record = hit_flag.shape[0] > 0
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        ul = _U(layer)
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        t = low[ul]
        n_hit = 0
        for a in range(lo, hi):
            b = base + expert[_U(a)]
            f = cnt[_U(b)] + 1
            hit = res[_U(b)]
            q = np.int64(tie_pos[_U(b)])
            cnt[_U(b)] = f if hit else 0
            n_hit += np.int64(hit)
            if record:
                hit_flag[_U(a)] = hit
            if ((np.int64(f) << tbits) | q) - (np.int64(hit) << 62) < t:    # a hit, or a miss below every resident
                continue
            _lfu_seq_miss(b, f, layer, base, n_experts, capacity[ul], tie_pos, order, tbits, True, cnt, res, size,
                          low)
            t = low[ul]
        _count(hits, misses, layer, hi - lo, n_hit, i >= count_from)


@intrinsic
def _f32_bits(typingctx, x):
    """The bits of a float32 as an int32."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int32))
    return sig, codegen


@jit_helper
def _packed_value(x, tp, hmask):
    """A value's packed key: float32 ``x`` (0 below the floor of values) with its low bits replaced by ``tp``."""
    v = np.float32(x) if x >= _LRFU_TINY else np.float32(0.0)
    return np.int32((_f32_bits(v) & hmask) | tp)


def replay_belady_seq(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, access_next, forced,
                      count_from, hits, misses, hit_flag):
    """Sequential (one unit per access, in the order of ``expert``), per-layer ``belady`` (``forced`` false: a miss
    whose next use is the farthest is not admitted) or ``belady-forced``: the decision of
    :func:`._kernels.replay_belady`, whose 8-ary heap sifted at every access (about 30 ns an access on the benchmark
    stream).

    A layer's residents sit in slots (:func:`_n_slots`, as ``lrfu``'s and ``lfru``'s), each holding a packed key ``next_use << tbits |
    (2**tbits - 1 - tp)`` (the farthest next use leaves first, then the lower tie position; -1 in a free slot). A hit
    only raises its block's key (its next use moves on), so the layer's largest key is kept through its accesses by
    a maximum and sought again, by one vectorized pass over the layer's slots, only at the eviction after the one
    that took it; the block that comes in takes the leaving one's slot. ``access_next`` is
    :func:`._kernels.next_use`'s for one unit per access; ``tie_pos`` each block's position in its layer by ascending
    tie rank (``N <= 1024``); the other parameters are those of ``replay_belady``."""
    tbits = _tie_bits(n_experts)
    npad = (n_experts + 63) // 64 * 64
    n_slots = _n_slots(capacity, n_experts)
    _replay_belady_seq(offsets, expert, ev_layer, n_experts, capacity, tie_pos.astype(np.int32), access_next, tbits,
                       bool(forced), count_from, hits, misses, hit_flag, np.full(n_layers * n_slots, -1, np.int64),
                       np.full(n_layers * npad, -1, np.int32), np.zeros(n_layers, dtype=np.int64),
                       np.full(n_layers, -1, dtype=np.int64))


@jit_helper
def _largest(rk, o, n):
    """The largest of -1 and ``rk[o:o + n]``: one vectorized reduction."""
    m = np.int64(-1)
    for q in range(o, o + n):
        m = max(m, rk[_U(q)])
    return m


@jit_loop
def _replay_belady_seq(offsets, expert, ev_layer, n_experts, capacity, tie_pos, access_next, tbits, forced,
                       count_from, hits, misses, hit_flag, rk, slot, size, maxk):
    """The loop of :func:`replay_belady_seq`: ``rk[l * S + s]`` the packed key in layer ``l``'s slot ``s`` (``S``
    slots a layer; -1: free), ``slot[l * 64 W + j]`` the slot of layer ``l``'s tie position ``j`` (-1: not
    resident), ``size[l]`` the layer's residents, ``maxk[l]`` its largest key where known (-1 where not)."""
    record = hit_flag.shape[0] > 0
    npad = (n_experts + 63) // 64 * 64
    n_slots = rk.shape[0] // maxk.shape[0]
    mask = (np.int64(1) << tbits) - 1
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        ul = _U(layer)
        cap = min(capacity[ul], n_experts)
        base = layer * n_experts
        pbase = layer * npad
        sbase = layer * n_slots
        lo = offsets[i]
        n = offsets[i + 1] - lo
        n_hit = 0
        mk = maxk[ul]
        tpn = np.int64(tie_pos[_U(base + expert[_U(lo)])]) if n > 0 else 0
        for a in range(lo, lo + n):    # the next access's tie position read before this access's outcome (as the
                                       # lfru loops, _LFRU_AHEAD_BITS): `kernel_ab.py --kernel belady-seq` 0.89-0.90
                                       # / 0.89 / 0.98 of the time at rho 0.1 / 0.2 / 0.4 (at batch 1 0.90 / 0.96 /
                                       # 0.99; docs/performance.md, *Session 65*)
            tp = tpn
            if a + 1 < lo + n:
                tpn = np.int64(tie_pos[_U(base + expert[_U(a + 1)])])
            j = _U(pbase + tp)
            key = (np.int64(access_next[_U(a)]) << tbits) | (mask - tp)
            s = np.int64(slot[j])
            if s >= 0:                 # a hit: its key rises (its next use moves on), and so may the largest
                old = rk[_U(sbase + s)]
                rk[_U(sbase + s)] = key
                n_hit += 1
                if record:
                    hit_flag[_U(a)] = 1
                if mk >= 0:            # (a key that fell from the largest: sought again; no next use falls)
                    mk = key if key > mk else (-1 if old == mk else mk)
            elif size[ul] < cap:       # the layer fills
                s = size[ul]
                slot[j] = s
                rk[_U(sbase + s)] = key
                size[ul] = s + 1
                mk = max(mk, key) if mk >= 0 else mk
            else:
                if mk < 0:
                    mk = _largest(rk, sbase, n_slots)
                if mk < 0 or (key > mk and not forced):     # no resident (a quota of 0), or the farthest next use:
                    continue                                # the block leaves at once
                v = _U(pbase + (mask - (mk & mask)))        # the farthest resident leaves; the block takes its slot
                s = np.int64(slot[v])
                slot[v] = -1
                slot[j] = s
                rk[_U(sbase + s)] = key
                mk = -1
        maxk[ul] = mk
        _count(hits, misses, layer, n, n_hit, i >= count_from)


def replay_lrfu_seq(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, lam, count_from, hits,
                    misses, hit_flag, on_ranks=None):
    """Sequential (one unit per access), per-layer ``lrfu``: the decision of :func:`._kernels.replay_heap`.

    Where every quota is at most 64, ``lam``'s window of units at most 64 and the stream's events large enough
    (:func:`lrfu_on_ranks`), each layer's residents are ranks in key order
    and an event is replayed whole (:mod:`._kernels_lrfu_ranks`); ``on_ranks`` True / False forces that loop / the
    loops below, None chooses by :func:`lrfu_on_ranks`.

    A block's CRF and last unit follow :func:`._kernels.crf_update` at each of its accesses (a layer's units
    count its accesses); the lowest ``(key, tie)`` (:func:`._kernels.crf_key`) of a layer's residents and the
    accessed block leaves. A resident's packed key is its value ``S * 2**(lam (u - R))`` (``R`` the layer's base
    unit, moved to the unit when ``lam (u - R)`` would pass 90, where every resident's value is computed again from
    its CRF and last unit; values below ``2**-110`` are 0) as float32, its low ``tbits`` bits replaced by its tie
    position. A value's error against ``2**(key - lam R)`` stays below the margin ``delta`` of
    :func:`._kernels_bits._lrfu_margin` (which grows with the unit: taken once, at the largest unit of the replay,
    :func:`_lrfu_range_ulps`), and packing costs at most ``2**(tbits - 23)`` of it; so a block whose
    value exceeds the smallest by more than those margins ranks above it, and where another block lies within them
    (a second pass finds the next smallest) the exact keys of those blocks decide. Parameters are those of
    :func:`._kernels_bits.replay_lrfu_bits` without ``pages``.
    """
    lrfu_seq_ranges(offsets, ev_layer, n_experts, n_layers, capacity, tie_pos, lam, count_from, hits, misses,
                    hit_flag, on_ranks)(expert, 0, offsets.shape[0] - 1)


def lrfu_on_ranks(offsets, n_experts: int, capacity, lam: float) -> bool:
    """Whether per-layer sequential ``lrfu`` runs on ranks (:mod:`._kernels_lrfu_ranks`): the loop takes the quotas and
    ``lam`` (:func:`._kernels_lrfu_ranks.fits`) and the stream's mean event has at least
    :data:`_LRFU_RANKS_MIN_EVENT` members, or at least :data:`_LRFU_RANKS_SMALL_EVENT` where every quota is at most
    :data:`_LRFU_RANKS_PER_MEMBER` times it."""
    n_events = offsets.shape[0] - 1
    if not KRK.fits(lam, n_experts, capacity):
        return False
    if n_events <= 0:
        return True
    n_acc = int(offsets[-1] - offsets[0])
    most = min(int(capacity.max()), n_experts) if capacity.shape[0] else 0
    return n_acc >= _LRFU_RANKS_MIN_EVENT * n_events or (
        n_acc >= _LRFU_RANKS_SMALL_EVENT * n_events and most * n_events <= _LRFU_RANKS_PER_MEMBER * n_acc)


def lrfu_seq_ranges(offsets, ev_layer, n_experts, n_layers, capacity, tie_pos, lam, count_from, hits, misses,
                    hit_flag, on_ranks=None):
    """:func:`replay_lrfu_seq` by ranges of events (:func:`_ranges`): its state allocated here. ``on_ranks`` as
    :func:`replay_lrfu_seq`'s."""
    if on_ranks is None:
        on_ranks = lrfu_on_ranks(offsets, n_experts, capacity, lam)
    elif on_ranks and not KRK.fits(lam, n_experts, capacity):
        raise ValueError(f"sequential lrfu on ranks takes quotas up to {KRK.RANKS_MAX}, a window of units up to "
                         f"{KRK.MAX_WINDOW} (lambda 0.07 or more) and up to 32,768 experts a layer")
    if on_ranks:
        return _ranges(KRK.replay_lrfu_ranks, offsets, ev_layer, (n_experts, capacity, tie_pos.astype(np.int32)),
                       count_from, (hits, misses, hit_flag, *KRK.lrfu_ranks_state(offsets, n_experts, n_layers, lam)))
    tbits = _tie_bits(n_experts)
    npad = (n_experts + 63) // 64 * 64
    n_units = int(_most_layer_accesses(offsets, ev_layer, n_layers))
    lam = float(lam)
    n_scale = min(n_units + 1, _LRFU_DECAYS)
    if lam > 0.0:
        n_scale = min(n_scale, int(_LRFU_SPAN / lam) + 1)             # lam * (n_scale - 1) <= _LRFU_SPAN
    scale = 2.0 ** (lam * np.arange(n_scale, dtype=np.float64))
    ns = _n_slots(capacity, n_experts)
    n_tab = min(n_units + 1, int(LRFU_DECAY_ZERO / lam) + 2) if lam > 0.0 else 1
    if ns in WIDTHS and n_tab <= _LRFU_SLOT_DECAYS:
        P = crf_decays(lam, max(n_tab, 2))
        return _ranges(_replay_lrfu_seq_v, offsets, ev_layer, (n_experts, capacity, tie_pos.astype(np.int32), lam),
                       count_from,
                       (hits, misses, hit_flag, np.zeros(2 * n_layers * npad),
                        np.full(n_layers * npad if ns > 1 << _TP_LANE_BITS else 0, -1, np.int32),
                        np.full(n_layers * ns, _EMPTY32), np.full(n_layers * ns, -1, np.int32),
                        np.zeros(n_layers, np.int64), np.zeros(n_layers, np.int64), np.zeros(n_layers, np.int64), P,
                        1.0 if lam == 0.0 else 0.0, scale, ns, _tp_first_buffer(offsets, ns, _LRFU_TP_FIRST_BITS),
                        Lanes(ns)))
    return _ranges(_replay_lrfu_seq, offsets, ev_layer, (n_experts, capacity, tie_pos.astype(np.int32), tbits, lam),
                   count_from,
                   (hits, misses, hit_flag, np.tile(np.array([0.0, -1.0]), n_layers * npad),
                    np.full(n_layers * npad, _EMPTY32), np.zeros(n_layers, dtype=np.int64),
                    np.zeros(n_layers, dtype=np.int64), np.zeros(n_layers, dtype=np.int64),
                    np.full(n_layers, -1, dtype=np.int64), crf_decays(lam, min(n_units + 1, _LRFU_DECAYS)), scale))


@jit_helper
def _lrfu_seq_exact(S, rk, pbase, npad, thr, lam, j, s, u, tp, take_new):
    """The lane (or ``-1``: the accessed block at lane ``j``, CRF ``s`` at unit ``u``, tie position ``tp``, when
    ``take_new``) of the lowest exact ``(key, tie position)`` among the residents whose packed key is at most
    ``thr``."""
    best = -1
    bk = np.inf
    bt = 1 << 30
    if take_new:
        bk = crf_key(s, float(u), lam)
        bt = tp
    for q in range(pbase, pbase + npad):
        if q != j and rk[_U(q)] <= thr:
            k = crf_key(S[_U(2 * q)], S[_U(2 * q + 1)], lam)
            if _below(k, q - pbase, bk, bt):
                bk = k
                bt = q - pbase
                best = q
    return best


@jit_inline
def _lrfu_ulps(u, lam, bits):
    """The margin of two packed lrfu keys at unit ``u`` (their low ``bits`` bits a tie position or a slot's index)
    in float32 units in the last place: ``8 delta`` (:func:`._kernels_bits._lrfu_margin`; a relative ``delta`` spans
    at most ``delta * 2**24`` units), packing's and the low bits' ``3 * 2**bits``, and one."""
    return np.int64(_lrfu_margin(u, lam) * 2.0 ** 27) + 3 * (1 << bits) + 1


@jit_inline
def _lrfu_range_ulps(offsets, lunits, lam, bits):
    """:func:`_lrfu_ulps` at the largest unit that a layer reaches in a range of events (``lunits`` its layers'
    units before it): a bound for every access of the range, since the margin grows with the unit, and a wider
    margin only sends more decisions to the exact keys. Once a range, not at each eviction: 0.89-0.93 of the
    loop's time at rho 0.1-0.4 (docs/performance.md, *Session 39*)."""
    umax = 0
    for la in range(lunits.shape[0]):
        umax = max(umax, lunits[la])
    return _lrfu_ulps(umax + offsets[offsets.shape[0] - 1] - offsets[0], lam, bits)


@jit_inline
def _lrfu_access(a, layer, cap, base, pbase, npad, tie_pos, expert, tbits, lam, d, S, rk, size, lunits, ubase, low,
                 P, scale, record, hit_flag):
    """Access ``a`` of :func:`_replay_lrfu_seq` (layer ``layer``, quota ``cap``): 1 where it hits."""
    ul = _U(layer)
    tmask = np.int32((1 << tbits) - 1)
    hmask = np.int32(-(1 << tbits))
    empty = _EMPTY32
    tp = np.int64(tie_pos[_U(base + expert[_U(a)])])
    j = pbase + tp
    u = lunits[ul]
    lunits[ul] = u + 1
    g = u - ubase[ul]
    if g >= scale.shape[0]:                         # the base moves to this unit: every resident's value again
        for q in range(pbase, pbase + npad):
            if rk[_U(q)] != empty:
                rk[_U(q)] = _packed_value(S[_U(2 * q)] * _lrfu_decay(P, lam, u - np.int64(S[_U(2 * q + 1)])),
                                          q - pbase, hmask)
        ubase[ul] = u
        low[ul] = -1
        g = 0
    s0 = S[_U(2 * j)]
    s = 1.0 + s0 * _lrfu_decay(P, lam, u - np.int64(S[_U(2 * j + 1)])) if s0 > 0.0 else 1.0
    S[_U(2 * j)] = s
    S[_U(2 * j + 1)] = float(u)
    key = np.int64(_packed_value(s * scale[_U(g)], tp, hmask))
    old = rk[_U(j)]
    if old != empty:                                # a hit: its key rises
        rk[_U(j)] = key
        if old == low[ul]:
            low[ul] = -1
        if record:
            hit_flag[_U(a)] = 1
        return 1
    m = low[ul]
    if size[ul] < cap:
        rk[_U(j)] = key
        size[ul] += 1
        if m >= 0 and key < m:
            low[ul] = key
        return 0
    if m < 0:
        m = np.int64(_smallest(rk, pbase, npad, empty))
    if m == empty:                                  # a quota of 0
        return 0
    mh = m & hmask
    if (key & hmask) + d < mh:                      # below every resident by more than the margins: it leaves
        low[ul] = m
        return 0
    thr = (max(mh, _TINY_BITS) + d) | tmask         # a block whose packed key is above ranks above the smallest
    if key > thr:
        m2 = np.int64(_next_smallest(rk, pbase, npad, np.int32(m), empty))
        if m2 > thr:                                # the smallest alone within the margins: it leaves
            rk[_U(pbase + (m & tmask))] = empty
            rk[_U(j)] = key
            low[ul] = min(m2, key)
            return 0
    v = _lrfu_seq_exact(S, rk, pbase, npad, thr, lam, j, s, u, tp, key <= thr)
    if v >= 0:                                      # decided by exact keys
        rk[_U(v)] = empty
        rk[_U(j)] = key
    low[ul] = -1
    return 0


@jit_loop
def _replay_lrfu_seq(offsets, expert, ev_layer, n_experts, capacity, tie_pos, tbits, lam, count_from, hits, misses,
                     hit_flag, S, rk, size, lunits, ubase, low, P, scale):
    """The loop of :func:`replay_lrfu_seq`: ``S[2 q]`` / ``S[2 q + 1]`` (``q = l * 64 W + j``) the CRF / last unit
    (as a float; ``-1``: none) of layer ``l``'s tie position ``j``, side by side so that an access reads one line
    (separate arrays took 1.10x the time: 96 KiB of them at 48 x 128, past the first-level cache), ``rk`` its
    packed key while it is resident (else ``_EMPTY32``), ``size`` / ``lunits`` / ``ubase`` each layer's residents,
    units so far and base unit, ``low`` its smallest
    packed key where known (else -1: after a move of the base, a hit on it, a decision by exact keys); ``P[g] =
    2**(-lam g)``, ``scale[g] = 2**(lam g)``.

    Margins are counted in float32 units in the last place: values whose bits (tie positions masked) differ by
    more than ``r 2**24`` differ by more than a factor ``1 + r`` (an ulp is at least ``2**-24`` of a value), and
    ``r`` covers the margin ``8 delta`` and what packing takes off, ``2**(tbits - 23)`` of a value (``2**(tbits +
    1)`` ulps); ``2**tbits`` more for the tie positions' bits. Two events of different layers run side by side
    (:func:`_paired`)."""
    record = hit_flag.shape[0] > 0
    npad = (n_experts + 63) // 64 * 64
    n_events = offsets.shape[0] - 1
    d = _lrfu_range_ulps(offsets, lunits, lam, tbits)
    i = 0
    while i < n_events:
        two, la, ca, lo, na, lb, cb, lob, nb = _pair(offsets, ev_layer, capacity, i, n_events, True)
        ha = 0
        hb = 0
        for k in range(max(na, nb)):
            if k < na:
                ha += _lrfu_access(lo + k, la, ca, la * n_experts, la * npad, npad, tie_pos, expert, tbits, lam, d,
                                   S, rk, size, lunits, ubase, low, P, scale, record, hit_flag)
            if k < nb:
                hb += _lrfu_access(lob + k, lb, cb, lb * n_experts, lb * npad, npad, tie_pos, expert, tbits, lam,
                                   d, S, rk, size, lunits, ubase, low, P, scale, record, hit_flag)
        _count(hits, misses, la, na, ha, i >= count_from)
        _count(hits, misses, lb, nb, hb, two and i + 1 >= count_from)
        i += 2 if two else 1


@jit_helper
def _lrfu_slot_exact(S, sK, sTP, so, pbase, n, thr, lam, s, u, tp, take_new):
    """The slot (or -1: the accessed block, CRF ``s`` at unit ``u``, tie position ``tp``, when ``take_new``) of the
    lowest exact ``(key, tie position)`` among the ``n`` slots from ``so`` whose packed key is at most ``thr``."""
    best = -1
    bk = np.inf
    bt = 1 << 30
    if take_new:
        bk = crf_key(s, float(u), lam)
        bt = tp
    for v in range(n):
        if sK[_U(so + v)] <= thr:
            q = np.int64(sTP[_U(so + v)])
            k = crf_key(S[_U(2 * (pbase + q))], float(_unit_of(S[_U(2 * (pbase + q) + 1)])), lam)
            if _below(k, q, bk, bt):
                bk = k
                bt = q
                best = v
    return best


@jit_inline
def _unit_of(x):
    """A last unit kept as the bits of a float64 beside its CRF (:func:`_replay_lrfu_seq_v`'s ``S``)."""
    return np.int64(f2u(x))


@jit_inline
def _decay_at(P, beyond, gap):
    """``crf_decay(lam, gap)`` from its table ``P``, ``beyond`` past it (where every gap past it decays alike)."""
    return P[_U(gap)] if gap < P.shape[0] else beyond


@jit_inline
def _lrfu_next(TP, first, tie_pos, base, pbase, expert, S, lo, k):
    """The tie position of an event's access ``k`` (its first access at ``lo``; from ``TP`` where ``first``) and its
    block's CRF and last unit (``S[2 j]``, ``S[2 j + 1]``): ``(tp, c0, c1)``, as :func:`_lfru_next` for ``lrfu``."""
    tp = np.int64(TP[_U(k)]) if first else _tie_position(tie_pos, base, expert, lo + k)
    j = pbase + tp
    return tp, S[_U(2 * j)], S[_U(2 * j + 1)]


@jit_inline
def _lrfu_vaccess(a, cap, pbase, so, tp, c0, c1, lam, d, S, slot, sK, sTP, n, u, ub, K, T, P, beyond, scale, record,
                  hit_flag, lanes):
    """Access ``a`` of :func:`_replay_lrfu_seq_v` to the block of tie position ``tp`` (its CRF ``c0`` and last unit
    ``c1``, ``S[2 j]`` and ``S[2 j + 1]``, read by the loop one access ahead; quota ``cap``, slots from
    ``so``, the layer's unit ``u``, base unit ``ub``, residents ``n``, their packed keys ``K`` in registers, and up to
    ``2**_TP_LANE_BITS`` slots their tie positions ``T``): ``(1 where it hits, n, ub, K, T)``. A decay is
    ``P[gap]``, or ``beyond`` past the table (:func:`lrfu_seq_ranges`)."""
    sbits = lane_bits(lanes)
    in_regs = sbits <= _TP_LANE_BITS
    smask = np.int64((1 << sbits) - 1)
    hmask = np.int32(-(1 << sbits))
    g = u - ub
    if g >= scale.shape[0]:                         # the base moves to this unit: every resident's value again
        if in_regs:
            vstore(sTP, so, T)
        for v in range(n):
            q = pbase + np.int64(sTP[_U(so + v)])
            sK[_U(so + v)] = _packed_value(S[_U(2 * q)] * _decay_at(P, beyond, u - _unit_of(S[_U(2 * q + 1)])), v,
                                           hmask)
        ub = u
        g = 0
        K = vload(sK, so, lanes)
    j = pbase + tp
    s = 1.0 + c0 * _decay_at(P, beyond, u - _unit_of(c1))     # (1.0 at a first access)
    S[_U(2 * j)] = s
    S[_U(2 * j + 1)] = u2f(np.uint64(u))
    kh = np.int64(_f32_bits(np.float32(s * scale[_U(g)])) & hmask)        # (at least 1: no floor of values)
    v = ifind(T, tp) if in_regs else np.int64(slot[_U(j)])     # its slot, where it is resident
    hit = v >= 0
    if hit:
        if record:
            hit_flag[_U(a)] = 1
    elif n < cap:
        v = n
        n += 1
        if not in_regs:
            _slot_put(v, j, tp, so, slot, sTP)
    elif cap <= 0:
        return 0, n, ub, K, T
    else:
        m = ilowest(K)
        mh = m & np.int64(hmask)
        if kh + d < mh:                             # below every resident by more than the margins: it leaves
            return 0, n, ub, K, T
        thr = (max(mh, _TINY_BITS) + d) | smask     # a block whose packed key is above ranks above the smallest
        if kh > thr and icount_le(K, thr) == 1:     # the smallest alone within the margins: it leaves
            if in_regs:                             # (its lane found by a vector compare)
                return 0, n, ub, ikey_lowest(K, np.int32(kh)), iset_lowest(T, K, np.int32(tp))
            v = m & smask
        else:                                       # decided by exact keys
            vstore(sK, so, K)
            if in_regs:
                vstore(sTP, so, T)
            v = _lrfu_slot_exact(S, sK, sTP, so, pbase, n, thr, lam, s, u, tp, kh <= thr)
            if v < 0:
                return 0, n, ub, K, T
        if not in_regs:
            _slot_take(v, j, tp, so, pbase, slot, sTP)
    return np.int64(hit), n, ub, vset(K, v, np.int32(kh | v)), vset(T, v, np.int32(tp)) if in_regs else T


@jit_loop
def _replay_lrfu_seq_v(offsets, expert, ev_layer, n_experts, capacity, tie_pos, lam, count_from, hits, misses,
                       hit_flag, S, slot, sK, sTP, size, lunits, ubase, P, beyond, scale, ns, TP, lanes):
    """:func:`replay_lrfu_seq` where a layer's residents fit ``ns`` (= ``lanes``' width: 16, 32 or 64) slots:
    ``S[2 q]`` the CRF of lane ``q = l * 64 W + j`` (0 before its first access: ``1 + 0 * decay`` is 1, as
    :func:`._kernels.crf_update` gives) and ``S[2 q + 1]`` its last unit as the bits of a float64 (0 at first, a
    gap that indexes the table), ``sK`` / ``sTP`` ``[l * ns + v]`` the packed key (the value, its low ``log2 ns``
    bits replaced by the slot's index; an empty slot ``_EMPTY32``) and the tie position (-1: none) of the block in
    slot ``v``. An event's layer's packed keys are held as one :class:`._vec.I32Vec` through its accesses: a miss
    past the quota takes the smallest by one reduction in registers (where the tie-position loop passes over the
    layer's lanes in memory twice) and a count of those within the margins by one compare. For 16 slots, and 32
    with AVX-512, the tie positions are held too, and an access finds its block's slot by one compare (``slot``
    unused; with the array, whose store at an eviction has an address known only after the reduction, the loop took
    1.04-1.11x the time there: :data:`_TP_LANE_BITS`); more slots keep ``slot[l * 64 W + j]``, the slot of layer
    ``l``'s tie position ``j`` while it is resident (else -1). Two events of different layers run side by side
    (:func:`_paired`) while their vectors fit the registers (:data:`_LRFU_PAIR_LANE_BITS`). From
    ``2**_LRFU_TP_FIRST_BITS`` slots the first event's tie positions are read into ``TP`` (as long as the widest
    event) when it begins."""
    record = hit_flag.shape[0] > 0
    in_regs = lane_bits(lanes) <= _TP_LANE_BITS
    npad = (n_experts + 63) // 64 * 64
    n_events = offsets.shape[0] - 1
    d = _lrfu_range_ulps(offsets, lunits, lam, lane_bits(lanes))
    i = 0
    while i < n_events:
        two, la, ca, lo, na, lb, cb, lob, nb = _pair(offsets, ev_layer, capacity, i, n_events,
                                                     lane_bits(lanes) <= _LRFU_PAIR_LANE_BITS)
        soa = la * ns
        sob = lb * ns
        Ka = vload(sK, soa, lanes)
        Kb = vload(sK, sob, lanes)
        Ta = vload(sTP, soa, lanes)
        Tb = vload(sTP, sob, lanes)
        sa = size[_U(la)]
        sb = size[_U(lb)]
        ua = lunits[_U(la)]
        ub_ = lunits[_U(lb)]
        ba = ubase[_U(la)]
        bb = ubase[_U(lb)]
        ha = 0
        hb = 0
        ea = la * n_experts
        eb = lb * n_experts
        first = lane_bits(lanes) >= _LRFU_TP_FIRST_BITS    # (a second event of a pair reads its own)
        if first:
            _read_tie_positions(TP, tie_pos, ea, expert, lo, na)
        pa = la * npad
        pb = lb * npad
        tpa, a0, a1 = _lrfu_next(TP, first, tie_pos, ea, pa, expert, S, lo, 0) if na > 0 else (0, 0.0, 0.0)
        tpb, b0, b1 = _lrfu_next(TP, False, tie_pos, eb, pb, expert, S, lob, 0) if nb > 0 else (0, 0.0, 0.0)
        for k in range(max(na, nb)):   # the next access's tie position, CRF and last unit read before this
            ta, x0, x1 = tpa, a0, a1       # access's decision, as the lfru loops do (_LFRU_AHEAD_BITS; at every
            tb, y0, y1 = tpb, b0, b1       # width here: `kernel_ab.py --kernel lrfu-seq --batch 1`, 0.89-0.96 of
                                           # the time at rho 0.1-0.5; docs/performance.md, *Session 65*)
            if k + 1 < na:
                tpa, a0, a1 = _lrfu_next(TP, first, tie_pos, ea, pa, expert, S, lo, k + 1)
            if k + 1 < nb:
                tpb, b0, b1 = _lrfu_next(TP, False, tie_pos, eb, pb, expert, S, lob, k + 1)
            if k < na:
                x, sa, ba, Ka, Ta = _lrfu_vaccess(lo + k, ca, pa, soa, ta, x0, x1, lam, d, S, slot, sK, sTP, sa, ua + k,
                                                  ba, Ka, Ta, P, beyond, scale, record, hit_flag, lanes)
                ha += x
            if k < nb:
                x, sb, bb, Kb, Tb = _lrfu_vaccess(lob + k, cb, pb, sob, tb, y0, y1, lam, d, S, slot, sK, sTP, sb,
                                                  ub_ + k, bb, Kb, Tb, P, beyond, scale, record, hit_flag, lanes)
                hb += x
        vstore(sK, soa, Ka)
        if in_regs:
            vstore(sTP, soa, Ta)
        size[_U(la)] = sa
        lunits[_U(la)] = ua + na
        ubase[_U(la)] = ba
        if two:
            vstore(sK, sob, Kb)
            if in_regs:
                vstore(sTP, sob, Tb)
            size[_U(lb)] = sb
            lunits[_U(lb)] = ub_ + nb
            ubase[_U(lb)] = bb
        _count(hits, misses, la, na, ha, i >= count_from)
        _count(hits, misses, lb, nb, hb, two and i + 1 >= count_from)
        i += 2 if two else 1


@intrinsic
def lfru_lowest(typingctx, R, L, off, n, t1, hmask, d):
    """The smallest packed lfru key of slots ``off .. off + n`` (``n`` a positive multiple of 16), and in bit 32
    whether another lies within ``d`` float32 units in the last place above it: each slot's key from the float32
    product ``R * (t1 - L)`` of its reciprocal count and age (:func:`._vec.packed_lfru_keys`: last units integers
    below ``2**24``, so the age is exact; the largest product, the smallest ``count / age``, has the smallest key),
    its low bits (``~hmask``) replaced by the slot's index from ``off``; another lies within when its packed key is
    at most ``((smallest & hmask) + d) | ~hmask``. One loop over groups of 16 slots keeps the two smallest per lane;
    the test is one vector compare of those against that bound."""
    sig = types.int64(R, L, types.int64, types.int64, types.float32, types.int32, types.int32)

    def codegen(context, builder, signature, args):
        R, L, off, n, t1, hmask, d = args
        v16f = ir.VectorType(ir.FloatType(), 16)
        v16i = ir.VectorType(_I32, 16)
        dR = context.make_array(signature.args[0])(context, builder, R).data
        dL = context.make_array(signature.args[1])(context, builder, L).data
        iota = ir.Constant(v16i, list(range(16)))
        big = _splat(builder, ir.Constant(_I32, 2**31 - 1), v16i, 16)
        nch = builder.lshr(n, ir.Constant(_I64, 4))
        pre = builder.block
        loop = builder.append_basic_block("lowest_loop")
        after = builder.append_basic_block("lowest_after")
        builder.branch(loop)
        builder.position_at_end(loop)
        c = builder.phi(_I64)
        m1 = builder.phi(v16i)
        m2 = builder.phi(v16i)
        idx = builder.add(off, builder.shl(c, ir.Constant(_I64, 4)))
        r = builder.load(builder.bitcast(builder.gep(dR, [idx]), v16f.as_pointer()), align=4)
        lst = builder.load(builder.bitcast(builder.gep(dL, [idx]), v16f.as_pointer()), align=4)
        lane = builder.add(iota, _splat(builder, builder.trunc(builder.shl(c, ir.Constant(_I64, 4)), _I32), v16i, 16))
        m1n, m2n = fold_two_lowest(builder, m1, m2, packed_lfru_keys(builder, r, lst, t1, hmask, lane, 16))
        cn = builder.add(c, ir.Constant(_I64, 1))
        c.add_incoming(ir.Constant(_I64, 0), pre)
        c.add_incoming(cn, loop)
        m1.add_incoming(big, pre)
        m1.add_incoming(m1n, loop)
        m2.add_incoming(big, pre)
        m2.add_incoming(m2n, loop)
        builder.cbranch(builder.icmp_signed("<", cn, nch), loop, after)
        builder.position_at_end(after)
        return lowest_and_near(builder, m1n, m2n, spread_min(builder, m1n), hmask, d)

    return sig, codegen


def replay_lfru_seq(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses,
                    hit_flag):
    """Sequential (one unit per access, the unit the access's index), per-layer ``lfru``: the decision of
    :func:`._kernels.replay_scan`.

    A block's key is ``freq / (t - last + 1)`` (float64, as ``replay_scan`` evaluates it), so every key drifts
    with the clock and the lowest is found again at each eviction. Every block's count (float32: integers below
    ``2**24``, the stream's bound) sits in an array over tie positions; a layer's residents also sit in ``s`` slots
    (its quota rounded up to 16), each holding the reciprocal of its count, its last unit (float32, so the age is
    exact) and its tie position (a block's last unit matters only while it is resident). An eviction runs
    :func:`lfru_lowest` over the slots: the float32 product ``age * (1 / count)`` (a multiplication where a
    division takes several times its latency: docs/performance.md, *Session 38*), within a factor ``1 + 2**-22`` of
    the exact ``age / count``, its bits flipped so that the
    largest product (the smallest key) is the smallest integer, its low ``sbits`` bits (those of a slot's index)
    replaced by the slot's index, so that the smallest names its slot. The smallest leaves where the next (and the
    accessed block's, from ``1 / count``: its age is 1) lie more than ``2**sbits + 2`` float32 units in the last
    place above it (two products more than 4 units apart order as their exact keys); otherwise the float64
    keys of the slots within that margin decide, ties to the lower tie position (packed keys that differ only in the
    slot's index are within it). Where the slots are 16, 32 or 64 (48 taken as 64), :func:`_replay_lfru_seq_v` holds
    an event's layer's reciprocal counts and last units in registers through its accesses; larger quotas run
    :func:`_replay_lfru_seq` on the slots in memory. Parameters are those of :func:`replay_lfu_seq` without
    ``reset_freq_on_evict``; streams of fewer than ``2**24`` accesses.
    """
    lfru_seq_ranges(offsets, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses, hit_flag)(
        expert, 0, offsets.shape[0] - 1)


def lfru_seq_ranges(offsets, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits, misses, hit_flag):
    """:func:`replay_lfru_seq` by ranges of events (:func:`_ranges`): its slots allocated here (a block's clock is
    its access's index in the whole stream, so ranges keep it)."""
    npad = (n_experts + 63) // 64 * 64
    ns = _n_slots(capacity, n_experts)
    n = n_layers * npad
    tail = (hits, misses, hit_flag, np.zeros(n, np.float32), np.full(n, -1, np.int32),
            np.zeros(n_layers * ns, np.float32), np.zeros(n_layers * ns, np.float32),
            np.zeros(n_layers * ns, np.int32), np.zeros(n_layers, np.int64), ns)
    head = (n_experts, capacity, tie_pos.astype(np.int32))
    if ns in WIDTHS:
        return _ranges(_replay_lfru_seq_v, offsets, ev_layer, head, count_from,
                       (*tail, _tp_first_buffer(offsets, ns, _LFRU_TP_FIRST_BITS), Lanes(ns)))
    return _ranges(_replay_lfru_seq, offsets, ev_layer, (*head, _tie_bits(ns)), count_from, tail)


@jit_inline
def _lfru_margins(sbits):
    """A slot-packed lfru key's high-bits mask and the margin in float32 units in the last place beyond packing's:
    keys further apart order in float64 too (the two last arguments of :func:`lfru_lowest` / :func:`._vec.vlowest`).
    Each product ``age * (1 / count)`` is rounded twice, within a factor ``1 + 2**-22`` of ``age / count``, and two
    floats ``D`` units apart differ by a factor of at least ``1 + D 2**-24``: products more than 4 units apart order
    as their exact keys. A block past the margin lies at least ``2**sbits + 3`` (16 slots: 19) units from the
    smallest, past packing's loss."""
    return np.int32(-(1 << sbits)), np.int32((2 << sbits) + 2)


@jit_inline
def _lfru_fast(r, rf, sbits):
    """The decision of a sequential ``lfru`` miss past the quota from the pass over the layer's slots (``r``:
    :func:`lfru_lowest` or :func:`._vec.vlowest`) and the accessed block's reciprocal count ``rf`` (its age is 1):
    ``(v, thr, take_new)``: ``v`` the slot whose block leaves, -1 where the accessed block leaves, or -2 where the
    exact keys of the slots whose packed key is at most ``thr`` decide (:func:`_lfru_seq_exact`, the accessed block
    among them where ``take_new``)."""
    smask = np.int64((1 << sbits) - 1)
    hmask, d32 = _lfru_margins(sbits)
    d = np.int64(d32)
    m = r & 0x7FFFFFFF
    kb = np.int64((_f32_bits(rf) ^ np.int32(0x7FFFFFFF)) & hmask)
    mh = m & np.int64(hmask)
    if kb + d < mh:                                 # below every resident: it leaves
        return np.int64(-1), np.int64(0), False
    thr = (mh + d) | smask
    if kb > thr and r < (1 << 32):                  # the smallest alone within the margin: it leaves
        return m & smask, thr, False
    return np.int64(-2), thr, kb <= thr


@jit_helper
def _lfru_seq_exact(freq, sR, sL, sTP, so, pbase, size, t, thr, hmask, f, tp, take_new):
    """The slot (or -1: the accessed block, count ``f``, tie position ``tp``, when ``take_new``) of the lowest
    float64 ``(key, tie position)`` among the ``size`` slots from ``so`` whose packed key is at most ``thr``."""
    best = -1
    bk = np.inf
    bt = 1 << 30
    if take_new:
        bk = float(f)                               # its age is 1
        bt = tp
    t1 = np.float32(t + 1)
    for s in range(size):
        p = np.int64(((_f32_bits(sR[_U(so + s)] * (t1 - sL[_U(so + s)])) ^ np.int32(0x7FFFFFFF)) & hmask) | s)
        if p <= thr:
            q = np.int64(sTP[_U(so + s)])
            k = float(freq[_U(pbase + q)]) / float(t - np.int64(sL[_U(so + s)]) + 1)
            if _below(k, q, bk, bt):
                bk = k
                bt = q
                best = s
    return best


@jit_inline
def _slot_put(v, j, tp, so, slot, sTP):
    """The accessed block (lane ``j``, tie position ``tp``) into slot ``v`` of a layer's slots from ``so``."""
    sTP[_U(so + v)] = tp
    slot[_U(j)] = v


@jit_inline
def _slot_take(v, j, tp, so, pbase, slot, sTP):
    """:func:`_slot_put` into a slot whose block leaves (its state stays in the arrays over tie positions; a hit's
    block takes its own slot again)."""
    slot[_U(pbase + np.int64(sTP[_U(so + v)]))] = -1
    _slot_put(v, j, tp, so, slot, sTP)


@jit_inline
def _lfru_touch_counted(a, tp, pbase, f, freq, slot):
    """Access ``a``'s block (tie position ``tp``, new count ``f``: its count plus one, :func:`_lfru_next`) counted:
    ``(the unit as float32, its lane over tie positions, the count's reciprocal, its slot or -1)``."""
    tf = np.float32(a)
    j = pbase + tp
    rf = np.float32(1.0) / f
    freq[_U(j)] = f
    v = np.int64(slot[_U(j)])
    return tf, j, rf, v


@jit_inline
def _lfru_next(TP, first, tie_pos, base, pbase, expert, freq, lo, k):
    """The tie position of an event's access ``k`` (its first access at ``lo``; from ``TP`` where ``first``) and its
    block's count plus one: ``(tp, f)``."""
    tp = np.int64(TP[_U(k)]) if first else _tie_position(tie_pos, base, expert, lo + k)
    return tp, freq[_U(pbase + tp)] + np.float32(1.0)


@jit_inline
def _lfru_pair_start(TP, first, tie_pos, expert, freq, la, lb, lo, lob, na, nb, n_experts, ahead):
    """The first blocks and lanes of a pair's layers (events of ``na`` / ``nb`` accesses from ``lo`` / ``lob``), and
    where the loop reads ahead, their first accesses' tie positions and counts (:func:`_lfru_next`; else 0 and 1):
    ``(ba, bb, pa, pb, tpa, fa, tpb, fb)``."""
    npad = (n_experts + 63) // 64 * 64
    ba = la * n_experts
    bb = lb * n_experts
    pa = la * npad
    pb = lb * npad
    tpa, fa = _lfru_next(TP, first, tie_pos, ba, pa, expert, freq, lo, 0) if ahead and na > 0 else (0, np.float32(1.0))
    tpb, fb = _lfru_next(TP, False, tie_pos, bb, pb, expert, freq, lob, 0) if ahead and nb > 0 else (0, np.float32(1.0))
    return ba, bb, pa, pb, tpa, fa, tpb, fb


@jit_inline
def _lfru_reads(TP, first, tie_pos, expert, freq, ba, bb, pa, pb, lo, lob, na, nb, k, tpa, fa, tpb, fb, ahead):
    """Step ``k`` of a pair's accesses (:func:`_lfru_pair_start`): ``(ta, ga, tb, gb, tpa, fa, tpb, fb)``, the tie
    positions and counts of its two accesses, and those read ahead. Where ``ahead`` (:data:`_LFRU_AHEAD_BITS`), its
    accesses' were read at the step before (``tpa`` ... ``fb``), and the next step's are read now, before this
    step's decisions; else its own are read now."""
    one = np.float32(1.0)
    if ahead:
        ta, ga, tb, gb = tpa, fa, tpb, fb
        if k + 1 < na:
            tpa, fa = _lfru_next(TP, first, tie_pos, ba, pa, expert, freq, lo, k + 1)
        if k + 1 < nb:
            tpb, fb = _lfru_next(TP, False, tie_pos, bb, pb, expert, freq, lob, k + 1)
    else:
        ta, ga = _lfru_next(TP, first, tie_pos, ba, pa, expert, freq, lo, k) if k < na else (0, one)
        tb, gb = _lfru_next(TP, False, tie_pos, bb, pb, expert, freq, lob, k) if k < nb else (0, one)
    return ta, ga, tb, gb, tpa, fa, tpb, fb


@jit_inline
def _lfru_access(a, layer, cap, pbase, so, ns, tp, f, sbits, freq, slot, sR, sL, sTP, size, record, hit_flag):
    """Access ``a`` of :func:`_replay_lfru_seq` (layer ``layer``, quota ``cap``, slots from ``so``) to the block of tie
    position ``tp`` and new count ``f`` (:func:`_lfru_next`): 1 where it hits."""
    tf, j, rf, v = _lfru_touch_counted(a, tp, pbase, f, freq, slot)
    hit = v >= 0
    if hit:
        if record:
            hit_flag[_U(a)] = 1
    else:
        n = size[_U(layer)]
        if n < cap:
            v = n
            size[_U(layer)] = n + 1
            _slot_put(v, j, tp, so, slot, sTP)
        elif cap <= 0:
            return 0
        else:
            hmask, d = _lfru_margins(sbits)
            v, thr, take = _lfru_fast(lfru_lowest(sR, sL, so, ns, tf + np.float32(1.0), hmask, d), rf, sbits)
            if v == -2:
                v = _lfru_seq_exact(freq, sR, sL, sTP, so, pbase, n, a, thr, hmask, f, tp, take)
            if v < 0:
                return 0
            _slot_take(v, j, tp, so, pbase, slot, sTP)
    sR[_U(so + v)] = rf
    sL[_U(so + v)] = tf
    return np.int64(hit)


@jit_loop
def _replay_lfru_seq(offsets, expert, ev_layer, n_experts, capacity, tie_pos, sbits, count_from, hits, misses,
                     hit_flag, freq, slot, sR, sL, sTP, size, ns):
    """The loop of :func:`replay_lfru_seq`: ``freq[l * 64 W + j]`` the count of layer ``l``'s tie position
    ``j``, ``slot`` its slot while it is resident (``0 .. ns - 1``; else -1); ``sR`` /
    ``sL`` / ``sTP`` ``[l * ns + s]`` the reciprocal count, the last unit and the tie position of the block in slot
    ``s`` (an empty slot: reciprocal 0, a product 0 that ranks above every resident); ``size[l]`` the layer's
    residents (slots ``0 .. size - 1``). Two events of different layers run side by side (:func:`_paired`)."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    i = 0
    while i < n_events:
        two, la, ca, lo, na, lb, cb, lob, nb = _pair(offsets, ev_layer, capacity, i, n_events, True)
        ha = 0
        hb = 0
        ba, bb, pa, pb, tpa, fa, tpb, fb = _lfru_pair_start(tie_pos, False, tie_pos, expert, freq, la, lb, lo, lob,
                                                            na, nb, n_experts, True)
        for k in range(max(na, nb)):
            ta, ga, tb, gb, tpa, fa, tpb, fb = _lfru_reads(tie_pos, False, tie_pos, expert, freq, ba, bb, pa, pb, lo,
                                                           lob, na, nb, k, tpa, fa, tpb, fb, True)
            if k < na:
                ha += _lfru_access(lo + k, la, ca, pa, la * ns, ns, ta, ga, sbits, freq, slot, sR, sL, sTP, size,
                                   record, hit_flag)
            if k < nb:
                hb += _lfru_access(lob + k, lb, cb, pb, lb * ns, ns, tb, gb, sbits, freq, slot, sR, sL, sTP, size,
                                   record, hit_flag)
        _count(hits, misses, la, na, ha, i >= count_from)
        _count(hits, misses, lb, nb, hb, two and i + 1 >= count_from)
        i += 2 if two else 1


@jit_inline
def _lfru_vaccess(a, cap, pbase, so, tp, f, freq, slot, sR, sL, sTP, n, R, L, record, hit_flag, lanes):
    """:func:`_lfru_access` to the block of tie position ``tp`` and new count ``f`` (:func:`_lfru_next`) with the
    layer's slots' reciprocal counts and last units held as two vectors, ``R`` and ``L`` (its residents ``n``),
    through an event: returns ``(1 where it hits, n, R, L)``. ``sR`` / ``sL`` are written from the vectors where the
    exact keys decide, and when the event ends."""
    sbits = lane_bits(lanes)
    tf, j, rf, v = _lfru_touch_counted(a, tp, pbase, f, freq, slot)
    hit = v >= 0
    if hit:
        if record:
            hit_flag[_U(a)] = 1
    elif n < cap:
        v = n
        n += 1
        _slot_put(v, j, tp, so, slot, sTP)
    elif cap <= 0:
        return 0, n, R, L
    else:
        t1 = tf + np.float32(1.0)
        hmask, d = _lfru_margins(sbits)
        v, thr, take = _lfru_fast(vlowest(R, L, t1, hmask, d), rf, sbits)
        if v >= 0:                                  # the lowest leaves: its lane found by a vector compare
            _slot_take(v, j, tp, so, pbase, slot, sTP)
            return 0, n, vset_lowest(R, R, L, t1, hmask, rf), vset_lowest(L, R, L, t1, hmask, tf)
        if v == -2:
            vstore(sR, so, R)
            vstore(sL, so, L)
            v = _lfru_seq_exact(freq, sR, sL, sTP, so, pbase, n, a, thr, hmask, f, tp, take)
        if v < 0:
            return 0, n, R, L
        _slot_take(v, j, tp, so, pbase, slot, sTP)
    return np.int64(hit), n, vset(R, v, rf), vset(L, v, tf)


@jit_loop
def _replay_lfru_seq_v(offsets, expert, ev_layer, n_experts, capacity, tie_pos, count_from, hits, misses, hit_flag,
                       freq, slot, sR, sL, sTP, size, ns, TP, lanes):
    """:func:`_replay_lfru_seq` for ``ns`` (= ``lanes``' width) of 16, 32 or 64: an event's layer's slots are
    loaded as two vectors (reciprocal counts, last units) when the event begins, held in registers through its
    accesses (:func:`_lfru_vaccess`), so that no pass waits for the stores of the access before it, and stored
    when it ends (its slots' index bits ``lane_bits(lanes)``, a constant of the compiled loop). From
    ``2**_LFRU_TP_FIRST_BITS`` slots, which run one event at a time, the event's tie positions are read into ``TP``
    (as long as the widest event) when it begins."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    i = 0
    while i < n_events:
        two, la, ca, lo, na, lb, cb, lob, nb = _pair(offsets, ev_layer, capacity, i, n_events,
                                                     lane_bits(lanes) <= _LFRU_PAIR_LANE_BITS)
        soa = la * ns
        sob = lb * ns
        Ra = vload(sR, soa, lanes)
        La = vload(sL, soa, lanes)
        Rb = vload(sR, sob, lanes)
        Lb = vload(sL, sob, lanes)
        sa = size[_U(la)]
        sb = size[_U(lb)]
        ha = 0
        hb = 0
        first = lane_bits(lanes) >= _LFRU_TP_FIRST_BITS    # (a second event of a pair reads its own)
        if first:
            _read_tie_positions(TP, tie_pos, la * n_experts, expert, lo, na)
        ahead = lane_bits(lanes) >= _LFRU_AHEAD_BITS
        ba, bb, pa, pb, tpa, fa, tpb, fb = _lfru_pair_start(TP, first, tie_pos, expert, freq, la, lb, lo, lob, na,
                                                            nb, n_experts, ahead)
        for k in range(max(na, nb)):
            ta, ga, tb, gb, tpa, fa, tpb, fb = _lfru_reads(TP, first, tie_pos, expert, freq, ba, bb, pa, pb, lo, lob,
                                                           na, nb, k, tpa, fa, tpb, fb, ahead)
            if k < na:
                x, sa, Ra, La = _lfru_vaccess(lo + k, ca, pa, soa, ta, ga, freq, slot, sR, sL, sTP, sa, Ra, La,
                                              record, hit_flag, lanes)
                ha += x
            if k < nb:
                x, sb, Rb, Lb = _lfru_vaccess(lob + k, cb, pb, sob, tb, gb, freq, slot, sR, sL, sTP, sb, Rb, Lb,
                                              record, hit_flag, lanes)
                hb += x
        vstore(sR, soa, Ra)
        vstore(sL, soa, La)
        size[_U(la)] = sa
        if two:
            vstore(sR, sob, Rb)
            vstore(sL, sob, Lb)
            size[_U(lb)] = sb
        _count(hits, misses, la, na, ha, i >= count_from)
        _count(hits, misses, lb, nb, hb, two and i + 1 >= count_from)
        i += 2 if two else 1
