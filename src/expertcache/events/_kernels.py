"""numba kernel of event building: the union, multiplicity and gate mass of each (step, layer). Trusts its inputs.

:func:`step_layer_events` computes what :func:`expertcache.events.fcfs._schedule_events` computes with a
stable sort of every (token, layer, slot) entry, for a schedule sorted by step, one step at a time: no
``O(entries)`` sort keys, and the same gate sums (float64, in the schedule's token order).
"""

from __future__ import annotations

import numpy as np

from .._jit import jit


@jit
def step_layer_events(step, rows, experts, gates, has_gates, n_experts, ev_ids, csr, expert, mult, gm, active):
    """Fill the event arrays of the schedule ``(step[i], rows[i])`` (``step`` non-decreasing); return
    ``(n_events, n_union)``.

    Parameters
    ----------
    step, rows : int64[n]
        Scheduler step and trace row of each executed token.
    experts : int[n_tokens, L, k]
        The trace's routing (distinct experts per token and layer).
    gates : float32[n_tokens, L, k] (read when ``has_gates``)
        Gate weights.
    n_experts : int
        ``N``.
    ev_ids, active : int64[>= n_steps * L], int32[...]
        Output: event id ``step * L + layer`` and ``|A(s)|`` of each event.
    csr : int64[>= n_events + 1]
        Output: CSR offsets.
    expert, mult, gm : int16, int32, float32 [>= n * L * k]
        Output: members ascending within each event, their multiplicity and summed gate mass.
    """
    n = step.shape[0]
    n_layers, k = experts.shape[1], experts.shape[2]
    count = np.zeros(n_experts, dtype=np.int64)
    gsum = np.zeros(n_experts, dtype=np.float64)
    touched = np.empty(n_experts, dtype=np.int64)
    n_ev = 0
    n_u = 0
    csr[0] = 0
    g0 = 0
    while g0 < n:
        g1 = g0
        while g1 < n and step[g1] == step[g0]:
            g1 += 1
        for l in range(n_layers):
            n_t = 0
            for i in range(g0, g1):
                r = rows[i]
                for j in range(k):
                    e = np.int64(experts[r, l, j])
                    if count[e] == 0:
                        touched[n_t] = e
                        n_t += 1
                        if has_gates:
                            gsum[e] = np.float64(gates[r, l, j])
                    elif has_gates:
                        gsum[e] += np.float64(gates[r, l, j])
                    count[e] += 1
            # ascending member ids (insertion sort: an event holds at most min(N, |A| k) experts)
            for a in range(1, n_t):
                x = touched[a]
                b = a
                while b > 0 and touched[b - 1] > x:
                    touched[b] = touched[b - 1]
                    b -= 1
                touched[b] = x
            for a in range(n_t):
                e = touched[a]
                expert[n_u] = e
                mult[n_u] = count[e]
                if has_gates:
                    gm[n_u] = np.float32(gsum[e])
                count[e] = 0
                n_u += 1
            ev_ids[n_ev] = step[g0] * n_layers + l
            active[n_ev] = g1 - g0
            n_ev += 1
            csr[n_ev] = n_u
        g0 = g1
    return n_ev, n_u
