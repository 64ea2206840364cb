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

**Memory.** :func:`router_advice` works one layer at a time and only on the
rows the schedule executes (plus each one's predecessor), writing straight
into the two ``float32[n_events, N]`` outputs; beyond them it holds a few
``(rows, N)`` arrays of one layer. :func:`router_scores` keeps every row of
every layer (three ``float32[n_tokens, L, N]`` arrays, ~2.2 GB for a
Qwen3-30B-A3B trace of 30k tokens): for inspecting small traces only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..events import ArrivalOffsets, EventStream, decode_rows, fcfs_schedule
from ..trace import RoutingTrace
from .checkpoint import RouterWeights

__all__ = ["RouterScores", "router_scores", "RouterAdvice", "router_advice", "advice_for_trace",
           "save_router_advice"]

#: Rows per matrix product (bounds the float64 copy of the hidden states: 64 MiB at d = 2048).
CHUNK_ROWS = 4096


@dataclass(frozen=True)
class RouterScores:
    """Per-row scores over experts (every row of every layer: for small traces; see :func:`router_advice`).

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
    """``p^R`` from logits (softmax, or normalised sigmoid for DeepSeek-V3), computed in float64."""
    x = logits.astype(np.float64)
    if kind == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-x))
        return s / s.sum(axis=-1, keepdims=True)
    return _softmax(x)


def _router_probs(hidden: np.ndarray, rows: np.ndarray, layer: int, w: np.ndarray, b: np.ndarray | None,
                  chunk: int = CHUNK_ROWS) -> np.ndarray:
    """``float64[len(rows), N]``: ``softmax(h(r, layer) W^T + b)``, ``chunk`` rows at a time."""
    w64 = w.astype(np.float64).T
    out = np.empty((rows.shape[0], w.shape[0]), dtype=np.float64)
    for lo in range(0, rows.shape[0], chunk):
        z = hidden[rows[lo:lo + chunk], layer].astype(np.float64) @ w64
        if b is not None:
            z += b
        out[lo:lo + z.shape[0]] = _softmax(z)
    return out


def _check_arrays(hidden: np.ndarray, logits: np.ndarray, weights: RouterWeights) -> None:
    L, N = weights.n_layers, weights.n_experts
    if (hidden.ndim != 3 or logits.shape != (hidden.shape[0], L, N)
            or weights.temporal_w.shape != (L, N, hidden.shape[2])):
        raise ValidationError(f"shapes disagree: hidden {hidden.shape}, logits {logits.shape}, routers "
                              f"{weights.temporal_w.shape} (expected (n, L, d), (n, L, N), (L, N, d))")


def _layer_scores(hidden: np.ndarray, logits: np.ndarray, weights: RouterWeights, l: int, rows: np.ndarray,
                  prev: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(p^R, s^T, s^ST)`` of ``rows`` at layer ``l``, each ``float32[len(rows), N]``.

    ``prev[i]`` is the predecessor row of ``rows[i]`` (-1: none, ``s^ST`` NaN). Every
    score is computed in float64 and rounded to float32 once, so a row's scores do
    not depend on which other rows are scored with it (BLAS blocking changes float32
    products in the last bit; advice from any subset or schedule agrees exactly).
    """
    L = weights.n_layers
    ok = prev >= 0
    need, inv = np.unique(np.concatenate([rows, prev[ok]]), return_inverse=True)
    at_row, at_prev = inv[:rows.shape[0]], inv[rows.shape[0]:]
    nat = native_probs(logits[need, l], weights.kind)
    ret = nat + _router_probs(hidden, need, l, weights.temporal_w[l],
                              None if weights.temporal_b is None else weights.temporal_b[l])
    # p^S of the causal predecessor rho: (t, l-1), or (t-1, L-1) for l = 0
    src_rows, src = (prev[ok], L - 1) if l == 0 else (rows[ok], l - 1)
    ps = _router_probs(hidden, src_rows, src, weights.spatio_w[src],
                       None if weights.spatio_b is None else weights.spatio_b[src])
    pre = np.full((rows.shape[0], nat.shape[1]), np.nan, dtype=np.float32)
    pre[ok] = ps + ret[at_prev]
    return nat[at_row].astype(np.float32), ret[at_row].astype(np.float32), pre


def router_scores(hidden: np.ndarray, logits: np.ndarray, prev: np.ndarray, weights: RouterWeights) -> RouterScores:
    """Retention and pre-access scores of every row of a trace (see the module docstring).

    Holds three ``float32[n, L, N]`` arrays: for inspecting small traces. For
    advice on a stream use :func:`router_advice`, which needs a fraction of the memory.

    Parameters
    ----------
    hidden, logits
        ``(n, L, d)`` MoE-block inputs and ``(n, L, N)`` native logits, aligned with the trace rows.
    prev
        ``int64[n]``: the same request's previous row, or -1 (:func:`~.train.pair_rows`).
    weights
        Trained routers (:func:`~.checkpoint.load_router_weights`).
    """
    _check_arrays(hidden, logits, weights)
    n, L, _ = hidden.shape
    N = weights.n_experts
    out = [np.empty((n, L, N), dtype=np.float32) for _ in range(3)]
    rows = np.arange(n)
    for l in range(L):
        for arr, part in zip(out, _layer_scores(hidden, logits, weights, l, rows, prev), strict=True):
            arr[:, l] = part
    native, ret, pre = out
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
        ``None`` for the native reference (``use="native"``), which never prefetches.
    warmup_events
        Leading prefill warm-up events the arrays were padded with.
    provenance
        Where the advice came from.
    """

    priority: np.ndarray
    prefetch_score: np.ndarray | None
    warmup_events: int = 0
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_advice(self) -> Any:
        """The same arrays as :class:`expertcache.nextuse.advice.Advice`, the replay's input."""
        from ..nextuse.advice import Advice

        return Advice(priority=self.priority, prefetch_score=self.prefetch_score,
                      provenance={**self.provenance, "warmup_events": self.warmup_events})


@dataclass(frozen=True)
class _Plan:
    """Which trace row each schedule entry executes, grouped by step, and the stream's warm-up."""

    rows: np.ndarray        # int64[n_exec], trace row executed, in step order
    starts: np.ndarray      # int64[n_steps], first entry of each step in ``rows``
    n_steps: int
    warm: int

    def sum_by_step(self, values: np.ndarray) -> np.ndarray:
        """``float64[n_steps, ...]``: ``values`` (one per entry) summed over each step's entries."""
        v = values.astype(np.float64)
        return v if v.shape[0] == self.n_steps else np.add.reduceat(v, self.starts, axis=0)


def _plan(trace: RoutingTrace, batch: int, offsets: ArrivalOffsets, stream: EventStream | None) -> _Plan:
    L = trace.n_layers
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValidationError(f"batch must be a positive integer; got {batch!r}", field="batch")
    lengths, first = decode_rows(trace)
    step, req, tok = fcfs_schedule(lengths, offsets.arrivals(trace.n_requests, trace.request_ids), int(batch))
    order = np.argsort(step, kind="stable")
    step = step[order]
    rows = (first[req] + tok)[order]
    starts = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    n_steps = int(starts.shape[0])
    warm = 0
    if stream is not None:
        warm = int(stream.provenance.get("warmup_events", 0))
        n_dec = n_steps * L
        if stream.n_events - warm != n_dec or not np.array_equal(stream.layer[warm:], np.tile(np.arange(L), n_steps)):
            raise ValidationError(f"the stream has {stream.n_events - warm} decode events; the schedule (batch "
                                  f"{batch}, offsets {offsets.describe()}) gives {n_dec}: build the stream from "
                                  "the same trace with the same --batch and --offsets")
    return _Plan(rows, starts, n_steps, warm)


def _warmup_priority(stream: EventStream, warm: int, out: np.ndarray) -> None:
    """Rows ``0..warm-1`` of ``out``: each warm-up event's member multiplicities (zero elsewhere)."""
    out[:warm] = 0.0
    end = int(stream.offsets[warm])
    ev = np.repeat(np.arange(warm), np.diff(stream.offsets[:warm + 1]))
    out[ev, stream.expert[:end].astype(np.int64)] = stream.multiplicity[:end]


def _advise(trace: RoutingTrace, batch: int, offsets: ArrivalOffsets | None, stream: EventStream | None, use: str,
            provenance: dict[str, Any] | None, layer_scores: Any, progress: Any = None) -> RouterAdvice:
    """Shared aggregation: ``layer_scores(l, plan)`` gives the executed rows' ``(s^T or p^R, s^ST or None)``
    at layer ``l`` (``s^ST`` NaN where a row has no score); summed per step into the event-aligned outputs."""
    if use not in ("routers", "native"):
        raise ValidationError(f"use must be 'routers' or 'native'; got {use!r}")
    L, N = trace.n_layers, trace.n_experts
    offsets = offsets or ArrivalOffsets()
    plan = _plan(trace, batch, offsets, stream)
    n_events = plan.warm + plan.n_steps * L
    pri = np.empty((n_events, N), dtype=np.float32)
    pre = np.full((n_events, N), -np.inf, dtype=np.float32) if use == "routers" else None
    if plan.warm:
        _warmup_priority(stream, plan.warm, pri)  # type: ignore[arg-type]
    pri_dec = pri[plan.warm:].reshape(plan.n_steps, L, N)
    pre_dec = None if pre is None else pre[plan.warm:].reshape(plan.n_steps, L, N)
    for l in range(L):
        ret_r, pre_r = layer_scores(l, plan)
        pri_dec[:, l] = plan.sum_by_step(ret_r)
        if pre_dec is not None and pre_r is not None:
            ok = ~np.isnan(pre_r[:, 0])
            acc = plan.sum_by_step(np.where(ok[:, None], pre_r, np.float32(0.0)))
            cnt = plan.sum_by_step(ok)
            pre_dec[:, l] = np.where(cnt[:, None] > 0, acc, -np.inf)
        if progress is not None:
            progress(l + 1, L)
    prov = {"predictor": "cache-learning routers" if use == "routers" else "native router (p^R)",
            "batch": int(batch), "offsets": offsets.describe(), "combine": "sum over active requests",
            "warmup_events": plan.warm, **(provenance or {})}
    return RouterAdvice(pri, pre, plan.warm, prov)


def advice_for_trace(trace: RoutingTrace, scores: RouterScores, batch: int, offsets: ArrivalOffsets | None = None,
                     *, stream: EventStream | None = None, use: str = "routers",
                     provenance: dict[str, Any] | None = None) -> RouterAdvice:
    """Sum per-request scores over the requests active in each event of ``build_events(trace, batch, offsets)``.

    The same advice as :func:`router_advice`, from precomputed :class:`RouterScores`.

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
    L, N = trace.n_layers, trace.n_experts
    if scores.retention.shape != (trace.n_tokens, L, N):
        raise ValidationError(f"scores have shape {scores.retention.shape}; the trace needs "
                              f"{(trace.n_tokens, L, N)}")

    def layer_scores(l: int, plan: _Plan) -> tuple[np.ndarray, np.ndarray | None]:
        if use == "native":
            return scores.native[plan.rows, l], None
        return scores.retention[plan.rows, l], scores.prefetch[plan.rows, l]

    return _advise(trace, batch, offsets, stream, use, provenance, layer_scores)


def router_advice(trace: RoutingTrace, hidden: np.ndarray | None, logits: np.ndarray, weights: RouterWeights, batch: int,
                  offsets: ArrivalOffsets | None = None, *, stream: EventStream | None = None, use: str = "routers",
                  provenance: dict[str, Any] | None = None, progress: Any = None) -> RouterAdvice:
    """Advice of trained routers for the events of ``build_events(trace, batch, offsets)``, one layer at a time.

    Equal to ``advice_for_trace(trace, router_scores(hidden, logits, pair_rows(...), weights), ...)``
    but it scores only the rows the schedule executes and their predecessors, layer by
    layer, straight into the outputs: memory beyond the two ``float32[n_events, N]``
    outputs is a few ``(rows, N)`` arrays of one layer (tested).

    Parameters
    ----------
    trace
        The routing trace; ``hidden`` and ``logits`` rows are aligned with its rows.
    hidden, logits
        ``(n_tokens, L, d)`` MoE-block inputs and ``(n_tokens, L, N)`` native router logits
        (float16 as collected; ``hidden`` may be ``None`` for ``use="native"``, which does not read it).
    weights
        Trained routers (:func:`~.checkpoint.load_router_weights`).
    batch, offsets, stream, use, provenance
        As in :func:`advice_for_trace`.
    progress
        Called with ``(layers done, L)``.
    """
    from .train import pair_rows

    L, N = trace.n_layers, trace.n_experts
    if hidden is None and use != "native":
        raise ValidationError('router advice needs the hidden states; only use="native" works without them')
    if hidden is not None:
        _check_arrays(hidden, logits, weights)
    if logits.shape[0] != trace.n_tokens or (weights.n_layers, weights.n_experts) != (L, N):
        raise ValidationError(f"the arrays hold {logits.shape[0]} rows of L = {weights.n_layers}, N = "
                              f"{weights.n_experts}; the trace has {trace.n_tokens} rows of L = {L}, N = {N}: "
                              "use the trace the arrays were collected with and routers trained for its model")
    prev_all = pair_rows(trace.request, trace.position)

    def layer_scores(l: int, plan: _Plan) -> tuple[np.ndarray, np.ndarray | None]:
        if use == "native":
            return native_probs(logits[plan.rows, l], weights.kind).astype(np.float32), None
        _, ret, pre = _layer_scores(hidden, logits, weights, l, plan.rows, prev_all[plan.rows])
        return ret, pre

    return _advise(trace, batch, offsets, stream, use, provenance, layer_scores, progress)


def save_router_advice(advice: RouterAdvice, path) -> None:
    """Write ``priority``, ``prefetch_score`` and ``provenance`` as an ``.npz`` (no pickle), as
    :func:`expertcache.nextuse.advice.save_advice` does; read it back with ``load_advice``."""
    from ..nextuse.advice import save_advice

    save_advice(advice.to_advice(), path)
