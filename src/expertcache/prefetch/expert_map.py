"""Expert-map search in the style of FineMoE: a store of per-iteration expert maps matched at run time.

FineMoE records fine-grained *expert maps* (which experts each layer of one
iteration used) together with a semantic embedding of the request, keeps a
bounded store (1,000 maps in CLR's reproduction, §4.1), and at run time
searches it with the request's semantics and the current iteration's routing
trajectory so far, prefetching the experts the best matches used next.

Here (trace-driven): the store holds up to ``store_size`` decode tokens sampled
(seeded) from the calibration trace, each with its map ``[L, N]`` — the gate
weights of the selected experts when both traces record gates (FineMoE's maps
are gate distributions), else multi-hot — and its request's semantic embedding — the mean hidden state of the prompt
when hidden states were collected, else the prompt's routing histogram
(``[L*N]``), a routing-derived stand-in. For token ``x`` at layer ``l`` the
similarity to map ``m`` is ``alpha * cos(sem_x, sem_m) + (1 - alpha) *
cos(traj_x[:l], map_m[:l])`` (the cosine over the current token's routing at
layers ``< l``, same weighting; at ``l = 0`` only semantics). The
``top_m`` best maps' rows at layer ``l`` are averaged into per-token scores,
summed over the event's active requests; experts no match used are no
candidates. Retention stays LRU.

Every similarity is a float64 sum in a fixed order, with no BLAS (whose kernels, chosen by CPU, round
differently), so the advice has the same bits on every machine: the semantic cosine once per pair of an
evaluated request and a calibrating request in the store (:func:`semantic_similarity`), the trajectory
dot products as sums of the token's ``k`` weighted rows in expert order (:func:`._kernels.expert_map_scores`).
"""

from __future__ import annotations

import numpy as np

from ..trace import PREFILL, RoutingTrace
from .context import AdviceContext
from .produced import Produced

#: No semantic similarities, no previous layer (``expertcache.prefetch._kernels.expert_map_scores``).
_NO_SEM = np.zeros((0, 0), dtype=np.float32)
_NO_COS = np.zeros((0, 0), dtype=np.float64)
_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_EXPERTS = np.zeros((0, 0), dtype=np.int64)

__all__ = ["prompt_vectors", "semantic_similarity", "semantic_embeddings", "expert_map_search", "top_m_rows"]


def top_m_rows(sim: np.ndarray, m: int) -> np.ndarray:
    """``int64[n, m]``: per row, the columns of the ``m`` largest values, largest first, lower column first
    among equals — ``np.argsort(-sim, axis=1, kind="stable")[:, :m]`` in ``O(n S)`` instead of ``O(n S log S)``.
    """
    n, width = sim.shape
    if m <= 0 or n == 0:
        return np.zeros((n, 0), dtype=np.int64)
    if m >= width:
        return np.argsort(-sim, axis=1, kind="stable")
    neg = -sim
    kth = np.partition(neg, m - 1, axis=1)[:, m - 1:m]                 # the m-th best value of each row
    strict = neg < kth
    tied = neg == kth
    # every strictly better column, then the lowest-numbered ties until m are taken
    room = m - strict.sum(axis=1)
    crowded = np.flatnonzero(tied.sum(axis=1) > room)                   # rows with more ties than room
    tied[crowded] &= np.cumsum(tied[crowded], axis=1) <= room[crowded, None]
    take = strict | tied
    cols = np.nonzero(take)[1].reshape(n, m)                            # ascending columns per row
    order = np.argsort(np.take_along_axis(neg, cols, axis=1), axis=1, kind="stable")
    return np.take_along_axis(cols, order, axis=1)


