"""numba kernels of the advice producers: per-token scores summed into events, expert-map matching.

Each kernel reproduces, operation for operation and in the same floating-point types and order, the numpy
expression it replaces (named in its docstring), so the advice arrays are bit-identical to it
(``tests/test_prefetch_kernels.py`` compares them); what goes away is the ``[n_tokens, S]`` and
``[n_tokens, N]`` temporaries and the passes over them. Kernels trust their inputs.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit, jit_helper, jit_inline


@jit
def scatter_sorted(out, ev, order, scores, gather):
    """Sum per-token scores into event rows of ``out``, NaN meaning "no score" (:meth:`AdviceContext.scatter`).

    Parameters
    ----------
    out : float32[n_events, N]
        Updated in place: an entry where at least one token has a score becomes ``float32(cur + sum)``
        (``cur`` read as 0 when NaN); the others are unchanged.
    ev : int64[n]
        The event of each token, sorted ascending (stable: tokens of one event keep their order).
    order : int64[n]
        For each sorted position, the token's row of ``scores`` (or of ``gather``).
    scores : float[n_rows, N]
        Per-token scores (float32 or float64); with ``gather`` non-empty, a table whose row
        ``gather[order[j]]`` is token ``order[j]``'s scores (a negative row: no score at all).
    gather : int64[n_tokens] (or [0])
        Row of ``scores`` per token, when the scores are looked up rather than given per token.

    The sum is float64, sequential over the event's tokens in order, starting from the first
    token's (masked) score: what ``np.add.reduceat`` over the stably sorted rows computes.
    """
    n = ev.shape[0]
    n_cols = out.shape[1]
    use_gather = gather.shape[0] > 0
    acc = np.zeros(n_cols, dtype=np.float64)
    cnt = np.zeros(n_cols, dtype=np.int64)
    j = 0
    while j < n:
        e = ev[j]
        first = True
        while j < n and ev[j] == e:
            t = order[j]
            row = t
            none = False
            if use_gather:
                row = gather[t]
                none = row < 0
            for c in range(n_cols):
                x = np.nan if none else np.float64(scores[row, c])
                valid = not np.isnan(x)
                v = x if valid else 0.0
                if first:
                    acc[c] = v
                    cnt[c] = 1 if valid else 0
                else:
                    acc[c] += v
                    cnt[c] += 1 if valid else 0
            first = False
            j += 1
        for c in range(n_cols):
            if cnt[c] > 0:
                cur = np.float64(out[e, c])
                if np.isnan(cur):
                    cur = 0.0
                out[e, c] = np.float32(cur + acc[c])


@jit
def expert_map_scores(dot, ex, w, maps_prev, x_sq, m_sq, sem, sem_row, alpha, use_traj, m_take, maps_layer, score):
    """Per token: similarity to every stored map, the ``m_take`` best maps' mean row (``expert_map_search``).

    Reproduces, per row ``x``::

        dot += (sum over q of float64(w[x, q]) * float64(maps_prev[ex[x, q]]))   (from 0, q in order, float64)
        x_sq += sum over q of float64(w[x, q]) ** 2                            (q in order)
        norm = sqrt(x_sq[x] * m_sq); traj = dot / norm where norm > 0 else 0
        sim = alpha * sem[sem_row[x]] + (1 - alpha) * traj   (float64; traj alone without sem; sem alone at layer 0)
        best = argsort(-sim, stable)[:m_take]
        score = mean(maps_layer[best], axis=0) in float32, NaN where <= 0

    The arrays over the stored maps hold map ``s`` at place ``(s % 8) * B + s // 8`` (:func:`store_places`; ``B``
    blocks of 8, the tail block's places past ``S`` zero): the eight maps of a block lie a row of ``B`` apart, so
    the blocks' maxima are one vector pass, and every other pass over the maps is the same loop as in map order.

    Parameters
    ----------
    dot : float64[n, 8 B]
        Trajectory dot products by place (ignored when ``use_traj`` is False); the previous layer's are added to it
        first.
    ex : int64[n, k] (or [0, 0]), w : float32[n, k]
        The previous layer's selected experts of each token (ascending) and their weights: the token's vector
        at that layer is ``w`` at ``ex``, zero elsewhere, so its dot product with every stored map is the sum
        of ``k`` rows of ``maps_prev``, each product exact in float64 (no BLAS: the same bits on every machine).
    maps_prev : float32[N + 1, 8 B]
        The stored maps at the previous layer, transposed (expert-major), by place, and a zero row: the last rows
        of a sum are taken four at a time, the missing ones as the zero row with weight 0 (a product +0.0, which
        leaves a sum that starts at +0.0, never -0.0, as it is).
    x_sq : float64[n], m_sq : float64[8 B]
        Squared trajectory norms of the tokens (the previous layer's weights are added here) and of the stored
        maps (up to the previous layer, by place).
    sem : float64[n_rows, 8 B] (or [0, 0])
        Semantic cosines to every stored map by place (:func:`cosine_table`), one row per request; empty when
        there are none.
    sem_row : int64[n]
        Each token's row of ``sem``.
    alpha : float
        Semantic weight.
    use_traj : bool
        False at layer 0 (similarity = ``sem`` alone).
    m_take : int
        Maps averaged (``>= 1``).
    maps_layer : float32[S, N]
        The stored maps' rows at this layer, in map order.
    score : float32[n, N]
        Output.
    """
    n, n_store = dot.shape[0], maps_layer.shape[0]
    n_cols = maps_layer.shape[1]
    n_pos = dot.shape[1]
    n_blocks = n_pos >> 3
    has_sem = sem.shape[0] > 0
    beta = 1.0 - alpha
    best = np.empty(m_take, dtype=np.int64)
    best_v = np.empty(m_take, dtype=np.float64)
    add = np.empty(n_pos, dtype=np.float64)
    near = np.empty(n_pos, dtype=np.float64)
    bmax = np.empty(n_blocks, dtype=np.float64)
    cand = np.empty(n_store, dtype=np.int64)
    blk = np.empty(n_blocks, dtype=np.int64)
    acc = np.empty(n_cols, dtype=np.float32)
    inv_m = np.empty(n_pos, dtype=np.float64)
    for p in range(n_pos):
        inv_m[p] = 1.0 / np.sqrt(m_sq[p]) if m_sq[p] > 0 else 0.0
    n_k = ex.shape[1] if ex.shape[0] > 0 else 0
    n_head = ((n_k - 1) >> 2) << 2 if n_k > 0 else 0     # rows summed into `add` before the last (up to) four
    zero_row = maps_prev.shape[0] - 1
    for x in range(n):
        xs = x_sq[x]
        if use_traj:
            # the previous layer's k rows of maps_prev summed in order (four a pass; the last four, padded with
            # the zero row and weight 0, in the pass that adds the sum to the dot products and takes a near
            # similarity without a square root or a division, within _NEAR of the exact one)
            g_sq = 0.0
            for q in range(n_k):
                g = np.float64(w[x, q])
                g_sq += g * g
            xs += g_sq
            x_sq[x] = xs
            for q in range(0, n_head, 4):
                e0, e1, e2, e3 = ex[x, q], ex[x, q + 1], ex[x, q + 2], ex[x, q + 3]
                g0, g1 = np.float64(w[x, q]), np.float64(w[x, q + 1])
                g2, g3 = np.float64(w[x, q + 2]), np.float64(w[x, q + 3])
                if q == 0:
                    for p in range(n_pos):
                        add[p] = _add4(0.0, maps_prev, p, e0, e1, e2, e3, g0, g1, g2, g3)
                else:
                    for p in range(n_pos):
                        add[p] = _add4(add[p], maps_prev, p, e0, e1, e2, e3, g0, g1, g2, g3)
            e0 = e1 = e2 = e3 = zero_row
            g0 = g1 = g2 = g3 = 0.0
            if n_k > 0:
                e0, g0 = ex[x, n_head], np.float64(w[x, n_head])
            if n_head + 1 < n_k:
                e1, g1 = ex[x, n_head + 1], np.float64(w[x, n_head + 1])
            if n_head + 2 < n_k:
                e2, g2 = ex[x, n_head + 2], np.float64(w[x, n_head + 2])
            if n_head + 3 < n_k:
                e3, g3 = ex[x, n_head + 3], np.float64(w[x, n_head + 3])
            if n_head == 0:                 # no rows summed yet: the sum starts at 0
                for p in range(n_pos):
                    add[p] = 0.0
            ix = 1.0 / np.sqrt(xs) if xs > 0 else 0.0
            if has_sem:
                sx = sem_row[x]
                for p in range(n_pos):
                    d = dot[x, p] + _add4(add[p], maps_prev, p, e0, e1, e2, e3, g0, g1, g2, g3)
                    dot[x, p] = d
                    near[p] = alpha * sem[sx, p] + beta * ((d * ix) * inv_m[p])
            else:
                for p in range(n_pos):
                    d = dot[x, p] + _add4(add[p], maps_prev, p, e0, e1, e2, e3, g0, g1, g2, g3)
                    dot[x, p] = d
                    near[p] = (d * ix) * inv_m[p]
        else:
            sx = sem_row[x]
            for p in range(n_pos):
                near[p] = sem[sx, p]
        for s in range(n_store, n_pos):             # the tail block's places past the store
            near[(s & 7) * n_blocks + (s >> 3)] = -np.inf
        for b in range(n_blocks):                    # a block's eight values a row apart: a vector pass over b
            bmax[b] = max(max(max(near[b], near[n_blocks + b]), max(near[2 * n_blocks + b], near[3 * n_blocks + b])),
                          max(max(near[4 * n_blocks + b], near[5 * n_blocks + b]),
                              max(near[6 * n_blocks + b], near[7 * n_blocks + b])))
        th = _near_threshold(near, bmax, m_take, best_v) - _NEAR
        n_blk = 0
        for b in range(n_blocks):              # the blocks that hold one, listed without a branch
            blk[n_blk] = b
            n_blk += bmax[b] >= th
        n_cand = 0
        for i in range(n_blk):
            b = blk[i]
            for s in range(b << 3, min((b << 3) + 8, n_store)):
                cand[n_cand] = s               # written always, kept when near the m_take-th (no branch)
                n_cand += near[(s & 7) * n_blocks + b] >= th
        # keep the m_take largest exact similarities, earlier index first among equals (a later equal never
        # displaces)
        n_best = 0
        for c in range(n_cand):
            s = cand[c]
            p = (s & 7) * n_blocks + (s >> 3)
            if use_traj:
                norm = np.sqrt(xs * m_sq[p])
                traj = dot[x, p] / norm if norm > 0 else 0.0
                v = alpha * sem[sem_row[x], p] + beta * traj if has_sem else traj
            else:
                v = sem[sem_row[x], p]
            if n_best < m_take:
                q = n_best
                n_best += 1
            elif v > best_v[m_take - 1]:
                q = m_take - 1
            else:
                continue
            while q > 0 and v > best_v[q - 1]:
                best_v[q] = best_v[q - 1]
                best[q] = best[q - 1]
                q -= 1
            best_v[q] = v
            best[q] = s
        # the best maps' mean row, column by column in loops the compiler vectorises
        b0 = best[0]
        for c in range(n_cols):
            acc[c] = maps_layer[b0, c]
        for q in range(1, m_take):
            bq = best[q]
            for c in range(n_cols):
                acc[c] = np.float32(acc[c] + maps_layer[bq, c])
        for c in range(n_cols):
            v32 = np.float32(acc[c] / np.float32(m_take))
            score[x, c] = np.nan if v32 <= 0 else v32


@jit_inline
def _add4(acc, maps_prev, p, e0, e1, e2, e3, g0, g1, g2, g3):
    """``acc`` plus four rows' weighted values at place ``p``, added in row order in float64."""
    return ((((acc + g0 * np.float64(maps_prev[e0, p])) + g1 * np.float64(maps_prev[e1, p]))
             + g2 * np.float64(maps_prev[e2, p])) + g3 * np.float64(maps_prev[e3, p]))


def store_places(n_store: int) -> np.ndarray:
    """``int64[S]``: the place of each stored map in :func:`expert_map_scores`' arrays, ``(s % 8) * B + s // 8``
    for ``B = ceil(S / 8)`` blocks of 8 (a block's maps a row of ``B`` apart).

    >>> store_places(10).tolist()
    [0, 2, 4, 6, 8, 10, 12, 14, 1, 3]
    """
    s = np.arange(n_store, dtype=np.int64)
    return (s & 7) * ((n_store + 7) >> 3) + (s >> 3)


#: How far below the m-th largest near similarity a map is still a candidate: far above twice the near value's
#: error (a few units of 2**-53 on values of magnitude <= 2: the quotient ``dot / sqrt(x_sq * m_sq)`` against
#: ``dot * (1 / sqrt(x_sq)) * (1 / sqrt(m_sq))``), far below any gap that matters.
_NEAR = 1e-9


@jit_helper
def _insert_top(x, top, m):
    """Insert ``x`` into ``top[:m]`` (descending) when it beats ``top[m - 1]``."""
    if x > top[m - 1]:
        r = m - 1
        while r > 0 and x > top[r - 1]:
            top[r] = top[r - 1]
            r -= 1
        top[r] = x


@jit_inline
def _push4(t0, t1, t2, t3, x):
    """``x`` into the four largest ``t0 >= t1 >= t2 >= t3`` seen (a value moves down past every one it does not
    exceed; a NaN, exceeding none, falls out), as selects rather than branches."""
    c = x > t0
    t0, x = (x, t0) if c else (t0, x)
    c = x > t1
    t1, x = (x, t1) if c else (t1, x)
    c = x > t2
    t2, x = (x, t2) if c else (t2, x)
    c = x > t3
    t3 = x if c else t3
    return t0, t1, t2, t3


@jit_inline
def _pick4(t0, t1, t2, t3, m):
    """The ``m``-th of ``t0, t1, t2, t3`` (``1 <= m <= 4``)."""
    return t0 if m == 1 else t1 if m == 2 else t2 if m == 3 else t3


@jit_helper
def _near_threshold(v, bmax, m, top):
    """The ``m``-th largest of ``v`` (``1 <= m <= len(v)``; blocks of 8 with maxima ``bmax``, block ``b``'s values
    at ``v[j * B + b]``); ``top`` is scratch.

    The ``m``-th largest block maximum ``low`` is at most the answer (``m`` blocks hold a value ``>= low``), so
    only the blocks whose maximum reaches ``low`` are searched, value by value: for ``m <= 4`` the four largest
    kept in registers, else ``top[:m]`` by insertion.
    """
    n_blocks = bmax.shape[0]
    if m <= 4:
        t0 = t1 = t2 = t3 = -np.inf
        for b in range(n_blocks):
            t0, t1, t2, t3 = _push4(t0, t1, t2, t3, bmax[b])
        low = _pick4(t0, t1, t2, t3, m)
        t0 = t1 = t2 = t3 = -np.inf
        for b in range(n_blocks):
            if bmax[b] >= low:
                for j in range(8):
                    t0, t1, t2, t3 = _push4(t0, t1, t2, t3, v[j * n_blocks + b])
        return _pick4(t0, t1, t2, t3, m)
    for q in range(m):
        top[q] = -np.inf
    for b in range(n_blocks):
        _insert_top(bmax[b], top, m)
    low = top[m - 1]
    for q in range(m):
        top[q] = -np.inf
    for b in range(n_blocks):
        if bmax[b] >= low:
            for j in range(8):
                _insert_top(v[j * n_blocks + b], top, m)
    return top[m - 1]


@jit
def add_rows(acc, x):
    """``acc[j] += float64(x[i, l, j])`` over ``i``, then ``l``, in order: hidden states ``float[m, L, d]`` summed
    into ``float64[d]`` (a prompt's mean hidden state, ``expert_map.prompt_vectors``), in one order on every
    machine."""
    for i in range(x.shape[0]):
        for l in range(x.shape[1]):
            for j in range(x.shape[2]):
                acc[j] += np.float64(x[i, l, j])


@jit
def cosine_table(a, bt, out):
    """``out[r, c]``: the cosine of ``a[r]`` and column ``c`` of ``bt``, ``dot / sqrt(|a[r]|^2 * |b_c|^2)``, 0 where
    either vector is zero (the semantic similarity of ``expert_map_search``).

    ``a`` is ``float64[n_a, F]``, ``bt`` is ``float64[F, n_b]`` (the other vectors as columns), ``out`` is
    ``float64[n_a, n_b]``. Every dot product and squared norm is a float64 sum over the features in order, each
    product rounded before it is added (no BLAS, no reassociation: the same bits on every machine; on whole
    numbers below 2**53, as routing histograms are, every sum is exact). A zero feature of ``a`` is skipped.
    """
    n_a, n_f = a.shape
    n_b = bt.shape[1]
    b_sq = np.zeros(n_b, dtype=np.float64)
    for f in range(n_f):
        for c in range(n_b):
            b_sq[c] += bt[f, c] * bt[f, c]
    acc = np.empty(n_b, dtype=np.float64)
    for r in range(n_a):
        for c in range(n_b):
            acc[c] = 0.0
        a_sq = 0.0
        for f in range(n_f):
            v = a[r, f]
            if v != 0.0:
                a_sq += v * v
                for c in range(n_b):
                    acc[c] += v * bt[f, c]
        for c in range(n_b):
            norm = np.sqrt(a_sq * b_sq[c])
            out[r, c] = acc[c] / norm if norm > 0 else 0.0


@jit
def prefix_activations(experts, rows, base, out):
    """``out[t] = base + activations of rows[:t]`` (float32 ``[n, L*N]``): a request's partial EAM before each
    of its tokens (``expertcache.prefetch.activation``).

    ``experts`` is ``int[n_tokens, L, k]``; counts are whole numbers (exact in float32 below 2**24), so this
    equals ``base + cumsum(multi_hot) - multi_hot`` in any summation order.
    """
    n_layers, k = experts.shape[1], experts.shape[2]
    n_cols = base.shape[0]
    n_experts = n_cols // n_layers
    run = base.copy()
    for t in range(rows.shape[0]):
        for c in range(n_cols):
            out[t, c] = run[c]
        r = rows[t]
        for l in range(n_layers):
            for j in range(k):
                run[l * n_experts + experts[r, l, j]] += np.float32(1.0)


@jit
def pair_counts(a, b, n_experts, aa, ab):
    """Co-occurrence counts of one token's experts at two layers: ``aa[i*N + j]`` += tokens with ``i`` and ``j``
    among ``a``'s row, ``ab[i*N + j]`` += tokens with ``i`` in ``a``'s row and ``j`` in ``b``'s (``a``, ``b``:
    ``[n, k]`` expert ids; ``aa``, ``ab``: int64 ``[N*N]``, added to). What ``np.bincount`` of the ``[n, k, k]``
    outer sums counts, without building them."""
    n, k = a.shape
    for r in range(n):
        for i in range(k):
            x = np.int64(a[r, i]) * n_experts
            for j in range(k):
                aa[x + a[r, j]] += 1
                ab[x + b[r, j]] += 1
