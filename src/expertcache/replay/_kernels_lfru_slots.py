"""numba kernel for event-atomic ``lfru`` under global scope with a small cache: dense slots and vector cuts.

``lfru`` ranks a block by ``freq / (t - last + 1)`` (``t`` the unit, here the event index; lower leaves first,
equal keys by lower tie rank). With a small global cache nearly every member misses and as many residents leave per
event, so the frequency groups of :mod:`._kernels_lfru_groups` move every member through their lists. Here the
residents sit in dense *slots* (count, last unit, block; the unit's misses take free slots, the last freed first,
so that the slots ever used stay about ``C ∪ U``), and an overflowing event is decided as the per-layer loop
``_kernels_bits.replay_lfru_bits`` decides it, over slots instead of tie positions: one vector pass gives the slots
whose key is at most a low and a high cut (from :data:`ONE_CUT_WORDS` words of slots on, the high cut alone: the
slots below it are listed as the pass goes, :func:`._simd.cut_list1_32_fma`, and the low cut is counted on the
list, 16 slots at a time by gathers where they are fast, :data:`._simd.FAST_GATHERS`, else one at a time), the
``need`` lowest of the band between are found by sorting its keys with a bitonic network (at most 64; a
quickselect past it), and of the keys equal to the ``need``-th the lowest tie ranks leave (equal keys are common:
the blocks of one event with one count). The cuts follow the band: a cut holding too many (too few) becomes the
high (low) cut, the other moves out by their gap (by twice the gap at each further move) and only its mask is
ranked again (:func:`._simd.cut_mask1_32`), and their spread around the last ``need``-th key halves after a band
wider than 16 and doubles after a pass repeated. A leaving slot is freed, and its last unit is set to ``inf`` (an
age of ``-inf``, below no cut) after the next event's members unless one of them took it (most are taken: a miss
writes its own last unit). The band's and the leaving slots are read from the masks as lists
(:func:`._simd.bit_positions`: by AVX-512 compresses, or a table of each byte's positions and, for a word of few
slots, unrolled steps, so no word's loop exit is mispredicted).

The cut pass is float32 (:func:`._simd.cut_masks32`, 16 lanes to a 512-bit vector): counts and last units
are float32 (integers below ``2**24``: :data:`MAX_EVENTS`) and the cuts have 8 significant bits
(:func:`._simd.dyadic8_down`, ``dyadic8_up``), so ``count <= cut * age`` is exact in float32 for every age
below ``2**16`` (the product has at most 24 significant bits); the pass marks the lanes of older blocks, which
are tested in float64 (exact; nearly never any). Until the oldest resident found by a scan (every ``2**16``
units, or 64 after one that found a block that old) can reach that age, the pass skips the age mask, and where
the machine fuses a multiply and an add it tests ``count <= fma(-cut, last, cut * t1)`` (one fused operation and a
compare per vector, :func:`._simd.cut_mask1_32_fma`): units are kept relative to a base moved up every
:data:`REBASE` events, so ``t1`` is below ``2**16``, ``cut * t1`` exact in float32 and the fused result the exact
product ``cut * age``. The key ``count / age`` a band is sorted by is float64, as ``replay_select``'s, and lies
on the same side of an 8-bit cut as the product test (a key other than the cut differs from it by more than
float64 rounds).

From :data:`CAND_WORDS` words of slots on, the one-cut pass runs over *candidates* instead of every slot: a pass
over every slot lists those whose key will be at most ``c_max`` (a little above the high cut) some events ahead
(``c_end``), with copies of their counts and last units. A key only falls while its slot is not accessed, and the
cuts move little from one event to the next, so until ``c_end``, or until the high cut passes ``c_max``, the
copies hold every slot below the high cut: a copy older than a hit is lower than its slot, a leaving slot's copy
is made ``inf``, and a miss whose count may fall to ``c_max`` by ``c_end`` joins them (:func:`_join`). The listed
candidates are then split by their slots' own counts and units.

The per-event cost is ``O(c / 64)`` vector compares (fewer with candidates) plus the unit's members, so the engine
takes this loop for global caches up to :func:`slots_per_member` blocks per member of a mean event. The decision,
the hit counts and the hit flags are those of :func:`._kernels_lfru.replay_select` (``tests/test_lfru_slots.py``).
"""

from __future__ import annotations

import numpy as np

from .._jit import jit_helper, jit_inline, jit_loop
from ._kernels import _cttz, _max_unit
from ._kernels_bits import _cut1, _kth_lowest, _popc, _settle
from ._pages import Packed
from ._simd import (
    AGE32,
    FAST_GATHERS,
    HAS_FMA,
    WIDE_VECTORS,
    array_at,
    band_masks,
    band_pick,
    bit_positions,
    cut_list1_32_fma,
    cut_list1_32_fma_dense,
    cut_mask1_32_fma,
    cut_masks32,
    cut_masks32_fma,
    cut_masks32_young,
    data_of,
    dyadic8_down,
    dyadic8_up,
    sort_small,
    split_low16,
)

#: An unsigned index: numba skips the negative-index wraparound (no index here is negative).
_U = np.uint64
#: Every lane of a word.
ALL = np.uint64(0xFFFFFFFFFFFFFFFF)

