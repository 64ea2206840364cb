"""numba kernel of LFU's one-pass miss-ratio curve (persistent counters, per-layer scope). Trusts its inputs.

With counters that persist across evictions, LFU's key of a block only grows, and only when the block is
accessed; so the cache of every capacity ``c`` is the ``c`` best blocks, by ``(frequency, tie rank)``,
of those seen so far (an unaccessed block never gains on a cached one). An access's depth in Mattson's
stack is then its block's rank among the seen blocks of its layer, kept in one sorted list per layer:
an access moves its block up past the few blocks it now outranks. This is what
:func:`._kernels.stack_depths` computes for the ``lfu`` key, without rebuilding a stack per unit.
"""

from __future__ import annotations

import numpy as np

from .._jit import jit


@jit
def lfu_stack_depths(offsets, expert, ev_layer, n_experts, n_layers, atomic, depth_cap, tie, hist):
    """Histogram of LFU stack depths: ``hist[l, d]`` += accesses of layer ``l`` at depth ``min(d, depth_cap)``.

    Parameters
    ----------
    offsets, expert, ev_layer
        The stream's CSR arrays.
    n_experts, n_layers : int
        ``N`` and ``L``.
    atomic : bool
        Event-atomic units (all members classified against the list at the event's start, then counted);
        otherwise one unit per access.
    depth_cap : int
        The deepest bin; unseen blocks and deeper accesses count there.
    tie : int64[L*N]
        Distinct tie ranks (the larger ranks first among equal frequencies).
    hist : int64[n_layers, depth_cap + 1]
        Output (accumulated).
    """
    n_blocks = n_layers * n_experts
    freq = np.zeros(n_blocks, dtype=np.int64)
    pos = np.full(n_blocks, -1, dtype=np.int64)          # rank among the layer's seen blocks, -1 unseen
    order = np.empty((n_layers, n_experts), dtype=np.int64)
    n_seen = np.zeros(n_layers, dtype=np.int64)
    n_events = offsets.shape[0] - 1
    for i in range(n_events):
        layer = ev_layer[i]
        base = layer * n_experts
        lo = offsets[i]
        hi = offsets[i + 1]
        n_units = 1 if atomic else hi - lo
        for u in range(n_units):
            a_lo = lo if atomic else lo + u
            a_hi = hi if atomic else lo + u + 1
            for a in range(a_lo, a_hi):
                d = pos[base + expert[a]]
                hist[layer, depth_cap if d < 0 or d > depth_cap else d] += 1
            for a in range(a_lo, a_hi):
                b = base + expert[a]
                freq[b] += 1
                q = pos[b]
                if q < 0:
                    q = n_seen[layer]
                    n_seen[layer] = q + 1
                # move up past every block it now outranks (the list stays sorted best first)
                while q > 0:
                    c = order[layer, q - 1]
                    if freq[c] > freq[b] or (freq[c] == freq[b] and tie[c] > tie[b]):
                        break
                    order[layer, q] = c
                    pos[c] = q
                    q -= 1
                order[layer, q] = b
                pos[b] = q
