"""Features available at the moment of each union access (§7.3), and the target.

Units are event-atomic (one per event). For the access of block ``b`` at unit ``t``:

* ``log_recency`` = log1p(t - last use of b) (0 at a first observation),
* ``first_observation`` = 1 if b was never accessed before,
* ``log_frequency`` = log1p(previous accesses of b),
* ``log_prev_gap`` = log1p(gap between b's two previous accesses) (0 if fewer than two),
* ``gate_mass`` of the access (0 if the stream has none),
* ``log_multiplicity`` = log(concurrent requests routing to b in this event),
* ``layer`` index,
* ``popularity_rate`` = previous accesses of b / previous events of b's layer.

Target: ``log_next_distance`` = log(next unit holding b - t); never-again accesses
are flagged in ``never_again`` and carry NaN, so a fit can drop or cap them explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._jit import jit
from ..events import EventStream
from ..replay import _kernels as K

__all__ = ["FEATURE_NAMES", "AccessFeatures", "access_features"]

FEATURE_NAMES = ("log_recency", "first_observation", "log_frequency", "log_prev_gap", "gate_mass",
                 "log_multiplicity", "layer", "popularity_rate")


@dataclass(frozen=True)
class AccessFeatures:
    """``X`` (float64[n_access, 8], columns :data:`FEATURE_NAMES`), target and bookkeeping per access."""

    X: np.ndarray
    log_next_distance: np.ndarray
    never_again: np.ndarray
    unit: np.ndarray
    next_unit: np.ndarray


@jit
def _features(offsets, expert, ev_layer, n_experts, n_layers, gate_mass, multiplicity, X, unit):
    """The rows of :func:`access_features`. Every logarithm is of an integer below the number of events (a gap, a
    count) or a multiplicity, so each comes from a table of ``np.log1p`` / ``np.log`` of those integers, computed
    here by the same calls (the same bits as a call per access, about 4 a row, which took most of the loop)."""
    n_blocks = n_layers * n_experts
    n_events = offsets.shape[0] - 1
    last = np.full(n_blocks, -1, dtype=np.int64)
    prev_gap = np.zeros(n_blocks, dtype=np.int64)
    count = np.zeros(n_blocks, dtype=np.int64)
    layer_events = np.zeros(n_layers, dtype=np.int64)
    log1p = np.empty(n_events + 1, dtype=np.float64)        # gaps and counts are at most n_events
    for g in range(n_events + 1):
        log1p[g] = np.log1p(g)
    top = 1
    for a in range(multiplicity.shape[0]):
        top = max(top, multiplicity[a])
    logm = np.empty(top + 1, dtype=np.float64)
    for m in range(top + 1):
        logm[m] = np.log(max(m, 1))
    for i in range(n_events):
        layer = ev_layer[i]
        base = layer * n_experts
        for a_ in range(offsets[i], offsets[i + 1]):
            a = np.uint64(a_)                          # unsigned indices: no test for a negative wraparound
            b = np.uint64(base + expert[a])
            unit[a] = i
            if last[b] < 0:
                X[a, 0] = 0.0
                X[a, 1] = 1.0
            else:
                X[a, 0] = log1p[np.uint64(i - last[b])]
                X[a, 1] = 0.0
            X[a, 2] = log1p[np.uint64(count[b])]
            X[a, 3] = log1p[np.uint64(prev_gap[b])]
            X[a, 4] = gate_mass[a] if gate_mass.shape[0] else 0.0
            X[a, 5] = logm[np.uint64(max(multiplicity[a], 0))]
            X[a, 6] = layer
            X[a, 7] = count[b] / layer_events[layer] if layer_events[layer] else 0.0
            if last[b] >= 0:
                prev_gap[b] = i - last[b]
            last[b] = i
            count[b] += 1
        layer_events[layer] += 1


def access_features(stream: EventStream) -> AccessFeatures:
    """Features and target for every union access of ``stream`` (event-atomic units)."""
    n = stream.union
    X = np.empty((n, len(FEATURE_NAMES)), dtype=np.float64)
    unit = np.empty(n, dtype=np.int64)
    gm = stream.gate_mass.astype(np.float64) if stream.gate_mass is not None else np.empty(0, dtype=np.float64)
    nxt = K.next_use(stream.offsets, stream.expert, stream.layer, stream.n_experts, stream.n_layers, True)
    _features(stream.offsets, stream.expert, stream.layer, stream.n_experts, stream.n_layers, gm,
              stream.multiplicity, X, unit)
    never = nxt == K.NEVER
    dist = nxt.astype(np.float64)                  # in place from here: the values of
    dist -= unit                                   # np.log(np.where(never, nan, nxt - unit)), one array
    dist[never] = np.nan
    np.log(dist, out=dist)
    return AccessFeatures(X, dist, never, unit, nxt)
