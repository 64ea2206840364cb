"""Our own JSON Lines interchange format of routing records (docs/design.md §3)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...errors import ValidationError
from ...jsonl import check_shape, float_list, int_field, int_list, iter_records
from ..model import PHASES, RoutingTrace

__all__ = ["import_routes_jsonl"]


def import_routes_jsonl(
    path: str | os.PathLike[str],
    n_layers: int,
    n_experts: int,
    top_k: int,
    provenance: dict[str, Any] | None = None,
) -> RoutingTrace:
    """Read routing records in the JSON Lines interchange format (docs/design.md §3).

    Each line is ``{"request_id", "phase": "decode"|"prefill", "position",
    "layer", "experts": [k ids], "gates": [k floats]?, "token_id"?}``. Within a
    request, records must come in non-decreasing position order, and every
    (request, position) must carry each of the ``L`` layers exactly once.

    Raises
    ------
    ValidationError
        Naming the file, the 1-based line and the field of the first fault.
    """
    src = str(path)
    L, N, k = n_layers, n_experts, top_k
    check_shape(L, N, k)
    tokens: dict[tuple[str, int], int] = {}   # (request, position) -> row
    request_ids: dict[str, int] = {}
    last_phase: dict[str, int] = {}  # request -> phase of its latest position
    last_pos: dict[str, tuple[int, int]] = {}  # request -> (position, line)
    rows_req: list[int] = []
    rows_phase: list[int] = []
    rows_pos: list[int] = []
    rows_tok: list[int] = []
    experts: list[np.ndarray] = []
    gates: list[np.ndarray] = []
    seen: list[np.ndarray] = []
    has_gates: bool | None = None
    for line_no, rec in iter_records(path):
        rid = rec.get("request_id")
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise ValidationError(f"expected a string or integer; got {rid!r}", source=src,
                                  record=line_no, field="request_id")
        rid = str(rid)
        phase = rec.get("phase")
        if phase not in PHASES:
            raise ValidationError(f"expected 'decode' or 'prefill'; got {phase!r}", source=src,
                                  record=line_no, field="phase")
        pos = int_field(rec, "position", src, line_no, lo=0)
        layer = int_field(rec, "layer", src, line_no, lo=0, hi=L)
        ex = int_list(rec, "experts", src, line_no, k, N)
        g = rec.get("gates")
        if has_gates is None:
            has_gates = g is not None
        elif has_gates != (g is not None):
            raise ValidationError("gates must be given on every record or on none", source=src,
                                  record=line_no, field="gates")
        tok = rec.get("token_id", -1)
        if tok is None:
            tok = -1
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < -1:
            raise ValidationError(f"expected a non-negative integer; got {tok!r}", source=src,
                                  record=line_no, field="token_id")
        prev = last_pos.get(rid)
        if prev is not None and pos < prev[0]:
            raise ValidationError(
                f"positions must not decrease within a request; got {pos} after {prev[0]} (line {prev[1]})",
                source=src, record=line_no, field="position")
        last_pos[rid] = (pos, line_no)
        key = (rid, pos)
        row = tokens.get(key)
        pcode = PHASES.index(phase)
        if row is None:
            row = len(rows_req)
            tokens[key] = row
            if rid not in request_ids:
                request_ids[rid] = len(request_ids)
            elif last_phase[rid] > pcode:
                raise ValidationError("a prefill record cannot follow a decode record of the same request",
                                      source=src, record=line_no, field="phase")
            last_phase[rid] = pcode
            rows_req.append(request_ids[rid])
            rows_phase.append(pcode)
            rows_pos.append(pos)
            rows_tok.append(tok)
            experts.append(np.full((L, k), -1, dtype=np.int16))
            gates.append(np.zeros((L, k), dtype=np.float32))
            seen.append(np.zeros(L, dtype=bool))
        else:
            if rows_phase[row] != pcode:
                raise ValidationError(f"phase differs from another layer of the same position ({PHASES[rows_phase[row]]})",
                                      source=src, record=line_no, field="phase")
        if seen[row][layer]:
            raise ValidationError(f"duplicate record for request {rid!r}, position {pos}, layer {layer}",
                                  source=src, record=line_no, field="layer")
        seen[row][layer] = True
        experts[row][layer] = ex
        if g is not None:
            gates[row][layer] = float_list(g, src, line_no, k)
        if tok >= 0:
            if rows_tok[row] >= 0 and rows_tok[row] != tok:
                raise ValidationError("token_id differs between layers of the same position",
                                      source=src, record=line_no, field="token_id")
            rows_tok[row] = tok
    if not rows_req:
        raise ValidationError("no routing records found; expected one JSON object per line", source=src)
    for (rid, pos), row in tokens.items():
        if not seen[row].all():
            missing = int(np.flatnonzero(~seen[row])[0])
            raise ValidationError(f"request {rid!r}, position {pos}: layer {missing} has no record "
                                  f"(every position needs all {L} layers)", source=src, field="layer")
    order = np.lexsort((np.array(rows_pos), np.array(rows_req)))
    req = np.array(rows_req, dtype=np.int32)[order]
    return RoutingTrace(
        L, N, k, tuple(request_ids), req,
        np.array(rows_phase, dtype=np.int8)[order],
        np.array(rows_pos, dtype=np.int32)[order],
        np.stack(experts)[order],
        np.stack(gates)[order] if has_gates else None,
        np.array(rows_tok, dtype=np.int64)[order],
        provenance=dict(provenance or {"source": os.path.basename(src), "format": "routes-jsonl"}),
    )
