"""The evaluation context of trace-driven advice: who executes what at which event.

A predictor reasons per request and token; the cache decides per event. An
:class:`AdviceContext` holds the replayed stream of a trace under FCFS
continuous batching (optionally preceded, request by request, by each
request's prefill, for a prefill-initialised cache at batch 1), and maps every
executed decode token and layer to its event, so producers can write
per-token scores and :meth:`AdviceContext.scatter` sums them into the
event-level advice arrays (the documented ``B > 1`` rule: per-request scores
summed over the active requests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ValidationError
from ..events import EventStream, build_events, concat_streams, decode_rows, fcfs_schedule
from ..events.prefill import prefill_events
from ..nextuse.advice import Advice
from ..trace import PREFILL, RoutingTrace

__all__ = ["AdviceContext", "advice_context", "warmup_advice"]

#: No looked-up rows: :func:`._kernels.scatter_sorted` reads the scores per token.
_NO_ROWS = np.zeros(0, dtype=np.int64)


def _scatter_sorted(*args) -> None:
    from ._kernels import scatter_sorted  # numba loads when advice is produced, not on import

    scatter_sorted(*args)


@dataclass(frozen=True, eq=False)
class AdviceContext:
    """A replayed stream of ``trace`` with the token -> event map.

    Attributes
    ----------
    trace
        The evaluated routing trace.
    stream
        The replayed stream (decode events, after each request's prefill events when
        ``prefill_init``).
    count_mask
        ``bool[n_events]``: decode events (the counted ones).
    batch
        Concurrency ``B``.
    exec_request, exec_row, exec_step
        ``int64[n_exec]``: for every executed decode token, its request, its trace row
        and the index of its scheduler step (0-based, decode steps only).
    exec_event
        ``int64[n_exec, L]``: the event of ``stream`` each token feeds at each layer.
    prefill_init
        Whether prefill events precede each request's decode (a warm cache).
    """

    trace: RoutingTrace
    stream: EventStream
    count_mask: np.ndarray
    batch: int
    exec_request: np.ndarray
    exec_row: np.ndarray
    exec_step: np.ndarray
    exec_event: np.ndarray
    prefill_init: bool

    @property
    def n_exec(self) -> int:
        """Executed decode tokens."""
        return int(self.exec_row.shape[0])

    def empty(self) -> np.ndarray:
        """``float32[n_events, N]`` of NaN (no score anywhere)."""
        return np.full((self.stream.n_events, self.stream.n_experts), np.nan, dtype=np.float32)

    def scatter(self, out: np.ndarray, layer: int, scores: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Sum per-token scores of ``layer`` into ``out``'s events (NaN = the token has no score).

        ``scores`` is ``float[n, N]`` for the executed tokens ``rows`` (all of them by
        default); calls for different rows accumulate. A NaN entry of one request
        leaves the other requests' sum unchanged; an entry where no request has a
        score stays NaN. The sums are float64, in token order within each event
        (:func:`._kernels.scatter_sorted`).
        """
        ev = self.exec_event[:, layer] if rows is None else self.exec_event[rows, layer]
        if ev.size == 0:
            return
        order = np.argsort(ev, kind="stable")
        _scatter_sorted(out, np.ascontiguousarray(ev[order], dtype=np.int64), order.astype(np.int64),
                        np.ascontiguousarray(scores), _NO_ROWS)

    def scatter_table(self, out: np.ndarray, layer: int, table: np.ndarray, table_row: np.ndarray) -> None:
        """:meth:`scatter` of every executed token's scores ``table[table_row[x]]`` (a negative row: no score),
        without the ``[n_exec, N]`` array of looked-up rows."""
        ev = self.exec_event[:, layer]
        if ev.size == 0:
            return
        order = np.argsort(ev, kind="stable")
        _scatter_sorted(out, np.ascontiguousarray(ev[order], dtype=np.int64), order.astype(np.int64),
                        np.ascontiguousarray(table), np.ascontiguousarray(table_row, dtype=np.int64))

    def advice(self, priority: np.ndarray | None, prefetch: np.ndarray | None, provenance: dict) -> Advice:
        """Wrap event arrays as :class:`Advice`, filling the warm-up (prefill) rows in place (:func:`warmup_advice`)."""
        priority, prefetch = warmup_advice(self.stream, self.count_mask, priority, prefetch)
        return Advice(priority=priority, prefetch_score=prefetch, provenance=dict(provenance))