def prompt_vectors(trace: RoutingTrace, hidden: np.ndarray | None) -> np.ndarray:
    """``float64[n_requests, F]``: each request's mean prompt hidden state (summed over its prompt rows, then
    layers, in order: :func:`._kernels.add_rows`), or its prompt's routing histogram ``[L*N]`` (whole counts).

    A request without prompt rows gets a zero vector (no semantic match).
    """
    from ._kernels import add_rows

    L, N = trace.n_layers, trace.n_experts
    pre = trace.phase == PREFILL
    dim = hidden.shape[2] if hidden is not None else L * N
    out = np.zeros((trace.n_requests, dim), dtype=np.float64)
    layer_base = np.arange(L, dtype=np.int64)[:, None] * N
    for r in range(trace.n_requests):
        rows = np.flatnonzero(pre & (trace.request == r))
        if rows.size == 0:
            continue
        if hidden is not None:
            for lo in range(0, rows.size, 256):        # float16 rows widened a block at a time
                blk = hidden[rows[lo:lo + 256]]
                add_rows(out[r], np.ascontiguousarray(blk, dtype=np.result_type(blk.dtype, np.float32)))
            out[r] /= rows.size * hidden.shape[1]
        else:                       # the prompt's routing histogram [L*N], counted (no [rows, L, N] one-hot)
            out[r] = np.bincount((layer_base + trace.experts[rows]).ravel(), minlength=L * N)
    return out


