"""Mixtral-style JSON Lines: one row per (request, token, layer)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from ...errors import ValidationError
from ...jsonl import iter_records
from ..model import PHASES, RoutingTrace
from ._common import ImportReport, _check_shape_args, _Collector, _expert_ids, _Row

__all__ = ["import_mixtral_jsonl"]


def import_mixtral_jsonl(
    path: str | os.PathLike[str],
    *,
    n_layers: int | None = None,
    n_experts: int | None = None,
    top_k: int | None = None,
    phase: str = "decode",
    skip_bad_rows: bool = False,
    provenance: dict[str, Any] | None = None,
) -> tuple[RoutingTrace, ImportReport]:
    """Read per-(request, token, layer) routing rows as published for Mixtral-8x7B.

    Parameters
    ----------
    path
        JSON Lines file; each row ``{"dataset", "problem_id", "layer", "experts": [..],
        "gating_probs"?: [..], "token_idx" | "token_pos"}``.
    n_layers, n_experts, top_k
        The model's shape; each one left ``None`` is inferred (see the module docstring)
        and named in ``ImportReport.inferred``.
    phase
        ``"decode"`` or ``"prefill"``: the phase of every token (the format does not say
        which tokens were prompt and which were generated); a row's own ``"phase"`` field wins.
    skip_bad_rows
        Count and skip unreadable rows instead of raising.
    provenance
        Extra metadata for the trace manifest (model id, ...).

    Returns
    -------
    (RoutingTrace, ImportReport)
        Requests in order of first appearance, tokens sorted by position.
    """
    _check_shape_args(n_layers, n_experts, top_k)
    if phase not in PHASES:
        raise ValidationError(f"phase must be 'decode' or 'prefill'; got {phase!r}", field="phase")
    src = str(path)
    col = _Collector("mixtral-jsonl", [src], skip_bad_rows)
    default_phase = PHASES.index(phase)
    n_without_phase = 0
    for line_no, rec in _iter_json_rows(path, col):
        col.n_rows += 1
        dataset, pid = rec.get("dataset", ""), rec.get("problem_id")
        if isinstance(pid, bool) or not isinstance(pid, (int, str)) or pid == "":
            col.bad(f"expected an integer or string problem id; got {pid!r}", src, line_no, "problem_id")
            continue
        if not isinstance(dataset, str):
            col.bad(f"expected a string; got {dataset!r}", src, line_no, "dataset")
            continue
        name = "token_idx" if "token_idx" in rec else "token_pos"
        pos = rec.get(name)
        if isinstance(pos, bool) or not isinstance(pos, int) or pos < 0:
            col.bad(f"expected a non-negative integer token_idx or token_pos; got {pos!r}", src, line_no, name)
            continue
        layer = rec.get("layer")
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            col.bad(f"expected a non-negative integer; got {layer!r}", src, line_no, "layer")
            continue
        ex = _expert_ids(rec.get("experts"))
        if isinstance(ex, str):
            col.bad(ex, src, line_no, "experts")
            continue
        g = rec.get("gating_probs")
        gates = None
        if g is not None:
            if (not isinstance(g, list) or len(g) != len(ex)
                    or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) for v in g)):
                col.bad(f"expected {len(ex)} finite numbers aligned with 'experts'; got {g!r:.60}", src, line_no,
                        "gating_probs")
                continue
            gates = tuple(float(v) for v in g)
        ph = rec.get("phase", phase)
        if ph not in PHASES:
            col.bad(f"expected 'decode' or 'prefill'; got {ph!r}", src, line_no, "phase")
            continue
        pcode = PHASES.index(ph) if "phase" in rec else default_phase
        n_without_phase += "phase" not in rec
        rid = f"{dataset}/{pid}" if dataset else str(pid)
        col.rows.append(_Row(rid, (pos, 0), pos, pcode, layer, ex, gates, -1, f"{src}:{line_no}"))
    if n_without_phase:
        col.notes.append(f"the format does not mark prompt vs generated tokens: {n_without_phase} row(s) without "
                         f"a 'phase' field imported as {phase} (--phase)")
    return col.build(n_layers, n_experts, top_k, provenance)


def _iter_json_rows(path: str | os.PathLike[str], col: _Collector) -> Iterable[tuple[int, dict[str, Any]]]:
    """JSON objects of a JSON Lines file; with ``skip_bad_rows`` unparsable lines are counted and skipped."""
    if not col.skip_bad_rows:
        yield from iter_records(path)
        return
    import json

    src = str(path)
    try:
        handle = open(path, encoding="utf-8", errors="strict")
    except OSError as exc:
        raise ValidationError(f"cannot open ({exc.strerror})", source=src) from None
    with handle:
        try:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    col.n_rows += 1
                    col.bad(f"not valid JSON ({exc.msg})", src, line_no)
                    continue
                if not isinstance(rec, dict):
                    col.n_rows += 1
                    col.bad(f"expected a JSON object; got {type(rec).__name__}", src, line_no)
                    continue
                yield line_no, rec
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text; expected JSON Lines", source=src) from None

