"""Scoped experiments of the evaluation paper (§9.1, §9.3), each with its scope block (checklist D4).

* :func:`static_vs_dynamic` — a calibration-frozen static pin list against LFRU and Belady across
  concurrency (Table 19 shape), initial load counted.
* :func:`service_disciplines` — the same request set under continuous batching and deadline rotation
  (Table 20 shape): the service discipline alone can flip static versus dynamic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .events import build_events
from .replay import ReplayConfig, replay
from .rotation import RotationConfig, rotation_events
from .trace import RoutingTrace

__all__ = ["scope_block", "StaticRow", "static_vs_dynamic", "DisciplineRow", "service_disciplines"]


def scope_block(trace: RoutingTrace, rho: float, concurrency: str, discipline: str, fairness: str) -> dict[str, Any]:
    """The D4 scope of a mechanism experiment: model, rho, concurrency, discipline, fairness, lossless."""
    prov = trace.provenance
    return {"model": prov.get("model", prov.get("generator", "not reported")), "rho": rho,
            "concurrency": concurrency, "discipline": discipline, "fairness": fairness, "lossless": True,
            "cache_scope": "per-layer", "replay": "event-atomic"}


@dataclass(frozen=True)
class StaticRow:
    """One concurrency: static pinned (frozen from calibration) vs LFRU and Belady."""

    batch: int
    static: float
    lfru: float
    belady: float
    static_vs_lfru: float

    def to_dict(self) -> dict:
        return asdict(self)


def static_vs_dynamic(trace: RoutingTrace, calibration: RoutingTrace, batches: Sequence[int] = (2, 4, 8, 16),
                      rho: float = 0.4) -> tuple[list[StaticRow], dict[str, Any]]:
    """Table 19 shape. ``static_vs_lfru = (m_lfru - m_static) / m_lfru`` (negative: static is worse)."""
    rows = []
    for b in batches:
        s = build_events(trace, b)
        cal = build_events(calibration, b)
        m = {p: replay(s, ReplayConfig(p, rho=rho), cal).miss_fraction for p in ("static", "lfru", "belady")}
        rows.append(StaticRow(int(b), m["static"], m["lfru"], m["belady"], (m["lfru"] - m["static"]) / m["lfru"]))
    scope = scope_block(trace, rho, f"B in {list(batches)}", "continuous batching (FCFS)", "n/a")
    scope["static_fit"] = "calibration trace, frozen; initial load counted"
    return rows, scope


@dataclass(frozen=True)
class DisciplineRow:
    """One service discipline on the same request set."""

    discipline: str
    mean_batch: float
    static: float
    lfru: float
    static_vs_lfru: float

    def to_dict(self) -> dict:
        return asdict(self)


def service_disciplines(trace: RoutingTrace, calibration: RoutingTrace, batch: int = 8, admitted: int = 24,
                        window: int = 4, rho: float = 0.4) -> tuple[list[DisciplineRow], dict[str, Any]]:
    """Table 20 shape: continuous batching at ``batch`` vs rotation (``admitted``/``batch``, ``window``)."""
    cal = build_events(calibration, batch)
    cont = build_events(trace, batch)
    rot, stats = rotation_events(trace, RotationConfig(admitted, batch, window))
    rows = []
    for name, s in (("continuous batching", cont), (f"rotation {admitted}/{batch}, W={window}", rot)):
        m = {p: replay(s, ReplayConfig(p, rho=rho), cal).miss_fraction for p in ("static", "lfru")}
        mean_batch = float(s.active[s.layer == s.layer.min()].mean())
        rows.append(DisciplineRow(name, mean_batch, m["static"], m["lfru"], (m["lfru"] - m["static"]) / m["lfru"]))
    scope = scope_block(trace, rho, f"B = {batch}", "continuous batching vs deadline rotation",
                        f"rotation: W = {window}, max interval {stats.max_interval}")
    return rows, scope
