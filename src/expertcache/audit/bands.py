"""Prefix-aligned decay (§5.4, B7): per-step expert union of homogeneous cohorts against a mixture, by band.

A *cohort* is ``B`` requests that start decoding together, so their decode
indices are aligned (the position-locked worst case of §5.2, which is what
exposes a shared generated prefix). Its per-step union at decode index ``t``
and layer ``l`` is ``|U_r E_r(t, l)|`` over the members still decoding. The
*union ratio* of a set of cohorts in a band is
``sum(union) / sum(active * k)`` over the band's ``(t, l)`` (1 when no two
members share an expert, ``1/active`` when all share all). For a category:

    reduction(band) = 1 - ratio(homogeneous cohorts of the category) / ratio(mixture cohorts)

where the mixture takes the categories' requests round-robin. Cohorts are
consecutive chunks of each (seeded) request order; a final partial chunk is
dropped so every cohort has the same size ``min(B, smallest category)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import _kernels as K
from .view import Band, DecodeView

__all__ = ["round_robin", "union_ratio_by_band", "band_reductions"]


def round_robin(orders: Sequence[np.ndarray]) -> np.ndarray:
    """Interleave request orders: first of each, then second of each, ... (shorter ones run out).

    >>> round_robin([np.array([1, 2, 3]), np.array([7])]).tolist()
    [1, 7, 2, 3]
    """
    out = []
    for i in range(max((len(o) for o in orders), default=0)):
        out.extend(int(o[i]) for o in orders if i < len(o))
    return np.array(out, dtype=np.int64)


def _chunks(order: np.ndarray, size: int) -> list[np.ndarray]:
    n = (len(order) // size) * size
    return [order[i:i + size] for i in range(0, n, size)]


def union_ratio_by_band(view: DecodeView, cohorts: list[np.ndarray], bands: Sequence[Band]) -> np.ndarray:
    """``float64[n_bands]`` union ratio of ``cohorts`` per band (NaN where no member is active)."""
    t_max = view.t_max
    if not cohorts:
        return np.full(len(bands), np.nan)
    members = np.concatenate(cohorts).astype(np.int64)
    offsets = np.r_[0, np.cumsum([len(c) for c in cohorts])].astype(np.int64)
    union = np.zeros((len(cohorts), t_max), dtype=np.int64)
    active = np.zeros((len(cohorts), t_max), dtype=np.int64)
    K.cohort_union(view.experts, view.first, view.length, members, offsets, view.n_experts, t_max, union, active)
    L, k = view.experts.shape[1], view.experts.shape[2]
    u_t, a_t = union.sum(axis=0), active.sum(axis=0) * L * k
    out = np.full(len(bands), np.nan)
    for i, b in enumerate(bands):
        m = b.mask(t_max)
        if a_t[m].sum() > 0:
            out[i] = u_t[m].sum() / a_t[m].sum()
    return out


def band_reductions(view: DecodeView, orders: Sequence[np.ndarray], cohort_size: int,
                    bands: Sequence[Band]) -> tuple[np.ndarray, np.ndarray, int]:
    """Per category and band, the union reduction of homogeneous cohorts against the round-robin mixture.

    Parameters
    ----------
    orders
        One request order per category (request indices).
    cohort_size
        ``B``; the cohorts use ``min(B, smallest category)``.

    Returns
    -------
    reduction
        ``float64[n_categories, n_bands]`` (NaN where unmeasurable, e.g. cohorts of one).
    mixture_ratio
        ``float64[n_bands]``.
    size
        The cohort size used.
    """
    size = int(min([cohort_size] + [len(o) for o in orders]))
    red = np.full((len(orders), len(bands)), np.nan)
    if size < 2:
        return red, np.full(len(bands), np.nan), size
    mix = union_ratio_by_band(view, _chunks(round_robin(orders), size), bands)
    for c, order in enumerate(orders):
        homo = union_ratio_by_band(view, _chunks(np.asarray(order, dtype=np.int64), size), bands)
        with np.errstate(invalid="ignore", divide="ignore"):
            red[c] = 1.0 - homo / mix
    return red, mix, size
