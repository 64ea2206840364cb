"""Activation-aware caching in the style of MoE-Infinity: request-level expert activation matrices.

MoE-Infinity traces, per request, an *expert activation matrix* (EAM:
activations per layer and expert) and keeps a store of past requests' EAMs.
At run time the request's partial EAM is matched to the stored matrices by
cosine similarity and the best match predicts which experts the remaining
layers and tokens will activate; cache retention and prefetching follow the
predicted activation.

Here (trace-driven): the store holds the EAMs (prefill + decode activations) of
the calibration requests; for a decode token ``t`` of request ``r`` the
partial EAM is ``r``'s prefill plus its decode tokens before ``t`` (decision
available at the previous token); its nearest stored EAM by cosine gives the
predicted activation ratio of every expert at every layer (the matched row,
normalised to sum 1). The event-level retention priority and pre-access score
are these ratios summed over the event's active requests. MoE-Infinity's
layer-proximity weighting (experts of layers about to execute first) is a
positive constant per layer, which cannot change any decision of a per-layer
cache; it would matter only under one global pool, so it is omitted.
"""

from __future__ import annotations

import numpy as np

from ..trace import PREFILL, RoutingTrace
from .context import AdviceContext
from .produced import Produced

__all__ = ["request_eams", "activation_aware"]


def request_eams(trace: RoutingTrace) -> np.ndarray:
    """``float32[n_requests, L, N]``: activations per layer and expert of each request (all phases)."""
    L, N, R = trace.n_layers, trace.n_experts, trace.n_requests
    out = np.zeros((R, L, N), dtype=np.float32)
    req = trace.request.astype(np.int64)[:, None] * N
    for layer in range(L):                                # counts per layer: no [n_tokens, L, k] index array
        out[:, layer] = np.bincount((req + trace.experts[:, layer]).ravel(), minlength=R * N).reshape(R, N)
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, n, out=np.zeros_like(x), where=n > 0)


def activation_aware(ctx: AdviceContext, calibration: RoutingTrace, store_size: int = 1000,
                     prefetch: bool = True) -> Produced:
    """MoE-Infinity-style advice for ``ctx`` from the EAMs of ``calibration`` (see the module docstring).

    Returns retention priorities (``U_B``) and, with ``prefetch``, the same
    predicted ratios as pre-access scores.
    """
    from ._kernels import prefix_activations

    trace = ctx.trace
    L, N = trace.n_layers, trace.n_experts
    store = request_eams(calibration)[:store_size]
    ratio = store / np.maximum(store.sum(axis=2, keepdims=True), 1.0)        # per-layer activation ratio
    store_unit = _unit(store.reshape(store.shape[0], L * N))
    best = np.full(ctx.n_exec, -1, dtype=np.int64)                          # matched store entry per token
    pre_rows = trace.phase == PREFILL
    layer_base = np.arange(L, dtype=np.int64)[:, None] * N
    for r in np.unique(ctx.exec_request):
        x = np.flatnonzero(ctx.exec_request == r)
        x = x[np.argsort(ctx.exec_row[x])]                                   # the request's tokens in order
        p_rows = np.flatnonzero(pre_rows & (trace.request == r))
        base = np.bincount((layer_base + trace.experts[p_rows]).ravel(), minlength=L * N).astype(np.float32)
        partial = np.empty((x.size, L * N), dtype=np.float32)               # activations before each token
        prefix_activations(trace.experts, ctx.exec_row[x].astype(np.int64), base, partial)
        sims = _unit(partial) @ store_unit.T                                 # cosine, [n_tok, n_store]
        known = np.linalg.norm(partial, axis=1) > 0
        best[x] = np.where(known, np.argmax(sims, axis=1), -1)               # ties: the first stored request
    # one scatter per layer over every token: the matched row's ratios, summed over the event's requests
    prio = ctx.empty()
    for layer in range(L):
        ctx.scatter_table(prio, layer, ratio[:, layer, :], best)             # best < 0: no prediction
    pf = None
    if prefetch:
        pf = prio.copy()
        pf[pf <= 0] = np.nan                                                 # predicted inactive: no candidate
    adv = ctx.advice(prio, pf, {"producer": "activation-aware (MoE-Infinity style)", "store": int(store.shape[0])})
    return Produced(adv, "advice", prefetch, added_params=0, store_entries=int(store.shape[0]),
                    availability="Prev. token",
                    note="EAM store of calibration requests; nearest by cosine; trace-driven, no runtime",
                    details={"store_requests": int(store.shape[0])})
