"""Controls (§5.8): a labelled synthetic positive control and the natural data as the false-positive check.

The positive control copies one record's first ``n`` decode token-and-route
positions (token ids, expert ids, gate weights) into every record, which is
what a shared generated prefix looks like; the diagnostics must flag it. It
is not a model-generated response and not a replication of the
prompt-rendering effect; the copy is marked in the trace's provenance.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..events import decode_rows
from ..trace import RoutingTrace
from .routes import RouteAudit, RouteAuditConfig, route_audit

__all__ = ["control_source", "inject_shared_prefix", "ControlResult", "positive_control"]


def control_source(trace: RoutingTrace, n_positions: int) -> int:
    """The record a control copies from: the first with at least ``n_positions`` decode tokens, else the longest.

    Copying from a shorter record would copy fewer positions than asked for (request 0 of a trace may
    have only a handful of decode tokens).
    """
    length, _ = decode_rows(trace)
    long_enough = np.flatnonzero(length >= n_positions)
    return int(long_enough[0]) if long_enough.size else int(np.argmax(length))


def inject_shared_prefix(trace: RoutingTrace, n_positions: int, source: int | None = None,
                         requests: np.ndarray | list[int] | None = None) -> RoutingTrace:
    """A copy of ``trace`` whose records start with request ``source``'s first ``n_positions`` decode positions.

    Parameters
    ----------
    n_positions
        Decode positions to copy (each record keeps its own length; shorter records get a shorter copy).
    source
        Index of the record copied from (default: :func:`control_source`). The provenance records
        ``copied_positions``, the positions actually available to copy: ``min(n_positions, its length)``.
    requests
        Request indices to overwrite (default: every record).
    """
    if isinstance(n_positions, bool) or not isinstance(n_positions, (int, np.integer)) or n_positions < 1:
        raise ValidationError(f"n_positions must be a positive integer; got {n_positions!r}", field="n_positions")
    if source is None:
        source = control_source(trace, int(n_positions))
    if not 0 <= source < trace.n_requests:
        raise ValidationError(f"source must be a request index in [0, {trace.n_requests}); got {source}",
                              field="source")
    length, first = decode_rows(trace)
    targets = np.arange(trace.n_requests) if requests is None else np.asarray(requests, dtype=np.int64)
    experts = trace.experts.copy()
    gates = None if trace.gates is None else trace.gates.copy()
    tokens = trace.token_id.copy()
    src_first, src_len = int(first[source]), int(length[source])
    for r in targets.tolist():
        n = min(int(n_positions), src_len, int(length[r]))
        if n <= 0 or r == source:
            continue
        dst = slice(int(first[r]), int(first[r]) + n)
        src = slice(src_first, src_first + n)
        experts[dst] = trace.experts[src]
        tokens[dst] = trace.token_id[src]
        if gates is not None:
            gates[dst] = trace.gates[src]
    prov = dict(trace.provenance)
    prov["control"] = {"kind": "synthetic-positive", "copied_positions": min(int(n_positions), src_len),
                       "requested_positions": int(n_positions),
                       "source_request": trace.request_ids[source],
                       "n_targets": int(targets.shape[0]),
                       "note": "records overwritten with one record's first decode positions (§5.8); "
                               "not model-generated"}
    return RoutingTrace(trace.n_layers, trace.n_experts, trace.top_k, trace.request_ids, trace.request,
                        trace.phase, trace.position, experts, gates, tokens, prov)


@dataclass(frozen=True)
class ControlResult:
    """The natural trace (false-positive check) against its injected copy (synthetic positive control)."""

    copied_positions: int
    requested_positions: int
    source_request: str
    natural_flag: bool
    injected_flag: bool
    natural_agreement_mean: float | None
    injected_agreement_mean: float | None
    natural_agreement_p95: float | None
    injected_agreement_p95: float | None
    natural_jaccard: float | None
    injected_jaccard: float | None
    natural_unique_sequences: int
    injected_unique_sequences: int
    n_requests: int

    @property
    def flipped(self) -> bool:
        """The flag is false on the natural data and true on the injected copy."""
        return (not self.natural_flag) and self.injected_flag

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "flipped": self.flipped}


def positive_control(trace: RoutingTrace, labels: dict[str, str] | str | os.PathLike[str] | None,
                     n_positions: int, config: RouteAuditConfig | None = None, source: int | None = None,
                     exclude: np.ndarray | None = None, natural: RouteAudit | None = None) -> ControlResult:
    """Run the route audit on ``trace`` and on its injected copy; report the flag flip (§5.8).

    ``copied_positions`` is what was copied (the source record's length caps it), ``requested_positions``
    what was asked for; the source defaults to :func:`control_source`.
    """
    config = config or RouteAuditConfig()
    if source is None:
        source = control_source(trace, int(n_positions))
    nat = natural if natural is not None else route_audit(trace, labels, config, exclude)
    injected = inject_shared_prefix(trace, n_positions, source)
    inj = route_audit(injected, labels, config, exclude)
    copied = int(injected.provenance["control"]["copied_positions"])
    return ControlResult(copied, int(n_positions), trace.request_ids[source], nat.flag, inj.flag,
                         nat.overall_agreement_mean, inj.overall_agreement_mean, nat.overall_agreement_p95,
                         inj.overall_agreement_p95, nat.overall_jaccard, inj.overall_jaccard,
                         nat.unique_sequences, inj.unique_sequences, nat.n_requests)
