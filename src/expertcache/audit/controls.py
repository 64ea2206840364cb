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

__all__ = ["inject_shared_prefix", "ControlResult", "positive_control"]


def inject_shared_prefix(trace: RoutingTrace, n_positions: int, source: int = 0,
                         requests: np.ndarray | list[int] | None = None) -> RoutingTrace:
    """A copy of ``trace`` whose records start with request ``source``'s first ``n_positions`` decode positions.

    Parameters
    ----------
    n_positions
        Decode positions to copy (each record keeps its own length; shorter records get a shorter copy).
    source
        Index of the record copied from.
    requests
        Request indices to overwrite (default: every record).
    """
    if isinstance(n_positions, bool) or not isinstance(n_positions, (int, np.integer)) or n_positions < 1:
        raise ValidationError(f"n_positions must be a positive integer; got {n_positions!r}", field="n_positions")
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
    prov["control"] = {"kind": "synthetic-positive", "copied_positions": int(n_positions),
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
                     n_positions: int, config: RouteAuditConfig | None = None, source: int = 0,
                     exclude: np.ndarray | None = None, natural: RouteAudit | None = None) -> ControlResult:
    """Run the route audit on ``trace`` and on its injected copy; report the flag flip (§5.8)."""
    config = config or RouteAuditConfig()
    nat = natural if natural is not None else route_audit(trace, labels, config, exclude)
    inj = route_audit(inject_shared_prefix(trace, n_positions, source), labels, config, exclude)
    return ControlResult(int(n_positions), trace.request_ids[source], nat.flag, inj.flag,
                         nat.overall_agreement_mean, inj.overall_agreement_mean, nat.overall_agreement_p95,
                         inj.overall_agreement_p95, nat.overall_jaccard, inj.overall_jaccard,
                         nat.unique_sequences, inj.unique_sequences, nat.n_requests)
