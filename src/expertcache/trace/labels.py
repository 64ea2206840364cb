"""Per-request workload labels (categories): one shared contract for experiments and diagnostics.

A label set maps request ids to a workload category (``"math"``, ``"code"``, ...).
It comes from one of two places:

- a labels file: CSV with a header ``request_id,category`` or JSON Lines records
  ``{"request_id": ..., "category": ...}``;
- a trace's own manifest: ``provenance["categories"]`` (a ``{request_id: category}``
  object), written by ``expertcache collect`` when the prompts file has a
  ``category`` field, and by the synthetic generators.

:func:`request_categories` turns either into integer codes aligned with
``trace.request_ids``; every request must be labelled.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ValidationError
from ..jsonl import iter_records

if TYPE_CHECKING:
    from .model import RoutingTrace

__all__ = ["read_labels", "request_categories"]


def read_labels(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a labels file (CSV ``request_id,category`` or JSON Lines) into ``{request_id: category}``."""
    src = str(path)
    p = Path(path)
    if not p.is_file():
        raise ValidationError("labels file not found; expected CSV with a 'request_id,category' header "
                              "or JSON Lines records {\"request_id\", \"category\"}", source=src)
    labels: dict[str, str] = {}
    if p.suffix.lower() == ".csv":
        row_no = 0
        try:
            with open(p, encoding="utf-8-sig", newline="") as fh:      # -sig: Excel's byte-order mark
                reader = csv.DictReader(fh)
                if reader.fieldnames is None or not {"request_id", "category"} <= set(reader.fieldnames):
                    raise ValidationError(f"expected a header with 'request_id' and 'category'; got "
                                          f"{str(reader.fieldnames)[:80]}", source=src)
                row_no = 1
                for row_no, row in enumerate(reader, start=2):
                    _add(labels, row.get("request_id"), row.get("category"), src, row_no)
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text; expected CSV", source=src) from None
        except csv.Error as exc:      # e.g. a field over csv.field_size_limit() (128 KiB), a NUL byte
            raise ValidationError(f"not readable CSV ({exc})", source=src, record=row_no + 1) from None
    else:
        for line_no, rec in iter_records(p):
            _add(labels, rec.get("request_id"), rec.get("category"), src, line_no)
    if not labels:
        raise ValidationError("no labels in the file; expected one row per request", source=src)
    return labels


def _add(labels: dict[str, str], rid, cat, src: str, record: int) -> None:
    if rid is None or (isinstance(rid, str) and not rid.strip()):
        raise ValidationError("missing request_id", source=src, record=record, field="request_id")
    if not isinstance(cat, str) or not cat.strip():
        raise ValidationError(f"expected a non-empty category string; got {str(cat)[:60]!r}", source=src,
                              record=record,
                              field="category")
    rid = str(rid)
    if rid in labels and labels[rid] != cat:
        raise ValidationError(f"request {rid!r} labelled twice ({labels[rid]!r} and {cat!r})", source=src,
                              record=record, field="request_id")
    labels[rid] = cat


def request_categories(trace: RoutingTrace, labels: dict[str, str] | str | os.PathLike[str] | None = None
                       ) -> tuple[np.ndarray, tuple[str, ...]]:
    """Category code per request (aligned with ``trace.request_ids``) and the category names.

    ``labels`` is a mapping, a labels file, or ``None`` to use the trace's own
    ``provenance["categories"]``. Names are sorted; codes index into them.
    Raises :class:`ValidationError` naming the unlabelled requests.
    """
    if labels is None:
        labels = trace.provenance.get("categories")
        if not isinstance(labels, dict) or not labels:
            raise ValidationError("the trace carries no request categories; pass a labels file "
                                  "(CSV 'request_id,category' or JSON Lines) with --labels")
    elif not isinstance(labels, dict):
        labels = read_labels(labels)
    missing = [r for r in trace.request_ids if r not in labels]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        raise ValidationError(f"{len(missing)} of {trace.n_requests} requests have no category (e.g. {shown}); "
                              "label every request of the trace")
    names = tuple(sorted({str(labels[r]) for r in trace.request_ids}))
    index = {n: i for i, n in enumerate(names)}
    codes = np.array([index[str(labels[r])] for r in trace.request_ids], dtype=np.int32)
    return codes, names
