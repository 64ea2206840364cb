"""Our own JSON Lines interchange format of routing records (docs/design.md §3).

The file is parsed by pyarrow's JSON reader and checked column by column; a file pyarrow cannot
type (a truncated line, a field that is a number in one record and a string in another, an id too
large for 64 bits, ``NaN``) is read again record by record, which names the line and the field of
the first fault. Both readers feed the same assembly, so they give the same trace.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import ValidationError
from ..model import PHASES, RoutingTrace
from ._common import (
    MAX_EXPERTS,
    MAX_POSITION,
    Records,
    RowBuffer,
    _check_shape_args,
    assemble,
    concat_records,
    guarded_record,
)

__all__ = ["import_routes_jsonl", "read_routes_records"]

#: Files from this size on are read by the compiled scanner first (``_routes_scan``).
_SCAN_MIN_BYTES = 16 << 20
_FIELDS = ("request_id", "phase", "position", "layer", "experts")


def import_routes_jsonl(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    n_layers: int,
    n_experts: int,
    top_k: int,
    provenance: dict[str, Any] | None = None,
    *,
    category_from: str | None = None,
    fast: bool = True,
) -> RoutingTrace:
    """Read routing records in the JSON Lines interchange format (docs/design.md §3).

    Each line is ``{"request_id", "phase": "decode"|"prefill", "position",
    "layer", "experts": [k ids], "gates": [k floats]?, "token_id"?}``. Within a
    request, records must come in non-decreasing position order, and every
    (request, position) must carry each of the ``L`` layers exactly once.

    Parameters
    ----------
    path
        One file or several (their records are read in order, as one file).
    n_layers, n_experts, top_k
        The model's shape ``L, N, k``.
    provenance
        Stored in the manifest as given (default ``{"source", "format"}``).
    category_from
        ``"file"`` (each file's name) or a field of the records holding each request's category;
        written to ``provenance["categories"]``.
    fast
        Parse with pyarrow (``False``: record by record; the result is the same).

    Raises
    ------
    ValidationError
        Naming the file, the 1-based line and the field of the first fault.
    """
    _check_shape_args(n_layers, n_experts, top_k)
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths:
        raise ValidationError("no input files given")
    parts = [read_routes_records(p, category_from, fast) for p in paths]
    recs = concat_records(parts)
    prov = dict(provenance or {"source": os.path.basename(str(paths[0])) if len(paths) == 1
                               else [os.path.basename(str(p)) for p in paths], "format": "routes-jsonl"})
    if recs.n == 0:
        raise ValidationError("no routing records found; expected one JSON object per line", source=str(paths[0]))
    trace, _ = assemble(recs, fmt="routes-jsonl", n_layers=n_layers, n_experts=n_experts, top_k=top_k, strict=True,
                        monotone_positions=True, provenance=prov, record_provenance=False,
                        categories_from=category_from)
    return trace


def read_routes_records(path: str | os.PathLike[str], category_from: str | None = None,
                        fast: bool = True) -> Records:
    """The records of one routes JSON Lines file (pyarrow first, record by record where it cannot)."""
    p = Path(path)
    src = str(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ValidationError(f"cannot open ({exc.strerror})", source=src) from None
    if size == 0:
        raise ValidationError("empty file; expected one JSON object per line", source=src)
    if fast:
        # the compiled scanner pays about a second to load, so it is for large files only
        big = size >= _SCAN_MIN_BYTES
        recs = _scanned(p, src, category_from) if big and category_from in (None, "file") else None
        if recs is None:
            recs = _fast(p, src, category_from)
        if recs is not None:
            return recs
    return _slow(p, src, category_from)


def _scanned(p: Path, src: str, category_from: str | None) -> Records | None:
    """The compiled scanner's columns (the common shape of the file), or ``None``."""
    from ._routes_scan import scan_routes

    cols = scan_routes(p)
    if cols is None:
        return None
    n = cols["line"].shape[0]  # type: ignore[union-attr]
    tok = cols["token_id"]
    category, cat_names = (np.zeros(n, np.int64), [p.stem]) if category_from == "file" else (None, [])
    return Records(request=cols["request"], request_names=cols["request_names"],  # type: ignore[arg-type]
                   position=cols["position"], layer=cols["layer"], ex_values=cols["ex_values"],  # type: ignore[arg-type]
                   ex_lengths=cols["ex_lengths"], gate_values=cols["gate_values"],  # type: ignore[arg-type]
                   gate_lengths=cols["gate_lengths"] if cols["gate_values"] is not None else None,  # type: ignore[arg-type]
                   phase=cols["phase"], token_id=tok if (tok >= 0).any() or (tok < -1).any() else None,  # type: ignore
                   file=np.zeros(n, np.int32), row=cols["line"], sources=[src],  # type: ignore[arg-type]
                   record_number=[lambda r: r], category=category, category_names=cat_names)


def _fast(p: Path, src: str, category_from: str | None) -> Records | None:
    """pyarrow's reader with every column checked as a whole; ``None`` where only a record-by-record read can tell."""
    import pyarrow.json as pj

    from .columnar import _Col, _json_row_lines

    try:
        table = pj.read_json(p, read_options=pj.ReadOptions(block_size=16 << 20))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    names = set(table.column_names)
    if not set(_FIELDS) <= names:
        return None
    t = {name: table.schema.field(name).type for name in table.column_names}
    if not ((pa.types.is_string(t["request_id"]) or pa.types.is_int64(t["request_id"]))
            and pa.types.is_string(t["phase"]) and pa.types.is_int64(t["position"]) and pa.types.is_int64(t["layer"])
            and _is_list_of(t["experts"], pa.types.is_int64)):
        return None
    if "gates" in t and not (pa.types.is_null(t["gates"])
                             or _is_list_of(t["gates"], lambda x: pa.types.is_float64(x) or pa.types.is_int64(x))):
        return None
    if "token_id" in t and not (pa.types.is_int64(t["token_id"]) or pa.types.is_null(t["token_id"])):
        return None
    cat_name = None if category_from in (None, "file") else category_from
    if cat_name is not None and cat_name in t and not pa.types.is_string(t[cat_name]):
        return None
    for name in ("request_id", "phase", "position", "layer", "experts"):
        if table[name].null_count:
            return None
    number = _json_row_lines(p)
    c = _Col(table, src, number)
    n = table.num_rows
    rid = table["request_id"].combine_chunks()
    if pa.types.is_int64(rid.type):
        rid = rid.cast(pa.string())
    enc = rid.dictionary_encode()
    phase_col = table["phase"].combine_chunks()
    phase = np.full(n, -1, np.int8)
    import pyarrow.compute as pc

    for code, name in enumerate(PHASES):
        phase[np.asarray(pc.equal(phase_col, name))] = code
    if (phase < 0).any():
        return None
    ex_values, ex_lengths = c.lists("experts")
    gv = gl = None
    if "gates" in t and not pa.types.is_null(t["gates"]):
        g = table["gates"].combine_chunks()
        present = np.asarray(g.is_valid())
        gl = np.full(n, -1, np.int64)
        gl[present] = g.value_lengths().to_numpy(zero_copy_only=False)[present]
        flat = g.flatten()  # null lists contribute no values
        if flat.null_count:
            return None
        gv = flat.to_numpy(zero_copy_only=False).astype(np.float64)
    token = None
    if "token_id" in t and not pa.types.is_null(t["token_id"]):
        token = table["token_id"].combine_chunks().fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    category = None
    cat_names: list[str] = []
    if category_from == "file":
        category, cat_names = np.zeros(n, np.int64), [p.stem]
    elif cat_name is not None:
        if cat_name not in t:
            raise ValidationError(f"no field {cat_name!r} (--category-from) in the records", source=src)
        cc = table[cat_name].combine_chunks().dictionary_encode()
        category = cc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        cat_names = cc.dictionary.to_pylist()
    return Records(request=enc.indices.to_numpy(zero_copy_only=False).astype(np.int64),
                   request_names=enc.dictionary.to_pylist(), position=c.ints("position"), layer=c.ints("layer"),
                   ex_values=ex_values, ex_lengths=ex_lengths, gate_values=gv, gate_lengths=gl, phase=phase,
                   token_id=token, file=np.zeros(n, np.int32), row=np.arange(n, dtype=np.int64), sources=[src],
                   record_number=[number], category=category, category_names=cat_names)


def _is_list_of(t: pa.DataType, pred) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and (pred(t.value_type)
                                                                   or pa.types.is_null(t.value_type))


def _slow(p: Path, src: str, category_from: str | None) -> Records:
    """Record by record: every fault raises at once with its line and field."""
    buf = RowBuffer(src)
    try:
        handle = open(p, encoding="utf-8-sig")
    except OSError as exc:
        raise ValidationError(f"cannot open ({exc.strerror})", source=src) from None
    file_cat = p.stem if category_from == "file" else None
    with handle:
        try:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                rec = guarded_record(line, src, line_no)

                def fail(message: str, name: str | None, line_no: int = line_no) -> ValidationError:
                    return ValidationError(message, source=src, record=line_no, field=name)

                rid = rec.get("request_id")
                if isinstance(rid, bool) or not isinstance(rid, (str, int)):
                    raise fail(f"expected a string or integer; got {rid!r:.60}", "request_id")
                phase = rec.get("phase")
                if phase not in PHASES:
                    raise fail(f"expected 'decode' or 'prefill'; got {phase!r:.60}", "phase")
                pos = _int(rec, "position", fail, MAX_POSITION)
                layer = _int(rec, "layer", fail, 2**31)
                ex = rec.get("experts")
                if not isinstance(ex, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in ex):
                    raise fail(f"expected a list of integers; got {ex!r:.60}", "experts")
                big = [v for v in ex if not -1 <= v < MAX_EXPERTS]
                if big:
                    raise fail(f"expert id must be in [0, {MAX_EXPERTS}) (the trace stores int16 ids); got "
                               f"{big[0]:.6g}", "experts")
                g = rec.get("gates")
                gates = None
                if g is not None:
                    if not isinstance(g, list) or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                                      or not math.isfinite(v) for v in g):
                        raise fail(f"expected a list of finite numbers; got {g!r:.60}", "gates")
                    gates = [float(v) for v in g]
                tok = rec.get("token_id", -1)
                if tok is None:
                    tok = -1
                if isinstance(tok, bool) or not isinstance(tok, int) or not -1 <= tok < 2**62:
                    raise fail(f"expected a non-negative 64-bit integer (below 2**62); got {tok!r:.60}", "token_id")
                cat = file_cat
                if category_from not in (None, "file"):
                    cv = rec.get(category_from)
                    if cv is not None and not isinstance(cv, str):
                        raise fail(f"expected a category string; got {cv!r:.60}", category_from)
                    cat = cv
                buf.add(line_no, str(rid), pos, layer, ex, gates, PHASES.index(phase), tok, cat)
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text; expected JSON Lines", source=src) from None
    if category_from not in (None, "file") and not buf.any_cat:
        raise ValidationError(f"no field {category_from!r} (--category-from) in the records", source=src)
    return buf.records()


def _int(rec: dict[str, Any], name: str, fail, hi: int) -> int:
    value = rec.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(f"expected an integer; got {value!r:.60}", name)
    if value < 0 or value > hi:
        raise fail(f"must be in [0, {hi}]; got {value:.6g}", name)
    return value
