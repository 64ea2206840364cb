"""Pivoting a result table: a metric by chosen condition fields (e.g. gap by B x rho).

A stored metric (``miss_fraction``, ``transferred``, ...) is read as is. The
derived metric ``gap`` is computed per group of conditions that differ only
in the policy (§7.1): ``(m_c - m_B) / m_c`` with ``m_c`` the lowest miss
fraction among the causal policies present (lru, lfu, lfru, least-stale) and
``m_B`` Belady's. Each tie seed is its own group, so a cell over seeds reports
the mean gap and its spread (max - min): implementation stability, not a
confidence interval (§7.1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from ..errors import ValidationError
from .spec import CONDITION_FIELDS

__all__ = ["Summary", "SummaryCell", "summarize", "metric_values", "gap_rows", "matches", "CAUSAL"]

#: Policies the best causal one is chosen from (§7.1).
CAUSAL = ("lru", "lfu", "lfru", "least-stale")


@dataclass(frozen=True)
class SummaryCell:
    """One pivot cell: the key values, and mean / min / max / count of the metric over its conditions."""

    key: dict[str, Any]
    mean: float | None
    min: float | None
    max: float | None
    n: int
    n_undefined: int = 0


@dataclass(frozen=True)
class Summary:
    """A pivot of ``metric`` by ``rows`` x ``cols`` over the conditions matching ``where``."""

    metric: str
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    where: dict[str, Any]
    cells: tuple[SummaryCell, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "rows": list(self.rows), "cols": list(self.cols), "where": self.where,
                "cells": [asdict(c) for c in self.cells]}


def _same(value: Any, want: Any) -> bool:
    """``value`` (from the table) equals ``want`` (from a spec or the command line, maybe a string)."""
    if isinstance(want, str) and not isinstance(value, str):
        if value is None:
            return want.lower() in ("none", "null", "")
        try:
            if isinstance(value, bool):
                return value == (want.lower() in ("true", "1", "yes"))
            return type(value)(want) == value
        except ValueError:
            return False
    if isinstance(value, float) and isinstance(want, (int, float)) and not isinstance(want, bool):
        return abs(value - float(want)) <= 1e-12
    return value == want


def matches(fields: Mapping[str, Any], where: Mapping[str, Any] | None) -> bool:
    """Whether a condition's ``fields`` satisfy every ``where`` entry (a value or a list of values)."""
    for name, want in (where or {}).items():
        if name not in fields:
            raise ValidationError(f"unknown condition field {name!r}; choose from {', '.join(CONDITION_FIELDS)}",
                                  field="where")
        wants = want if isinstance(want, (list, tuple)) else [want]
        if not any(_same(fields[name], w) for w in wants):
            return False
    return True


def _conditions(table: pa.Table) -> dict[str, dict[str, Any]]:
    """Condition ID -> its fields plus ``{metric: value}`` under ``"_metrics"``."""
    cols = {n: table[n].to_pylist() for n in (*CONDITION_FIELDS, "condition_id", "metric", "value")}
    out: dict[str, dict[str, Any]] = {}
    for i, cid in enumerate(cols["condition_id"]):
        rec = out.get(cid)
        if rec is None:
            rec = out[cid] = {n: cols[n][i] for n in CONDITION_FIELDS}
            rec["_metrics"] = {}
        rec["_metrics"][cols["metric"][i]] = cols["value"][i]
    return out


def gap_rows(table: pa.Table, where: Mapping[str, Any] | None = None) -> list[tuple[dict[str, Any], float | None]]:
    """``(fields without policy + best_causal, gap)`` per group of conditions differing only in policy.

    Groups lacking ``belady`` or every causal policy are skipped; the gap is ``None`` when ``m_c = 0``.
    """
    groups: dict[tuple, dict[str, float]] = {}
    keys: dict[tuple, dict[str, Any]] = {}
    for rec in _conditions(table).values():
        if not matches(rec, {k: v for k, v in (where or {}).items() if k != "policy"}):
            continue
        fields = {n: rec[n] for n in CONDITION_FIELDS if n != "policy"}
        k = tuple(fields.values())
        keys[k] = fields
        groups.setdefault(k, {})[rec["policy"]] = rec["_metrics"]["miss_fraction"]
    out = []
    for k, m in groups.items():
        causal = {p: m[p] for p in CAUSAL if p in m}
        if "belady" not in m or not causal:
            continue
        best = min(causal, key=lambda p: (causal[p], p))
        m_c = causal[best]
        out.append(({**keys[k], "best_causal": best}, (m_c - m["belady"]) / m_c if m_c > 0 else None))
    return out


def metric_values(table: pa.Table, metric: str, where: Mapping[str, Any] | None = None
                  ) -> list[tuple[dict[str, Any], float | None]]:
    """``(condition fields, value)`` of ``metric`` (a stored metric or ``gap``) for matching conditions."""
    if metric == "gap":
        return gap_rows(table, where)
    stored = set(table["metric"].unique().to_pylist()) if table.num_rows else set()
    if metric not in stored:
        raise ValidationError(f"unknown metric {metric!r}; choose from gap, {', '.join(sorted(stored))}",
                              field="metric")
    out = []
    for rec in _conditions(table).values():
        if metric in rec["_metrics"] and matches(rec, where):
            out.append(({n: rec[n] for n in CONDITION_FIELDS}, rec["_metrics"][metric]))
    return out


def summarize(table: pa.Table, metric: str = "gap", rows: Sequence[str] = ("batch",),
              cols: Sequence[str] = ("rho",), where: Mapping[str, Any] | None = None) -> Summary:
    """Pivot ``metric`` by ``rows`` x ``cols``: each cell aggregates the matching conditions.

    Cells are ordered by key (``None`` first). Raises if nothing matches.
    """
    allowed = set(CONDITION_FIELDS) | ({"best_causal"} if metric == "gap" else set())
    for name in (*rows, *cols):
        if name not in allowed or (metric == "gap" and name == "policy"):
            raise ValidationError(f"cannot pivot {metric} by {name!r}; choose from "
                                  f"{', '.join(sorted(allowed - ({'policy'} if metric == 'gap' else set())))}",
                                  field="rows")
    values = metric_values(table, metric, where)
    if not values:
        raise ValidationError(f"no results match (metric {metric}, where {dict(where or {})})", field="where")
    cells: dict[tuple, list[float | None]] = {}
    for fields, v in values:
        cells.setdefault(tuple(fields[n] for n in (*rows, *cols)), []).append(v)
    out = []
    for k in sorted(cells, key=lambda t: tuple((x is not None, x if x is not None else 0) for x in t)):
        vs = [v for v in cells[k] if v is not None]
        out.append(SummaryCell(dict(zip((*rows, *cols), k, strict=True)),
                               sum(vs) / len(vs) if vs else None, min(vs) if vs else None,
                               max(vs) if vs else None, len(vs), len(cells[k]) - len(vs)))
    return Summary(metric, tuple(rows), tuple(cols), dict(where or {}), tuple(out))
