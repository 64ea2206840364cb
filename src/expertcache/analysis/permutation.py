"""Permutation ablation (§6.5): same events, same sets, same r̄ — only temporal order changes.

Whole scheduler steps are permuted (the events of one step stay together, in
layer order), so the multiset of event expert sets, every event's active count
and therefore ``r̄`` are held exactly; only reuse structure changes. This is a
sufficiency counterexample, not a realizable scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..events import EventStream
from ..events.stream import concat_ranges
from .gap import CAUSAL_POLICIES, gap_decomposition

__all__ = ["permute_steps", "PermutationResult", "permutation_ablation"]


def permute_steps(stream: EventStream, rng: np.random.Generator) -> EventStream:
    """A copy of ``stream`` whose steps come in a random order (renumbered 0, 1, ...)."""
    steps, first = np.unique(stream.step, return_index=True)
    bounds = np.r_[first, stream.n_events]
    order = rng.permutation(steps.shape[0])
    per_step = np.diff(bounds)[order]
    ev = concat_ranges(bounds[:-1][order], per_step)
    new_step = np.repeat(np.arange(steps.shape[0], dtype=np.int64), per_step)
    sizes = stream.event_size[ev]
    offsets = np.zeros(ev.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    # a step's events, and so its members, are contiguous: the members moved a step's slice at a time (an index
    # of every member, gathered from, took most of the time: docs/performance.md, *Session 67*)
    acc = stream.offsets[bounds]
    ranges = list(zip(acc[:-1][order].tolist(), acc[1:][order].tolist(), strict=True))

    def moved(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a[lo:hi] for lo, hi in ranges]) if ranges else a[:0].copy()

    prov = {**stream.provenance, "permutation": "whole steps permuted (§6.5 ablation)"}
    # valid by construction: whole steps of a valid stream, renumbered in their new order, each step's events
    # still in layer order; the per-event checks run, the passes over every member do not
    return EventStream._trusted(stream.n_layers, stream.n_experts, stream.top_k, new_step, stream.layer[ev],
                                stream.active[ev], stream.logical_per_event[ev], offsets, moved(stream.expert),
                                moved(stream.multiplicity),
                                None if stream.gate_mass is None else moved(stream.gate_mass), prov)


@dataclass(frozen=True)
class PermutationResult:
    """The gap on the original order and on each permutation."""

    rho: float
    original_gap: float | None
    original_best_causal: str
    permuted_gaps: tuple[float | None, ...]
    permuted_best_causal: tuple[str, ...]
    seed: int

    def to_dict(self) -> dict:
        return asdict(self)


def permutation_ablation(stream: EventStream, n_permutations: int = 20, seed: int = 0, rho: float = 0.4,
                         scope: str = "per-layer", tie_seeds: Sequence[int] = (0,),
                         causal: Sequence[str] = CAUSAL_POLICIES, jobs: int = 1) -> PermutationResult:
    """Gap and best causal policy on the original stream and on ``n_permutations`` step permutations."""
    rng = np.random.default_rng(seed)
    base = gap_decomposition(stream, rho, scope, seeds=tie_seeds, causal=causal, jobs=jobs)
    gaps, bests = [], []
    for _ in range(n_permutations):
        res = gap_decomposition(permute_steps(stream, rng), rho, scope, seeds=tie_seeds, causal=causal, jobs=jobs)
        gaps.append(res.gap)
        bests.append(res.best_causal)
    return PermutationResult(float(rho), base.gap, base.best_causal, tuple(gaps), tuple(bests), int(seed))
