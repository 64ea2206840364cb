"""numba kernel of the proactive-load-aware replay (CLR Alg. 1/2 on the event-atomic contract of §2.2).

Trusts its inputs (the wrapper in :mod:`.proactive` validates). Per-layer
scope: the cache partition of an event is its layer. Per event ``i``:

1. *pre-access refinement* (budget ``R``): the top-``R`` finite scores of
   ``prefetch[i]`` (descending, lower expert id first among equals) are
   examined in order; a non-resident candidate is inserted into a free slot,
   or replaces the resident with the lowest score of the same vector (NaN and
   ``-inf`` rank lowest; among equals the lower tie rank leaves) when its own
   score is strictly higher. Every insertion is one proactive load.
2. *access*: members of ``E(i)`` found resident are hits, the others demand
   misses (one transfer each).
3. *update*: misses join the candidates; when they exceed the capacity the
   lowest-ranked candidates leave. Base keys rank every candidate (the rule of
   :func:`._kernels.replay_scan`, so misses may be bypassed); the advice key is
   ``U_B``: members of ``E(i)`` are protected and rank above every other
   resident, and within each class the advice priority of event ``i`` decides.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit, jit_helper
from ._kernels import _less, crf_key, crf_update
from ._kernels_bits import _kth_lowest

#: Priority sources (key codes of this kernel).
PKEY_LRU = 0
PKEY_LFU = 1
PKEY_LFRU = 2
PKEY_LRFU = 3
PKEY_ADVICE = 4


@jit_helper
def _score(x):
    """A score with NaN read as ``-inf`` (never preferred)."""
    return -np.inf if np.isnan(x) else x


@jit_helper
def _base_key(code, b, t, last, freq, crf, plast, lam):
    """Retention key of a base policy for block ``b`` at the end of event ``t`` (larger = keep)."""
    if code == PKEY_LRU:
        return float(last[b])
    if code == PKEY_LFU:
        return float(freq[b])
    if code == PKEY_LFRU:
        return freq[b] / float(t - last[b] + 1)
    # LRFU: log2 of the CRF at the last access plus lam * that unit (_kernels.crf_key): changes only on access
    if crf[b] <= 0.0:
        return -np.inf
    return crf_key(crf[b], float(plast[b]), lam)


@jit_helper
def _drop_lowest(cand, n, d, k1, k2, tie, keep, idx, fa, fb, fc):
    """``keep[j] = False`` for the ``d`` lowest-ranked of ``cand[:n]`` (``0 < d < n``), ``True`` for the others.

    The order is strict and total: ``k1`` of the block, then ``k2``, then its tie rank (distinct), lower first.

    Level by level without a data-dependent branch per candidate: the ``d``-th lowest ``k1`` (a branch-free
    quickselect, :func:`._kernels_bits._kth_lowest`) drops every candidate below it; among those equal to it,
    the same on ``k2``, then on the tie rank (distinct, so the last level decides). ``idx`` (int64) and ``fa``,
    ``fb``, ``fc`` (float64) are scratch of at least ``n`` entries.
    """
    m = n
    for j in range(n):
        idx[j] = j
    level = 0
    while True:
        for j in range(m):
            b = cand[idx[j]]
            x = k1[b] if level == 0 else (k2[b] if level == 1 else float(tie[b]))
            fa[j] = x
            fc[j] = x
        v = _kth_lowest(fa, fb, m, d)
        n_less = 0
        n_eq = 0
        for j in range(m):
            x = fc[j]
            c = idx[j]
            keep[c] = x > v
            n_less += x < v
            idx[n_eq] = c                  # written always, kept when equal (no branch)
            n_eq += x == v
        d -= n_less
        if d == n_eq:                      # every candidate at v drops
            for j in range(n_eq):
                keep[idx[j]] = False
            return
        # those below v drop (keep False); the next level decides among the n_eq equal to it
        m = n_eq
        level += 1


@jit_helper
def _heap_down(hp, q, n, rs, rk, rt):
    """Sift slot ``hp[q]`` down the min-heap ``hp[:n]`` of slots ordered by ``(rs, rk, rt)`` (strict: ties distinct)."""
    x = hp[q]
    while True:
        c = 2 * q + 1
        if c >= n:
            break
        d = c + 1
        if d < n:
            a = hp[c]
            y = hp[d]
            if _less(y, a, rs, rk, rt):
                c = d
        y = hp[c]
        if not _less(y, x, rs, rk, rt):
            break
        hp[q] = y
        q = c
    hp[q] = x


@jit_helper
def top_scores(scores, i, n, budget, order, ids, vals, fa, fb):
    """The experts of row ``i`` of ``scores`` (float32, ``n`` columns) with the ``budget`` highest scores that are
    neither NaN nor ``-inf``, in ``order[:k]``, descending, the lower expert first among equal scores (what a stable
    sort of the negated scores over ascending experts puts first); returns ``k``, at most ``budget``.

    No branch on a score: the ``k``-th highest score ``v`` (the ``m - k + 1``-th lowest of the ``m`` valid ones) by a
    branch-free quickselect (:func:`._kernels_bits._kth_lowest`), then one pass in expert order keeps the scores above
    ``v`` and the first of those equal to it (in ``ids`` / ``vals``), and each kept expert goes to its rank among them.
    ``ids`` (int64) and ``vals``, ``fa``, ``fb`` (float64) are scratch of at least ``n`` entries. With an insertion
    into a sorted buffer instead (a branch an expert), a budgeted replay of ``prefetch compare`` took 1/0.87 of its
    time (docs/performance.md, *Session 45*).
    """
    n_valid = 0
    for e in range(n):
        x = scores[i, e]
        fa[n_valid] = np.float64(x)                # written always, kept where valid
        n_valid += not (np.isnan(x) or x == -np.inf)
    k = min(budget, n_valid)
    if k <= 0:
        return 0
    v = _kth_lowest(fa, fb, n_valid, n_valid - k + 1)      # the k-th highest valid score
    n_above = 0
    for e in range(n):
        n_above += np.float64(scores[i, e]) > v    # (NaN above nothing)
    eq_left = k - n_above                          # of the scores equal to v, the first eq_left experts
    q = 0
    for e in range(n):
        x = np.float64(scores[i, e])
        eq = np.int64((x == v) & (eq_left > 0))
        ids[q] = e
        vals[q] = x
        q += np.int64(x > v) + eq
        eq_left -= eq
    for j in range(k):                             # ranks among the kept: higher first, then lower expert
        x = vals[j]
        r = 0
        for t in range(k):
            y = vals[t]
            r += (y > x) | ((y == x) & (t < j))
        order[r] = ids[j]
    return k


@jit
def replay_proactive(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie, key_code, lam, priority,
                     prefetch, budget, counted, hits, misses, proactive, useful, hit_flag, pf_expert, pf_n):
    """Replay with pre-access refinement and a retention key; counts into per-layer arrays.

    Parameters
    ----------
    offsets, expert, ev_layer
        The stream's CSR arrays (members ascending within an event).
    n_experts, n_layers : int
        ``N`` and ``L``.
    capacity : int64[L]
        Blocks each layer may hold.
    tie : int64[L*N]
        Distinct tie ranks; the larger is retained among equal keys.
    key_code : int
        ``PKEY_*``: the retention key.
    lam : float
        LRFU decay ``lambda`` (``F(x) = 2**(-lam * x)``), on the per-layer event clock.
    priority : float32[n_events, N] (or [0, 0])
        Advice priorities, read when ``key_code == PKEY_ADVICE``.
    prefetch : float32[n_events, N] (or [0, 0])
        Pre-access scores, read when ``budget > 0``.
    budget : int
        ``R``: candidates examined per event.
    counted : bool[n_events]
        Events whose counts enter the outputs (the others only update the cache).
    hits, misses, proactive, useful : int64[L]
        Outputs: hits, demand misses, proactive loads, and proactive loads later hit
        before leaving the cache.
    hit_flag : uint8[n_access] (or [0])
        Output when not empty: 1 where the access hit (every event, counted or not).
    pf_expert : int32[n_events, W] (or [0, 0]), pf_n : int64[n_events] (or [0])
        Outputs when not empty (``W >= min(budget, N)``): the experts inserted by pre-access refinement
        before each event, in insertion order, and how many (every event, counted or not).
    """
    record_hits = hit_flag.shape[0] > 0
    record_pf = pf_n.shape[0] > 0
    n_blocks = n_layers * n_experts
    n_events = offsets.shape[0] - 1
    slots = 1
    for p in range(n_layers):
        slots = max(slots, min(capacity[p], n_experts))
    max_unit = 1
    for i in range(n_events):
        max_unit = max(max_unit, offsets[i + 1] - offsets[i])
    res = np.empty((n_layers, slots), dtype=np.int64)
    n_res = np.zeros(n_layers, dtype=np.int64)
    in_cache = np.zeros(n_blocks, dtype=np.bool_)
    member = np.zeros(n_blocks, dtype=np.bool_)
    prefetched = np.zeros(n_blocks, dtype=np.bool_)       # loaded proactively in a counted event, not yet hit
    last = np.full(n_blocks, -1, dtype=np.int64)
    freq = np.zeros(n_blocks, dtype=np.int64)
    crf = np.zeros(n_blocks, dtype=np.float64)
    plast = np.zeros(n_blocks, dtype=np.int64)            # per-layer clock of the last access
    k1 = np.zeros(n_blocks, dtype=np.float64)
    k2 = np.zeros(n_blocks, dtype=np.float64)
    cand = np.empty(slots + max_unit, dtype=np.int64)
    keep = np.zeros(slots + max_unit, dtype=np.bool_)
    pos = np.empty(slots + max_unit, dtype=np.int64)
    fa = np.empty(slots + max_unit, dtype=np.float64)    # scratch of the eviction's selection
    fb = np.empty(slots + max_unit, dtype=np.float64)
    fc = np.empty(slots + max_unit, dtype=np.float64)
    miss_buf = np.empty(max_unit, dtype=np.int64)
    order = np.empty(n_experts, dtype=np.int64)           # a refinement's candidates (top_scores), and its scratch
    top_i = np.empty(n_experts, dtype=np.int64)
    top_s = np.empty(n_experts, dtype=np.float64)
    sel_a = np.empty(n_experts, dtype=np.float64)
    sel_b = np.empty(n_experts, dtype=np.float64)
    rs = np.empty(slots, dtype=np.float64)                # residents' prefetch scores in a refinement
    rk = np.empty(slots, dtype=np.float64)                # and their retention keys
    rt = np.empty(slots, dtype=np.int64)                  # and tie ranks
    hp = np.empty(slots, dtype=np.int64)                  # a min-heap of their slots
    use_advice = key_code == PKEY_ADVICE
    is_lrfu = key_code == PKEY_LRFU
    decay_clock = np.zeros(n_layers, dtype=np.int64)   # events seen per layer: the LRFU clock
    prev_ev = np.full(n_layers, -1, dtype=np.int64)     # the layer's previous event (its priority row)
    for i in range(n_events):
        layer = ev_layer[i]
        cap = capacity[layer]
        base = layer * n_experts
        count = counted[i]
        now = decay_clock[layer]
        decay_clock[layer] += 1
        # 1. pre-access refinement
        if budget > 0 and cap > 0:
            n_top = top_scores(prefetch, i, n_experts, budget, order, top_i, top_s, sel_a, sel_b)
            pe = prev_ev[layer]
            keyed = 0           # residents res[layer, :keyed] have their (score, key) in rs, rk for this event
            for j in range(n_top):
                e = order[j]
                b = base + e
                if in_cache[b]:
                    continue
                s = prefetch[i, e]
                r = n_res[layer]
                if r < cap:
                    slot = r
                    res[layer, r] = b
                    n_res[layer] = r + 1
                else:
                    # victim: lowest prefetch score; among equal scores the lowest retention rank, then tie.
                    # Within the event only the inserted block's score and key change: computed once each, the
                    # residents kept in a min-heap of slots by (score, key, tie) whose top is the victim.
                    if keyed < r:
                        for q in range(r):
                            v = res[layer, q]
                            rs[q] = _score(prefetch[i, v - base])
                            if use_advice:
                                rk[q] = _score(priority[pe, v - base]) if pe >= 0 else -np.inf
                            else:
                                rk[q] = _base_key(key_code, v, i, last, freq, crf, plast, lam)
                            rt[q] = tie[v]
                            hp[q] = q
                        for q in range((r >> 1) - 1, -1, -1):
                            _heap_down(hp, q, r, rs, rk, rt)
                        keyed = r
                    lo = hp[0]
                    if not s > rs[lo]:
                        continue
                    slot = lo
                    v = res[layer, lo]
                    in_cache[v] = False
                    prefetched[v] = False
                    res[layer, lo] = b
                in_cache[b] = True
                if record_pf:
                    pf_expert[i, pf_n[i]] = e
                    pf_n[i] += 1
                prefetched[b] = count          # only counted loads can be counted as useful
                last[b] = i                 # a load is an insertion at the most recent end (LRU clock)
                if count:
                    proactive[layer] += 1
                if keyed:                   # the inserted block takes the victim's slot, the heap's top
                    rs[slot] = _score(s)
                    if use_advice:
                        rk[slot] = _score(priority[pe, e]) if pe >= 0 else -np.inf
                    else:
                        rk[slot] = _base_key(key_code, b, i, last, freq, crf, plast, lam)
                    rt[slot] = tie[b]
                    _heap_down(hp, 0, r, rs, rk, rt)
        # 2. access against the snapshot
        n_miss = 0
        for a in range(offsets[i], offsets[i + 1]):
            b = base + expert[a]
            member[b] = True
            if in_cache[b]:
                if record_hits:
                    hit_flag[a] = 1
                if count:
                    hits[layer] += 1
                    if prefetched[b]:
                        useful[layer] += 1
                prefetched[b] = False
            else:
                if count:
                    misses[layer] += 1
                miss_buf[n_miss] = b
                n_miss += 1
            # policy state: this event references b (the CRF, a pow per access, only where LRFU reads it)
            if is_lrfu:
                crf[b] = crf_update(crf[b], float(plast[b]), float(now), lam)
            plast[b] = now
            last[b] = i
            freq[b] += 1
        # 3. admission and eviction after the event
        r = n_res[layer]
        if n_miss and r + n_miss <= cap:
            for j in range(n_miss):
                b = miss_buf[j]
                res[layer, r + j] = b
                in_cache[b] = True
            n_res[layer] = r + n_miss
        elif n_miss:
            n_c = r + n_miss
            for j in range(r):
                cand[j] = res[layer, j]
            for j in range(n_miss):
                cand[r + j] = miss_buf[j]
            for j in range(n_c):
                b = cand[j]
                if use_advice:      # U_B: protected members of E(i) first, then the advice priority
                    k1[b] = 1.0 if member[b] else 0.0
                    k2[b] = _score(priority[i, b - base])
                else:
                    k1[b] = _base_key(key_code, b, i, last, freq, crf, plast, lam)
                    k2[b] = 0.0
                keep[j] = True
            # drop the n_c - cap lowest under the strict total order (key, key2, tie)
            n_drop = n_c - min(cap, n_c)
            if n_drop == n_c:
                for j in range(n_c):
                    keep[j] = False
            elif n_drop > 0:
                _drop_lowest(cand, n_c, n_drop, k1, k2, tie, keep, pos, fa, fb, fc)
            kept = 0
            for j in range(n_c):
                b = cand[j]
                if keep[j]:
                    in_cache[b] = True
                    res[layer, kept] = b
                    kept += 1
                else:
                    in_cache[b] = False
                    prefetched[b] = False
            n_res[layer] = kept
        for a in range(offsets[i], offsets[i + 1]):
            member[base + expert[a]] = False
        prev_ev[layer] = i
