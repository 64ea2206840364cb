"""Per-event cache advice from trained routers, aligned to an EventStream (numpy only; no torch).

For every decode row ``r`` (request ``i``, step ``t``) and MoE layer ``l``:

- retention priority ``s^T(r, l) = p^R(r, l) + p^T(r, l)`` (CLR §3.2), used
  *after* event ``(t, l)`` to choose what stays for step ``t + 1``;
- pre-access score ``s^ST(r, l) = p^S_rho(r, l) + s^T(prev(r), l)`` (CLR §3.3),
  known *before* event ``(t, l)``: ``p^S`` from the predecessor
  ``rho = (t, l-1)``, or ``(t-1, L-1)`` for ``l = 0``, and the carry-over
  ``a^T = s^T`` of the same request's previous row at layer ``l``. A row without
  a previous row (a request whose trace holds no prefill) has no score.

**Batches (B > 1).** An event ``(s, l)`` serves every request active at step
``s``; its advice is the *sum* of the per-request vectors over those requests
(the sum of distributions ranks experts by expected demand over the batch, the
natural generalisation of the paper's single-sequence priority; an expert
wanted by two requests outranks one wanted by one). For ``prefetch_score``
requests without a score are left out; an event where none has one gets
``-inf`` everywhere (no candidates).

**Warm-up.** A stream built with a prefill-initialised cache begins with
``warmup`` prefill events that replay fills the cache with but does not count;
their ``priority`` row is the member multiplicity (keep what the prefill used)
and their ``prefetch_score`` is ``-inf``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..events import ArrivalOffsets, EventStream, decode_rows, fcfs_schedule
from ..trace import RoutingTrace
from .checkpoint import RouterWeights

__all__ = ["RouterScores", "router_scores", "RouterAdvice", "advice_for_trace", "save_router_advice"]


@dataclass(frozen=True)
class RouterScores:
    """Per-row scores over experts.

    Attributes
    ----------
    retention
        ``float32[n_tokens, L, N]``: ``s^T = p^R + p^T``.
    prefetch
        ``float32[n_tokens, L, N]``: ``s^ST``; NaN in rows without a predecessor.
    native
        ``float32[n_tokens, L, N]``: ``p^R`` alone (the LM-only reference).
    """

    retention: np.ndarray
    prefetch: np.ndarray
    native: np.ndarray


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def native_probs(logits: np.ndarray, kind: str) -> np.ndarray:
    """``p^R`` in float32 from logits (softmax, or normalised sigmoid for DeepSeek-V3)."""
    x = logits.astype(np.float32)
    if kind == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-x))
        return s / s.sum(axis=-1, keepdims=True)
    return _softmax(x)


def router_scores(hidden: np.ndarray, logits: np.ndarray, prev: np.ndarray, weights: RouterWeights) -> RouterScores:
    """Retention and pre-access scores of every row of a trace (see the module docstring).

    Parameters
    ----------
    hidden, logits
        ``(n, L, d)`` MoE-block inputs and ``(n, L, N)`` native logits, aligned with the trace rows.
    prev
        ``int64[n]``: the same request's previous row, or -1 (:func:`~.train.pair_rows`).
    weights
        Trained routers (:func:`~.checkpoint.load_router_weights`).
    """
    n, L, d = hidden.shape
    N = weights.n_experts
    if logits.shape != (n, L, N) or weights.temporal_w.shape != (L, N, d):
        raise ValidationError(f"shapes disagree: hidden {hidden.shape}, logits {logits.shape}, routers "
                              f"{weights.temporal_w.shape} (expected (n, L, d), (n, L, N), (L, N, d))")
    native = np.empty((n, L, N), dtype=np.float32)
    ret = np.empty((n, L, N), dtype=np.float32)
    succ = np.empty((n, L, N), dtype=np.float32)     # p^S for the successor of (r, l)
    for l in range(L):
        h = hidden[:, l].astype(np.float32)
        native[:, l] = native_probs(logits[:, l], weights.kind)
        zt = h @ weights.temporal_w[l].T
        zs = h @ weights.spatio_w[l].T
        if weights.temporal_b is not None:
            zt += weights.temporal_b[l]
        if weights.spatio_b is not None:
            zs += weights.spatio_b[l]
        ret[:, l] = native[:, l] + _softmax(zt)
        succ[:, l] = _softmax(zs)
    pre = np.full((n, L, N), np.nan, dtype=np.float32)
    has = np.flatnonzero(prev >= 0)
    p = prev[has]
    for l in range(L):
        ps = succ[has, l - 1] if l > 0 else succ[p, L - 1]
        pre[has, l] = ps + ret[p, l]
    return RouterScores(ret, pre, native)


@dataclass(frozen=True)
class RouterAdvice:
    """Event-aligned arrays for the proactive-load-aware replay.

    Attributes
    ----------
    priority
        ``float32[n_events, N]``: post-access retention priority of each event's layer.
    prefetch_score
        ``float32[n_events, N]``: pre-access score; ``-inf`` = not a candidate.
    warmup_events
        Leading prefill warm-up events the arrays were padded with.
    provenance
        Where the advice came from.
    """

    priority: np.ndarray
    prefetch_score: np.ndarray
    warmup_events: int = 0
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_advice(self) -> Any:
        """The same arrays as :class:`expertcache.nextuse.advice.Advice`, the replay's input."""
        from ..nextuse.advice import Advice

        return Advice(priority=self.priority, prefetch_score=self.prefetch_score,
                      provenance={**self.provenance, "warmup_events": self.warmup_events})


