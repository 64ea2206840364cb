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

__all__ = ["ReferenceFrame", "REFERENCE_FRAME", "output_tokens", "TrafficReading", "traffic_reading"]

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


def output_tokens(stream: EventStream) -> int:
    """Decode tokens executed: ``sum over steps of |A(s)|`` (one active count per step)."""
    _, first = np.unique(stream.step, return_index=True)
    return int(stream.active[first].sum())


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
