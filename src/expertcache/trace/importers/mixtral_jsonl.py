"""Mixtral-style JSON Lines: one row per (request, token, layer), as a vLLM routing profiler writes them.

``{"dataset": "gsm8k", "problem_id": 0, "layer": 0, "experts": [7, 0], "gating_probs": [0.80, 0.20],
"token_idx": 0}``. The file is parsed by pyarrow's JSON reader and checked column by column; where
pyarrow cannot type it, or with ``skip_bad_rows``, it is read record by record (same result).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import ValidationError
from ..model import PHASES, RoutingTrace
from ._common import (
    MAX_POSITION,
    ImportReport,
    Records,
    RowBuffer,
    _check_shape_args,
    _expert_ids,
    assemble,
    concat_records,
    file_list,
    guarded_record,
    phase_code,
)

__all__ = ["import_mixtral_jsonl"]

_READING = ("one record per generated token and layer (batch-1 generation through vLLM); replayed as decode "
            "positions in token order per problem")


def import_mixtral_jsonl(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    n_layers: int | None = None,
    n_experts: int | None = None,
    top_k: int | None = None,
    phase: str = "decode",
    skip_bad_rows: bool = False,
    category_from: str | None = None,
    provenance: dict[str, Any] | None = None,
    fast: bool = True,
) -> tuple[RoutingTrace, ImportReport]:
    """Read per-(request, token, layer) routing rows as published for Mixtral-8x7B.

    Parameters
    ----------
    path
        JSON Lines file(s), or a directory of ``*.jsonl``; each row ``{"dataset", "problem_id",
        "layer", "experts": [..], "gating_probs"?: [..], "token_idx" | "token_pos"}``. Rows of
        several files are read in order, as one file (a problem split over two runs is one request).
    n_layers, n_experts, top_k
        The model's shape; each one left ``None`` is inferred (see the package docstring)
        and named in ``ImportReport.inferred``.
    phase
        ``"decode"`` or ``"prefill"``: the phase of every token (the format does not say
        which tokens were prompt and which were generated); a row's own ``"phase"`` field wins.
    skip_bad_rows
        Count and skip unreadable rows instead of raising.
    category_from
        ``"dataset"`` (or another field of the rows) or ``"file"``: each request's category,
        written to ``provenance["categories"]``.
    provenance
        Extra metadata for the trace manifest (model id, ...).
    fast
        Parse with pyarrow where it can (``False``: record by record; the result is the same).

    Returns
    -------
    (RoutingTrace, ImportReport)
        Requests in order of first appearance, tokens sorted by position.
    """
    _check_shape_args(n_layers, n_experts, top_k)
    default_phase = phase_code(phase)
    files = file_list(path, ["*.jsonl", "*.json", "*.ndjson"])
    parts: list[Records] = []
    n_rows = 0
    n_without_phase = 0
    for f in files:
        recs = _fast(f, default_phase, category_from) if fast and not skip_bad_rows else None
        if recs is None:
            recs = _slow(f, default_phase, category_from)
        parts.append(recs)
        n_rows += recs.n
        n_without_phase += int(recs.fields.pop("_without_phase", "0"))
    recs = concat_records(parts)
    notes = []
    if n_without_phase:
        notes.append(f"the format does not mark prompt vs generated tokens: {n_without_phase} row(s) without "
                     f"a 'phase' field imported as {phase} (--phase)")
    return assemble(recs, fmt="mixtral-jsonl", n_layers=n_layers, n_experts=n_experts, top_k=top_k,
                    skip_bad_rows=skip_bad_rows, provenance=provenance, notes=notes, n_rows=n_rows,
                    reading=_READING, categories_from=category_from)


def _fast(p: Path, default_phase: int, category_from: str | None) -> Records | None:
    import pyarrow.json as pj

    from .columnar import _Col, _json_row_lines

    src = str(p)
    if p.stat().st_size == 0:
        return None
    try:
        table = pj.read_json(p, read_options=pj.ReadOptions(block_size=16 << 20))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    t = {name: table.schema.field(name).type for name in table.column_names}
    pos_names = [x for x in ("token_idx", "token_pos") if x in t]
    if ("problem_id" not in t or "layer" not in t or "experts" not in t or not pos_names
            or not (pa.types.is_int64(t["problem_id"]) or pa.types.is_string(t["problem_id"]))
            or not pa.types.is_int64(t["layer"])
            or not (pa.types.is_list(t["experts"]) and pa.types.is_int64(t["experts"].value_type))
            or any(not pa.types.is_int64(t[x]) for x in pos_names)
            or ("dataset" in t and not (pa.types.is_string(t["dataset"]) or pa.types.is_null(t["dataset"])))
            or ("phase" in t and not pa.types.is_string(t["phase"]))
            or ("gating_probs" in t and not (pa.types.is_null(t["gating_probs"]) or (
                pa.types.is_list(t["gating_probs"])
                and (pa.types.is_float64(t["gating_probs"].value_type)
                     or pa.types.is_int64(t["gating_probs"].value_type)))))):
        return None
    if category_from not in (None, "file") and (category_from not in t
                                                or not pa.types.is_string(t[category_from])):
        return None
    n = table.num_rows
    for name in ("problem_id", "layer", "experts"):
        if table[name].null_count:
            return None
    pos = table[pos_names[0]].combine_chunks()
    if len(pos_names) == 2:
        pos = pc.coalesce(pos, table[pos_names[1]].combine_chunks())
    if pos.null_count:
        return None
    pid = table["problem_id"].combine_chunks()
    if pa.types.is_string(pid.type) and pc.any(pc.equal(pid, "")).as_py():
        return None
    pid = pid.cast(pa.string())
    if "dataset" in t and not pa.types.is_null(t["dataset"]):
        ds = table["dataset"].combine_chunks().fill_null("")
        rid = pc.if_else(pc.equal(ds, ""), pid, pc.binary_join_element_wise(ds, pid, "/"))
    else:
        rid = pid
    enc = rid.dictionary_encode()
    number = _json_row_lines(p)
    c = _Col(table, src, number)
    phase = np.full(n, default_phase, np.int8)
    without = n
    if "phase" in t:
        ph = table["phase"].combine_chunks()
        has = np.asarray(ph.is_valid())
        for code, name in enumerate(PHASES):
            phase[np.asarray(pc.fill_null(pc.equal(ph, name), False))] = code
        ok = np.zeros(n, bool)
        for name in PHASES:
            ok |= np.asarray(pc.fill_null(pc.equal(ph, name), False))
        if (has & ~ok).any():
            return None
        without = int((~has).sum())
    ex_values, ex_lengths = c.lists("experts")
    gv = gl = None
    if "gating_probs" in t and not pa.types.is_null(t["gating_probs"]):
        g = table["gating_probs"].combine_chunks()
        present = np.asarray(g.is_valid())
        gl = np.full(n, -1, np.int64)
        gl[present] = g.value_lengths().to_numpy(zero_copy_only=False)[present]
        flat = g.flatten()
        if flat.null_count:
            return None
        gv = flat.to_numpy(zero_copy_only=False).astype(np.float64)
    category = None
    cat_names: list[str] = []
    if category_from == "file":
        category, cat_names = np.zeros(n, np.int64), [p.stem]
    elif category_from is not None:
        cc = table[category_from].combine_chunks().dictionary_encode()
        category = cc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        cat_names = cc.dictionary.to_pylist()
    fields = {"position": pos_names[0], "gates": "gating_probs", "_without_phase": str(without)}
    return Records(request=enc.indices.to_numpy(zero_copy_only=False).astype(np.int64),
                   request_names=enc.dictionary.to_pylist(), position=pos.to_numpy(zero_copy_only=False).astype(np.int64),
                   layer=c.ints("layer"), ex_values=ex_values, ex_lengths=ex_lengths, gate_values=gv, gate_lengths=gl,
                   phase=phase, token_id=None, file=np.zeros(n, np.int32), row=np.arange(n, dtype=np.int64),
                   sources=[src], record_number=[number], fields=fields, category=category, category_names=cat_names)


def _slow(p: Path, default_phase: int, category_from: str | None) -> Records:
    """Record by record; unreadable rows become placeholders that the bad-row policy raises or skips, in order."""
    src = str(p)
    buf = RowBuffer(src, fields={"gates": "gating_probs"})
    without = 0
    try:
        handle = open(p, encoding="utf-8-sig", errors="strict")
    except OSError as exc:
        raise ValidationError(f"cannot open ({exc.strerror})", source=src) from None
    file_cat = p.stem if category_from == "file" else None
    with handle:
        try:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:  # the shared guards: nesting, 64-bit integers, lone surrogates (jsonl.json_object)
                    rec = guarded_record(line, src, line_no)
                except ValidationError as exc:
                    buf.bad(line_no, exc.detail, exc.field)
                    continue
                dataset, pid = rec.get("dataset", ""), rec.get("problem_id")
                if dataset is None:
                    dataset = ""
                if isinstance(pid, bool) or not isinstance(pid, (int, str)) or pid == "":
                    buf.bad(line_no, f"expected an integer or string problem id; got {pid!r:.60}", "problem_id")
                    continue
                if not isinstance(dataset, str):
                    buf.bad(line_no, f"expected a string; got {dataset!r:.60}", "dataset")
                    continue
                name = "token_idx" if rec.get("token_idx") is not None else "token_pos"
                pos = rec.get(name)
                if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos <= MAX_POSITION:
                    buf.bad(line_no, f"expected a non-negative integer token_idx or token_pos; got {pos!r:.60}", name)
                    continue
                layer = rec.get("layer")
                if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < 2**31:
                    buf.bad(line_no, f"expected a non-negative integer; got {layer!r:.60}", "layer")
                    continue
                ex = _expert_ids(rec.get("experts"))
                if isinstance(ex, str):
                    buf.bad(line_no, ex, "experts")
                    continue
                g = rec.get("gating_probs")
                gates = None
                if g is not None:
                    if (not isinstance(g, list) or len(g) != len(ex)
                            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                   for v in g)):
                        buf.bad(line_no, f"expected {len(ex)} finite numbers aligned with 'experts'; got {g!r:.60}",
                                "gating_probs")
                        continue
                    gates = [float(v) for v in g]
                ph = rec.get("phase")
                if ph is not None and ph not in PHASES:
                    buf.bad(line_no, f"expected 'decode' or 'prefill'; got {ph!r:.60}", "phase")
                    continue
                without += ph is None
                cat = file_cat
                if category_from not in (None, "file"):
                    cv = rec.get(category_from)
                    if cv is not None and not isinstance(cv, str):
                        buf.bad(line_no, f"expected a category string; got {cv!r:.60}", category_from)
                        continue
                    cat = cv
                rid = f"{dataset}/{pid}" if dataset else str(pid)
                pcode = default_phase if ph is None else PHASES.index(ph)
                buf.add(line_no, rid, pos, layer, ex, gates, pcode, -1, cat)
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text; expected JSON Lines", source=src) from None
    recs = buf.records()
    recs.fields["_without_phase"] = str(without)
    if category_from not in (None, "file") and not buf.any_cat:
        raise ValidationError(f"no field {category_from!r} (--category-from) in the rows", source=src)
    return recs
