"""numba kernel for sequential ``lrfu`` under global scope: per layer a recency list, its lowest key in a window.

LRFU's key ``log2(S) + lam * u`` (:func:`expertcache.replay._kernels.crf_key`: ``S`` a block's CRF at its last access,
``u`` that access's unit of the block's layer) lies in ``[lam * u, lam * u + log2(S_max))``, since the CRF stays below
``S_max = 1 / (1 - 2**-lam)`` (a geometric series). A block last accessed ``W`` units after the oldest resident of its
layer, with ``lam * W >= log2(S_max) + lam``, keys above that resident: a layer's lowest key is among the residents
accessed within :func:`window` units of its oldest one. Under sequential replay a layer unit holds one access, so a
layer's residents in the order of their last access (a list per layer) have their lowest key among the first
``window`` of them (5 at ``lam = 0.5``).

:func:`replay_lrfu_window` keeps each layer's lowest ``(key, tie position)`` and a tournament tree of the layers (the
lowest of all at its root). An access computes its block's CRF and key; a hit moves the block to its list's tail (the
layer's lowest is found again where the block was in the window); a miss past the quota compares its key with the
root's: the lower leaves (the miss is bypassed, or the root's block is evicted and its layer's lowest found again in
its window, a walk of at most ``window`` residents, and the tree updated along one path). The decision, hit counts and
hit flags are those of the pool loop (:func:`._kernels_lrfu_global.replay_lrfu_global`) and of ``replay_ranked``.
The engine runs it for sequential global ``lrfu`` where :func:`window` is at most :data:`MAX_WINDOW` (``lam`` 0.07
or more: ``window(0.07)`` is 64, ``window(0.04)`` 131; ``lam = 0`` has no window).

A key's ``log2(S)`` comes from a memo of earlier results keyed by the CRF's bits (:func:`_log2_memo`), libm's
``log2`` only where the memo does not hold that CRF: under sequential units a block's gaps are long, so its CRF is 1
or a sum of a few decays, and few CRFs recur often (docs/performance.md, *Session 45*). The memo holds libm's own
results, so the keys are those of :func:`._kernels.crf_key` bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import jit_inline, jit_loop
from ._kernels import _append, _unlink, crf_decays
from ._kernels_bits import _LRFU_DECAYS, _U, _lrfu_decay
from ._simd import f2u

#: The longest window (in layer units) this loop takes; past it the engine runs the pool loop.
MAX_WINDOW = 64
#: The memo of ``log2`` by CRF (:func:`_log2_memo`) holds ``2**k`` entries of 16 bytes, ``k`` the bits of the
#: stream's accesses within these bounds (1 MiB at most): with ``2**16`` entries 0.77-0.91 of the time of libm's
#: ``log2`` at every access on the benchmark stream (``python benchmarks/kernel_ab.py --kernel lrfu-global-seq``);
#: smaller memos hold fewer of its CRFs (docs/performance.md, *Session 45*).
MEMO_BITS = (8, 16)


def window(lam: float) -> int:
    """Layer units past a layer's oldest resident within which its lowest key lies: ``floor(log2(S_max) / lam) +
    2`` with ``S_max = 1 / (1 - 2**-lam)`` (the bound plus a unit of margin for rounding); a large value where ``lam``
    is 0 or tiny.

    >>> window(0.5), window(1.0), window(0.0) > MAX_WINDOW
    (5, 3, True)
    """
    if not lam > 1e-6:
        return 1 << 62
    s_max = 1.0 / (1.0 - 2.0 ** -lam)
    return int(math.floor(math.log2(s_max) / lam)) + 2


def replay_lrfu_window(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, lam, count_from, hits,
                       misses, hit_flag):
    """Sequential ``lrfu`` with one global pool of ``capacity[0]`` blocks (the decision of the pool loop).

    ``tie_pos[b]``: block ``b``'s position among all blocks by ascending tie rank (lower leaves first among equal
    keys); ``lam``: ``lrfu_lambda``, with :func:`window` at most :data:`MAX_WINDOW`; the other parameters are those of
    :func:`._kernels_lrfu_global.replay_lrfu_global`. The state is allocated here and the loop runs in
    :func:`_replay_lrfu_window`.
    """
    lam = float(lam)
    n_units = int(offsets[-1] - offsets[0]) if offsets.shape[0] > 1 else 0
    size = 1
    while size < max(n_layers, 1):
        size *= 2
    n_blocks = n_layers * n_experts
    tree = np.zeros(2 * size, dtype=np.int64)
    tree[size:] = np.arange(size)
    for q in range(size - 1, 0, -1):
        tree[q] = tree[2 * q]
    bits = min(max(int(n_units).bit_length(), MEMO_BITS[0]), MEMO_BITS[1])
    _replay_lrfu_window(offsets, expert, ev_layer, n_experts, n_layers, min(int(capacity[0]), n_blocks),
                        tie_pos.astype(np.int64), lam, window(lam), count_from, hits, misses, hit_flag,
                        crf_decays(lam, min(n_units + 1, _LRFU_DECAYS)), size, np.zeros(n_blocks),
                        np.full(n_blocks, -1, dtype=np.int64), np.zeros(n_blocks), np.zeros(n_blocks, dtype=np.bool_),
                        np.full(n_blocks, -1, dtype=np.int64), np.full(n_blocks, -1, dtype=np.int64),
                        np.full(max(n_layers, 1), -1, dtype=np.int64), np.full(max(n_layers, 1), -1, dtype=np.int64),
                        np.full(size, np.inf), np.full(size, 1 << 62, dtype=np.int64),
                        np.full(size, -1, dtype=np.int64), tree, np.zeros(max(n_layers, 1), dtype=np.int64),
                        np.zeros(1 << bits, dtype=np.uint64), np.zeros(1 << bits), np.uint64((1 << bits) - 1))


@jit_inline
def _log2_memo(s, tag, val, mask):
    """``np.log2(s)`` of a CRF ``s`` (at least 1), from a direct-mapped memo of earlier results: the entry at a hash
    of ``s``'s bits holds ``s``'s bits (``tag``; 0, the bits of 0.0, no CRF's: empty) and its ``log2`` (``val``); a CRF
    not held is computed by libm and takes the entry. ``mask``: the entries less one (a power of two)."""
    sb = f2u(s)
    h = _U((sb ^ (sb >> np.uint64(23)) ^ (sb >> np.uint64(41))) & mask)
    if tag[h] == sb:
        return val[h]
    x = np.log2(s)
    tag[h] = sb
    val[h] = x
    return x


@jit_loop
def _replay_lrfu_window(offsets, expert, ev_layer, n_experts, n_layers, cap, tie_pos, lam, win, count_from, hits,
                        misses, hit_flag, P, size, S, PL, K, res, nxt, prv, head, tail, low_k, low_t, low_b, tree,
                        lunits, mtag, mval, mmask):
    """The loop of :func:`replay_lrfu_window`. Per block: its CRF ``S``, layer unit of the last access ``PL`` (-1:
    none), key ``K``, whether resident, and its links in its layer's list (``nxt`` towards the newest); per layer its
    list's ends, its lowest key, that block's tie position and the block (-1: an empty layer); ``tree[1]`` the layer
    of the lowest key of all (leaves ``size + l``); ``mtag`` / ``mval`` / ``mmask`` the memo of ``log2`` by CRF
    (:func:`_log2_memo`)."""
    record = hit_flag.shape[0] > 0
    n_res = 0
    for i in range(ev_layer.shape[0]):
        layer = np.int64(ev_layer[i])
        base = layer * n_experts
        counted = i >= count_from
        for a in range(offsets[i], offsets[i + 1]):
            b = _U(base + expert[_U(a)])
            u = lunits[layer]
            lunits[layer] = u + 1
            s = 1.0 + S[b] * _lrfu_decay(P, lam, u - PL[b])     # a first access: S 0, its CRF 1
            S[b] = s
            old = PL[b]
            PL[b] = u
            k = _log2_memo(s, mtag, mval, mmask) + lam * float(u)     # crf_key(s, float(u), lam), bit for bit
            K[b] = k
            if res[b]:                     # a hit: to the tail; the layer's lowest again if it was in the window
                if counted:
                    hits[layer] += 1
                if record:
                    hit_flag[_U(a)] = 1
                front = PL[_U(head[layer])] if head[layer] != np.int64(b) else old
                _unlink(b, layer, head, tail, nxt, prv)
                _append(b, layer, head, tail, nxt, prv)
                if old < front + win:
                    _lowest(layer, head, nxt, PL, K, tie_pos, win, low_k, low_t, low_b)
                    _update(tree, size, layer, low_k, low_t)
                continue
            if counted:
                misses[layer] += 1
            t = tie_pos[b]
            if n_res >= cap:               # the lowest of the pool and the miss leaves
                m = tree[1]
                if cap == 0 or k < low_k[_U(m)] or (k == low_k[_U(m)] and t < low_t[_U(m)]):
                    continue               # the miss is the lowest: bypassed
                out = _U(low_b[_U(m)])
                res[out] = False
                _unlink(out, m, head, tail, nxt, prv)
                _lowest(m, head, nxt, PL, K, tie_pos, win, low_k, low_t, low_b)
                _update(tree, size, m, low_k, low_t)
                n_res -= 1
            res[b] = True
            n_res += 1
            _append(b, layer, head, tail, nxt, prv)
            if u < PL[_U(head[layer])] + win:      # the new tail is in its layer's window (a short list)
                _lowest(layer, head, nxt, PL, K, tie_pos, win, low_k, low_t, low_b)
                _update(tree, size, layer, low_k, low_t)


@jit_inline
def _lowest(layer, head, nxt, PL, K, tie_pos, win, low_k, low_t, low_b):
    """The lowest ``(key, tie position)`` of the layer's residents accessed within ``win`` units of its oldest."""
    node = head[layer]
    best_k = np.inf
    best_t = np.int64(1) << 62
    best_b = np.int64(-1)
    if node >= 0:
        stop = PL[_U(node)] + win
        while node >= 0 and PL[_U(node)] < stop:
            kk = K[_U(node)]
            tt = tie_pos[_U(node)]
            if kk < best_k or (kk == best_k and tt < best_t):
                best_k = kk
                best_t = tt
                best_b = node
            node = nxt[_U(node)]
    low_k[layer] = best_k
    low_t[layer] = best_t
    low_b[layer] = best_b


@jit_inline
def _update(tree, size, layer, low_k, low_t):
    """The tournament tree's path from ``layer``'s leaf to the root, after its lowest changed."""
    q = (size + layer) >> 1
    while q >= 1:
        x = tree[_U(2 * q)]
        y = tree[_U(2 * q + 1)]
        kx = low_k[_U(x)]
        ky = low_k[_U(y)]
        left = (kx < ky) | ((kx == ky) & (low_t[_U(x)] <= low_t[_U(y)]))     # no branch (bitwise, not and / or)
        tree[_U(q)] = x if left else y
        q >>= 1