def semantic_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``float64[len(a), len(b)]``: the cosine of every row of ``a`` with every row of ``b`` (0 where either is
    zero), every sum float64 in feature order (:func:`._kernels.cosine_table`): the same bits on every machine."""
    from ._kernels import cosine_table

    out = np.empty((a.shape[0], b.shape[0]), dtype=np.float64)
    cosine_table(np.ascontiguousarray(a, dtype=np.float64), np.ascontiguousarray(b.T, dtype=np.float64), out)
    return out


def semantic_embeddings(trace: RoutingTrace, hidden: np.ndarray | None) -> np.ndarray:
    """``float32[n_requests, F]`` unit vectors: mean prompt hidden state, or the prompt's routing histogram
    (:func:`prompt_vectors` over its norm, a float64 sum of squares in feature order).

    A request without prompt rows gets a zero vector (no semantic match). The search itself takes cosines of
    the float64 vectors (:func:`semantic_similarity`), not products of these.
    """
    out = prompt_vectors(trace, hidden)
    n = np.zeros((out.shape[0], 1), dtype=np.float64)
    for f in range(out.shape[1]):                   # in feature order (np.linalg.norm's order is numpy's)
        n[:, 0] += out[:, f] * out[:, f]
    n = np.sqrt(n)
    return np.divide(out, n, out=np.zeros_like(out), where=n > 0).astype(np.float32)


def expert_map_search(ctx: AdviceContext, calibration: RoutingTrace, store_size: int = 1000, top_m: int = 3,
                      alpha: float = 0.5, seed: int = 0, hidden: np.ndarray | None = None,
                      hidden_calibration: np.ndarray | None = None, chunk: int = 512) -> Produced:
    """FineMoE-style prefetch advice for ``ctx`` (see the module docstring), ``chunk`` executed tokens at a time
    (the advice does not depend on it: each token's row is its own; 512 tokens' dot products with 1,000 stored
    maps are 4 MB, which stay in cache between layers where 4,096 tokens' did not: docs/performance.md,
    *Session 68*)."""
    from ._kernels import expert_map_scores, store_places

    trace = ctx.trace
    L, N = trace.n_layers, trace.n_experts
    dec = np.flatnonzero(calibration.phase != PREFILL)
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(dec, size=min(store_size, dec.size), replace=False))
    weighted = calibration.gates is not None and trace.gates is not None

    def vectors(t: RoutingTrace, rows: np.ndarray, layer: int) -> np.ndarray:
        """``float32[n, N]``: gate weights (or ones) at the selected experts of ``rows`` at ``layer``."""
        out = np.zeros((rows.size, N), dtype=np.float32)
        w = t.gates[rows, layer] if weighted else 1.0
        np.put_along_axis(out, t.experts[rows, layer].astype(np.int64), w, axis=1)
        return out

    maps = np.stack([vectors(calibration, pick, layer) for layer in range(L)], axis=1)   # [S, L, N]
    # the kernel's arrays over the stored maps hold them by place (blocks of 8 a row apart), their tail zero
    place = store_places(pick.size)
    n_pos = ((pick.size + 7) >> 3) << 3
    map_sq = np.zeros((n_pos, L), dtype=np.float64)                                      # [places, L]
    for e in range(N):              # in expert order, as the kernel sums a token's squared weights
        map_sq[place] += maps[:, :, e].astype(np.float64) ** 2
    maps_t = np.zeros((L, N + 1, n_pos), dtype=np.float32)                     # [L, N + 1, places]: a zero row
    maps_t[:, :N, place] = maps.transpose(1, 2, 0)
    maps_l = np.ascontiguousarray(maps.transpose(1, 0, 2))                               # [L, S, N]
    # semantic cosines once per (evaluated request, calibration request in the store), then per stored map
    cal_req, store_col = np.unique(calibration.request[pick], return_inverse=True)
    vec_store = prompt_vectors(calibration, hidden_calibration)[cal_req]
    vec_eval = prompt_vectors(trace, hidden)
    has_sem = bool(vec_store.any() and vec_eval.any())
    sem_req = semantic_similarity(vec_eval, vec_store) if has_sem else None               # [n_requests, U]
    pf = ctx.empty()
    m_take = min(top_m, pick.size)
    for lo in range(0, ctx.n_exec if m_take > 0 else 0, chunk):   # an empty store: no map, no candidate
        x = np.arange(lo, min(lo + chunk, ctx.n_exec))
        rows = ctx.exec_row[x]
        sem, sem_row = _NO_COS, _NO_ROWS
        if sem_req is not None:     # the chunk's requests' cosines to every stored map [n_req, S], row per token
            req, sem_row = np.unique(ctx.exec_request[x], return_inverse=True)
            sem = np.zeros((req.size, n_pos), dtype=np.float64)
            sem[:, place] = sem_req[req][:, store_col]
            sem_row = sem_row.astype(np.int64)
        dot = np.zeros((x.size, n_pos), dtype=np.float64)
        x_sq = np.zeros(x.size, dtype=np.float64)
        m_sq = np.zeros(n_pos, dtype=np.float64)
        score = np.empty((x.size, N), dtype=np.float32)
        # every layer's vectors: k weights each, experts ascending
        ex_all = trace.experts[rows].astype(np.int64)
        w_all = trace.gates[rows].astype(np.float32) if weighted else np.ones(ex_all.shape, np.float32)
        order = np.argsort(ex_all, axis=2, kind="stable")
        ex_all = np.take_along_axis(ex_all, order, axis=2)
        w_all = np.take_along_axis(w_all, order, axis=2)
        for layer in range(L):
            if layer == 0 and sem_req is None:
                continue
            ex, w = _NO_EXPERTS, _NO_SEM
            if layer > 0:           # the previous layer's vectors
                ex = np.ascontiguousarray(ex_all[:, layer - 1])
                w = np.ascontiguousarray(w_all[:, layer - 1])
                m_sq += map_sq[:, layer - 1]
            # the previous layer's dot products, the similarity, the m_take best maps (ties: lower store index
            # first) and their mean row, per token
            expert_map_scores(dot, ex, w, maps_t[layer - 1] if layer > 0 else _NO_SEM, x_sq, m_sq, sem, sem_row,
                              float(alpha), layer > 0, m_take, maps_l[layer], score)
            ctx.scatter(pf, layer, score, rows=x)
    adv = ctx.advice(None, pf, {"producer": "expert-map search (FineMoE style)", "store": int(pick.size),
                                "semantic": "hidden" if hidden is not None else "prompt routing"})
    sem_kind = ("mean prompt hidden state" if hidden is not None else
                "prompt routing histogram (no hidden states)" if has_sem else "none (no prompts)")
    return Produced(adv, "lru", True, added_params=0, store_entries=int(pick.size), availability="Prev. layer",
                    note=f"store of {pick.size} token maps; semantics: {sem_kind}; trajectory: layers < l",
                    details={"semantic": sem_kind, "top_m": m_take, "alpha": alpha,
                             "maps": "gate weights" if weighted else "multi-hot"})
