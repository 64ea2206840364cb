"""Prefill events: chunked prefill routing in layer-major or chunk-major execution order (§8.1, §8.5).

A prompt of ``P`` routed tokens is cut into chunks of ``chunk`` tokens. Each
(chunk, layer) is one event whose expert set is the union over the chunk's
tokens; logical assignments count every routed token (``tokens x k``).

* **chunk-major** — each chunk goes through all layers before the next chunk:
  events ``(c, l)``;
* **layer-major** — each layer processes the whole prompt before the next:
  events in the order ``(l, c)``, numbered ``step = l * n_chunks + c``.

Requests are prefilled one after another, in input order. Under per-layer
scope the two orders present each layer's cache with the same sequence, so
they differ only where layers share capacity (global scope) — which is where
the §8.5 gap opens.
"""

from __future__ import annotations

import numpy as np

from ..errors import ValidationError
from ..trace.model import PREFILL, RoutingTrace, select_requests
from .fcfs import ArrivalOffsets, events_from_schedule, fcfs_decode_schedule
from .stream import EventStream, concat_streams

__all__ = ["ORDERS", "prefill_events", "prefill_initialised_events", "uniform_prefill_estimate"]

ORDERS = ("chunk-major", "layer-major")


def prefill_events(trace: RoutingTrace, chunk: int, order: str = "chunk-major") -> EventStream:
    """Events of the prefill routing of ``trace`` (see the module docstring)."""
    if order not in ORDERS:
        raise ValidationError(f"order must be one of {', '.join(ORDERS)}; got {order!r}", field="order")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValidationError(f"chunk must be a positive number of tokens; got {chunk!r}", field="chunk")
    L, N, k = trace.n_layers, trace.n_experts, trace.top_k
    steps, layers, experts, mults, gms, active = [], [], [], [], [], []
    base = 0
    for r in range(trace.n_requests):
        rows = np.flatnonzero((trace.request == r) & (trace.phase == PREFILL))
        if rows.size == 0:
            continue
        chunks = [rows[i:i + chunk] for i in range(0, rows.size, chunk)]
        n = len(chunks)
        cells = ([(c, layer) for c in range(n) for layer in range(L)] if order == "chunk-major"
                 else [(c, layer) for layer in range(L) for c in range(n)])
        for c, layer in cells:
            ex = trace.experts[chunks[c], layer].ravel().astype(np.int64)
            uniq, inv = np.unique(ex, return_inverse=True)
            steps.append(base + (c if order == "chunk-major" else layer * n + c))
            layers.append(layer)
            experts.append(uniq)
            mults.append(np.bincount(inv, minlength=uniq.size))
            if trace.gates is not None:
                gms.append(np.bincount(inv, weights=trace.gates[chunks[c], layer].ravel().astype(np.float64),
                                       minlength=uniq.size))
            active.append(len(chunks[c]))
        base += n if order == "chunk-major" else n * L
    if not steps:
        raise ValidationError("the trace has no prefill tokens; collect (or synthesize) prompts with their routing")
    return EventStream.from_lists(L, N, k, steps, layers, experts, active, multiplicity=mults,
                                  gate_mass=gms if trace.gates is not None else None,
                                  provenance={"source": "routing_trace", "trace_provenance": trace.provenance,
                                              "phase": "prefill", "chunk": int(chunk), "order": order,
                                              "discipline": "sequential prefill, one request at a time"})


def prefill_initialised_events(trace: RoutingTrace, batch: int, chunk: int = 128, order: str = "chunk-major",
                               offsets: ArrivalOffsets | None = None) -> EventStream:
    """Decode events preceded by a warm-up of prefill events: a prefill-initialised cache (CLR §4.1).

    The warm-up is the chunked prefill (:func:`prefill_events`) of the requests
    that the FCFS schedule has active at the first decode step, one after
    another in admission order; then the decode stream of :func:`build_events`
    follows. ``provenance["warmup_events"]`` holds the warm-up length, which
    ``expertcache replay`` applies by default (``ReplayConfig.warmup_events``),
    so only decode events are counted. Prefills of requests admitted later
    are not modelled (decode-only aggregation); with ``batch=1`` and one
    request this is exactly CLR's protocol.
    """
    step, req, tok, decode_prov = fcfs_decode_schedule(trace, batch, offsets)
    decode = events_from_schedule(trace, step, req, tok, decode_prov)
    arrivals = (offsets or ArrivalOffsets()).arrivals(trace.n_requests, trace.request_ids)
    first = np.unique(req[step == step.min()]) if step.size else np.array([], dtype=np.int64)
    first = sorted(first.tolist(), key=lambda r: (arrivals[r], r))
    warm = prefill_events(select_requests(trace, first, note="prefill warm-up"), chunk, order)
    prov = {**decode.provenance, "warmup_events": int(warm.n_events),
            "warmup": {"kind": "prefill", "chunk": int(chunk), "order": order,
                       "requests": [trace.request_ids[r] for r in first]}}
    return concat_streams(warm, decode, prov)


def uniform_prefill_estimate(n_layers: int, n_experts: int, top_k: int, prompt_tokens: int, chunk: int,
                             rho: float) -> dict[str, float]:
    """Expected transfers for one prompt under independent uniform routing, one global pool (our approximation).

    * chunk union ``u = N (1 - (1 - k/N)^chunk)``, ``n = ceil(P / chunk)`` chunks;
    * layer-major: a layer's experts accumulate while it processes the whole
      prompt (assumes the pool holds one layer, ``rho*L >= 1``): ``L N (1 - (1 - k/N)^P)``;
    * chunk-major: the other layers pass between two visits of a layer, so a
      needed expert is resident with probability about ``rho`` (the pool's share
      of the universe): ``L u (1 + (n - 1)(1 - rho))``.

    An analytical projection for orientation, not a measurement.
    """
    L, N, k = n_layers, n_experts, top_k
    n = -(-prompt_tokens // chunk)
    u = N * (1 - (1 - k / N) ** chunk)
    layer_major = L * N * (1 - (1 - k / N) ** prompt_tokens)
    chunk_major = L * u * (1 + (n - 1) * (1 - rho))
    return {"chunk_union": u, "n_chunks": float(n), "layer_major": layer_major, "chunk_major": chunk_major,
            "ratio_chunk_over_layer": chunk_major / layer_major}