#: The engine replays here global caches of at most this many blocks per member of a mean event on streams of
#: up to :data:`SLOTS_BASE_EVENTS` events per layer (beyond it the frequency groups are faster: the slots' work
#: grows with the cache, the groups' with the event). Measured (``benchmarks/lfru_slots_vs_groups.py``, after the
#: candidates; docs/performance.md, *Candidates*): the slots take 0.75 / 0.81 / 0.94 / 0.90 of the groups' time at
#: 64 / 96 / 128 / 150 blocks per member on the benchmark stream at 650 events per layer (150: about the whole
#: universe there), and 0.82 / 1.00 / 0.98 at 128 / 200 / 256 on a 48 x 512, B = 8 stream of about 515 events per
#: layer (``routed:48x512x8:1.2e6``). It was 64 before the candidates, 48 before the freed slots.
SLOTS_PER_MEMBER = 150
#: Events per layer of the streams :data:`SLOTS_PER_MEMBER` was measured on.
SLOTS_BASE_EVENTS = 650
#: Longer streams take the slots for larger caches, up to this many blocks per member at
#: :data:`SLOTS_LONG_EVENTS` events per layer and beyond, linearly in the events per layer between: the groups'
#: time per access grows with the stream (their counts spread over more groups, every full ranking visits each
#: one), the slots' does not. Measured as :data:`SLOTS_PER_MEMBER`: on the 48 x 512 stream at about 2,060 events
#: per layer (``routed:48x512x8:4.8e6``) 0.68 / 0.78 / 0.93 / 1.08 at 72 / 128 / 256 / 450, at about 5,150
#: (``routed:48x512x8:12e6``) 0.87 / 0.95 / 1.03 at 256 / 350 / 450, and on the benchmark stream at 5,200 events
#: per layer 0.52-0.57 up to 150 (its universe). 325 keeps the line's values whole at 1,300 and 2,600 events
#: (175 and 225; 204 at 2,060). It was 99 before the candidates.
SLOTS_PER_MEMBER_LONG = 325
#: Events per layer from which the bound is :data:`SLOTS_PER_MEMBER_LONG` (the longest stream measured).
SLOTS_LONG_EVENTS = 5200


def slots_per_member(events_per_layer: float) -> float:
    """The most blocks per member of a mean event for which the engine takes this loop, on a stream of
    ``events_per_layer`` events per layer: :data:`SLOTS_PER_MEMBER` up to :data:`SLOTS_BASE_EVENTS`, then linear
    up to :data:`SLOTS_PER_MEMBER_LONG` at :data:`SLOTS_LONG_EVENTS`, flat beyond.

    >>> slots_per_member(650) == SLOTS_PER_MEMBER, slots_per_member(1300), slots_per_member(10400)
    (True, 175.0, 325.0)
    """
    x = min(max(events_per_layer - SLOTS_BASE_EVENTS, 0.0) / (SLOTS_LONG_EVENTS - SLOTS_BASE_EVENTS), 1.0)
    return SLOTS_PER_MEMBER + (SLOTS_PER_MEMBER_LONG - SLOTS_PER_MEMBER) * x


#: Units are kept relative to a base moved up every this many events (float32 products of an 8-bit cut and a unit
#: below ``2**16`` are exact: the fused cut pass, :func:`._simd.cut_mask1_32_fma`).
REBASE = 1 << 15

#: From :data:`CAND_WORDS` words on, the one-cut pass runs over *candidates*: copies of the counts and units of the
#: slots whose key is at most ``CAND_MARGIN`` times the high cut some events ahead (a superset of the slots below
#: the high cut until then, while it stays under that bound), made afresh by one pass over every slot. They hold for
#: a quarter of the words of slots in events, within these bounds: more events make fewer passes over every slot
#: but more candidates. Measured on the benchmark stream (single process, 5,200 steps): 8 / 12 / 16 events 0.90 /
#: 0.98 / 1.15 of no candidates' time at rho 0.3 (30 words), 0.89 / 0.89 / 0.90 at 0.4 (39); kernel_ab at 2,600
#: steps: 8 / 32 events 1.02 / 1.06 of 16's at rho 0.5 (48 words), 1.10 / 0.98 at 0.75 (73).
CAND_EVENTS = (4, 32)
#: The candidates' bound over the high cut they are made for (rounded up to 8 significant bits).
CAND_MARGIN = 1.03125
#: Candidates from this many words of slots on (fewer: a third of the slots or more are candidates, and making
#: them costs what their pass saves: 1.02 of no candidates' time at rho 0.25, 25 words, with 8 events). It was 28
#: until the one-cut pass listed its slots as it goes; on the AMD core the one-cut pass then took 0.945 / 0.961 of
#: the candidates' time at 28 / 30 words (rho 0.28 / 0.3, 5,200 steps) and 1.09 at 35 (rho 0.35). That is a
#: machine with 512-bit vectors (:data:`._simd.WIDE_VECTORS`); with AVX2 (a Zen 3 core) candidates pay from about 26
#: words: the loop with them took 1.03-1.13 of its time without at 16-23 words, 1.00 at 25 and 0.94-0.97 at 27-31
#: (``python benchmarks/lfru_slots_vs_groups.py --stream drifting:5200 --bpm 31,34,38,41,45,48 --cands --processes
#: 4``, and ``--bpm 24,26,28,29.5`` with 2; docs/performance.md, *Session 52*). Machines without AVX-512 take the
#: AVX2 value.
CAND_WORDS = 32 if WIDE_VECTORS else 26

#: Longest stream (events) this loop takes: counts and last units are float32, exact below ``2**24``.
MAX_EVENTS = 1 << 24

#: Slots are listed as int32 positions (:func:`._simd.bit_positions`): the engine takes this loop only below it.
MAX_SLOTS = 2**31 - 128

__all__ = ["MAX_EVENTS", "MAX_SLOTS", "SLOTS_BASE_EVENTS", "SLOTS_LONG_EVENTS", "SLOTS_PER_MEMBER",
           "SLOTS_PER_MEMBER_LONG", "replay_lfru_slots", "slots_per_member"]


