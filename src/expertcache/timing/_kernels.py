"""The timeline loop (numba): one pass over the events, in order, with each access's hit flag from the replay.

Kernels see arrays and scalars only; :mod:`expertcache.timing.model` validates and prepares them.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit

#: Contracts (how a layer's misses meet its computation).
FUSED_OVERLAP, FUSED_BLOCKING, SERIALIZED = 0, 1, 2


@jit
def timeline(offsets, mult, hit, ev_step, ev_layer, ev_tokens, costs, step_fixed, step_per_token, transfer_s,
             n_streams, contract, event_start, event_routed, event_end, event_stall, event_link):
    """Put every event on one device's timeline; fill the per-event output arrays.

    Parameters
    ----------
    offsets : int64[n_events + 1]
        CSR offsets of each event's members.
    mult : int32[n_access]
        Routed tokens of each member (multiplicity).
    hit : uint8[n_access]
        1 where the member was resident at its event (from the replay).
    ev_step, ev_layer : int64[n_events], int32[n_events]
        Step and MoE layer of each event; events are in ``(step, layer)`` order.
    ev_tokens : int64[n_events]
        Tokens the event's layer processes (routed tokens / k).
    costs : float64[4, n_layers]
        Dense fixed, dense per token, expert fixed, expert per routed token (seconds).
    step_fixed, step_per_token : float
        Per forward step, paid before its first layer.
    transfer_s : float
        Seconds one transfer occupies a channel.
    n_streams : int
        Transfer channels.
    contract : int
        ``FUSED_OVERLAP`` (misses stream while hits compute, then each miss computes once landed),
        ``FUSED_BLOCKING`` (the misses are copied first, compute waits, then every expert computes), or
        ``SERIALIZED`` (one expert at a time in ascending id: load if missing, then compute).
    event_start, event_routed, event_end, event_stall, event_link : float64[n_events]
        Outputs: when the event's layer starts, when its routing is known (dense work done), when it ends,
        how long the compute unit waited for weights, and the transfer time it put on the link.
    """
    n_events = offsets.shape[0] - 1
    chan = np.zeros(n_streams, dtype=np.float64)      # when each transfer channel is next free
    t = 0.0
    cur_step = -1
    for i in range(n_events):
        layer = ev_layer[i]
        if ev_step[i] != cur_step:
            cur_step = ev_step[i]
            t += step_fixed + step_per_token * ev_tokens[i]
        event_start[i] = t
        t += costs[0, layer] + costs[1, layer] * ev_tokens[i]
        routed = t
        event_routed[i] = routed
        lo = offsets[i]
        hi = offsets[i + 1]
        stall = 0.0
        link = 0.0
        if contract == SERIALIZED:
            for a in range(lo, hi):
                if hit[a] == 0:
                    t += transfer_s
                    stall += transfer_s
                    link += transfer_s
                t += costs[2, layer] + costs[3, layer] * mult[a]
        elif contract == FUSED_BLOCKING:
            for a in range(lo, hi):
                if hit[a] == 0:
                    link += transfer_s
            # copies on n_streams channels all start when the routing is known; compute waits for the last
            n_miss = 0
            for a in range(lo, hi):
                if hit[a] == 0:
                    n_miss += 1
            waves = (n_miss + n_streams - 1) // n_streams
            t += waves * transfer_s
            stall += waves * transfer_s
            for a in range(lo, hi):
                t += costs[2, layer] + costs[3, layer] * mult[a]
        else:
            # hits compute first while the misses stream (issued in ascending id on the earliest free channel)
            for a in range(lo, hi):
                if hit[a] != 0:
                    t += costs[2, layer] + costs[3, layer] * mult[a]
            for a in range(lo, hi):
                if hit[a] == 0:
                    c = 0
                    for j in range(1, n_streams):
                        if chan[j] < chan[c]:
                            c = j
                    start = chan[c] if chan[c] > routed else routed
                    land = start + transfer_s
                    chan[c] = land
                    link += transfer_s
                    if land > t:
                        stall += land - t
                        t = land
                    t += costs[2, layer] + costs[3, layer] * mult[a]
        event_end[i] = t
        event_stall[i] = stall
        event_link[i] = link
