"""Naive twin of a policy registered from Python, written from ``docs/policies.md`` alone.

Plain Python: sets, ``sorted()`` with tuple keys, a list of units per
semantics (``naive.units_of``), capacities and tie ranks from ``naive``. The
key and update are the *Python* functions of the plugin (``.py_func``), called
with this twin's own ``last``/``freq``/``state`` arrays, so only the loop of
the engine is under test.
"""

from __future__ import annotations

import naive
import numpy as np


def naive_plugin_replay(stream, key, update=None, state_init=(), *, rho=0.4, scope="per-layer",
                        semantics="event-atomic", tie_break="random", seed=0, capacity=None, warmup_events=0):
    """Counts of a plugin policy: ``{"hits", "demand_misses", "per_layer_hits", "per_layer_demand_misses"}``."""
    L, N = int(stream.n_layers), int(stream.n_experts)
    caps = naive.capacities(L, N, scope, rho=rho, capacity=capacity)
    tie = naive.tie_ranks(L, N, tie_break, seed)
    units = naive.units_of(stream, semantics, seed)
    events = naive.events_of(stream)
    unit_event = [i for i, (_s, _l, m) in enumerate(events) for _ in range(1 if semantics == "event-atomic" else len(m))]
    last = np.full(L * N, -1, dtype=np.int64)
    freq = np.zeros(L * N, dtype=np.int64)
    state = np.tile(np.asarray(state_init, dtype=np.float64), (L * N, 1)).reshape(L * N, len(state_init))
    caches = [set() for _ in caps]
    hits, misses = [0] * L, [0] * L
    for t, (_step, layer, blocks) in enumerate(units):
        p = layer if scope == "per-layer" else 0
        C = caches[p]
        counted = unit_event[t] >= warmup_events
        for b in blocks:                      # access order
            hit = b in C
            if counted:
                hits[layer] += hit
                misses[layer] += not hit
            if update is not None:
                update(b, t, hit, last, freq, state)
            last[b] = t
            freq[b] += 1
        K = C | set(blocks)
        if len(K) <= caps[p]:
            caches[p] = K
            continue

        def rank(b, t=t):
            v = float(key(b, t, last, freq, state))
            return (-np.inf if v != v else v, tie[b])

        caches[p] = set(sorted(K, key=rank, reverse=True)[:caps[p]])
    return {"hits": sum(hits), "demand_misses": sum(misses), "per_layer_hits": hits,
            "per_layer_demand_misses": misses}
