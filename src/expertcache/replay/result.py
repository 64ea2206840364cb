"""ReplayResult: the record one replay produces (§2.4). Reports and plots only consume it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["LayerCounts", "ReplayResult", "results_to_arrow", "results_to_pandas"]

#: Configuration columns repeated on every per-layer row.
_RUN = ("policy", "semantics", "scope", "rho", "tie_break", "seed", "warmup_events")


@dataclass(frozen=True)
class LayerCounts:
    """Counts of one MoE layer (under global scope, capacity is the shared pool's and is reported as -1)."""

    layer: int
    capacity: int
    hits: int
    demand_misses: int
    initial_load: int
    union: int
    logical: int


@dataclass(frozen=True)
class ReplayResult:
    """Counts of one replay of one stream under one configuration.

    Attributes
    ----------
    policy, semantics, scope, rho, tie_break, seed
        The configuration that produced the counts.
    capacity_total
        Blocks the cache may hold in all (sum of per-layer quotas, or the global pool).
    transferred
        ``M``: demand misses + initial load (+ proactive loads; none yet).
    initial_load
        Blocks preloaded by a static pinned set (counted in ``transferred``).
    demand_misses, hits
        Union accesses that missed / hit; ``hits + demand_misses == union``.
    logical, union
        Pre-deduplication assignments and distinct-block accesses (§2.4).
    n_events
        Events counted (the stream's events after the warm-up).
    per_layer
        One :class:`LayerCounts` per layer.
    warmup_events
        Leading events replayed to fill the cache but not counted.
    """

    policy: str
    semantics: str
    scope: str
    rho: float | None
    tie_break: str
    seed: int
    capacity_total: int
    transferred: int
    initial_load: int
    demand_misses: int
    hits: int
    logical: int
    union: int
    n_events: int
    per_layer: tuple[LayerCounts, ...]
    warmup_events: int = 0

    @property
    def proactive_loads(self) -> int:
        """Blocks loaded ahead of demand (prefetch); always 0 for the policies of this release."""
        return self.transferred - self.demand_misses - self.initial_load

    @property
    def miss_fraction(self) -> float:
        """Effective miss fraction ``m = M / logical`` (§2.4)."""
        return self.transferred / self.logical if self.logical else 0.0

    @property
    def union_over_logical(self) -> float:
        """Deduplication ratio ``union / logical`` — the scheduler's benefit, never a policy's."""
        return self.union / self.logical if self.logical else 0.0

    @property
    def union_miss_ratio(self) -> float:
        """``demand_misses / union``: the denominator of the static identity (§9.2)."""
        return self.demand_misses / self.union if self.union else 0.0

    @property
    def steady_miss_fraction(self) -> float:
        """``demand_misses / logical``: effective miss fraction without the initial load."""
        return self.demand_misses / self.logical if self.logical else 0.0

    def to_dict(self, per_layer: bool = True) -> dict[str, Any]:
        """A JSON-ready dict with the derived metrics included."""
        out = asdict(self)
        out["per_layer"] = [asdict(x) for x in self.per_layer] if per_layer else None
        if not per_layer:
            del out["per_layer"]
        out.update(
            proactive_loads=self.proactive_loads,
            miss_fraction=self.miss_fraction,
            union_over_logical=self.union_over_logical,
            union_miss_ratio=self.union_miss_ratio,
            steady_miss_fraction=self.steady_miss_fraction,
        )
        return out

    def rows(self, per_layer: bool = False) -> list[dict[str, Any]]:
        """Table rows: one (:meth:`to_dict` without layers), or one per layer with the run's configuration."""
        if not per_layer:
            return [self.to_dict(per_layer=False)]
        run = {f: getattr(self, f) for f in _RUN}
        return [{**run, **asdict(x)} for x in self.per_layer]

    def to_arrow(self, per_layer: bool = False) -> Any:
        """:meth:`rows` as a :class:`pyarrow.Table`."""
        return results_to_arrow([self], per_layer)

    def to_pandas(self, per_layer: bool = False) -> Any:
        """:meth:`rows` as a pandas DataFrame (needs pandas: ``pip install pandas``)."""
        return results_to_pandas([self], per_layer)

    def __repr__(self) -> str:
        rho = "None" if self.rho is None else f"{self.rho:g}"
        return (f"ReplayResult(policy={self.policy!r}, semantics={self.semantics!r}, scope={self.scope!r}, "
                f"rho={rho}, capacity_total={self.capacity_total}, hits={self.hits}, "
                f"demand_misses={self.demand_misses}, transferred={self.transferred}, logical={self.logical}, "
                f"miss_fraction={self.miss_fraction:.4f}, per_layer=<{len(self.per_layer)} layers>)")


def results_to_arrow(results: Sequence[ReplayResult], per_layer: bool = False) -> Any:
    """A :class:`pyarrow.Table` of many results (e.g. a :func:`~expertcache.replay.sweep`): one row per run,
    or per run and layer with ``per_layer=True``."""
    from ..frames import rows_to_arrow

    return rows_to_arrow([row for r in results for row in r.rows(per_layer)])


def results_to_pandas(results: Sequence[ReplayResult], per_layer: bool = False) -> Any:
    """:func:`results_to_arrow` as a pandas DataFrame (needs pandas: ``pip install pandas``)."""
    from ..frames import arrow_to_pandas

    return arrow_to_pandas(results_to_arrow(results, per_layer))
