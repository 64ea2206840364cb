"""Matched-pair attribution (§5.5, B8): the fixed-template arm minus the diverse arm, same source records.

A probe set built with a control arm (``expertcache probe build``) renders a
subset of its source records twice: ``arm = "diverse"`` and ``arm = "fixed"``
(one fixed template), paired by ``source_id``. Its ``labels.csv`` carries
``request_id,category,arm,source_id``. For each category, the matched
sources (both renderings present in the trace) are put in one seeded order;
the union reduction by band (:mod:`expertcache.audit.bands`) is measured on
the fixed renderings and on the diverse renderings of the same sources in the
same cohort order, each against the round-robin mixture of its own arm, and

    attributable(band) = reduction_fixed(band) - reduction_diverse(band).

The contrast is causal for the rendering policy, not for a pure template-echo
component: changing the wrapper also changes the continuation and its length.
Given a replay configuration, the end-to-end effective miss fraction of each
arm's stream (all matched requests) is reported next to it: §5.5 found the
fixed arm *higher* over the full trace while its early-band union reduction
was larger, so template echo cannot be read off the end-to-end difference.
"""

from __future__ import annotations

import csv
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..jsonl import iter_records
from ..trace import RoutingTrace
from ..trace.labels import request_categories
from .bands import band_reductions, round_robin
from .locality import LocalityConfig, stream_miss
from .routes import RouteAuditConfig
from .view import decode_view

__all__ = ["Arms", "read_arms", "MatchedRow", "MatchedAttribution", "matched_attribution", "FIXED", "DIVERSE"]

FIXED, DIVERSE = "fixed", "diverse"


@dataclass(frozen=True)
class Arms:
    """Arm and source record of each request id (from a labels file with ``arm`` and ``source_id``)."""

    arm: dict[str, str]
    source: dict[str, str]

    def fixed_mask(self, trace: RoutingTrace) -> np.ndarray:
        """``bool[n_requests]``: requests of the fixed-template arm."""
        return np.array([self.arm.get(r) == FIXED for r in trace.request_ids], dtype=bool)


def read_arms(path: str | os.PathLike[str]) -> Arms | None:
    """Read ``arm`` and ``source_id`` from a labels file; ``None`` when it has no ``arm`` field."""
    p = Path(path)
    src = str(p)
    rows: list[tuple[int, dict[str, Any]]]
    if p.suffix.lower() == ".csv":
        with open(p, encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or "arm" not in reader.fieldnames:
                return None
            rows = list(enumerate(reader, start=2))
    else:
        rows = list(iter_records(p))
        if not any("arm" in r for _, r in rows):
            return None
    arm: dict[str, str] = {}
    source: dict[str, str] = {}
    for rec_no, r in rows:
        a, s = r.get("arm"), r.get("source_id")
        if a not in (FIXED, DIVERSE):
            raise ValidationError(f"expected arm 'diverse' or 'fixed'; got {a!r}", source=src, record=rec_no,
                                  field="arm")
        if s is None or str(s) == "":
            raise ValidationError("a labels file with arms needs a source_id on every row", source=src,
                                  record=rec_no, field="source_id")
        arm[str(r.get("request_id"))] = a
        source[str(r.get("request_id"))] = str(s)
    return Arms(arm, source)


@dataclass(frozen=True)
class MatchedRow:
    """One category: reductions per band under each arm and their difference (Table 7 / Figure 2)."""

    category: str
    n_matched: int
    reduction_fixed: tuple[float | None, ...]
    reduction_diverse: tuple[float | None, ...]
    attributable: tuple[float | None, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MatchedAttribution:
    """Matched-pair attribution per category and band."""

    bands: tuple[str, ...]
    cohort_size: int
    rows: tuple[MatchedRow, ...]
    miss_fraction_fixed: float | None = None
    miss_fraction_diverse: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"bands": list(self.bands), "cohort_size": self.cohort_size,
                "rows": [r.to_dict() for r in self.rows], "miss_fraction_fixed": self.miss_fraction_fixed,
                "miss_fraction_diverse": self.miss_fraction_diverse}


def _opt(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def matched_attribution(trace: RoutingTrace, labels: dict[str, str] | str | os.PathLike[str] | None, arms: Arms,
                        config: RouteAuditConfig | None = None, replay: LocalityConfig | None = None
                        ) -> MatchedAttribution:
    """Fixed-template arm minus diverse arm, matched on source record, per category and band (§5.5).

    ``replay`` (batch, offsets, policy, rho of a :class:`LocalityConfig`) adds
    each arm's end-to-end effective miss fraction.

    Raises
    ------
    ValidationError
        When no category has at least two matched source records in the trace.
    """
    config = config or RouteAuditConfig()
    codes, names = request_categories(trace, labels)
    view = decode_view(trace)
    index = {r: i for i, r in enumerate(trace.request_ids)}
    pairs: dict[int, dict[str, dict[str, int]]] = {}
    for rid, i in index.items():
        a = arms.arm.get(rid)
        if a is None or view.length[i] == 0:
            continue
        pairs.setdefault(int(codes[i]), {}).setdefault(arms.source[rid], {})[a] = i
    rng = np.random.default_rng(config.seed)
    used, fixed_orders, diverse_orders = [], [], []
    for c in sorted(pairs):
        matched = sorted(s for s, d in pairs[c].items() if FIXED in d and DIVERSE in d)
        if len(matched) < 2:
            continue
        order = [matched[int(i)] for i in rng.permutation(len(matched))]
        used.append(c)
        fixed_orders.append(np.array([pairs[c][s][FIXED] for s in order], dtype=np.int64))
        diverse_orders.append(np.array([pairs[c][s][DIVERSE] for s in order], dtype=np.int64))
    if not used:
        raise ValidationError("no category has two or more source records rendered in both arms in this trace; "
                              "collect the probe set's fixed arm together with its diverse arm")
    rf, _, size_f = band_reductions(view, fixed_orders, config.cohort_size, config.bands)
    rd, _, size_d = band_reductions(view, diverse_orders, config.cohort_size, config.bands)
    rows = []
    for j, c in enumerate(used):
        diff = rf[j] - rd[j]
        rows.append(MatchedRow(names[c], int(fixed_orders[j].shape[0]), tuple(_opt(x) for x in rf[j]),
                               tuple(_opt(x) for x in rd[j]), tuple(_opt(x) for x in diff)))
    m_fixed = m_diverse = None
    if replay is not None:
        m_fixed = stream_miss(trace, round_robin(fixed_orders), replay, "matched pairs: fixed arm")
        m_diverse = stream_miss(trace, round_robin(diverse_orders), replay, "matched pairs: diverse arm")
    return MatchedAttribution(tuple(b.label for b in config.bands), min(size_f, size_d), tuple(rows),
                              m_fixed, m_diverse)
