"""numba kernels of event building and of the rotation schedulers. They trust their inputs.

:func:`step_layer_events` (the union, multiplicity and gate mass of each (step, layer)) computes what
:func:`expertcache.events.fcfs._schedule_events` computes with a stable sort of every (token, layer, slot) entry,
for a schedule sorted by step, one step at a time: no ``O(entries)`` sort keys, and the same gate sums (float64, in
the schedule's token order). :func:`greedy_union` and :func:`union_size` are the union counts of
:mod:`expertcache.events.rotation`'s causal and oracle schedulers.
"""

from __future__ import annotations

import numpy as np

from .._bits import U as _U
from .._bits import cttz
from .._jit import jit, jit_inline

#: The most experts a layer for which :func:`step_layer_events` reads every event's members from all ``N / 64`` words
#: of its bits (:func:`_step_layer_events_words`): 1.10x the general loop's speed at N = 1,024, B = 1 (eight members
#: an event, sixteen words), 1.89x / 2.20x at B = 8 / 32 (medians, ``benchmarks/event_build.py --experts 1024``;
#: docs/performance.md, *Session 69*).
_WORDS_MAX_EXPERTS = 1024


@jit_inline
def _step_end(step, g0, n):
    """The end of the rows of ``step[g0]``'s step (``step`` non-decreasing)."""
    g1 = g0
    while g1 < n and step[g1] == step[g0]:
        g1 += 1
    return g1


@jit_inline
def _add_entry(count, gsum, has_gates, gates, r, l, j, e):
    """Entry ``(r, l, j)`` of expert ``e`` counted, and its gate added to the expert's sum, with no branch on
    whether it is the event's first of ``e``."""
    count[e] += 1
    if has_gates:
        gsum[e] += np.float64(gates[_U(r), _U(l), _U(j)])


@jit_inline
def _members_of_word(x, base, count, gsum, has_gates, expert, mult, gm, n_u):
    """The experts of word ``x`` (ids from ``base``) written as members from ``n_u`` in ascending order, each one's
    count and gate sum read and cleared (sums to ``-0.0``); returns the members so far."""
    one = np.uint64(1)
    while x:
        e = _U(base + np.int64(cttz(x)))
        x &= x - one
        expert[_U(n_u)] = e
        mult[_U(n_u)] = count[e]
        count[e] = 0
        if has_gates:
            gm[_U(n_u)] = np.float32(gsum[e])
            gsum[e] = -0.0
        n_u += 1
    return n_u


@jit_inline
def _end_event(ev_ids, active, csr, n_ev, n_u, ev_id, n_active):
    """Close event ``n_ev`` (its members end at ``n_u``): its id and ``|A(s)|``; returns the events so far."""
    ev_ids[n_ev] = ev_id
    active[n_ev] = n_active
    csr[n_ev + 1] = n_u
    return n_ev + 1


@jit
def step_layer_events(step, rows, experts, gates, has_gates, n_experts, ev_ids, csr, expert, mult, gm, active):
    """Fill the event arrays of the schedule ``(step[i], rows[i])`` (``step`` non-decreasing); return
    ``(n_events, n_union)``. Layers of at most 128 experts take :func:`_step_layer_events_bits`, of at most
    :data:`_WORDS_MAX_EXPERTS` :func:`_step_layer_events_words`, larger ones :func:`_step_layer_events_any`.

    Parameters
    ----------
    step, rows : int64[n]
        Scheduler step and trace row of each executed token.
    experts : int[n_tokens, L, k]
        The trace's routing (distinct experts per token and layer).
    gates : float32[n_tokens, L, k] (read when ``has_gates``)
        Gate weights.
    n_experts : int
        ``N``.
    ev_ids, active : int64[>= n_steps * L], int32[...]
        Output: event id ``step * L + layer`` and ``|A(s)|`` of each event.
    csr : int64[>= n_events + 1]
        Output: CSR offsets.
    expert, mult, gm : int16, int32, float32 [>= n * L * k]
        Output: members ascending within each event, their multiplicity and summed gate mass.
    """
    if n_experts <= 128:
        return _step_layer_events_bits(step, rows, experts, gates, has_gates, n_experts, ev_ids, csr, expert, mult,
                                       gm, active)
    if n_experts <= _WORDS_MAX_EXPERTS:
        return _step_layer_events_words(step, rows, experts, gates, has_gates, n_experts, ev_ids, csr, expert, mult,
                                        gm, active)
    return _step_layer_events_any(step, rows, experts, gates, has_gates, n_experts, ev_ids, csr, expert, mult, gm,
                                  active)


