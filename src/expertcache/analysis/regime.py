"""Operating regime (§6.1-§6.2, checklist C1): union per layer-step against capacity.

``r(s, l) = |E(s, l)| / c_l``; its mean ``r̄``, p95 and the fraction of events
above 1 place a measurement in the regime where replacement policies have room
(r < 1) or where capacity-forced traffic dominates (r > 1). The independent
uniform-routing null gives the union concurrency would produce without any
overlap structure: ``N (1 - (1 - k/N)^{|A(s)|})`` per layer-step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..events import EventStream
from ..replay import capacities_for_rho, total_capacity

__all__ = ["RegimeStats", "regime_stats", "expected_union_null"]


def expected_union_null(n_experts: int, top_k: int, active: np.ndarray | int) -> np.ndarray:
    """Expected ``|E|`` when each of ``active`` requests picks ``k`` of ``N`` experts uniformly, independently.

    Each expert is missed by one request with probability ``1 - k/N``, so it is
    in the union with probability ``1 - (1 - k/N)^active``.
    """
    a = np.asarray(active, dtype=np.float64)
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** a)


@dataclass(frozen=True)
class RegimeStats:
    """The regime block of a stream at one residency fraction (all means over events)."""

    rho: float
    scope: str
    n_events: int
    union_mean: float
    union_p95: float
    capacity_per_layer: tuple[int, ...]
    capacity_mean: float
    r_mean: float
    r_p95: float
    r_fraction_over_1: float
    null_union_mean: float
    reduction_vs_null: float
    mean_active: float

    def to_dict(self) -> dict:
        return asdict(self)


def regime_stats(stream: EventStream, rho: float, scope: str = "per-layer") -> RegimeStats:
    """Union distribution, ``r(s, l)`` and the uniform null for ``stream`` at ``rho``.

    Both p95s are nearest-rank (the smallest value with at least 95% of the events at or below it),
    so ``union_p95`` is always a union size that occurs.

    Under global scope the per-layer "capacity" is the pool divided evenly,
    ``total / L`` (the pool is shared, so r is then a reference ratio only).
    """
    L, N = stream.n_layers, stream.n_experts
    size = stream.event_size.astype(np.float64)
    if scope == "global":
        caps = np.full(L, total_capacity(rho, L, N) / L)
    else:
        caps = capacities_for_rho(rho, L, N).astype(np.float64)
    cap_ev = caps[stream.layer]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(cap_ev > 0, size / np.where(cap_ev > 0, cap_ev, 1), np.inf)
    null = expected_union_null(N, stream.top_k, stream.active)
    with np.errstate(invalid="ignore"):                 # zero capacity: r is infinite
        r_p95 = float(np.percentile(r, 95, method="inverted_cdf"))
    if np.isnan(r_p95):
        r_p95 = float("inf")
    return RegimeStats(
        rho=float(rho), scope=scope, n_events=stream.n_events,
        union_mean=float(size.mean()), union_p95=float(np.percentile(size, 95, method="inverted_cdf")),
        capacity_per_layer=tuple(int(c) for c in np.floor(caps)) if scope != "global" else tuple(),
        capacity_mean=float(caps.mean()),
        r_mean=float(r.mean()), r_p95=r_p95, r_fraction_over_1=float((r > 1).mean()),
        null_union_mean=float(null.mean()), reduction_vs_null=float(1.0 - size.mean() / null.mean()),
        mean_active=float(stream.active.mean()),
    )