def warmup_advice(stream: EventStream, count_mask: np.ndarray | None, priority: np.ndarray | None,
                  prefetch: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Fill the advice rows of the uncounted (prefill) events **in place**, the same for every producer.

    Warm-up rows: priority = member multiplicity (keep what the prefill used most),
    no prefetch candidates (``-inf``), as in the routers' advice. So every
    baseline starts its decode from a cache the prefill filled by one rule.
    In place because the arrays are ``float32[n_events, N]`` (hundreds of MB on
    long streams); returns them for convenience.
    """
    if count_mask is None or count_mask.all():
        return priority, prefetch
    warm = np.flatnonzero(~count_mask)
    if priority is not None:
        ev = stream.event_of_access
        sel = ~count_mask[ev]
        rows = np.zeros((warm.size, stream.n_experts), dtype=np.float32)
        rows[np.searchsorted(warm, ev[sel]), stream.expert[sel].astype(np.int64)] = stream.multiplicity[sel]
        priority[warm] = rows
    if prefetch is not None:
        prefetch[warm] = -np.inf
    return priority, prefetch


def _gather_events(stream: EventStream, idx: np.ndarray, step: np.ndarray, provenance: dict) -> EventStream:
    """The events ``idx`` of ``stream``, in that order, renumbered with ``step`` (members gathered without a
    per-event loop)."""
    lo = stream.offsets[idx]
    sizes = stream.offsets[idx + 1] - lo
    offsets = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    acc = np.repeat(lo - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)
    gm = stream.gate_mass[acc] if stream.gate_mass is not None else None
    return EventStream(stream.n_layers, stream.n_experts, stream.top_k, step, stream.layer[idx],
                       stream.active[idx], stream.logical_per_event[idx], offsets, stream.expert[acc],
                       stream.multiplicity[acc], gm, provenance)


def advice_context(trace: RoutingTrace, batch: int = 1, prefill_init: bool = False) -> AdviceContext:
    """Schedule ``trace``'s decode under FCFS continuous batching (zero arrival offsets) and map tokens to events.

    ``prefill_init`` (batch 1 only, CLR §4.1): each request's prompt is replayed as
    one prefill event per layer just before its decode, uncounted, so each decode
    starts from the cache the prefill left.
    """
    decode = build_events(trace, batch)
    lengths, first = decode_rows(trace)
    step, req, tok = fcfs_schedule(lengths, np.zeros(trace.n_requests, dtype=np.int64), int(batch))
    L = trace.n_layers
    rows = first[req] + tok
    step_ids = np.unique(step)
    key = decode.step.astype(np.int64) * L + decode.layer
    dec_event = np.searchsorted(key, step[:, None] * L + np.arange(L)[None, :])
    exec_step = np.searchsorted(step_ids, step)
    if not prefill_init:
        return AdviceContext(trace, decode, np.ones(decode.n_events, dtype=np.bool_), int(batch), req, rows,
                             exec_step, dec_event, False)
    if batch != 1:
        raise ValidationError("a prefill-initialised cache is defined here for batch 1 (CLR's setting: each "
                              "request's decode starts from its own prefill); use batch 1 or no prefill init",
                              field="prefill_init")
    if not (trace.phase == PREFILL).any():
        raise ValidationError("the trace has no prefill tokens to initialise the cache with; "
                              "run without prefill init", field="prefill_init")
    pre = prefill_events(trace, chunk=1 << 30)        # one chunk per prompt: L events per request
    pre_req = np.repeat(np.flatnonzero(np.bincount(trace.request[trace.phase == PREFILL],
                                                   minlength=trace.n_requests) > 0), L)
    # batch 1: requests decode one after another in input order; interleave each one's prefill before it
    dec_req_of_step = req[np.searchsorted(step, step_ids)]
    dec_req = dec_req_of_step[np.searchsorted(step_ids, decode.step)]
    # the merged order as indices into the pool "prefill events, then decode events"
    order_idx, new_step, is_decode = [], [], []
    counter = 0
    pos_of_decode = np.empty(decode.n_events, dtype=np.int64)
    pos = 0
    for r in req[np.sort(np.unique(req, return_index=True)[1])]:      # requests in service order
        p_idx = np.flatnonzero(pre_req == r)
        if p_idx.size:
            order_idx.append(p_idx)
            new_step.append(np.full(p_idx.size, counter, dtype=np.int64))
            is_decode.append(np.zeros(p_idx.size, dtype=np.bool_))
            counter += 1
            pos += p_idx.size
        d_idx = np.flatnonzero(dec_req == r)
        uniq, inv = np.unique(decode.step[d_idx], return_inverse=True)
        order_idx.append(pre.n_events + d_idx)
        new_step.append(counter + inv.astype(np.int64))
        is_decode.append(np.ones(d_idx.size, dtype=np.bool_))
        counter += uniq.size
        pos_of_decode[d_idx] = pos + np.arange(d_idx.size)
        pos += d_idx.size
    pool = concat_streams(pre, decode)
    stream = _gather_events(pool, np.concatenate(order_idx), np.concatenate(new_step),
                            {"source": "routing_trace", "trace_provenance": trace.provenance,
                             "discipline": "fcfs-continuous-batching", "batch": 1,
                             "prefill_init": "each request's prompt (one event per layer) before its decode"})
    return AdviceContext(trace, stream, np.concatenate(is_decode), 1, req, rows, exec_step,
                         pos_of_decode[dec_event], True)