@jit
def _step_layer_events_any(step, rows, experts, gates, has_gates, n_experts, ev_ids, csr, expert, mult, gm, active):
    """:func:`step_layer_events` for any ``N``: an entry's first test of its count lists its expert as new (and
    sets its bit); the members are read from the bits where they span few words, else sorted by insertion
    (``benchmarks/event_build.py`` times it against :func:`_step_layer_events_bits`)."""
    n = step.shape[0]
    n_layers, k = experts.shape[1], experts.shape[2]
    count = np.zeros(n_experts, dtype=np.int64)
    gsum = np.zeros(n_experts, dtype=np.float64)
    touched = np.empty(n_experts, dtype=np.int64)
    n_words = (n_experts + 63) >> 6
    seen = np.zeros(n_words, dtype=np.uint64)        # the event's experts as bits, read in ascending order
    n_ev = 0
    n_u = 0
    csr[0] = 0
    g0 = 0
    while g0 < n:
        g1 = _step_end(step, g0, n)
        for l in range(n_layers):
            n_t = 0
            for i in range(g0, g1):
                r = rows[_U(i)]
                for j in range(k):
                    e = _U(experts[_U(r), _U(l), _U(j)])
                    if count[e] == 0:
                        touched[_U(n_t)] = e
                        n_t += 1
                        seen[e >> 6] |= np.uint64(1) << np.uint64(e & 63)
                        if has_gates:
                            gsum[e] = np.float64(gates[_U(r), _U(l), _U(j)])
                    elif has_gates:
                        gsum[e] += np.float64(gates[_U(r), _U(l), _U(j)])
                    count[e] += 1
            # ascending member ids: the bits of the event's experts where they span few words (a scan of
            # n_words words; an insertion sort of ~40 members took about half the loop's time at N = 128), else
            # an insertion sort of the n_t members (an event holds at most min(N, |A| k) experts)
            if n_words <= 2 * n_t:
                a = 0
                for w in range(n_words):
                    x = seen[w]
                    seen[w] = 0
                    while x:
                        touched[a] = (w << 6) + np.int64(cttz(x))
                        x &= x - np.uint64(1)
                        a += 1
            else:
                for a in range(n_t):
                    e = touched[a]
                    seen[e >> 6] = 0
                for a in range(1, n_t):
                    x = touched[a]
                    b = a
                    while b > 0 and touched[b - 1] > x:
                        touched[b] = touched[b - 1]
                        b -= 1
                    touched[b] = x
            for a in range(n_t):
                e = _U(touched[_U(a)])
                expert[_U(n_u)] = e
                mult[_U(n_u)] = count[e]
                if has_gates:
                    gm[_U(n_u)] = np.float32(gsum[e])
                count[e] = 0
                n_u += 1
            n_ev = _end_event(ev_ids, active, csr, n_ev, n_u, step[g0] * n_layers + l, g1 - g0)
        g0 = g1
    return n_ev, n_u


@jit
def _step_layer_events_bits(step, rows, experts, gates, has_gates, n_experts, ev_ids, csr, expert, mult, gm,
                            active):
    """:func:`step_layer_events` for ``N <= 128``, with no branch per entry: each entry sets its expert's bit in
    one of two registers and adds to its count and gate sum; the members are read from the bits in ascending
    order, each count and sum read and cleared there (:func:`_step_layer_events_any`'s test of a first entry per
    entry, true about half the time on a Qwen3-sized trace, made it take 1.4-2.2x this loop's time at B = 1-32:
    ``benchmarks/event_build.py``). The sums start at ``-0.0``, so that a first gate is its own sum, ``-0.0``
    included; every later one is added in the same order."""
    n = step.shape[0]
    n_layers, k = experts.shape[1], experts.shape[2]
    count = np.zeros(n_experts, dtype=np.int64)
    gsum = np.full(n_experts, -0.0, dtype=np.float64)
    one = np.uint64(1)
    zero = np.uint64(0)
    n_ev = 0
    n_u = 0
    csr[0] = 0
    g0 = 0
    while g0 < n:
        g1 = _step_end(step, g0, n)
        for l in range(n_layers):
            w0 = zero                  # the event's experts below 64, and from 64
            w1 = zero
            for i in range(g0, g1):
                r = rows[_U(i)]
                for j in range(k):
                    e = _U(experts[_U(r), _U(l), _U(j)])
                    bit = one << (e & np.uint64(63))
                    hi = e >> np.uint64(6)
                    w0 |= bit & (hi - one)
                    w1 |= bit & (zero - hi)
                    _add_entry(count, gsum, has_gates, gates, r, l, j, e)
            n_u = _members_of_word(w0, 0, count, gsum, has_gates, expert, mult, gm, n_u)
            n_u = _members_of_word(w1, 64, count, gsum, has_gates, expert, mult, gm, n_u)
            n_ev = _end_event(ev_ids, active, csr, n_ev, n_u, step[g0] * n_layers + l, g1 - g0)
        g0 = g1
    return n_ev, n_u


