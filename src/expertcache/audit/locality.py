"""Workload locality measured honestly (§5.1, §5.7, Tables 4 and 8).

The effect of a category is the reduction in effective miss fraction ``m``
(``ReplayResult.miss_fraction``, §2.4) of a homogeneous single-category stream
relative to a mixed stream, both replayed by the real engine
(:func:`expertcache.events.build_events` then :func:`expertcache.replay.replay`).
Two corrections of §5.7 are built in:

- **Size-matched reference.** The mixed reference is rebuilt as
  ``n_reference_draws`` draws of exactly ``per_draw`` requests, the size of
  each homogeneous stream, so that fewer distinct requests cannot pass for
  locality. Each draw is stratified: ``per_draw // K`` requests of each of
  the ``K`` categories, and one more from ``per_draw % K`` categories picked at
  random. The draw-to-draw spread (sample s.d.) is reported.
- **Replicated homogeneous draws.** Each category gets ``n_category_draws``
  disjoint draws of ``per_draw`` requests (so it needs
  ``n_category_draws * per_draw`` requests).

``improvement = 1 - mean(m_category) / mean(m_reference)``; its interval
propagates ±1 s.d. of the reference (Table 8's column; not a population
confidence interval). The verdict (:func:`compare_draws`) is a two-sample
Student t test of the category's draws against the reference draws with a
pooled variance, ``df = n_reference + n_category - 2`` (a single category
draw takes its spread from the reference): ``"separated"`` when the
two-sided p-value is below ``alpha`` and the category's mean miss fraction is
lower, ``"below reference"`` when it is below ``alpha`` and higher, else
``"not distinguishable from zero"`` at this sample size. Its error rate under
the null (homogeneous draws behave like mixed draws of the same size) is
``alpha`` whatever the number of draws, which a fixed threshold on a ratio
of sample spreads is not: ``(mean_ref - mean_cat) / sqrt(sd_ref² + sd_cat²) >= 2``
called a null category "separated" 0.8% of the time with 7 and 2 draws and
17% with 2 and 1. It is a test over draws of this trace's requests, not a
population confidence statement. A homogeneous draw is streamed in input
order; a reference draw interleaves its categories (one request of each in
turn, in a seeded order), so it is mixed throughout however the trace's
requests are ordered (a probe set lists its categories in blocks, and a draw
streamed in input order would run part-homogeneous at each end).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..events import ArrivalOffsets, build_events
from ..trace import RoutingTrace, select_requests
from ..trace.labels import request_categories
from .bands import round_robin

__all__ = ["LocalityConfig", "CategoryLocality", "LocalityResult", "workload_locality", "stream_miss", "VERDICTS",
           "DrawComparison", "compare_draws", "student_t_sf"]

VERDICTS = ("separated", "not distinguishable from zero", "below reference")


@dataclass(frozen=True)
class LocalityConfig:
    """Parameters of :func:`workload_locality`.

    Attributes
    ----------
    batch, offsets
        Concurrency ``B`` and arrival offsets of every stream (FCFS continuous batching).
    policy, rho, scope, tie_break
        The replay configuration (:class:`expertcache.replay.ReplayConfig`).
    per_draw
        Requests per draw; ``None``: ``min(12, smallest category // n_category_draws)``.
    n_reference_draws, n_category_draws
        Size-matched mixed draws (§5.7 used 7) and disjoint draws per category (2).
    alpha
        Two-sided level of the verdict's t test (:func:`compare_draws`).
    seed
        Seed of every draw and of the replay's tie ranks.
    """

    batch: int = 8
    offsets: ArrivalOffsets = field(default_factory=ArrivalOffsets)
    policy: str = "lru"
    rho: float = 0.4
    scope: str = "per-layer"
    tie_break: str = "random"
    per_draw: int | None = None
    n_reference_draws: int = 7
    n_category_draws: int = 2
    alpha: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        from ..replay import ReplayConfig

        ReplayConfig(self.policy, rho=self.rho, scope=self.scope, tie_break=self.tie_break, seed=self.seed)
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValidationError(f"batch must be a positive integer; got {self.batch!r}", field="batch")
        if self.per_draw is not None and (not isinstance(self.per_draw, int) or self.per_draw < 1):
            raise ValidationError(f"per_draw must be a positive integer; got {self.per_draw!r}", field="per_draw")
        if not isinstance(self.n_reference_draws, int) or self.n_reference_draws < 2:
            raise ValidationError(f"n_reference_draws must be >= 2 (a spread needs two); got "
                                  f"{self.n_reference_draws!r}", field="n_reference_draws")
        if not isinstance(self.n_category_draws, int) or self.n_category_draws < 1:
            raise ValidationError(f"n_category_draws must be >= 1; got {self.n_category_draws!r}",
                                  field="n_category_draws")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 < self.alpha < 1:
            raise ValidationError(f"alpha must be in (0, 1); got {self.alpha!r}", field="alpha")

    def replay_config(self):
        from ..replay import ReplayConfig

        return ReplayConfig(self.policy, rho=self.rho, scope=self.scope, tie_break=self.tie_break, seed=self.seed)


@dataclass(frozen=True)
class CategoryLocality:
    """One category against the size-matched reference (a Table 8 row)."""

    category: str
    n_requests: int
    miss_fractions: tuple[float, ...]
    miss_mean: float
    improvement: float
    interval_low: float
    interval_high: float
    t: float
    df: int
    p_value: float
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LocalityResult:
    """Reference draws and every category's rows."""

    per_draw: int
    reference_miss_fractions: tuple[float, ...]
    reference_mean: float
    reference_sd: float
    categories: tuple[CategoryLocality, ...]
    config: dict[str, Any]

    @property
    def separated(self) -> tuple[str, ...]:
        return tuple(c.category for c in self.categories if c.verdict == "separated")

    @property
    def indistinguishable(self) -> tuple[str, ...]:
        return tuple(c.category for c in self.categories if c.verdict == "not distinguishable from zero")

    def statement(self) -> str:
        """The sentence §5.7 asks for: which categories are separated and which are not distinguishable."""
        sep = ", ".join(self.separated) or "none"
        ind = ", ".join(self.indistinguishable) or "none"
        below = ", ".join(c.category for c in self.categories if c.verdict == "below reference")
        text = (f"separated from the size-matched reference ({self.per_draw} requests per draw): {sep}; "
                f"not distinguishable from zero at this sample size: {ind}")
        return text + (f"; below the reference: {below}" if below else "")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["categories"] = [c.to_dict() for c in self.categories]
        d["separated"] = list(self.separated)
        d["indistinguishable"] = list(self.indistinguishable)
        d["statement"] = self.statement()
        return d


def _improvement(m: float, reference: float) -> float:
    return 1.0 - m / reference if reference > 0 else float("nan")


@dataclass(frozen=True)
class DrawComparison:
    """Pooled two-sample t test of category draws against reference draws (``t > 0``: category lower)."""

    t: float
    df: int
    p_value: float
    verdict: str


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_sf(t: float, df: int) -> float:
    """``P(T >= t)`` for Student's t with ``df`` degrees of freedom.

    >>> round(student_t_sf(2.0, 7), 6), student_t_sf(0.0, 3)
    (0.04281, 0.5)
    """
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t > 0 else 1.0 - tail


def compare_draws(reference: list[float] | tuple[float, ...], category: list[float] | tuple[float, ...],
                  alpha: float = 0.05) -> DrawComparison:
    """The locality verdict: pooled-variance two-sample t test, two-sided at ``alpha``.

    ``t = (mean(ref) - mean(cat)) / (s_p * sqrt(1/n_ref + 1/n_cat))`` with
    ``s_p² = ((n_ref - 1) s_ref² + (n_cat - 1) s_cat²) / df`` and
    ``df = n_ref + n_cat - 2`` (needs ``n_ref >= 2``). Exact when the draws
    are normal with a common spread, which is the null: a homogeneous stream
    behaves like a size-matched mixed one.
    """
    ref, cat = np.asarray(reference, dtype=np.float64), np.asarray(category, dtype=np.float64)
    nr, nc = ref.size, cat.size
    if nr < 2 or nc < 1:
        raise ValidationError(f"the verdict needs >= 2 reference draws and >= 1 category draw; got {nr} and {nc}")
    df = nr + nc - 2
    ss = float(((ref - ref.mean()) ** 2).sum() + ((cat - cat.mean()) ** 2).sum())
    diff = float(ref.mean() - cat.mean())
    se = math.sqrt(ss / df) * math.sqrt(1.0 / nr + 1.0 / nc)
    scale = max(abs(float(ref.mean())), abs(float(cat.mean())), 1e-300)
    if se <= 1e-12 * scale:
        t = 0.0 if abs(diff) <= 1e-12 * scale else math.copysign(math.inf, diff)
    else:
        t = diff / se
    p = min(1.0, 2.0 * student_t_sf(abs(t), df))
    verdict = VERDICTS[1] if p >= alpha else VERDICTS[0] if t > 0 else VERDICTS[2]
    return DrawComparison(float(t), int(df), float(p), verdict)


def stream_miss(trace: RoutingTrace, requests: np.ndarray, config: LocalityConfig, note: str) -> float:
    """Effective miss fraction of the stream of ``requests`` (arriving in the given order) under ``config``."""
    from ..replay import replay

    sub = select_requests(trace, requests, note=note)
    return replay(build_events(sub, config.batch, config.offsets), config.replay_config()).miss_fraction


def workload_locality(trace: RoutingTrace, labels: dict[str, str] | str | os.PathLike[str] | None = None,
                      config: LocalityConfig = LocalityConfig(), exclude: np.ndarray | None = None,
                      progress: Callable[[int, int], None] | None = None) -> LocalityResult:
    """Homogeneous-stream miss fractions against a size-matched mixed reference (§5.7, Table 8).

    Parameters
    ----------
    labels
        Category per request (mapping, labels file, or ``None`` for the trace's own).
    exclude
        ``bool[n_requests]`` left out (e.g. the fixed-template arm).
    progress
        Called with ``(done, total)`` after every replay.

    Raises
    ------
    ValidationError
        When a category has fewer than ``n_category_draws * per_draw`` requests (naming it).
    """
    codes, names = request_categories(trace, labels)
    keep = np.ones(trace.n_requests, dtype=bool) if exclude is None else ~np.asarray(exclude, dtype=bool)
    members = {c: np.flatnonzero(keep & (codes == i)) for i, c in enumerate(names)}
    members = {c: m for c, m in members.items() if m.size}
    if len(members) < 2:
        raise ValidationError(f"workload locality needs at least two categories (a mixed reference needs a mix); "
                              f"got {len(members)}: label the requests with categories, or skip it (--no-locality)")
    nd = config.n_category_draws
    per = config.per_draw if config.per_draw is not None else min(12, min(m.size for m in members.values()) // nd)
    need = nd * max(per, 1)
    short = {c: need - m.size for c, m in members.items() if m.size < need}
    if short:
        detail = ", ".join(f"{c!r} has {members[c].size} ({n} missing)" for c, n in short.items())
        fix = "lower per_draw (--per-draw), " if per > 1 else ""
        raise ValidationError(f"each category needs {nd} disjoint draws of {max(per, 1)} requests: {detail}; "
                              f"{fix}label more requests, or skip locality (--no-locality)")
    rng = np.random.default_rng(config.seed)
    cats = list(members)
    total = config.n_reference_draws + nd * len(cats)
    done = 0
    ref = []
    for d in range(config.n_reference_draws):
        alloc = np.full(len(cats), per // len(cats))
        alloc[rng.permutation(len(cats))[: per % len(cats)]] += 1
        picks = [rng.choice(members[c], size=min(int(a), members[c].size), replace=False)
                 for c, a in zip(cats, alloc, strict=True)]
        draw = round_robin([picks[int(i)] for i in rng.permutation(len(cats))])
        ref.append(stream_miss(trace, draw, config, f"locality reference draw {d}"))
        done += 1
        if progress:
            progress(done, total)
    ref_mean = float(np.mean(ref))
    ref_sd = float(np.std(ref, ddof=1))
    rows = []
    for c in cats:
        order = members[c][rng.permutation(members[c].size)]
        ms = []
        for d in range(nd):
            ms.append(stream_miss(trace, np.sort(order[d * per:(d + 1) * per]), config, f"locality {c} draw {d}"))
            done += 1
            if progress:
                progress(done, total)
        mean = float(np.mean(ms))
        cmp = compare_draws(ref, ms, config.alpha)
        rows.append(CategoryLocality(c, int(members[c].size), tuple(ms), mean, _improvement(mean, ref_mean),
                                     _improvement(mean, ref_mean - ref_sd), _improvement(mean, ref_mean + ref_sd),
                                     cmp.t, cmp.df, cmp.p_value, cmp.verdict))
    cfg = asdict(config)
    cfg["offsets"] = config.offsets.describe()
    return LocalityResult(per, tuple(ref), ref_mean, ref_sd, tuple(rows), cfg)