def replay_lfru_slots(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie, count_from, hits, misses,
                      hit_flag, old_age=AGE32, one_cut_words=None, rebase=None, cand_k=None, cand_words=None,
                      pages=None):
    """Event-atomic ``lfru`` under global scope (one pool of ``capacity[0]`` blocks) on dense slots.

    Parameters are those of :func:`._kernels_lfru_groups.replay_lfru_groups` less ``atomic`` (always one unit
    per event) and, for tests (each value gives the same decision):

    * ``old_age``: lanes at least that old are decided in float64 (at most :data:`._simd.AGE32`);
    * ``one_cut_words``: from this many words of slots on, the vector pass ranks the high cut alone
      (:data:`ONE_CUT_WORDS`);
    * ``rebase``: units are kept relative to a base moved up every this many events (:data:`REBASE`, the most);
    * ``cand_words``: from this many words of slots on, the one-cut pass runs over candidates (:data:`CAND_WORDS`;
      -1: never);
    * ``cand_k``: the candidates hold for this many events (by default a quarter of the words of slots, within
      :data:`CAND_EVENTS`);
    * ``pages``: the allocator of the state arrays (:class:`._pages.Packed` by default; ``benchmarks/placement.py``
      passes others).

    The stream must have fewer than :data:`MAX_EVENTS` events. The state is allocated here and the loop runs in
    :func:`_replay_lfru_slots`.
    """
    if offsets.shape[0] > MAX_EVENTS:
        raise ValueError(f"{offsets.shape[0] - 1} events: this loop keeps counts and units as float32, so at most "
                         f"{MAX_EVENTS - 1}")
    if not hit_flag.flags.c_contiguous:
        raise ValueError("hit_flag must be C-contiguous: the member loop writes it through its data pointer")
    expert = np.ascontiguousarray(expert)      # read through its data pointer (_touch_at)
    n_blocks = n_layers * n_experts
    cap = int(min(int(capacity[0]), n_blocks))
    width = cap + int(_max_unit(offsets, True))
    npad = slot_words(cap, width - cap) * 64
    if npad + 64 > MAX_SLOTS:
        raise ValueError(f"{width} slots: this loop lists slots as int32, so at most {MAX_SLOTS - 128}")
    pa = Packed() if pages is None else pages      # no list across a page boundary (_pages)
    br = pa(n_blocks, np.int16 if npad < 32000 else np.int32, -1)
    _replay_lfru_slots(offsets, expert, ev_layer, n_experts, cap, tie, count_from, hits, misses, hit_flag, br,
                       pa(n_blocks, np.float32, 0),
                       pa(npad, np.float32, 0), pa(npad, np.float32, np.inf), pa(npad, np.int64, 0),
                       pa(npad // 32, np.uint64, 0), pa(4, np.uint64, 0), pa(npad + 64, np.float64, np.inf),
                       pa(npad, np.float64), pa(npad + 64, np.float64), pa(npad + 64, np.int64),
                       pa(npad + 64, np.int32), pa.copy(np.arange(npad - 1, -1, -1, dtype=np.int64)),
                       pa(npad + 64, np.int32), np.float32(min(float(old_age), AGE32)),
                       ONE_CUT_WORDS if one_cut_words is None else int(one_cut_words),
                       REBASE if rebase is None else min(max(int(rebase), 1), REBASE),
                       pa(npad + 64, np.int32, 0), pa(npad + 64, np.float32, 0), pa(npad + 64, np.float32, np.inf),
                       pa(npad, np.int32, 0), 0 if cand_k is None else max(int(cand_k), 1),
                       CAND_WORDS if cand_words is None else int(cand_words) if cand_words >= 0 else MAX_SLOTS)


def slot_words(cap: int, widest: int) -> int:
    """The words of 64 slots :func:`replay_lfru_slots` keeps for a cache of ``cap`` blocks (at most the universe) on
    a stream whose widest event has ``widest`` members: ``C ∪ U`` at most, at least one word. The loop compares them
    with :data:`ONE_CUT_WORDS` and :data:`CAND_WORDS`.

    >>> slot_words(1229, 53), slot_words(0, 1), slot_words(64, 0)
    (21, 1, 1)
    """
    return max((cap + widest + 63) // 64, 1)


#: From this many words of slots on, the vector pass ranks the high cut alone: the slots below it are listed
#: with their counts and ages, and the low cut is counted on that list (its moves too, without a pass). Fewer
#: words: both cuts in the pass, the leaving slots and the band listed from their masks. Measured (kernel_ab
#: against both cuts at every size, 4 processes): 1.045 / 1.018 at 16 / 20 words (rho 0.15 / 0.2), 0.942 /
#: 0.927 / 0.863 / 0.824 at 25 / 29 / 39 / 48 (rho 0.25 / 0.3 / 0.4 / 0.5); it was 24 then. Since the list is split
#: in float32: 18 words against 24, 0.976 / 0.953 at rho 0.18 / 0.2 (2,600 steps), 0.968 at rho 0.2 (5,200 steps);
#: one cut at 15 words 1.03 of two (single process, 5,200 steps). It was 18 until the one-cut pass listed its slots
#: as it goes; on the AMD core one cut then took 0.954 / 0.926 / 0.992 of two cuts' time at rho 0.13 / 0.15 / 0.17
#: (13-17 words), 0.997 at 0.12 and 1.065 at 0.1 (11 words: from 4 words on).
ONE_CUT_WORDS = 12

#: From this many words of slots on, the slots below the high cut are listed from the words that hold any (a
#: summary bit per word) rather than from every word: on the benchmark stream 0.99 / 0.95 / 0.92 of the time at
#: 29 / 39 / 48 words (rho 0.3 / 0.4 / 0.5), 1.03 at 20 (rho 0.2), measured for the band and leaving slots'
#: lists of the two-cut pass.
SPARSE_WORDS = 32


@jit_helper
def _slot_tie(tie, SB, s):
    """The tie rank of the block in slot ``s``, as a float (exact below ``2**53``)."""
    return float(tie[_U(SB[_U(s)])])


@jit_helper
def _tie_cut(ckey, v, nb, tie, SB, bpos, buf, scratch, eq, n_eq):
    """Of the ``n_eq`` band lanes whose key ``ckey[:nb]`` is ``v`` (slots ``bpos``, blocks ``SB``), the ``eq`` with
    the lowest tie ranks leave: the highest of those ranks (distinct; :func:`_slot_tie`), ``inf`` when all
    ``n_eq`` leave."""
    if eq >= n_eq:
        return np.inf
    r2 = 0
    for r in range(nb):
        if ckey[_U(r)] == v:
            buf[_U(r2)] = _slot_tie(tie, SB, bpos[_U(r)])
            r2 += 1
    return _kth_lowest(buf, scratch, n_eq, eq)


@jit_helper
def _below_fused(F, L, n_w, th, t, out):
    """The lanes of ``n_w`` words of counts ``F`` and units ``L`` whose key is at most ``th`` at unit ``t`` (the
    fused test: exact where ``t`` and every age are below ``2**16``), listed in ``out``; returns how many. It lists
    the candidates afresh and, over them, those below the high cut: many lanes a word either way, listed by
    :data:`._simd.cut_list1_32_fma_dense` (without AVX-512 the few-bits steps of :data:`._simd.bit_positions` took
    1.00-1.04x the time of the byte table alone at rho 0.3-0.75, ``kernel_ab.py --kernel slots``;
    docs/performance.md, *Session 52*)."""
    n1 = -np.float32(th)
    p1 = np.float32(th) * np.float32(t)
    k = 0
    for w in range(n_w):
        k = cut_list1_32_fma_dense(F, L, w << 6, n1, p1, out, k)
    return k


@jit_helper
def _candidates(SF, SL, n_w, c_max, c_end, CS, CF, CL, SC, nc):
    """The candidates afresh: the slots of ``n_w`` words whose key is at most ``c_max`` at ``c_end`` (the
    fused test, exact: ``c_end`` below ``2**16``, every age then below it), listed in ``CS`` with copies of their
    counts and units (``CF``, ``CL``) and each slot's index in ``SC``; the lanes past them ``inf``. Returns how
    many (``nc``, the last count, bounds the lanes to reset)."""
    old = ((nc + 63) >> 6) << 6
    k = _below_fused(SF, SL, n_w, c_max, c_end, CS)
    for j in range(k):
        s = _U(CS[_U(j)])
        CF[_U(j)] = SF[s]
        CL[_U(j)] = SL[s]
        SC[s] = np.int32(j)
    for j in range(k, max(old, ((k + 63) >> 6) << 6)):
        CL[_U(j)] = np.inf
    return k


@jit_helper
def _join(BR, BRf, SF, SL, expert, lo, hi, base, lim, CS, CF, CL, SC, nc):
    """The slots of the members ``expert[lo:hi]`` whose count is at most ``lim`` join the candidates ``CS[:nc]``
    with copies of their counts and units, unless a copy of the slot is there (its count and unit then at most
    the slot's: a hit only raises a key; ``BR`` / ``BRf``: the slots / counts, as in :func:`_touch`). Returns the
    candidates' new count, negated where there was no room."""
    for a in range(lo, hi):
        b = _U(base + expert[_U(a)])
        s = np.int64(BR[b])
        if BRf[b] <= lim and s >= 0:
            j = np.int64(SC[_U(s)])
            if nc >= SC.shape[0]:
                return -nc
            if not (j < nc and CS[_U(j)] == s and CL[_U(j)] < np.inf):
                CS[_U(nc)] = np.int32(s)
                CF[_U(nc)] = SF[_U(s)]
                CL[_U(nc)] = SL[_U(s)]
                SC[_U(s)] = np.int32(nc)
                nc += 1
    return nc


@jit_inline
def _keep_masks(masks, w, lw, hw, c0, c1):
    """Word ``w``'s masks below the low and the high cut kept (``masks[2 w]``, ``masks[2 w + 1]``), and the two
    counts below the cuts with theirs added."""
    masks[_U(2 * w)] = lw
    masks[_U(2 * w + 1)] = hw
    return c0 + np.int64(_popc(lw)), c1 + np.int64(_popc(hw))


@jit_helper
def _touch_at(pBR, pBRf, pSF, pSL, pSB, pex, pfree, phit, n_blocks, n_slots, n_acc, n_flag, lo, hi, base, nf, fi,
              cap, mixed, record):
    """:func:`_touch` called with the arrays' data (:func:`._simd.data_of`) and lengths, viewed again here
    (:func:`._simd.array_at`): 20 arguments, where the eight arrays passed whole took 64, most pushed on the
    stack at every event (3.6% of the loop's samples at rho 0.2). 0.96-0.98 of the loop's time at rho 0.1-0.5 on
    the AMD core (docs/performance.md, *Session 32*)."""
    return _touch(array_at(pBR, n_blocks), array_at(pBRf, n_blocks), array_at(pSF, n_slots),
                  array_at(pSL, n_slots), array_at(pSB, n_slots), array_at(pex, n_acc), lo, hi, base,
                  array_at(pfree, n_slots), nf, fi, cap, mixed, record, array_at(phit, n_flag))


@jit_inline
def _touch(BR, BRf, SF, SL, SB, expert, lo, hi, base, free, nf, fi, cap, mixed, record, hit_flag):
    """The members ``expert[lo:hi]`` of an event (blocks ``base + e``): their counts up by one, a hit's count
    and last unit ``fi`` in its slot, a miss's in a free slot (``free[nf - 1]``, ``free[nf - 2]``, ...; none where
    ``cap`` is 0); returns the hits, the free slots left and the lowest of the members' counts (one low enough
    may have to join the candidates). ``BR``: each block's slot, ``BRf``: its count (:func:`_replay_lfru_slots`).
    ``mixed``: hits and misses mixed, no branch on either. Inlined into :func:`_touch_at`, a function of its own:
    in the loop's body LLVM kept the next slot on the stack, a store and a load per member on one chain (here in a
    register: 0.98 of the loop's time at rho 0.5, 1.00 at 0.2-0.4; inlined again on the AMD core, 1.10-1.12 at rho
    0.2-0.4)."""
    n_hit = 0
    low = np.float32(MAX_EVENTS)
    if mixed:
        nf0 = nf
        for a in range(lo, hi):
            b = _U(base + expert[_U(a)])
            f = BRf[b] + np.float32(1.0)
            BRf[b] = f
            s = np.int64(BR[b])
            hit = np.int64(s >= 0)
            top = free[_U(nf - 1)]             # the next free slot, taken where this is a miss
            d = top + hit * (s - top)          # a hit's own slot, or slot top for a miss
            SF[_U(d)] = f
            SL[_U(d)] = fi
            SB[_U(top)] = np.int64(b)          # slot top is free until a miss takes it
            BR[b] = d
            nf -= 1 - hit
            low = min(low, f)
            if record:
                hit_flag[_U(a)] = hit
        n_hit = (hi - lo) - (nf0 - nf)     # each miss took one free slot (no counter live in the loop)
    else:
        for a in range(lo, hi):
            b = _U(base + expert[_U(a)])
            f = BRf[b] + np.float32(1.0)
            BRf[b] = f
            s = BR[b]
            low = min(low, f)
            if s >= 0:
                n_hit += 1
                SF[_U(s)] = f
                SL[_U(s)] = fi
                if record:
                    hit_flag[_U(a)] = 1
            elif cap > 0:
                top = free[_U(nf - 1)]
                nf -= 1
                SF[_U(top)] = f
                SL[_U(top)] = fi
                SB[_U(top)] = np.int64(b)
                BR[b] = top
    return n_hit, nf, low


@jit_loop
def _replay_lfru_slots(offsets, expert, ev_layer, n_experts, cap, tie, count_from, hits, misses, hit_flag,
                       BR, BRf, SF, SL, SB, masks, w4, ckey, sel, sel2, bpos, lst, free, lv, old_age, one_cut_words,
                       rebase, CS, CF, CL, SC, cand_k, cand_words):
    """The loop of :func:`replay_lfru_slots`. ``BR[b]``: block ``b``'s slot (-1: not resident; int16 where every slot
    is below 32,000, else int32: a layer's 128 blocks then take 256 bytes, and ``BR`` 12 KiB for 6,144 blocks),
    ``BRf[b]``: its count (float32, exact below MAX_EVENTS, so the member loop stores a count into its slot without
    a conversion). Against one 8-byte record per block (count and slot side by side, 48 KiB): 0.991 / 0.978 / 0.983
    of the time at rho 0.2 / 0.3 / 0.4 on the AMD core (docs/performance.md, *Session 30*); slot ``s``: count
    ``SF``, last unit ``SL`` (float32), block ``SB`` (its tie rank ``tie[SB[s]]``, read only where equal keys meet
    the cut); ``masks[2w]``, ``masks[2w + 1]``: the slots of word ``w`` below the low and the high cut (one-cut
    pass: ``masks[w]``, below the high cut); ``w4``: a pass's masks (below each cut, and the lanes ``old_age`` or
    older); ``free[:nf]``: the free slots (slots never used last, in ascending order; the rest freed slots, the
    latest last); ``CS[:nc]``: the candidates' slots, ``CF`` / ``CL`` the copies of their counts and units (``inf``
    past them and for a freed slot's), ``SC[s]``: slot ``s``'s index in them (valid where ``CS`` agrees); ``cand_k``
    0: the candidates' events by size."""
    record = hit_flag.shape[0] > 0
    n_events = offsets.shape[0] - 1
    one = np.uint64(1)
    n_res = 0                          # residents
    npad = free.shape[0]
    nf = npad                          # free slots: free[:nf] (the next taken last)
    pend = npad                        # free[pend:nf]: slots freed at the last event, their last units not yet inf
    used = 0                           # slots ever used: [0, used), the rest free[:npad - used]
    th0 = 0.0
    th1 = np.inf                       # the first overflow ranks every slot
    spread = 0.25
    mixed = False                      # the last event's members were between 1/8 and 7/8 hits
    young_until = 0                    # before this event every resident is younger than old_age
    next_scan = 0
    ubase = 0                          # units are kept relative to this one (below 2**16 past it: exact products)
    nc = 0                             # candidates: CS[:nc] (slots), copies CF / CL of their counts and units
    c_max = 0.0                        # ... holding every slot whose key is at most c_max up to unit c_end
    c_end = -1.0
    for i in range(n_events):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        if i - ubase >= rebase:        # the base moves up: every last unit down by as much (inf stays inf)
            d32 = np.float32(i - ubase)
            for s in range(npad):
                SL[_U(s)] -= d32
            ubase = i
            c_end = -1.0               # the candidates' copies are on the old base
        fi = float(i - ubase)
        counted = i >= count_from
        lim = c_max * (c_end - fi) if c_end > fi else -1.0     # a count up to this may fall below c_max by c_end
        n_hit, nf, fmin = _touch_at(data_of(BR), data_of(BRf), data_of(SF), data_of(SL), data_of(SB),
                                    data_of(expert), data_of(free), data_of(hit_flag), BR.shape[0], npad,
                                    expert.shape[0], hit_flag.shape[0], lo, hi, base, nf, fi, cap, mixed, record)
        if fmin <= lim:                # a member may fall below c_max by c_end: its slot joins the candidates
            nc = _join(BR, BRf, SF, SL, expert, lo, hi, base, lim, CS, CF, CL, SC, nc)
            if nc < 0:                 # no room: the candidates afresh at the next overflow
                nc = -nc
                c_end = -1.0
        used = max(used, npad - nf)    # a miss past the freed slots took the lowest never used
        for k in range(pend, nf):      # slots freed at the last event and not taken by a miss of this one: last
            SL[_U(free[_U(k)])] = np.inf               # unit inf (a taken one was written by _touch)
        pend = nf
        top = n_res + (hi - lo) - n_hit if cap > 0 else 0
        mixed = cap > 0 and 8 * n_hit >= hi - lo and 8 * n_hit <= 7 * (hi - lo)
        if counted:
            hits[_U(layer)] += n_hit
            misses[_U(layer)] += (hi - lo) - n_hit
        m = top - cap
        if m <= 0:
            n_res = top
            continue
        n_total = used
        n_w = (n_total + 63) >> 6
        t1 = fi + 1.0                  # age = t1 - last
        passes = 1                     # passes over the slots, and moves of a cut counted on a list
        t32 = np.float32(t1)
        if i >= young_until and i >= next_scan:    # the oldest resident's unit bounds every age until then
            lm = SL[0]
            for s in range(1, n_total):
                lm = min(lm, SL[_U(s)])
            young_until = np.int64(lm) + ubase + np.int64(old_age) - 1
            next_scan = i + 64
        young = i < young_until        # no resident old enough to need the float64 test: no age mask
        fused = young and HAS_FMA and th1 < np.inf      # the fused pass (th * t1 exact: t1 below 2**16)
        if n_w < one_cut_words:        # few words: both cuts in the vector pass, the two lists read from masks
            c0 = 0
            c1 = 0
            if fused:                  # a loop for each form of the pass: one loop choosing the form per word left
                for w in range(n_w):   # LLVM one value of the three forms' lane masks, which it moves through
                                       # memory a byte at a time without AVX-512 (0.45-0.53 of the loop's time at
                                       # rho 0.05-0.1 on an AVX2 core, docs/performance.md, *Session 50*)
                    cut_masks32_fma(SF, SL, w << 6, -np.float32(th0), np.float32(th0) * t32, -np.float32(th1),
                                    np.float32(th1) * t32, w4)
                    c0, c1 = _keep_masks(masks, w, w4[0], w4[1], c0, c1)
            elif young:
                for w in range(n_w):
                    cut_masks32_young(SF, SL, w << 6, np.float32(th0), np.float32(th1), t32, w4)
                    c0, c1 = _keep_masks(masks, w, w4[0], w4[1], c0, c1)
            else:
                for w in range(n_w):
                    cut_masks32(SF, SL, w << 6, np.float32(th0), np.float32(th1), t32, old_age, w4)
                    u = w4[2]
                    c0, c1 = _keep_masks(masks, w, _settle(w4[0] & ~u, u, SF, SL, w << 6, th0, t1),
                                         _settle(w4[1] & ~u, u, SF, SL, w << 6, th1, t1), c0, c1)
            # A cut moved alone is ranked alone. The two loops below are one body written twice: one loop for
            # either cut, or a helper, measured 1.012-1.014x the time.
            f = 1.0                    # the first move by the cuts' gap, each later one by twice the gap
            while c0 > m:              # more than leave sit below the low cut: it becomes the high cut, and the
                gap = max(th1 - th0, th1 * 2.0 ** -10) if th1 < np.inf else np.inf    # low one goes down
                th1 = th0
                c1 = c0
                th0 = dyadic8_down(th0 - f * gap) if th0 - f * gap > 0.0 else 0.0
                f = 2.0
                passes += 1
                c0 = 0
                for w in range(n_w):   # the low cut alone
                    lw = _cut1(SF, SL, w << 6, ALL, th0, t1, t32, old_age, young, w4)
                    masks[_U(2 * w + 1)] = masks[_U(2 * w)]
                    masks[_U(2 * w)] = lw
                    c0 += np.int64(_popc(lw))
            f = 1.0
            while c1 < m:              # fewer than leave sit below the high cut (c0 <= c1 < m): it becomes the
                gap = max(th1 - th0, th1 * 2.0 ** -10) if th1 < np.inf else np.inf    # low cut, and the high one
                th0 = th1              # goes up
                c0 = c1
                th1 = dyadic8_up(th1 + f * gap) if th1 > 0.0 else np.inf
                f = 2.0
                passes += 1
                c1 = 0
                for w in range(n_w):   # the high cut alone
                    hw = _cut1(SF, SL, w << 6, ALL, th1, t1, t32, old_age, young, w4)
                    masks[_U(2 * w)] = masks[_U(2 * w + 1)]
                    masks[_U(2 * w + 1)] = hw
                    c1 += np.int64(_popc(hw))
            q = 0                      # the slots that leave and the band as lists (every word: no loop exit per
            for w in range(n_w):       # word to mispredict)
                q = bit_positions(masks[_U(2 * w)], w << 6, lv, q)
            bb = 0
            for w in range(n_w):
                bb = bit_positions(masks[_U(2 * w + 1)] & ~masks[_U(2 * w)], w << 6, lst, bb)
            for r in range(bb):        # the band's counts and ages
                s = np.int64(lst[_U(r)])
                bpos[_U(r)] = s
                ckey[_U(r)] = np.float64(SF[_U(s)])
                sel2[_U(r)] = t1 - np.float64(SL[_U(s)])
        else:                          # many words: the high cut alone in the vector pass, the low one on the list
            f = 1.0                        # the first move by the cuts' gap, each later one by twice the gap
            kk = cand_k if cand_k > 0 else min(max(n_w >> 2, CAND_EVENTS[0]), CAND_EVENTS[1])
            use_c = fused and n_w >= cand_words and i + kk < young_until          # (ages below old_age to c_end)
            q = 0
            while use_c:                   # the candidates' copies: a superset of the slots below the high cut
                if t1 > c_end or th1 > c_max:                  # (or none yet): the candidates afresh
                    c_max = dyadic8_up(th1 * CAND_MARGIN)
                    c_end = t1 + float(kk - 1)
                    nc = _candidates(SF, SL, n_w, c_max, c_end, CS, CF, CL, SC, nc)
                q = _below_fused(CF, CL, (nc + 63) >> 6, th1, t1, lst)
                c0 = 0                     # their slots split by the slot's own count and unit (a copy older than a
                bb = 0                     # hit is lower: no slot below the high cut is left out): below the low
                l32 = np.float32(th0)      # cut (lv), between the cuts (bpos), neither; in float32, exact as the
                h32 = np.float32(th1)      # pass (8-bit cuts, every age below 2**16)
                for r in range(q):
                    s = np.int64(CS[_U(lst[_U(r)])])
                    fr = SF[_U(s)]
                    ar = t32 - SL[_U(s)]
                    low = np.int64(fr <= l32 * ar)
                    lv[_U(c0)] = np.int32(s)
                    bpos[_U(bb)] = s
                    c0 += low
                    bb += np.int64(fr <= h32 * ar) - low
                if c0 + bb >= m:
                    break
                gap = max(th1 - th0, th1 * 2.0 ** -10)   # fewer than leave: the high cut up, as below
                th0 = th1
                th1 = dyadic8_up(th1 + f * gap) if th1 > 0.0 else np.inf
                f = 2.0
                passes += 1
                if th1 == np.inf:      # every slot: the pass below
                    use_c = False
            if not use_c:
                c1 = 0                     # one vector pass: the slots below the high cut (the low cut's are among
                                           # them, counted on their list below)
                listed = fused and th1 < np.inf and n_w < SPARSE_WORDS
                if listed:                 # listed as the pass goes (the mask stays in its register)
                    n1 = -np.float32(th1)
                    p1 = np.float32(th1) * t32
                    for w in range(n_w):
                        c1 = cut_list1_32_fma(SF, SL, w << 6, n1, p1, lst, c1)
                elif fused and th1 < np.inf:
                    n1 = -np.float32(th1)
                    p1 = np.float32(th1) * t32
                    for w in range(n_w):
                        cut_mask1_32_fma(SF, SL, w << 6, n1, p1, w4)
                        hw = w4[0]
                        masks[_U(w)] = hw
                        c1 += np.int64(_popc(hw))
                else:
                    for w in range(n_w):
                        hw = _cut1(SF, SL, w << 6, ALL, th1, t1, t32, old_age, young, w4)
                        masks[_U(w)] = hw
                        c1 += np.int64(_popc(hw))
                while c1 < m:              # fewer than leave sit below the high cut: it becomes the low cut, and the
                    gap = max(th1 - th0, th1 * 2.0 ** -10) if th1 < np.inf else np.inf    # high one goes up
                    th0 = th1
                    th1 = dyadic8_up(th1 + f * gap) if th1 > 0.0 else np.inf
                    f = 2.0
                    passes += 1
                    listed = False
                    c1 = 0
                    for w in range(n_w):
                        hw = _cut1(SF, SL, w << 6, ALL, th1, t1, t32, old_age, young, w4)
                        masks[_U(w)] = hw
                        c1 += np.int64(_popc(hw))
                q = c1 if listed else 0    # the slots below the high cut as a list (listed by the pass, or)
                if not listed and n_w >= SPARSE_WORDS:     # from the words that hold any (a summary word built
                                                            # in a register)
                    for k in range((n_w + 63) >> 6):
                        z = np.uint64(0)
                        for w in range(k << 6, min((k + 1) << 6, n_w)):
                            z |= np.uint64(masks[_U(w)] != 0) << np.uint64(w & 63)
                        while z:
                            w = (k << 6) + np.int64(_cttz(z))
                            z &= z - one
                            q = bit_positions(masks[_U(w)], w << 6, lst, q)
                elif not listed:           # from every word (no loop exit per word to mispredict)
                    for w in range(n_w):
                        q = bit_positions(masks[_U(w)], w << 6, lst, q)
            n_src = q                      # their counts and ages (lst): those below the low cut leave, the band
            f = 1.0                        # sits between the cuts (branch-free: each slot written to both lists,
            split = use_c                  # the index of its own advanced; the product of an 8-bit cut and an age
            while True:                    # below 2**24 is exact in float64; the candidates' loop split its own)
                if not split:
                    c0 = 0
                    bb = 0
                    if young:              # every age below old_age: float32, exact as the pass
                        l32 = np.float32(th0)
                        if FAST_GATHERS:   # 16 at a time (two gathers and two compresses: 0.95 of the loop's
                            for r in range(0, n_src, 16):      # time at rho 0.2 on the Intel core)
                                c = np.int64(_popc(split_low16(lst, r, n_src, SF, SL, l32, t32, lv, c0, bpos, bb)))
                                c0 += c
                                bb += min(16, n_src - r) - c
                        else:              # one at a time (AMD's gathers are slower than scalar loads)
                            for r in range(n_src):
                                s = np.int64(lst[_U(r)])
                                low = np.int64(SF[_U(s)] <= l32 * (t32 - SL[_U(s)]))
                                lv[_U(c0)] = np.int32(s)
                                bpos[_U(bb)] = s
                                c0 += low
                                bb += 1 - low
                    else:
                        for r in range(n_src):
                            s = np.int64(lst[_U(r)])
                            low = np.int64(np.float64(SF[_U(s)]) <= th0 * (t1 - np.float64(SL[_U(s)])))
                            lv[_U(c0)] = np.int32(s)
                            bpos[_U(bb)] = s
                            c0 += low
                            bb += 1 - low
                split = False
                if c0 <= m:
                    break
                gap = max(th1 - th0, th1 * 2.0 ** -10) if th1 < np.inf else np.inf    # more than leave sit below
                th1 = th0                  # the low cut: it becomes the high cut, and the low one goes down; the
                th0 = dyadic8_down(th0 - f * gap) if th0 - f * gap > 0.0 else 0.0     # list of those below it is
                f = 2.0                    # split again, copied back to lst (a name bound to either list cost a
                passes += 1                # reference count call each way every event; without: 0.991 / 0.980 /
                for r in range(c0):        # 0.978 of the time at rho 0.2 / 0.3 / 0.4)
                    lst[_U(r)] = lv[_U(r)]
                n_src = c0
            for r in range(bb):            # the band's counts and ages
                s = bpos[_U(r)]
                ckey[_U(r)] = np.float64(SF[_U(s)])
                sel2[_U(r)] = t1 - np.float64(SL[_U(s)])
        c1 = c0 + bb
        need = m - c0
        nb = bb
        v = th0
        nl = c0
        ckey[_U(nb)] = np.inf          # the lane past the band (written above) inf again
        if need > 0:
            if nb <= 16:               # the need-th key ranked in registers (its value only: equal keys
                band_pick(ckey, sel2, nb, need, w4)         # are ordered by tie rank below); leaves the keys
                v = ckey[_U(_cttz(w4[1]))]                  # in ckey
            else:
                for r in range(nb):
                    ckey[_U(r)] = ckey[_U(r)] / sel2[_U(r)]
            if nb <= 64:               # sorted by a network; the leaving lanes as a mask
                if nb > 16:
                    sort_small(ckey, nb, sel)
                    v = sel[need - 1]
                below, eqm = band_masks(ckey, v, nb)        # lanes past the band are inf
                eq = need - np.int64(_popc(below))
                n_eq = np.int64(_popc(eqm))
                leave = below | eqm
                if eq < n_eq:          # equal keys at the need-th: the eq lowest tie ranks of them leave
                    tr = _tie_cut(ckey, v, nb, tie, SB, bpos, sel2, sel, eq, n_eq)
                    x = eqm
                    while x:
                        r = np.int64(_cttz(x))
                        x &= x - one
                        if _slot_tie(tie, SB, bpos[_U(r)]) > tr:
                            leave &= ~(one << np.uint64(r))
                x = leave
                while x:
                    r = np.int64(_cttz(x))
                    x &= x - one
                    lv[_U(nl)] = np.int32(bpos[_U(r)])
                    nl += 1
                for r in range(nb):
                    ckey[_U(r)] = np.inf
            else:                      # a wide band: a selection
                for r in range(nb):
                    sel[_U(r)] = ckey[_U(r)]
                v = _kth_lowest(sel, sel2, nb, need)
                n_less = 0
                n_eq = 0
                for r in range(nb):
                    c = ckey[_U(r)]
                    n_less += c < v
                    n_eq += c == v
                tr = _tie_cut(ckey, v, nb, tie, SB, bpos, sel2, sel, need - n_less, n_eq)
                for r in range(nb):
                    c = ckey[_U(r)]
                    s = bpos[_U(r)]
                    if c < v or (c == v and _slot_tie(tie, SB, s) <= tr):
                        lv[_U(nl)] = np.int32(s)
                        nl += 1
                    ckey[_U(r)] = np.inf
        else:
            for r in range(nb):
                ckey[_U(r)] = np.inf
        for r in range(nl):            # freed (its last unit inf after the next event's members unless a miss
            s = np.int64(lv[_U(r)])    # takes it; swap-removal, a copy of the top slot into each: 0.92-0.98x the
                                       # time at rho 0.05-0.3, 1.00 at 0.4-0.5)
            BR[_U(SB[_U(s)])] = -1
        for r in range(nl):            # onto the free stack (a loop of its own: vector copies)
            free[_U(nf + r)] = np.int64(lv[_U(r)])
        nf += nl
        if nc > 0:
            for r in range(nl):        # their candidates' copies hold no slot now
                s = np.int64(lv[_U(r)])
                j = np.int64(SC[_U(s)])
                if j < nc and CS[_U(j)] == s:
                    CL[_U(j)] = np.inf
        n_res = top - nl
        if nb > 16:                    # the cuts follow the band: narrower when it is past band_pick's 16 (was
                                       # past 32: bands of 17-64 after 70-83% of the overflows, 20-25% now), wider
                                       # after a miss
            spread = max(spread * 0.5, 2.0 ** -20)
        elif passes > 1:
            spread = min(spread * 2.0, 0.5)
        th0 = dyadic8_down((1.0 - spread) * v)
        th1 = dyadic8_up((1.0 + spread) * v)
    return n_res
