"""The event stream an execution presents to its cache, rebuilt from a recorded trace alone.

``executed_stream(trace, B, offsets)`` replays the executor's schedule
(:func:`~expertcache.execute.schedule.fcfs_forwards`) over the trace's rows: every forward is one
scheduler *unit step* of the stream (``step`` = forward index, so prefill and decode forwards of one
scheduler step are distinct steps), and each (forward, MoE layer) is one event whose expert set is
the union over the forward's tokens (``active`` = tokens in the forward: the prompt length for a
prefill forward, the active requests for a decode forward; docs/execute.md). This is what
``expertcache replay`` reads to predict the executor's transfers.

Needs numpy only; the trace is the one ``expertcache execute`` (or ``collect``) wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..events import ArrivalOffsets, EventStream
from ..trace import DECODE, PREFILL, RoutingTrace
from .schedule import Forward, fcfs_forwards

__all__ = ["ExecutedStream", "executed_stream", "request_rows"]


@dataclass(frozen=True)
class ExecutedStream:
    """An executed stream and, per event, the phase of its forward (0 prefill, 1 decode)."""

    stream: EventStream
    phase: np.ndarray
    forwards: tuple[Forward, ...]


def request_rows(trace: RoutingTrace) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per request: its prefill rows and its decode rows (position order)."""
    pre = [np.flatnonzero((trace.request == r) & (trace.phase == PREFILL)) for r in range(trace.n_requests)]
    dec = [np.flatnonzero((trace.request == r) & (trace.phase == DECODE)) for r in range(trace.n_requests)]
    return pre, dec


def executed_stream(trace: RoutingTrace, batch: int, offsets: ArrivalOffsets | None = None,
                    *, provenance: dict | None = None) -> ExecutedStream:
    """The stream of every forward the executor runs for ``trace`` at concurrency ``batch``.

    Parameters
    ----------
    trace
        A trace with prefill and decode rows for every request.
    batch
        Concurrency ``B``.
    offsets
        Arrival offsets (all zero by default).
    provenance
        Extra provenance stored with the stream.
    """
    offsets = offsets or ArrivalOffsets()
    L, N, k = trace.n_layers, trace.n_experts, trace.top_k
    pre, dec = request_rows(trace)
    lengths = [d.shape[0] for d in dec]
    forwards = fcfs_forwards(lengths, offsets.arrivals(trace.n_requests), batch)
    steps, layers, experts, mults, gms, active, phase = [], [], [], [], [], [], []
    for f_idx, fwd in enumerate(forwards):
        if fwd.kind == "prefill":
            rows = pre[fwd.requests[0]]
        else:
            rows = np.array([dec[r][j] for r, j in zip(fwd.requests, fwd.tokens, strict=True)], dtype=np.int64)
        if rows.shape[0] == 0:
            continue
        for l in range(L):
            e = trace.experts[rows, l].reshape(-1).astype(np.int64)
            u, inv = np.unique(e, return_inverse=True)
            steps.append(f_idx)
            layers.append(l)
            experts.append(u)
            mults.append(np.bincount(inv, minlength=u.shape[0]))
            if trace.gates is not None:
                gms.append(np.bincount(inv, weights=trace.gates[rows, l].reshape(-1).astype(np.float64),
                                       minlength=u.shape[0]))
            active.append(rows.shape[0])
            phase.append(0 if fwd.kind == "prefill" else 1)
    prov = {"source": "expertcache execute", "discipline": "fcfs-continuous-batching", "batch": int(batch),
            "offsets": offsets.describe(), "offsets_seed": offsets.seed if offsets.kind == "random" else None,
            "phase": "prefill+decode", "unit_step": "one step per forward (prefill forwards of admitted "
            "requests, then the scheduler step's decode forward)",
            "n_requests": trace.n_requests, "trace_provenance": trace.provenance, **(provenance or {})}
    stream = EventStream.from_lists(L, N, k, steps, layers, experts, active, multiplicity=mults,
                                    gate_mass=gms if trace.gates is not None else None, provenance=prov)
    return ExecutedStream(stream, np.asarray(phase, dtype=np.int8), tuple(forwards))
