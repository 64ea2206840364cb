"""Prefix-aligned decay (§5.4, B7): per-step expert union of homogeneous cohorts against a mixture, by band.

A *cohort* is ``B`` requests that start decoding together, so their decode
indices are aligned (the position-locked worst case of §5.2, which is what
exposes a shared generated prefix). Its per-step union at decode index ``t``
and layer ``l`` is ``|U_r E_r(t, l)|`` over the members still decoding
(``a`` of them, the step's *active count*). The *union ratio* of a set of
cohorts in a band is ``sum(union) / sum(a * k)`` over the band's ``(t, l)``
(1 when no two members share an expert, ``1/a`` when all share all).

The union of ``a`` sets grows less than linearly in ``a``, so a ratio taken
over steps with fewer active members is higher whatever the routing: with
natural EOS, a category whose responses are long keeps more members active in
late bands than a mixture of long and short ones, and would show a "reduction"
made of response lengths alone. The reduction therefore compares the
homogeneous cohorts with the mixture *at equal active count* (indirect
standardisation): over the band's steps with ``a >= 2`` active members,

    reduction(band) = 1 - sum_a U_h(a) / sum_a S_h(a) * U_m(a) / S_m(a)

where ``U_x(a)`` is the summed union and ``S_x(a)`` the number of steps with
``a`` active members of the homogeneous (``h``) or mixture (``m``) cohorts,
and only counts ``a`` that both have enter. Steps with one active member carry
no sharing and are left out. When every member is active at every step (equal
lengths) this is exactly ``1 - ratio(homogeneous) / ratio(mixture)``.

The mixture takes the categories' requests round-robin. Cohorts are
consecutive chunks of each (seeded) request order; a final partial chunk is
dropped so every cohort has the same size ``min(B, smallest category)``,
where categories of a single request (no cohort possible) do not count; they
join the mixture and get no reduction of their own.
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


def _union_by_active(view: DecodeView, cohorts: list[np.ndarray], bands: Sequence[Band]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``int64[n_bands, B + 1]`` summed union and step count (steps x layers) by active count, per band."""
    t_max = view.t_max
    size = max((len(c) for c in cohorts), default=0)
    union_a = np.zeros((len(bands), size + 1), dtype=np.int64)
    steps_a = np.zeros((len(bands), size + 1), dtype=np.int64)
    if not cohorts:
        return union_a, steps_a
    members = np.concatenate(cohorts).astype(np.int64)
    offsets = np.r_[0, np.cumsum([len(c) for c in cohorts])].astype(np.int64)
    union = np.zeros((len(cohorts), t_max), dtype=np.int64)
    active = np.zeros((len(cohorts), t_max), dtype=np.int64)
    K.cohort_union(view.experts, view.first, view.length, members, offsets, view.n_experts, t_max, union, active)
    L = view.experts.shape[1]
    for i, b in enumerate(bands):
        m = np.broadcast_to(b.mask(t_max), union.shape)
        union_a[i] = np.bincount(active[m], weights=union[m], minlength=size + 1).astype(np.int64)
        steps_a[i] = np.bincount(active[m], minlength=size + 1) * L
    steps_a[:, 0] = 0
    return union_a, steps_a


def union_ratio_by_band(view: DecodeView, cohorts: list[np.ndarray], bands: Sequence[Band]) -> np.ndarray:
    """``float64[n_bands]`` union ratio of ``cohorts`` per band (NaN where no member is active)."""
    return _ratio(*_union_by_active(view, cohorts, bands), view.experts.shape[2])


def _ratio(union_a: np.ndarray, steps_a: np.ndarray, k: int) -> np.ndarray:
    slots = (steps_a * np.arange(steps_a.shape[1]) * k).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(slots > 0, union_a.sum(axis=1) / np.maximum(slots, 1), np.nan)


def _standardised_reduction(homo: tuple[np.ndarray, np.ndarray], mix: tuple[np.ndarray, np.ndarray]
                            ) -> np.ndarray:
    """``1 - sum_a U_h(a) / sum_a S_h(a) U_m(a) / S_m(a)`` per band over ``a >= 2`` present in both."""
    (uh, sh), (um, sm) = homo, mix
    n = min(uh.shape[1], um.shape[1])
    uh, sh, um, sm = uh[:, :n], sh[:, :n], um[:, :n], sm[:, :n]
    both = (sh > 0) & (sm > 0)
    both[:, :2] = False
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.where(both, sh * um / np.maximum(sm, 1), 0.0).sum(axis=1)
        observed = np.where(both, uh, 0).sum(axis=1)
        return np.where(expected > 0, 1.0 - observed / np.maximum(expected, 1e-300), np.nan)


def band_reductions(view: DecodeView, orders: Sequence[np.ndarray], cohort_size: int,
                    bands: Sequence[Band]) -> tuple[np.ndarray, np.ndarray, int]:
    """Per category and band, the union reduction of homogeneous cohorts against the round-robin mixture.

    The comparison is made at equal active count (module docstring).

    Parameters
    ----------
    orders
        One request order per category (request indices).
    cohort_size
        ``B``; the cohorts use ``min(B, smallest category of two or more requests)``.

    Returns
    -------
    reduction
        ``float64[n_categories, n_bands]`` (NaN where unmeasurable, e.g. cohorts of one, or no
        active count with two or more members shared by both sides).
    mixture_ratio
        ``float64[n_bands]`` (the plain union ratio of the mixture cohorts).
    size
        The cohort size used.
    """
    size = int(min([cohort_size] + [len(o) for o in orders if len(o) >= 2]))
    red = np.full((len(orders), len(bands)), np.nan)
    if size < 2:
        return red, np.full(len(bands), np.nan), size
    mix = _union_by_active(view, _chunks(round_robin(orders), size), bands)
    for c, order in enumerate(orders):
        homo = _union_by_active(view, _chunks(np.asarray(order, dtype=np.int64), size), bands)
        red[c] = _standardised_reduction(homo, mix)
    return red, _ratio(*mix, view.experts.shape[2]), size