@jit
def _step_layer_events_words(step, rows, experts, gates, has_gates, n_experts, ev_ids, csr, expert, mult, gm,
                             active):
    """:func:`_step_layer_events_bits` for more than 128 experts: the event's bits in ``ceil(N / 64)`` words in
    memory, every word read at the event's end (:data:`_WORDS_MAX_EXPERTS`); the same arrays."""
    n = step.shape[0]
    n_layers, k = experts.shape[1], experts.shape[2]
    count = np.zeros(n_experts, dtype=np.int64)
    gsum = np.full(n_experts, -0.0, dtype=np.float64)
    n_words = (n_experts + 63) >> 6
    seen = np.zeros(n_words, dtype=np.uint64)
    one = np.uint64(1)
    n_ev = 0
    n_u = 0
    csr[0] = 0
    g0 = 0
    while g0 < n:
        g1 = _step_end(step, g0, n)
        for l in range(n_layers):
            for i in range(g0, g1):
                r = rows[_U(i)]
                for j in range(k):
                    e = _U(experts[_U(r), _U(l), _U(j)])
                    seen[e >> np.uint64(6)] |= one << (e & np.uint64(63))
                    _add_entry(count, gsum, has_gates, gates, r, l, j, e)
            for w in range(n_words):
                n_u = _members_of_word(seen[w], w << 6, count, gsum, has_gates, expert, mult, gm, n_u)
                seen[w] = 0
            n_ev = _end_event(ev_ids, active, csr, n_ev, n_u, step[g0] * n_layers + l, g1 - g0)
        g0 = g1
    return n_ev, n_u


@jit
def greedy_union(cand, known, base, base_known, room, top_k, width):
    """The rotation schedulers' greedy pick (:func:`expertcache.events.rotation._greedy`): starting from the union
    of the ``base`` sessions' known sets, add ``room`` candidates one at a time, each the one bringing the fewest
    experts new to the union (summed over layers; a candidate of unknown set costs ``top_k`` per layer), the first
    in candidate order among equal costs; returns their positions in ``cand``, in the order picked.

    ``cand`` / ``base``: int64 ``[m, L, k]`` / ``[b, L, k]`` expert sets (distinct experts per layer, ids below
    ``width``), ``known`` / ``base_known``: uint8 per session (0: its set is unknown, its row ignored).

    >>> c = np.array([[[0, 1]], [[2, 3]], [[1, 2]]]); b = np.array([[[0, 1]]])
    >>> greedy_union(c, np.ones(3, np.uint8), b, np.ones(1, np.uint8), 2, 2, 4).tolist()
    [0, 2]
    """
    m, n_layers, k = cand.shape
    union = np.zeros((n_layers, width), dtype=np.bool_)
    for r in range(base.shape[0]):
        if base_known[r]:
            for layer in range(n_layers):
                for j in range(k):
                    union[layer, base[r, layer, j]] = True
    n_pick = min(room, m)
    taken = np.zeros(m, dtype=np.bool_)
    out = np.empty(n_pick, dtype=np.int64)
    for q in range(n_pick):
        best = -1
        best_cost = 0
        for r in range(m):
            if taken[r]:
                continue
            cost = top_k * n_layers
            if known[r]:
                cost = 0
                for layer in range(n_layers):
                    for j in range(k):
                        cost += not union[layer, cand[r, layer, j]]
            if best < 0 or cost < best_cost:
                best = r
                best_cost = cost
        taken[best] = True
        out[q] = best
        if known[best]:
            for layer in range(n_layers):
                for j in range(k):
                    union[layer, cand[best, layer, j]] = True
    return out


@jit
def union_size(sets, width):
    """``sum over layers of |union of sets[:, layer]|`` for int64 ``sets[m, L, k]`` (ids below ``width``).

    >>> union_size(np.array([[[0, 1], [2, 3]], [[1, 2], [2, 3]]]), 4)
    5
    """
    m, n_layers, k = sets.shape
    seen = np.zeros((n_layers, width), dtype=np.bool_)
    total = 0
    for r in range(m):
        for layer in range(n_layers):
            for j in range(k):
                e = sets[r, layer, j]
                if not seen[layer, e]:
                    seen[layer, e] = True
                    total += 1
    return total