def advice_for_trace(trace: RoutingTrace, scores: RouterScores, batch: int, offsets: ArrivalOffsets | None = None,
                     *, stream: EventStream | None = None, use: str = "routers",
                     provenance: dict[str, Any] | None = None) -> RouterAdvice:
    """Sum per-request scores over the requests active in each event of ``build_events(trace, batch, offsets)``.

    Parameters
    ----------
    trace
        The routing trace the scores' rows belong to.
    scores
        From :func:`router_scores`.
    batch, offsets
        The schedule (FCFS continuous batching), as given to :func:`~expertcache.events.build_events`.
    stream
        The stream the advice is for, checked against the schedule; its
        ``provenance["warmup_events"]`` prefill warm-up events are padded (see the module docstring).
    use
        ``"routers"`` (``s^T`` and ``s^ST``) or ``"native"`` (``p^R`` alone as priority, no prefetch:
        the LM-only reference that ranks by the current native distribution).
    """
    if use not in ("routers", "native"):
        raise ValidationError(f"use must be 'routers' or 'native'; got {use!r}")
    L, N = trace.n_layers, trace.n_experts
    if scores.retention.shape != (trace.n_tokens, L, N):
        raise ValidationError(f"scores have shape {scores.retention.shape}; the trace needs "
                              f"{(trace.n_tokens, L, N)}")
    offsets = offsets or ArrivalOffsets()
    lengths, first = decode_rows(trace)
    step, req, tok = fcfs_schedule(lengths, offsets.arrivals(trace.n_requests), int(batch))
    rows = first[req] + tok
    steps, slot = np.unique(step, return_inverse=True)
    n_dec = steps.shape[0] * L
    pri = np.zeros((steps.shape[0], L, N), dtype=np.float64)
    np.add.at(pri, slot, (scores.native if use == "native" else scores.retention)[rows])
    pre = np.full((steps.shape[0], L, N), -np.inf, dtype=np.float64)
    if use == "routers":
        sc = scores.prefetch[rows]                      # (n_exec, L, N), NaN = no score
        ok = ~np.isnan(sc[..., 0])                      # (n_exec, L)
        acc = np.zeros_like(pre)
        cnt = np.zeros((steps.shape[0], L), dtype=np.int64)
        np.add.at(acc, slot, np.where(ok[..., None], sc, 0.0))
        np.add.at(cnt, slot, ok.astype(np.int64))
        pre = np.where(cnt[..., None] > 0, acc, -np.inf)
    pri, pre = pri.reshape(n_dec, N), pre.reshape(n_dec, N)
    warm = 0
    if stream is not None:
        warm = int(stream.provenance.get("warmup_events", 0))
        dec_layer = stream.layer[warm:]
        if stream.n_events - warm != n_dec or not np.array_equal(dec_layer, np.tile(np.arange(L), steps.shape[0])):
            raise ValidationError(f"the stream has {stream.n_events - warm} decode events; the schedule (batch "
                                  f"{batch}, offsets {offsets.describe()}) gives {n_dec}: build the stream from "
                                  "the same trace with the same --batch and --offsets")
        if warm:
            wp = np.zeros((warm, N), dtype=np.float64)
            for i in range(warm):
                lo, hi = stream.offsets[i], stream.offsets[i + 1]
                wp[i, stream.expert[lo:hi]] = stream.multiplicity[lo:hi]
            pri = np.concatenate([wp, pri])
            pre = np.concatenate([np.full((warm, N), -np.inf), pre])
    prov = {"predictor": "cache-learning routers" if use == "routers" else "native router (p^R)",
            "batch": int(batch), "offsets": offsets.describe(), "combine": "sum over active requests",
            "warmup_events": warm, **(provenance or {})}
    return RouterAdvice(pri.astype(np.float32), pre.astype(np.float32), warm, prov)


def save_router_advice(advice: RouterAdvice, path) -> None:
    """Write ``priority``, ``prefetch_score`` and ``provenance`` as an ``.npz`` (no pickle), as
    :func:`expertcache.nextuse.advice.save_advice` does; read it back with ``load_advice``."""
    from ..nextuse.advice import save_advice

    save_advice(advice.to_advice(), path)
