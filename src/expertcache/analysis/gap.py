"""The recoverable gap and its decomposition (§7.1-§7.2, checklist D2).

``g = (m_c - m_B) / m_c`` with ``m_c`` the best causal policy's effective miss
fraction (among lru, lfu, lfru, least-stale), ``m_B`` Belady's. Belady-forced
(``m_F``: must admit every miss) splits it: admission share
``(m_F - m_B) / (m_c - m_B)`` and future-victim share ``(m_c - m_F) / (m_c - m_B)``,
which sum to 1. Repeating over tie seeds measures implementation stability —
the simulator's own nondeterminism — not sampling uncertainty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from ..events import EventStream
from ..replay import ReplayConfig, ReplayResult, sweep
from ..replay.engine import reuse_belady_inputs

__all__ = ["GapResult", "gap_decomposition", "CAUSAL_POLICIES"]

#: The causal policies the best one is chosen from (§7.1).
CAUSAL_POLICIES = ("lru", "lfu", "lfru", "least-stale")


@dataclass(frozen=True)
class GapResult:
    """Gap and decomposition at one configuration, per tie seed and summarised.

    Attributes
    ----------
    miss_fraction
        Mean effective miss fraction over seeds, per policy (causal ones, belady, belady-forced).
    best_causal
        The causal policy with the lowest mean miss fraction.
    gap, admission_share, future_victim_share
        From the mean miss fractions (None when the gap is undefined: m_c == m_B).
    gap_per_seed
        The gap at each tie seed; ``gap_spread`` = max - min (implementation stability).
    """

    rho: float
    scope: str
    semantics: str
    seeds: tuple[int, ...]
    miss_fraction: dict[str, float]
    best_causal: str
    gap: float | None
    admission_share: float | None
    future_victim_share: float | None
    gap_per_seed: tuple[float | None, ...]
    gap_spread: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def _gap(m_c: float, m_b: float) -> float | None:
    return (m_c - m_b) / m_c if m_c > 0 else None


def gap_decomposition(stream: EventStream, rho: float = 0.4, scope: str = "per-layer",
                      semantics: str = "event-atomic", seeds: Sequence[int] = (0, 1, 2, 3, 4),
                      causal: Sequence[str] = CAUSAL_POLICIES, jobs: int = 1,
                      known: Mapping[ReplayConfig, ReplayResult] | None = None) -> GapResult:
    """Replay the causal policies, belady and belady-forced at every seed; return the gap record.

    ``known`` holds results of ``stream`` already computed (by configuration); those are not replayed
    again (a replay is a pure function of stream and configuration, so the record is the same).
    """
    names = (*causal, "belady", "belady-forced")
    configs = [ReplayConfig(p, rho=rho, scope=scope, semantics=semantics, tie_break="random", seed=s)
               for s in seeds for p in names]
    known = known or {}
    todo = [c for c in configs if c not in known]
    with reuse_belady_inputs():         # belady and belady-forced of a seed share their next uses (or event bitsets)
        lookup = {**known, **dict(zip(todo, sweep(stream, todo, jobs=jobs) if todo else [], strict=True))}
    results = [lookup[c] for c in configs]
    per_seed: dict[int, dict[str, float]] = {}
    for cfg, res in zip(configs, results, strict=True):
        per_seed.setdefault(cfg.seed, {})[cfg.policy] = res.miss_fraction
    mean = {p: sum(per_seed[s][p] for s in seeds) / len(seeds) for p in names}
    best = min(causal, key=lambda p: (mean[p], p))
    m_c, m_b, m_f = mean[best], mean["belady"], mean["belady-forced"]
    denom = m_c - m_b
    gaps = tuple(_gap(min(per_seed[s][p] for p in causal), per_seed[s]["belady"]) for s in seeds)
    valid = [g for g in gaps if g is not None]
    return GapResult(
        rho=float(rho), scope=scope, semantics=semantics, seeds=tuple(int(s) for s in seeds),
        miss_fraction=mean, best_causal=best, gap=_gap(m_c, m_b),
        admission_share=(m_f - m_b) / denom if denom > 0 else None,
        future_victim_share=(m_c - m_f) / denom if denom > 0 else None,
        gap_per_seed=gaps, gap_spread=(max(valid) - min(valid)) if valid else None,
    )
