"""numba kernels of the advice producers: per-token scores summed into events, expert-map matching.

Each kernel reproduces, operation for operation and in the same floating-point types and order, the numpy
expression it replaces (named in its docstring), so the advice arrays are bit-identical to it
(``tests/test_prefetch_kernels.py`` compares them); what goes away is the ``[n_tokens, S]`` and
``[n_tokens, N]`` temporaries and the passes over them. Kernels trust their inputs.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit


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
def expert_map_scores(dot, add, x_sq, m_sq, sem, alpha, use_traj, m_take, maps_layer, score):
    """Per token: similarity to every stored map, the ``m_take`` best maps' mean row (``expert_map_search``).

    Reproduces, per row ``x``::

        norm = sqrt(x_sq[x] * m_sq); traj = dot / norm where norm > 0 else 0
        sim = float32(alpha) * sem + (1 - alpha) * traj      (traj alone without sem; sem alone at layer 0)
        best = argsort(-sim, stable)[:m_take]
        score = mean(maps_layer[best], axis=0) in float32, NaN where <= 0

    Parameters
    ----------
    dot : float64[n, S]
        Trajectory dot products (ignored when ``use_traj`` is False); ``add`` is added to it first.
    add : float32[n, S] (or [0, 0])
        This layer's dot products (``dot += add`` as numpy does it: each float32 widened, then added).
    x_sq : float64[n], m_sq : float64[S]
        Squared trajectory norms of the tokens and of the stored maps.
    sem : float32[n, S] (or [0, 0])
        Semantic cosines; empty when there are none.
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
    a32 = np.float32(alpha)
    beta = 1.0 - alpha
    best = np.empty(m_take, dtype=np.int64)
    best_v = np.empty(m_take, dtype=np.float64)
    sim = np.empty(n_store, dtype=np.float64)
    for x in range(n):
        # the similarity row first, in a branch-free loop the compiler vectorises
        if add.shape[0] > 0:
            for s in range(n_store):
                dot[x, s] += np.float64(add[x, s])
        if use_traj:
            xs = x_sq[x]
            if has_sem:
                for s in range(n_store):
                    norm = np.sqrt(xs * m_sq[s])
                    traj = dot[x, s] / norm if norm > 0 else 0.0
                    sim[s] = np.float64(a32 * sem[x, s]) + beta * traj
            else:
                for s in range(n_store):
                    norm = np.sqrt(xs * m_sq[s])
                    sim[s] = dot[x, s] / norm if norm > 0 else 0.0
        else:
            for s in range(n_store):
                sim[s] = np.float64(sem[x, s])
        # keep the m_take largest, earlier index first among equals (a later equal never displaces)
        n_best = 0
        for s in range(n_store):
            v = sim[s]
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
