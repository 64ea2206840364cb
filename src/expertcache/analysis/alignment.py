"""Cross-model alignment by regime (§6.4, Table 11): pair conditions by r̄, not by batch size.

Models with different expert counts sit in different regimes at the same B;
comparing them "at B = 8" mixes regimes. ``regime_grid`` measures r̄ and the
gap per (model, B); ``align`` lays out the conventional batch-size alignment
next to an alignment on r̄, with the gap spread of each group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from ..events import build_events
from ..trace import RoutingTrace
from .gap import gap_decomposition
from .regime import expected_union_null, regime_stats
from .traffic import REFERENCE_FRAME

__all__ = ["GridPoint", "AlignmentRow", "regime_grid", "align", "reference_frame_r_null"]


@dataclass(frozen=True)
class GridPoint:
    """One (model, B) condition."""

    model: str
    batch: int
    r_mean: float
    gap: float | None
    best_causal: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AlignmentRow:
    """One row of the Table 11 layout; ``spread_pp`` (max - min gap, percentage points) on a group's last row."""

    alignment: str
    target: float
    model: str
    batch: int
    r_mean: float
    gap: float | None
    spread_pp: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def regime_grid(traces: Mapping[str, RoutingTrace], batches: Sequence[int], rho: float = 0.4,
                scope: str = "per-layer", seeds: Sequence[int] = (0,)) -> list[GridPoint]:
    """r̄ and the recoverable gap for every model and concurrency."""
    out = []
    for name, trace in traces.items():
        for b in batches:
            s = build_events(trace, b)
            g = gap_decomposition(s, rho, scope, seeds=seeds)
            out.append(GridPoint(name, int(b), regime_stats(s, rho, scope).r_mean, g.gap, g.best_causal))
    return out


def _spread(rows: list[GridPoint]) -> float | None:
    gaps = [p.gap for p in rows if p.gap is not None]
    return (max(gaps) - min(gaps)) * 100 if len(gaps) >= 2 else None


def align(grid: Sequence[GridPoint], batch: int = 8, r_targets: Sequence[float] | None = None,
          tolerance: float = 0.15) -> list[AlignmentRow]:
    """Rows aligned on ``batch`` and on each r̄ target.

    For a target, each model contributes its condition with the closest r̄ if
    it lies within ``tolerance`` (relative) of the target; groups with fewer
    than two models are dropped. Without targets, every condition of every
    model is tried as a target and distinct groups are kept.
    """
    rows: list[AlignmentRow] = []
    same_b = [p for p in grid if p.batch == batch]
    for i, p in enumerate(same_b):
        rows.append(AlignmentRow("batch size", float(batch), p.model, p.batch, p.r_mean, p.gap,
                                 _spread(same_b) if i == len(same_b) - 1 else None))
    models = list(dict.fromkeys(p.model for p in grid))
    targets = list(r_targets) if r_targets is not None else sorted({p.r_mean for p in grid})
    seen: set[tuple] = set()
    for target in targets:
        group = []
        for m in models:
            cands = [p for p in grid if p.model == m]
            best = min(cands, key=lambda p: abs(p.r_mean - target))
            if abs(best.r_mean - target) <= tolerance * target:
                group.append(best)
        key = tuple((p.model, p.batch) for p in group)
        if len(group) < 2 or key in seen:
            continue
        seen.add(key)
        for i, p in enumerate(group):
            rows.append(AlignmentRow("r_bar", float(target), p.model, p.batch, p.r_mean, p.gap,
                                     _spread(group) if i == len(group) - 1 else None))
    return rows


def reference_frame_r_null(batch: int, rho: float = 0.4) -> float:
    """r̄ of the §3.2 reference frame under the uniform null — an analytical projection, not a measurement."""
    f = REFERENCE_FRAME
    c = rho * f.n_layers * f.n_experts / f.n_layers
    return float(expected_union_null(f.n_experts, f.top_k, batch)) / c
