"""Route-side contamination diagnostics on a labelled trace (§5.3–§5.4, B5–B7).

Definitions (all on decode tokens, aligned by decode index ``t``; see
:mod:`expertcache.audit.view`):

- **Positional token agreement** of two requests: the fraction of
  ``t < min(len_a, len_b)`` where they emitted the same token (or, for a
  trace without token ids, took the same expert set at every layer).
- **Expert Jaccard** of two requests: the mean over those ``t`` and every
  layer of ``|E_a ∩ E_b| / |E_a ∪ E_b|`` (per-position overlap, the quantity
  that a copied prefix drives to 1).
- Per category: agreement mean and p95 over within-category pairs, unique
  generated sequences, expert Jaccard over all pairs and over pairs with
  agreement below ``low_agreement`` (5%), against the **cross-category
  baseline** (pairs from different categories, same restriction); the
  **residual** is the restricted within-category Jaccard minus the baseline.
- **Prefix-aligned decay**: :mod:`expertcache.audit.bands`.
- **Shared generated prefix**: a band is occupied by one for a category when
  the within-category agreement over the band's positions is at least
  ``prefix_agreement``.
- **Screening flag** (§5.4): a category is flagged when its union reduction in
  a prefix-occupied band exceeds its largest reduction in the other bands by at
  least ``decay_margin`` (with no other band: when it is at least
  ``decay_margin``). Treat a flagged effect as surface repetition until a
  diverse or matched control says otherwise.
- **Stable across bands**: at least two bands measured, not flagged, every
  measured band's reduction has the same sign (or all are smaller than ``decay_margin`` in size: no effect
  anywhere), and they span at most ``stable_spread``.

When there are more pairs than ``max_pairs`` (per category, and across
categories) a seeded uniform sample of pairs is used and reported.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..trace import RoutingTrace
from ..trace.labels import request_categories
from . import _kernels as K
from .bands import band_reductions
from .view import DEFAULT_BANDS, Band, DecodeView, decode_view

__all__ = ["RouteAuditConfig", "CategoryRoutes", "RouteAudit", "route_audit", "PairStats", "pair_stats"]


@dataclass(frozen=True)
class RouteAuditConfig:
    """Parameters of :func:`route_audit`.

    Attributes
    ----------
    bands
        Decode-index bands of the decay measurement.
    cohort_size
        ``B`` of the position-aligned cohorts (§5.4 used 16).
    low_agreement
        Pairs below this positional agreement count as low-text-overlap (§5.3: 5%).
    prefix_agreement
        Within-category agreement over a band at or above which the band is occupied by a shared prefix.
    decay_margin
        How much larger the prefix-band reduction must be than elsewhere to flag.
    stable_spread
        Largest spread of band reductions still called stable.
    max_pairs
        Pair budget per category and across categories (seeded sample above it).
    seed
        Seed of the request orders and pair samples.
    """

    bands: tuple[Band, ...] = DEFAULT_BANDS
    cohort_size: int = 8
    low_agreement: float = 0.05
    prefix_agreement: float = 0.25
    decay_margin: float = 0.05
    stable_spread: float = 0.10
    max_pairs: int = 20000
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.bands or not all(isinstance(b, Band) for b in self.bands):
            raise ValidationError("bands must be a non-empty tuple of Band", field="bands")
        if isinstance(self.cohort_size, bool) or not isinstance(self.cohort_size, int) or self.cohort_size < 2:
            raise ValidationError(f"cohort_size must be an integer >= 2; got {self.cohort_size!r}",
                                  field="cohort_size")
        for name in ("low_agreement", "prefix_agreement", "decay_margin", "stable_spread"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ValidationError(f"{name} must be in [0, 1]; got {v!r}", field=name)
        if isinstance(self.max_pairs, bool) or not isinstance(self.max_pairs, int) or self.max_pairs < 1:
            raise ValidationError(f"max_pairs must be a positive integer; got {self.max_pairs!r}", field="max_pairs")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValidationError(f"seed must be a non-negative integer; got {self.seed!r}", field="seed")


@dataclass(frozen=True)
class PairStats:
    """Per-pair figures (arrays aligned with ``a``, ``b``) and per-position agreement counts per group."""

    a: np.ndarray
    b: np.ndarray
    group: np.ndarray
    n_positions: np.ndarray
    agreement: np.ndarray
    jaccard: np.ndarray
    agree_pos: np.ndarray
    count_pos: np.ndarray


def pair_stats(view: DecodeView, a: np.ndarray, b: np.ndarray, group: np.ndarray, n_groups: int) -> PairStats:
    """Agreement and expert Jaccard of each pair ``(a[i], b[i])`` (NaN where a pair shares no position)."""
    a, b, group = (np.ascontiguousarray(x, dtype=np.int64) for x in (a, b, group))
    t_max = view.t_max
    agree_pos = np.zeros((n_groups, t_max), dtype=np.int64)
    count_pos = np.zeros((n_groups, t_max), dtype=np.int64)
    n = np.zeros(a.shape[0], dtype=np.int64)
    agree = np.zeros(a.shape[0], dtype=np.int64)
    jac = np.zeros(a.shape[0], dtype=np.float64)
    masks = K.route_masks(view.experts, (view.n_experts + 63) // 64)     # set intersections by popcount
    K.pair_stats(masks, view.experts.shape[2], view.tokens, view.use_tokens, view.first, view.length, a, b, group,
                 agree_pos, count_pos, n, agree, jac)
    L = view.experts.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        agreement = np.where(n > 0, agree / np.maximum(n, 1), np.nan)
        jaccard = np.where(n > 0, jac / np.maximum(n * L, 1), np.nan)
    return PairStats(a, b, group, n, agreement, jaccard, agree_pos, count_pos)


@dataclass(frozen=True)
class CategoryRoutes:
    """B5–B7 figures of one category (agreements and Jaccards are fractions; ``None`` when unmeasurable)."""

    category: str
    n_requests: int
    unique_sequences: int
    n_pairs: int
    n_low_pairs: int
    agreement_mean: float | None
    agreement_p95: float | None
    jaccard_all: float | None
    jaccard_low: float | None
    residual: float | None
    band_agreement: tuple[float | None, ...]
    band_reduction: tuple[float | None, ...]
    prefix_bands: tuple[str, ...]
    flagged: bool
    stable: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RouteAudit:
    """Route-side audit of one trace.

    ``overall_*`` pool every compared pair (within and across categories):
    the label-free view of §5.8. ``within_agreement_p95`` pools the
    within-category pairs only (the B6 figure: cross-category pairs are the
    baseline, not part of it). Every p95 is nearest-rank: the smallest value
    with at least 95% of the values at or below it. ``flag`` (the contamination screening flag,
    equal to ``shared_prefix``) is true when any category has a
    prefix-occupied band or the pooled agreement reaches ``prefix_agreement``
    in some band: a shared generated prefix is present. ``flagged_categories``
    names the categories whose union effect sits in such a band (the §5.4
    screening rule); their effect should be treated as surface repetition.
    """

    basis: str
    bands: tuple[str, ...]
    cohort_size: int
    n_requests: int
    categories: tuple[CategoryRoutes, ...]
    baseline_all: float | None
    baseline_low: float | None
    n_cross_pairs: int
    n_cross_low_pairs: int
    overall_agreement_mean: float | None
    overall_agreement_p95: float | None
    within_agreement_p95: float | None
    overall_jaccard: float | None
    overall_band_agreement: tuple[float | None, ...]
    unique_sequences: int
    shared_prefix: bool
    flag: bool
    flagged_categories: tuple[str, ...]
    mixture_ratio: tuple[float | None, ...]
    sampled: bool
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["categories"] = [c.to_dict() for c in self.categories]
        return d


def _opt(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def _pairs_within(idx: np.ndarray, max_pairs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, bool]:
    n = idx.shape[0]
    total = n * (n - 1) // 2
    if total <= max_pairs:
        i, j = np.triu_indices(n, 1)
        return idx[i], idx[j], False
    seen: set[tuple[int, int]] = set()
    while len(seen) < max_pairs:
        x = rng.integers(0, n, size=2 * max_pairs)
        y = rng.integers(0, n, size=2 * max_pairs)
        for u, v in zip(x.tolist(), y.tolist(), strict=True):
            if u != v and len(seen) < max_pairs:
                seen.add((min(u, v), max(u, v)))
    arr = np.array(sorted(seen), dtype=np.int64)
    return idx[arr[:, 0]], idx[arr[:, 1]], True


def _pairs_across(idx: np.ndarray, codes: np.ndarray, max_pairs: int, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray, bool]:
    n = idx.shape[0]
    counts = np.bincount(codes[idx])
    total = (n * n - int((counts ** 2).sum())) // 2
    if total <= max_pairs:
        i, j = np.triu_indices(n, 1)
        keep = codes[idx[i]] != codes[idx[j]]
        return idx[i[keep]], idx[j[keep]], False
    seen: set[tuple[int, int]] = set()
    while len(seen) < max_pairs:
        x = rng.integers(0, n, size=2 * max_pairs)
        y = rng.integers(0, n, size=2 * max_pairs)
        for u, v in zip(x.tolist(), y.tolist(), strict=True):
            if codes[idx[u]] != codes[idx[v]] and len(seen) < max_pairs:
                seen.add((min(u, v), max(u, v)))
    arr = np.array(sorted(seen), dtype=np.int64)
    return idx[arr[:, 0]], idx[arr[:, 1]], True


def _band_agreement(agree: np.ndarray, count: np.ndarray, bands: tuple[Band, ...], t_max: int) -> list[float | None]:
    out = []
    for b in bands:
        m = b.mask(t_max)
        c = count[m].sum()
        out.append(float(agree[m].sum() / c) if c else None)
    return out


def _flag(agreement: list[float | None], reduction: list[float | None], labels: tuple[str, ...],
          cfg: RouteAuditConfig) -> tuple[tuple[str, ...], bool, bool]:
    prefix = [i for i, a in enumerate(agreement) if a is not None and a >= cfg.prefix_agreement]
    measured = [i for i, r in enumerate(reduction) if r is not None]
    in_prefix = [reduction[i] for i in prefix if reduction[i] is not None]
    elsewhere = [reduction[i] for i in measured if i not in prefix]
    flagged = False
    if in_prefix:
        top = max(in_prefix)
        flagged = (top - max(elsewhere) >= cfg.decay_margin) if elsewhere else top >= cfg.decay_margin
    vals = [reduction[i] for i in measured]
    same_sign = all(v > 0 for v in vals) or all(v < 0 for v in vals) or all(abs(v) < cfg.decay_margin for v in vals)
    stable = len(vals) >= 2 and not flagged and same_sign and max(vals) - min(vals) <= cfg.stable_spread
    return tuple(labels[i] for i in prefix), flagged, stable


def route_audit(trace: RoutingTrace, labels: dict[str, str] | str | os.PathLike[str] | None = None,
                config: RouteAuditConfig = RouteAuditConfig(), exclude: np.ndarray | None = None) -> RouteAudit:
    """Route-side diagnostics of ``trace`` per category (§5.3–§5.4, B5–B7).

    Parameters
    ----------
    labels
        Category per request: a mapping, a labels file, or ``None`` for the
        trace's own ``provenance["categories"]``.
    exclude
        ``bool[n_requests]``: requests left out (e.g. the fixed-template arm of a matched-pair probe set).
    """
    codes, names = request_categories(trace, labels)
    view = decode_view(trace)
    keep = view.length > 0
    if exclude is not None:
        keep &= ~np.asarray(exclude, dtype=bool)
    idx_all = np.flatnonzero(keep)
    if idx_all.shape[0] < 2:
        raise ValidationError("the route audit needs at least two requests with decode tokens")
    rng = np.random.default_rng(config.seed)
    K_ = len(names)
    members = [idx_all[codes[idx_all] == c] for c in range(K_)]
    orders = [m[rng.permutation(m.shape[0])] for m in members]
    pa, pb, pg = [], [], []
    sampled = False
    for c in range(K_):
        a, b, s = _pairs_within(members[c], config.max_pairs, rng)
        pa.append(a)
        pb.append(b)
        pg.append(np.full(a.shape[0], c, dtype=np.int64))
        sampled |= s
    a, b, s = _pairs_across(idx_all, codes, config.max_pairs, rng)
    pa.append(a)
    pb.append(b)
    pg.append(np.full(a.shape[0], K_, dtype=np.int64))
    sampled |= s
    ps = pair_stats(view, np.concatenate(pa), np.concatenate(pb), np.concatenate(pg), K_ + 1)
    ok = np.isfinite(ps.agreement)
    low = ok & (ps.agreement < config.low_agreement)
    t_max = view.t_max
    present = [i for i in range(K_) if members[i].shape[0] > 0]
    red, mix, size = band_reductions(view, [orders[i] for i in present], config.cohort_size, config.bands)
    labels_b = tuple(b.label for b in config.bands)
    cats = []
    for j, c in enumerate(present):
        sel = ok & (ps.group == c)
        lo = low & (ps.group == c)
        cross_lo = low & (ps.group == K_)
        ag = _band_agreement(ps.agree_pos[c], ps.count_pos[c], config.bands, t_max)
        rd = [_opt(x) for x in red[j]]
        prefix, flagged, stable = _flag(ag, rd, labels_b, config)
        j_low = _opt(ps.jaccard[lo].mean()) if lo.any() else None
        base_low = _opt(ps.jaccard[cross_lo].mean()) if cross_lo.any() else None
        cats.append(CategoryRoutes(
            category=names[c], n_requests=int(members[c].shape[0]),
            unique_sequences=len({view.sequence_key(int(r)) for r in members[c]}),
            n_pairs=int(sel.sum()), n_low_pairs=int(lo.sum()),
            agreement_mean=_opt(ps.agreement[sel].mean()) if sel.any() else None,
            agreement_p95=_opt(np.percentile(ps.agreement[sel], 95, method="inverted_cdf")) if sel.any() else None,
            jaccard_all=_opt(ps.jaccard[sel].mean()) if sel.any() else None,
            jaccard_low=j_low, residual=None if j_low is None or base_low is None else j_low - base_low,
            band_agreement=tuple(ag), band_reduction=tuple(rd), prefix_bands=prefix, flagged=flagged,
            stable=stable))
    cross = ok & (ps.group == K_)
    cross_low = low & (ps.group == K_)
    within = ok & (ps.group < K_)
    overall_ag = _band_agreement(ps.agree_pos.sum(axis=0), ps.count_pos.sum(axis=0), config.bands, t_max)
    shared = any(c.prefix_bands for c in cats) or any(a is not None and a >= config.prefix_agreement
                                                     for a in overall_ag)
    flagged_names = tuple(c.category for c in cats if c.flagged)
    flag = bool(shared)
    cfg = asdict(config)
    cfg["bands"] = list(labels_b)
    return RouteAudit(
        basis=view.basis, bands=labels_b, cohort_size=size, n_requests=int(idx_all.shape[0]),
        categories=tuple(cats),
        baseline_all=_opt(ps.jaccard[cross].mean()) if cross.any() else None,
        baseline_low=_opt(ps.jaccard[cross_low].mean()) if cross_low.any() else None,
        n_cross_pairs=int(cross.sum()), n_cross_low_pairs=int(cross_low.sum()),
        overall_agreement_mean=_opt(ps.agreement[ok].mean()) if ok.any() else None,
        overall_agreement_p95=_opt(np.percentile(ps.agreement[ok], 95, method="inverted_cdf")) if ok.any() else None,
        within_agreement_p95=(_opt(np.percentile(ps.agreement[within], 95, method="inverted_cdf"))
                              if within.any() else None),
        overall_jaccard=_opt(ps.jaccard[ok].mean()) if ok.any() else None,
        overall_band_agreement=tuple(overall_ag),
        unique_sequences=len({view.sequence_key(int(r)) for r in idx_all}),
        shared_prefix=bool(shared), flag=flag, flagged_categories=flagged_names,
        mixture_ratio=tuple(_opt(x) for x in mix), sampled=sampled, config=cfg)
