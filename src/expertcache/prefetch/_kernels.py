"""numba kernels of the advice producers: per-token scores summed into events, expert-map matching.

Each kernel reproduces, operation for operation and in the same floating-point types and order, the numpy
expression it replaces (named in its docstring), so the advice arrays are bit-identical to it
(``tests/test_prefetch_kernels.py`` compares them); what goes away is the ``[n_tokens, S]`` and
``[n_tokens, N]`` temporaries and the passes over them. Kernels trust their inputs.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit, jit_helper


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

        dot += sum over q of float64(w[x, q]) * float64(maps_prev[ex[x, q]])   (q in order, float64)
        x_sq += sum over q of float64(w[x, q]) ** 2                            (q in order)
        norm = sqrt(x_sq[x] * m_sq); traj = dot / norm where norm > 0 else 0
        sim = alpha * sem[sem_row[x]] + (1 - alpha) * traj   (float64; traj alone without sem; sem alone at layer 0)
        best = argsort(-sim, stable)[:m_take]
        score = mean(maps_layer[best], axis=0) in float32, NaN where <= 0

    Parameters
    ----------
    dot : float64[n, S]
        Trajectory dot products (ignored when ``use_traj`` is False); the previous layer's are added to it first.
    ex : int64[n, k] (or [0, 0]), w : float32[n, k]
        The previous layer's selected experts of each token (ascending) and their weights: the token's vector
        at that layer is ``w`` at ``ex``, zero elsewhere, so its dot product with every stored map is the sum
        of ``k`` rows of ``maps_prev``, each product exact in float64 (no BLAS: the same bits on every machine).
    maps_prev : float32[N, S]
        The stored maps at the previous layer, transposed (expert-major).
    x_sq : float64[n], m_sq : float64[S]
        Squared trajectory norms of the tokens (the previous layer's weights are added here) and of the stored
        maps (up to the previous layer).
    sem : float64[n_rows, S] (or [0, 0])
        Semantic cosines to every stored map (:func:`cosine_table`), one row per request; empty when there are
        none.
    sem_row : int64[n]
        Each token's row of ``sem``.
    alpha : float
        Semantic weight.
    use_traj : bool
        False at layer 0 (similarity = ``sem`` alone).
    m_take : int
        Maps averaged (``>= 1``).
    maps_layer : float32[S, N]
        The stored maps' rows at this layer.
    score : float32[n, N]
        Output.
    """
    n, n_store = dot.shape[0], maps_layer.shape[0]
    n_cols = maps_layer.shape[1]
    has_sem = sem.shape[0] > 0
    beta = 1.0 - alpha
    best = np.empty(m_take, dtype=np.int64)
    best_v = np.empty(m_take, dtype=np.float64)
    add = np.empty(n_store, dtype=np.float64)
    n_blocks = (n_store + 7) >> 3
    near = np.full(n_blocks << 3, -np.inf)             # whole blocks of 8: the tail block padded with -inf
    bmax = np.empty(n_blocks, dtype=np.float64)
    cand = np.empty(n_store, dtype=np.int64)
    inv_m = np.empty(n_store, dtype=np.float64)
    for s in range(n_store):
        inv_m[s] = 1.0 / np.sqrt(m_sq[s]) if m_sq[s] > 0 else 0.0
    n_k = ex.shape[1] if ex.shape[0] > 0 else 0
    for x in range(n):
        # the previous layer's dot products (k rows of maps_prev, in order), in loops the compiler vectorises
        if n_k > 0:
            for s in range(n_store):
                add[s] = 0.0
            g_sq = 0.0
            q = 0
            while q < n_k:
                if q + 4 <= n_k:               # four rows per pass, summed in the same order
                    e0, e1, e2, e3 = ex[x, q], ex[x, q + 1], ex[x, q + 2], ex[x, q + 3]
                    g0, g1 = np.float64(w[x, q]), np.float64(w[x, q + 1])
                    g2, g3 = np.float64(w[x, q + 2]), np.float64(w[x, q + 3])
                    g_sq = (((g_sq + g0 * g0) + g1 * g1) + g2 * g2) + g3 * g3
                    for s in range(n_store):
                        add[s] = ((((add[s] + g0 * np.float64(maps_prev[e0, s])) + g1 * np.float64(maps_prev[e1, s]))
                                   + g2 * np.float64(maps_prev[e2, s])) + g3 * np.float64(maps_prev[e3, s]))
                    q += 4
                else:
                    e = ex[x, q]
                    g = np.float64(w[x, q])
                    g_sq += g * g
                    for s in range(n_store):
                        add[s] += g * np.float64(maps_prev[e, s])
                    q += 1
            x_sq[x] += g_sq
            for s in range(n_store):
                dot[x, s] += add[s]
        # a near similarity without a square root or a division (within _NEAR of the exact one) and its block
        # maxima; the m_take-th largest near value from the blocks whose maximum can reach it; the exact
        # similarity of the maps near enough to it to be among the m_take best
        xs = x_sq[x]
        if use_traj:
            ix = 1.0 / np.sqrt(xs) if xs > 0 else 0.0
            if has_sem:
                sx = sem_row[x]
                for s in range(n_store):
                    near[s] = alpha * sem[sx, s] + beta * ((dot[x, s] * ix) * inv_m[s])
            else:
                for s in range(n_store):
                    near[s] = (dot[x, s] * ix) * inv_m[s]
        else:
            sx = sem_row[x]
            for s in range(n_store):
                near[s] = sem[sx, s]
        for b in range(n_blocks):
            o = b << 3
            bmax[b] = max(max(max(near[o], near[o + 1]), max(near[o + 2], near[o + 3])),
                          max(max(near[o + 4], near[o + 5]), max(near[o + 6], near[o + 7])))
        th = _near_threshold(near, bmax, m_take, best_v) - _NEAR
        n_cand = 0
        for b in range(n_blocks):
            if bmax[b] >= th:
                o = b << 3
                for s in range(o, min(o + 8, n_store)):
                    cand[n_cand] = s           # written always, kept when near the m_take-th (no branch)
                    n_cand += near[s] >= th
        # keep the m_take largest exact similarities, earlier index first among equals (a later equal never
        # displaces)
        n_best = 0
        for c in range(n_cand):
            s = cand[c]
            if use_traj:
                norm = np.sqrt(xs * m_sq[s])
                traj = dot[x, s] / norm if norm > 0 else 0.0
                v = alpha * sem[sem_row[x], s] + beta * traj if has_sem else traj
            else:
                v = sem[sem_row[x], s]
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
        for c in range(n_cols):
            acc = maps_layer[best[0], c]
            for q in range(1, m_take):
                acc = np.float32(acc + maps_layer[best[q], c])
            v32 = np.float32(acc / np.float32(m_take))
            score[x, c] = np.nan if v32 <= 0 else v32


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


@jit_helper
def _near_threshold(v, bmax, m, top):
    """The ``m``-th largest of ``v`` (``1 <= m <= len(v)``, blocks of 8 with maxima ``bmax``); ``top`` is scratch.

    The ``m``-th largest block maximum ``low`` is at most the answer (``m`` blocks hold a value ``>= low``), so
    only the blocks whose maximum reaches ``low`` are searched, value by value.
    """
    for q in range(m):
        top[q] = -np.inf
    for b in range(bmax.shape[0]):
        _insert_top(bmax[b], top, m)
    low = top[m - 1]
    for q in range(m):
        top[q] = -np.inf
    for b in range(bmax.shape[0]):
        if bmax[b] >= low:
            for s in range(b << 3, (b << 3) + 8):
                _insert_top(v[s], top, m)
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
