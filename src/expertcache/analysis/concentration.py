"""Expert-usage concentration (CLR Fig. 2-3) and gate mass by rank (evaluation paper §9.4)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..events import EventStream
from ..replay._kernels import block_weights
from ..trace import DECODE, RoutingTrace

__all__ = ["ConcentrationStats", "concentration", "selection_counts", "gate_mass_by_rank"]


def selection_counts(source: RoutingTrace | EventStream) -> np.ndarray:
    """``int64[L, N]`` expert selections before deduplication (decode tokens of a trace, or a stream's multiplicities)."""
    L, N = source.n_layers, source.n_experts
    if isinstance(source, RoutingTrace):               # a layer at a time: no int64 copy of every route
        ex = source.experts[source.phase == DECODE]    # (T, L, k)
        return np.stack([np.bincount(ex[:, layer, :].ravel(), minlength=N) for layer in range(L)]).astype(np.int64)
    return block_weights(source.offsets, source.expert, source.layer, N, L, source.multiplicity).reshape(L, N)


@dataclass(frozen=True)
class ConcentrationStats:
    """Per-layer and overall concentration of expert selections.

    ``max_frequency``: the most selected expert's share; ``topk_mass``: the
    share of the ``k`` most selected; ``entropy``: in nats; ``effective_experts``:
    ``exp(entropy)`` (``N`` for uniform use). "overall" values are means over layers.
    """

    top_k: int
    max_frequency: tuple[float, ...]
    topk_mass: tuple[float, ...]
    entropy: tuple[float, ...]
    effective_experts: tuple[float, ...]
    overall_max_frequency: float
    overall_topk_mass: float
    overall_entropy: float
    overall_effective_experts: float

    def to_dict(self) -> dict:
        return asdict(self)


def concentration(counts: np.ndarray, top_k: int) -> ConcentrationStats:
    """Concentration statistics of an ``[L, N]`` selection-count matrix."""
    counts = np.asarray(counts, dtype=np.float64)
    tot = counts.sum(axis=1, keepdims=True)
    p = np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)
    srt = -np.sort(-p, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
    eff = np.exp(ent)
    mx, tk = srt[:, 0], srt[:, :top_k].sum(axis=1)
    return ConcentrationStats(int(top_k), tuple(mx.tolist()), tuple(tk.tolist()), tuple(ent.tolist()),
                              tuple(eff.tolist()), float(mx.mean()), float(tk.mean()), float(ent.mean()),
                              float(eff.mean()))


def gate_mass_by_rank(trace: RoutingTrace) -> np.ndarray | None:
    """Share of total gate mass at each top-k rank (rank 1 = largest gate), decode tokens; None without gates."""
    if trace.gates is None:
        return None
    g = trace.gates[trace.phase == DECODE]                    # a copy (the decode rows), sorted in place, then
    g.sort(axis=2)                                             # per (token, layer) descending as float64: the
    ranked = g[:, :, ::-1].astype(np.float64, order="C")       # values of -sort(-g.astype(float64)), one pass
    mass = ranked.sum(axis=(0, 1))                             # less per step (docs/performance.md, *Session 67*)
    return mass / mass.sum() if mass.sum() > 0 else mass
