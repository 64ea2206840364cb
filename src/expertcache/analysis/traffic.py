"""Absolute traffic (§6.6, checklist D1): blocks and bytes per output token, bandwidth, the two-by-two reading.

A relative gap is ambiguous without absolute traffic: a small gap may mean
policies suffice or that nothing helps. The reading pairs the gap with
Belady's (offline) bytes per token against the bandwidth a target service
rate would need.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..events import EventStream

__all__ = ["ReferenceFrame", "REFERENCE_FRAME", "output_tokens", "TrafficReading", "traffic_reading",
           "recorded_block_bytes", "ReplayBytes", "replay_bytes"]

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class ReferenceFrame:
    """The analytical frontier-scale MoE of §3.2. Every figure derived from it is a projection."""

    name: str = "frontier-reference (§3.2, analytical projection only)"
    n_layers: int = 92
    n_experts: int = 896
    top_k: int = 16
    block_bytes: float = 16.74 * MIB
    non_routed_bytes: float = 106.55 * GIB
    routed_bytes: float = 1347.12 * GIB
    logical_bytes_per_token: float = 25.83e9


#: The §3.2 preset.
REFERENCE_FRAME = ReferenceFrame()


def output_tokens(stream: EventStream, warmup_events: int = 0) -> int:
    """Decode tokens executed: ``sum over steps of |A(s)|`` (one active count per step).

    With ``warmup_events = W`` only the steps whose first event is counted (index ``>= W``)
    contribute, as for the timing model's tokens.
    """
    _, first = np.unique(stream.step, return_index=True)
    return int(stream.active[first[first >= warmup_events]].sum())


def recorded_block_bytes(stream: EventStream) -> int | None:
    """The expert block size (bytes) the stream's manifest, or its trace's, declares (``expert_block_bytes``)."""
    prov = stream.provenance
    for p in (prov, prov.get("trace_provenance") or {}):
        value = p.get("expert_block_bytes") if isinstance(p, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class ReplayBytes:
    """Bytes one replay moves: ``transferred * expert_block_bytes``, and per output token.

    ``output_tokens`` counts the steps of counted events (:func:`output_tokens` after the
    warm-up); ``bytes_per_output_token`` is ``None`` when no token is counted.
    """

    expert_block_bytes: int
    source: str
    bytes_moved: int
    output_tokens: int
    bytes_per_output_token: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def replay_bytes(stream: EventStream, transferred: int, block_bytes: int, warmup_events: int = 0,
                 source: str = "given") -> ReplayBytes:
    """Bytes moved by a replay of ``stream`` that transferred ``transferred`` blocks of ``block_bytes`` each."""
    tokens = output_tokens(stream, warmup_events)
    moved = int(transferred) * int(block_bytes)
    return ReplayBytes(int(block_bytes), source, moved, tokens, moved / tokens if tokens else None)


@dataclass(frozen=True)
class TrafficReading:
    """Bytes per output token and the §6.6 two-by-two cell."""

    output_tokens: int
    block_bytes: float
    causal_blocks_per_token: float
    offline_blocks_per_token: float
    causal_bytes_per_token: float
    offline_bytes_per_token: float
    target_tokens_per_s: float | None
    causal_bandwidth_needed: float | None
    offline_bandwidth_needed: float | None
    bandwidth_budget: float | None
    gap: float | None
    gap_threshold: float
    cell: str
    projection: bool

    def to_dict(self) -> dict:
        return asdict(self)


def traffic_reading(stream: EventStream, causal_transferred: int, offline_transferred: int, block_bytes: float,
                    gap: float | None, target_tokens_per_s: float | None = None,
                    bandwidth_budget: float | None = None, gap_threshold: float = 0.10,
                    projection: bool = False) -> TrafficReading:
    """Per-token traffic of the best causal policy and of Belady, and the §6.6 reading.

    Parameters
    ----------
    causal_transferred, offline_transferred
        Transferred blocks (``ReplayResult.transferred``) of the best causal policy and of Belady.
    block_bytes
        Bytes of one expert block (from the model config, or given).
    target_tokens_per_s, bandwidth_budget
        Service rate and host-to-device bandwidth (bytes/s); without both the cell is "no budget given".
    projection
        Mark the figures as an analytical projection (e.g. the §3.2 reference frame).
    """
    t = output_tokens(stream)
    cb, ob = causal_transferred / t, offline_transferred / t
    need_c = cb * block_bytes * target_tokens_per_s if target_tokens_per_s else None
    need_o = ob * block_bytes * target_tokens_per_s if target_tokens_per_s else None
    if need_o is None or bandwidth_budget is None or gap is None:
        cell = "no budget given: the gap alone is not a decision criterion (§6.6)"
    else:
        small = gap < gap_threshold
        within = need_o <= bandwidth_budget
        cell = {
            (True, True): "small gap, offline within budget: existing policies suffice",
            (False, True): "large gap, offline within budget: genuine algorithmic headroom on this sequence",
            (True, False): "small gap, offline over budget: no residency policy on this sequence is viable",
            (False, False): "large gap, offline over budget: the oracle also fails; the gap cannot cross the budget",
        }[(small, within)]
    return TrafficReading(t, float(block_bytes), cb, ob, cb * block_bytes, ob * block_bytes,
                          target_tokens_per_s, need_c, need_o, bandwidth_budget, gap, gap_threshold, cell,
                          projection)
