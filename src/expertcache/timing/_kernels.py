"""The timeline loop (numba): one pass over the events, in order, with each access's hit flag from the replay.

Kernels see arrays and scalars only; :mod:`expertcache.timing.model` validates and prepares them.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit, jit_helper

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


@jit_helper
def _issue(pf_off, pf_exp, k, base, at, chan, transfer_s, land, pf_land):
    """Put event ``k``'s prefetches on the earliest free channels from time ``at``; return their link time."""
    link = 0.0
    n_streams = chan.shape[0]
    for q in range(pf_off[k], pf_off[k + 1]):
        c = 0
        for j in range(1, n_streams):
            if chan[j] < chan[c]:
                c = j
        start = chan[c] if chan[c] > at else at
        chan[c] = start + transfer_s
        land[base + pf_exp[q]] = chan[c]
        pf_land[q] = chan[c]
        link += transfer_s
    return link


@jit
def timeline_prefetch(offsets, expert, mult, hit, ev_step, ev_layer, ev_tokens, costs, step_fixed, step_per_token,
                      transfer_s, n_streams, blocking, n_experts, pf_off, pf_exp, lead, counted, event_start,
                      event_routed, event_end, event_stall, event_link, pf_land, pf_state, pf_wait):
    """:func:`timeline` of the fused contract with the replay's prefetches on the link as well.

    Parameters (beyond :func:`timeline`'s)
    --------------------------------------
    expert : int16[n_access]
        Expert of each member (blocks are ``layer * n_experts + expert``).
    blocking : bool
        Copies block compute (a prefetch is then a copy the compute unit makes when it is issued).
    pf_off, pf_exp : int64[n_events + 1], int32[n_pf]
        CSR of the experts inserted by pre-access refinement before each event, in insertion order.
    lead : int
        When event ``i``'s prefetches are issued: ``lead >= 1``: when the routing of event ``i - lead`` is known
        (after that event's own misses are issued; events ``i < lead`` at time 0); ``lead == 0``: when the
        previous forward step ends (the start of ``i``'s step, before the step's own cost).
    counted : bool[n_events]
        Events whose prefetches and hits are classified (the replay's counted events).
    pf_land, pf_state, pf_wait : float64[n_pf], int8[n_pf], float64[n_pf]
        Outputs per prefetch: when it lands; 1 timely (landed when its expert was to compute), 2 late (the
        compute unit waited for it), 0 never hit before it left the cache (useless) or not classified; how long
        the compute unit waited for it.

    Under an overlapping link each event's resident members whose weights have landed by the routing compute
    first (ascending id); then the others (demand misses, issued at the routing, and prefetches still in
    flight) in the order they land, each once it has landed.
    """
    n_events = offsets.shape[0] - 1
    n_layers = 0
    for i in range(n_events):
        if ev_layer[i] + 1 > n_layers:
            n_layers = ev_layer[i] + 1
    land_size = n_layers * n_experts
    land = np.zeros(land_size, dtype=np.float64)        # when each block's weights are (were) on the device
    pf_of = np.full(land_size, -1, dtype=np.int64)      # the counted prefetch of each block not yet hit
    chan = np.zeros(n_streams, dtype=np.float64)
    max_unit = 1
    for i in range(n_events):
        max_unit = max(max_unit, offsets[i + 1] - offsets[i])
    pend = np.empty(max_unit, dtype=np.int64)
    pend_land = np.empty(max_unit, dtype=np.float64)
    waited = np.zeros(max_unit, dtype=np.float64)
    t = 0.0
    cur_step = -1
    if lead >= 1:
        for k in range(min(lead, n_events)):
            base = ev_layer[k] * n_experts
            if blocking:
                n = pf_off[k + 1] - pf_off[k]
                w = ((n + n_streams - 1) // n_streams) * transfer_s
                t += w
                event_stall[0] += w
                for q in range(pf_off[k], pf_off[k + 1]):
                    land[base + pf_exp[q]] = t
                    pf_land[q] = t
                event_link[k] += n * transfer_s
            else:
                event_link[k] += _issue(pf_off, pf_exp, k, base, 0.0, chan, transfer_s, land, pf_land)
            if counted[k]:
                for q in range(pf_off[k], pf_off[k + 1]):
                    pf_of[base + pf_exp[q]] = q
    for i in range(n_events):
        layer = ev_layer[i]
        base = layer * n_experts
        if ev_step[i] != cur_step:
            cur_step = ev_step[i]
            if lead == 0:
                k = i
                while k < n_events and ev_step[k] == cur_step:
                    kb = ev_layer[k] * n_experts
                    if blocking:
                        n = pf_off[k + 1] - pf_off[k]
                        w = ((n + n_streams - 1) // n_streams) * transfer_s
                        t += w
                        event_stall[i] += w
                        event_link[k] += n * transfer_s
                        for q in range(pf_off[k], pf_off[k + 1]):
                            land[kb + pf_exp[q]] = t
                            pf_land[q] = t
                    else:
                        event_link[k] += _issue(pf_off, pf_exp, k, kb, t, chan, transfer_s, land, pf_land)
                    if counted[k]:
                        for q in range(pf_off[k], pf_off[k + 1]):
                            pf_of[kb + pf_exp[q]] = q
                    k += 1
            t += step_fixed + step_per_token * ev_tokens[i]
        event_start[i] = t
        t += costs[0, layer] + costs[1, layer] * ev_tokens[i]
        routed = t
        event_routed[i] = routed
        lo = offsets[i]
        hi = offsets[i + 1]
        stall = 0.0
        link = 0.0
        # the event's own misses, issued as soon as the routing is known
        n_miss = 0
        for a in range(lo, hi):
            if hit[a] == 0:
                n_miss += 1
                link += transfer_s
                if blocking:
                    continue
                c = 0
                for j in range(1, n_streams):
                    if chan[j] < chan[c]:
                        c = j
                start = chan[c] if chan[c] > routed else routed
                chan[c] = start + transfer_s
                land[base + expert[a]] = chan[c]
        if blocking:
            w = ((n_miss + n_streams - 1) // n_streams) * transfer_s
            t += w
            stall += w
            for a in range(lo, hi):
                if hit[a] == 0:
                    land[base + expert[a]] = t
        # then the prefetches this routing makes available
        k = i + lead
        if lead >= 1 and k < n_events:
            kb = ev_layer[k] * n_experts
            if blocking:
                n = pf_off[k + 1] - pf_off[k]
                w = ((n + n_streams - 1) // n_streams) * transfer_s
                t += w
                stall += w
                event_link[k] += n * transfer_s
                for q in range(pf_off[k], pf_off[k + 1]):
                    land[kb + pf_exp[q]] = t
                    pf_land[q] = t
            else:
                event_link[k] += _issue(pf_off, pf_exp, k, kb, routed, chan, transfer_s, land, pf_land)
            if counted[k]:
                for q in range(pf_off[k], pf_off[k + 1]):
                    pf_of[kb + pf_exp[q]] = q
        # compute: members whose weights are there first, then the rest as they land
        n_pend = 0
        ready = t
        for a in range(lo, hi):
            waited[a - lo] = 0.0
            if hit[a] != 0 and land[base + expert[a]] <= ready:
                t += costs[2, layer] + costs[3, layer] * mult[a]
            else:
                # insertion by landing time (stable: ascending id among equal times)
                x = land[base + expert[a]]
                j = n_pend
                while j > 0 and pend_land[j - 1] > x:
                    pend[j] = pend[j - 1]
                    pend_land[j] = pend_land[j - 1]
                    j -= 1
                pend[j] = a
                pend_land[j] = x
                n_pend += 1
        for j in range(n_pend):
            a = pend[j]
            if pend_land[j] > t:
                waited[a - lo] = pend_land[j] - t
                stall += pend_land[j] - t
                t = pend_land[j]
            t += costs[2, layer] + costs[3, layer] * mult[a]
        # classify the first hit of each counted prefetch; every access ends a prefetch's pending state
        for a in range(lo, hi):
            b = base + expert[a]
            q = pf_of[b]
            if q >= 0 and hit[a] != 0 and counted[i]:
                if waited[a - lo] > 0.0:
                    pf_state[q] = 2
                    pf_wait[q] = waited[a - lo]
                else:
                    pf_state[q] = 1
            pf_of[b] = -1
        event_end[i] = t
        event_stall[i] += stall
        event_link[i] += link
