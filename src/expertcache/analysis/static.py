"""Static residency from the access histogram alone (§9.2).

A static pinned set never evicts, so its demand misses are the union accesses
to non-pinned blocks: with the top-``c_l`` experts of each layer pinned, the
miss ratio over union accesses is ``1 - (share captured by the top c_l)``. No
access order is needed — unlike every dynamic policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..events import EventStream
from ..replay._kernels import block_counts

__all__ = ["access_histogram", "static_misses_from_histogram", "access_share_table"]


def access_histogram(stream: EventStream) -> np.ndarray:
    """``int64[L, N]``: union accesses per (layer, expert)."""
    counts = block_counts(stream.offsets, stream.expert, stream.layer, stream.n_experts, stream.n_layers)
    return counts.reshape(stream.n_layers, stream.n_experts)


def static_misses_from_histogram(hist: np.ndarray, capacity: Sequence[int]) -> np.ndarray:
    """Per-layer demand misses of a static set pinned to each layer's top-``c_l`` experts.

    Parameters
    ----------
    hist
        ``[L, N]`` union-access counts (:func:`access_histogram`).
    capacity
        Per-layer quotas ``c_l``.
    """
    srt = -np.sort(-hist, axis=1)
    out = np.empty(hist.shape[0], dtype=np.int64)
    for l, c in enumerate(capacity):
        out[l] = int(hist[l].sum() - srt[l, : min(int(c), hist.shape[1])].sum())
    return out


def access_share_table(hist: np.ndarray, fractions: Sequence[float] = (0.1, 0.2, 0.3, 0.4)) -> list[dict]:
    """Share of union accesses captured by the top fraction of blocks (§9.2's table), per layer then summed.

    For each fraction ``f`` every layer contributes its top ``c_l`` experts under
    the per-layer quota rule at ``rho = f`` (so the share at ``f`` is exactly
    ``1 -`` the static-same-trace union miss ratio at ``rho = f``).
    """
    from ..replay import capacities_for_rho

    total = int(hist.sum())
    L, N = hist.shape
    rows = []
    for f in fractions:
        missed = int(static_misses_from_histogram(hist, capacities_for_rho(f, L, N)).sum())
        rows.append({"fraction_of_blocks": float(f),
                     "share_of_accesses": (total - missed) / total if total else 0.0})
    return rows
