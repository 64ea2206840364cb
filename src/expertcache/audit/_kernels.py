"""Numba kernels of the route-side diagnostics; they see only arrays and scalars."""

from __future__ import annotations

import numpy as np

from .._jit import jit


@jit
def route_masks(experts, n_words):
    """``uint64[n_tokens, L, n_words]``: each (row, layer)'s expert set as a bitset (bit ``e % 64`` of word
    ``e // 64``)."""
    n, n_layers, k = experts.shape
    out = np.zeros((n, n_layers, n_words), dtype=np.uint64)
    for r in range(n):
        for l in range(n_layers):
            for j in range(k):
                e = np.int64(experts[r, l, j])
                out[r, l, e >> 6] |= np.uint64(1) << np.uint64(e & 63)
    return out


@jit
def _popcount(x):
    """Set bits of a uint64 (the SWAR count; LLVM lowers it to one ``popcnt``)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@jit
def pair_stats(masks, k, tokens, use_tokens, first, length, pair_a, pair_b, pair_group, agree_pos, count_pos,
               out_n, out_agree, out_jac):
    """Per request pair: positions compared, positional agreements, summed per-(position, layer) Jaccard.

    ``masks`` is :func:`route_masks` of the decode rows (``k`` experts each); pair ``p`` compares
    decode index ``t < min(length[a], length[b])`` of requests ``a`` and ``b``
    (rows ``first[a] + t`` and ``first[b] + t``). A position agrees when the
    token ids are equal (``use_tokens``) or, otherwise, when every layer's
    expert set is equal. ``agree_pos[g, t]`` / ``count_pos[g, t]`` accumulate
    agreements / comparisons at each ``t`` for the pair's group ``g``. The per-layer Jaccard
    ``|A & B| / (2k - |A & B|)`` is summed in position, then layer order.
    """
    n_layers = masks.shape[1]
    n_words = masks.shape[2]
    jt = np.empty(k + 1, dtype=np.float64)           # Jaccard of each intersection size
    for i in range(k + 1):
        jt[i] = i / (2 * k - i)
    for p in range(pair_a.shape[0]):
        a = pair_a[p]
        b = pair_b[p]
        g = pair_group[p]
        n = min(length[a], length[b])
        agree = 0
        jac = 0.0
        for t in range(n):
            ra = first[a] + t
            rb = first[b] + t
            same_route = True
            for l in range(n_layers):
                inter = 0
                for w in range(n_words):
                    inter += _popcount(masks[ra, l, w] & masks[rb, l, w])
                if inter != k:
                    same_route = False
                jac += jt[inter]
            if use_tokens:
                match = tokens[ra] == tokens[rb]
            else:
                match = same_route
            if match:
                agree += 1
                agree_pos[g, t] += 1
            count_pos[g, t] += 1
        out_n[p] = n
        out_agree[p] = agree
        out_jac[p] = jac


@jit
def cohort_union(experts, first, length, members, member_offsets, n_experts, t_max, out_union, out_active):
    """Per cohort and decode index ``t``: the summed per-layer expert union and the active members.

    Cohort ``c`` holds requests ``members[member_offsets[c]:member_offsets[c + 1]]``,
    all starting at decode index 0 together (position-aligned); a member is
    active at ``t`` while ``t < length[member]``.
    """
    n_layers = experts.shape[1]
    k = experts.shape[2]
    stamp = np.zeros(n_experts, dtype=np.int64)
    cur = 0
    for c in range(member_offsets.shape[0] - 1):
        for t in range(t_max):
            active = 0
            for m in range(member_offsets[c], member_offsets[c + 1]):
                if length[members[m]] > t:
                    active += 1
            out_active[c, t] = active
            if active == 0:
                continue
            for l in range(n_layers):
                cur += 1
                u = 0
                for m in range(member_offsets[c], member_offsets[c + 1]):
                    r = members[m]
                    if length[r] > t:
                        row = first[r] + t
                        for j in range(k):
                            e = experts[row, l, j]
                            if stamp[e] != cur:
                                stamp[e] = cur
                                u += 1
                out_union[c, t] += u
