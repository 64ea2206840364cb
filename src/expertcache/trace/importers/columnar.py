"""The generic columnar importer: Parquet, CSV or JSON Lines as routing hooks write them, read through pyarrow.

Two row shapes are read:

* one row per (token, layer): a layer column and an expert-id list column (a list, or a string
  such as ``"[3, 17, 42]"``, ``"3 17 42"`` or ``"3,17,42"``);
* one row per token: no layer column, and an expert column holding one list of ids per layer
  (``[[3, 17], [5, 1], ...]``); the i-th inner list is layer i.

A column mapping names the source columns (``--map request=req_id,position=token_idx,layer=layer,
experts=topk_ids,gates=topk_weights``). Unmapped fields default to this project's names
(``request_id``, ``position``, ``layer``, ``experts``, ``gates``, ``phase``, ``token_id``) when such a
column exists. The request is a column, ``@file`` (the file's name without its extension, the
default when there is no ``request_id`` column) or ``@const:NAME``. Without a position column a row's
position is its rank among the rows of the same (request, layer), in file order.

Every column is converted as a whole (no Python loop over records); an error still names the
file, the record (line for text files, row for Parquet) and the field.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import ValidationError
from ..model import PHASES, RoutingTrace
from ._common import (
    MAX_FIELD_BYTES,
    ImportReport,
    Records,
    _check_shape_args,
    assemble,
    concat_records,
    file_list,
    phase_code,
)

__all__ = ["import_columnar", "parse_map", "MAP_FIELDS"]

#: Fields a ``--map`` may name, and the column each defaults to.
MAP_FIELDS = {"request": "request_id", "position": "position", "layer": "layer", "experts": "experts",
              "gates": "gates", "phase": "phase", "token_id": "token_id"}
_PARQUET = (".parquet", ".pq")
_CSV = (".csv",)
_JSON = (".jsonl", ".json", ".ndjson")


def parse_map(text: str | None) -> dict[str, str]:
    """``"request=req_id,experts=topk_ids"`` -> ``{"request": "req_id", "experts": "topk_ids"}``."""
    out: dict[str, str] = {}
    if not text:
        return out
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ValidationError(f"expected FIELD=COLUMN; got {part!r}", field="--map")
        if key not in MAP_FIELDS:
            raise ValidationError(f"unknown field {key!r}; expected one of {', '.join(MAP_FIELDS)}", field="--map")
        if key in out:
            raise ValidationError(f"field {key!r} mapped twice", field="--map")
        out[key] = value
    return out


# ----------------------------------------------------------------------------- reading files
def file_kind(path: Path) -> str:
    """``"parquet"``, ``"csv"`` or ``"json"`` from the file's extension."""
    suffix = path.suffix.lower()
    if suffix in _PARQUET:
        return "parquet"
    if suffix in _CSV:
        return "csv"
    if suffix in _JSON:
        return "json"
    raise ValidationError(f"cannot tell the file type from {suffix or 'no extension'!r}; expected "
                          f"{', '.join(_PARQUET + _CSV + _JSON)}", source=str(path))


def read_any(path: Path, kind: str | None = None) -> tuple[pa.Table, Callable[[int], int]]:
    """The file as a table, and its 0-based row -> the record number messages show."""
    kind = kind or file_kind(path)
    src = str(path)
    if path.stat().st_size == 0:
        raise ValidationError("empty file; expected routing records", source=src)
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as exc:
            raise ValidationError(f"not a readable Parquet file ({_first_line(exc)})", source=src) from None
        return table, lambda r: r + 1
    if kind == "csv":
        import pyarrow.csv as pcsv

        _check_csv_lines(path)
        try:
            table = pcsv.read_csv(path, read_options=pcsv.ReadOptions(block_size=16 << 20))
        except pa.ArrowInvalid as exc:
            raise ValidationError(f"malformed CSV ({_first_line(exc)})", source=src) from None
        return table, _csv_row_lines(path)
    import pyarrow.json as pj

    try:
        table = pj.read_json(path, read_options=pj.ReadOptions(block_size=16 << 20))
    except pa.ArrowInvalid:
        table = None
    if table is None:
        raise _JsonFallback()
    return table, _json_row_lines(path)


class _JsonFallback(Exception):
    """pyarrow could not read a JSON Lines file; the record-by-record reader finds and names the fault."""


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__


def _check_csv_lines(path: Path) -> None:
    """A line over :data:`MAX_FIELD_BYTES` is not routing data: name it before parsing (bounded memory)."""
    line, carried = 1, 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(16 << 20)
            if not chunk:
                break
            nl = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)
            lengths = np.diff(np.r_[-1, nl]) - 1
            if lengths.size:
                lengths[0] += carried
                carried = len(chunk) - 1 - int(nl[-1])
            else:
                carried += len(chunk)
            over = np.flatnonzero(lengths > MAX_FIELD_BYTES)
            if over.size:
                _too_long(path, line + int(over[0]))
            line += nl.size
            if carried > MAX_FIELD_BYTES:
                _too_long(path, line)


def _too_long(path: Path, line: int) -> None:
    raise ValidationError(f"a line over {MAX_FIELD_BYTES // 1024} KiB: no routing field is that long; is this "
                          "the right file?", source=str(path), record=line)


def _csv_row_lines(path: Path) -> Callable[[int], int]:
    @lru_cache(maxsize=1)
    def lines() -> list[int]:
        import csv

        out = []
        with open(path, encoding="utf-8-sig", errors="replace", newline="") as fh:
            reader = csv.reader(fh)
            next(reader, None)
            for row in reader:
                if any(c.strip() for c in row):
                    out.append(reader.line_num)
        return out

    return lambda r: lines()[r] if r < len(lines()) else r + 2


def _json_row_lines(path: Path) -> Callable[[int], int]:
    @lru_cache(maxsize=1)
    def lines() -> list[int]:
        with open(path, "rb") as fh:
            return [i for i, line in enumerate(fh, start=1) if line.strip()]

    return lambda r: lines()[r] if r < len(lines()) else r + 1


# ----------------------------------------------------------------------------- column conversion
class _Col:
    """Converts columns of one file, raising errors that name the file, the record and the field."""

    def __init__(self, table: pa.Table, src: str, record_number: Callable[[int], int]) -> None:
        self.table = table
        self.src = src
        self.number = record_number

    def fail(self, message: str, row: int | None, field_name: str) -> ValidationError:
        return ValidationError(message, source=self.src, record=None if row is None else self.number(row),
                               field=field_name)

    def get(self, name: str) -> pa.Array:
        arr = self.table[name].combine_chunks()
        if arr.null_count:
            row = int(np.flatnonzero(np.asarray(arr.is_null()))[0])
            raise self.fail("missing value", row, name)
        return arr

    def ints(self, name: str, arr: pa.Array | None = None, rows: np.ndarray | None = None) -> np.ndarray:
        """An integer column (or a list column's values, ``rows`` mapping each value to its row)."""
        arr = self.get(name) if arr is None else arr

        def row_of(i: int) -> int:
            return int(rows[i]) if rows is not None else i

        t = arr.type
        if pa.types.is_dictionary(t):
            arr = arr.dictionary_decode()
            t = arr.type
        if pa.types.is_integer(t):
            vals = arr.to_numpy(zero_copy_only=False)
            if pa.types.is_uint64(t) and vals.size and vals.max() > np.iinfo(np.int64).max:
                i = int(np.argmax(vals))
                raise self.fail(f"integer too large; got {vals[i]}", row_of(i), name)
            return vals.astype(np.int64, copy=False)
        if pa.types.is_floating(t):
            vals = arr.to_numpy(zero_copy_only=False).astype(np.float64)
            bad = ~np.isfinite(vals) | (vals != np.round(vals)) | (np.abs(vals) > 2.0**62)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise self.fail(f"expected an integer; got {vals[i]!r}", row_of(i), name)
            return vals.astype(np.int64)
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            trimmed = pc.utf8_trim_whitespace(arr)
            try:
                return pc.cast(trimmed, pa.int64()).to_numpy(zero_copy_only=False)
            except pa.ArrowInvalid:
                vals = trimmed.to_pylist()
                for i, v in enumerate(vals):
                    try:
                        int(v)
                    except ValueError:
                        raise self.fail(f"expected an integer; got {v!r:.40}", row_of(i), name) from None
                raise self.fail("expected integers", None, name) from None
        raise self.fail(f"expected integers; got a column of {t}", None, name)

    def floats(self, name: str, arr: pa.Array, rows: np.ndarray) -> np.ndarray:
        t = arr.type
        if pa.types.is_floating(t) or pa.types.is_integer(t):
            return arr.to_numpy(zero_copy_only=False).astype(np.float64)
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            try:
                return pc.cast(pc.utf8_trim_whitespace(arr), pa.float64()).to_numpy(zero_copy_only=False)
            except pa.ArrowInvalid:
                for i, v in enumerate(arr.to_pylist()):
                    try:
                        float(v)
                    except ValueError:
                        raise self.fail(f"expected a number; got {v!r:.40}", int(rows[i]), name) from None
        raise self.fail(f"expected numbers; got a column of {t}", None, name)

    def lists(self, name: str, as_float: bool = False, arr: pa.Array | None = None,
              rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A list column (or list-like strings) -> (concatenated values, length of each row)."""
        arr = self.get(name) if arr is None else arr
        n = len(arr)
        rows = np.arange(n) if rows is None else rows
        t = arr.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            arr = _split_lists(arr)
            t = arr.type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
            raise self.fail(f"expected a list of {'numbers' if as_float else 'expert ids'}; got a column of {t}",
                            None, name)
        if arr.null_count:
            raise self.fail("missing value", int(rows[int(np.flatnonzero(np.asarray(arr.is_null()))[0])]), name)
        lengths = arr.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
        child = arr.flatten()
        if child.null_count:
            i = int(np.flatnonzero(np.asarray(child.is_null()))[0])
            raise self.fail("missing value inside a list", int(np.repeat(rows, lengths)[i]), name)
        vrows = _LazyRows(rows, lengths)
        vals = self.floats(name, child, vrows) if as_float else self.ints(name, child, vrows)  # type: ignore[arg-type]
        return vals, lengths


class _LazyRows:
    """Value index -> row of a flattened list column, computed only when an error needs it."""

    def __init__(self, rows: np.ndarray, lengths: np.ndarray) -> None:
        self.rows, self.lengths = rows, lengths

    def __getitem__(self, i: int) -> int:
        ends = np.cumsum(self.lengths)
        return int(self.rows[int(np.searchsorted(ends, i, side="right"))])


def _split_lists(arr: pa.Array) -> pa.Array:
    """``"[3, 17, 42]"``, ``"3 17 42"``, ``"3,17,42"`` -> ``["3", "17", "42"]`` (vectorised)."""
    s = pc.replace_substring_regex(arr, r"[\[\]\(\)]", " ")
    s = pc.utf8_trim(s, characters=" \t\r\n,")
    parts = pc.split_pattern_regex(s, r"[\s,]+")
    # an empty string splits into [""]: a list of no ids
    lengths = pc.list_value_length(parts)
    flat = pc.list_flatten(parts)
    empty = pc.equal(pc.binary_length(flat), 0)
    if pc.any(empty).as_py():
        keep = pc.invert(empty)
        owner = np.repeat(np.arange(len(parts)), lengths.to_numpy(zero_copy_only=False))
        kept = np.asarray(keep)
        new_len = np.bincount(owner[kept], minlength=len(parts)).astype(np.int32)
        offsets = np.r_[0, np.cumsum(new_len)].astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pc.filter(flat, keep))
    return parts


# ----------------------------------------------------------------------------- one table -> records
@dataclass(frozen=True)
class Layout:
    """Which column feeds which field for one file (see :func:`import_columnar`)."""

    request: str | None
    request_value: str | None
    position: str | None
    layer: str | None
    experts: str
    gates: str | None
    phase: str | None
    token_id: str | None
    category: str | None


def resolve_layout(columns: Sequence[str], mapping: dict[str, str], src: str, file_stem: str,
                   category_from: str | None) -> Layout:
    """The :class:`Layout` of a file from its columns, the user's ``--map`` and the defaults."""
    cols = set(columns)

    def pick(key: str, required: bool = False) -> str | None:
        name = mapping.get(key)
        if name is None:
            default = MAP_FIELDS[key]
            if default in cols:
                return default
            if required:
                raise ValidationError(f"no {default!r} column; name the {key} column with --map {key}=COLUMN "
                                      f"(columns: {', '.join(columns)})", source=src)
            return None
        if name not in cols:
            raise ValidationError(f"column {name!r} (--map {key}={name}) not found; columns: {', '.join(columns)}",
                                  source=src)
        return name

    req = mapping.get("request")
    request: str | None
    value: str | None = None
    if req == "@file" or (req is None and MAP_FIELDS["request"] not in cols):
        request, value = None, file_stem
    elif req is not None and req.startswith("@const:"):
        request, value = None, req[len("@const:"):]
        if not value:
            raise ValidationError("expected @const:NAME with a non-empty NAME", field="--map request")
    else:
        request = pick("request")
    category = None
    if category_from is not None and category_from != "file":
        if category_from not in cols:
            raise ValidationError(f"column {category_from!r} (--category-from) not found; columns: "
                                  f"{', '.join(columns)}", source=src)
        category = category_from
    return Layout(request, value, pick("position"), pick("layer"), pick("experts", required=True) or "experts",
                  pick("gates"), pick("phase"), pick("token_id"), category)


def table_records(table: pa.Table, lay: Layout, src: str, record_number: Callable[[int], int], default_phase: int,
                  file_category: str | None = None) -> Records:
    """Convert one file's table to :class:`Records` (per-token rows are expanded to one record per layer)."""
    c = _Col(table, src, record_number)
    n = table.num_rows
    if n == 0:
        raise ValidationError("no routing records (a header but no rows)", source=src)
    rows = np.arange(n, dtype=np.int64)
    fields = {k: v for k, v in (("request", lay.request), ("position", lay.position), ("layer", lay.layer),
                                ("experts", lay.experts), ("gates", lay.gates), ("phase", lay.phase),
                                ("token_id", lay.token_id)) if v}
    per_token = lay.layer is None
    if per_token:
        outer = c.get(lay.experts)
        t = outer.type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) or not (
                pa.types.is_list(t.value_type) or pa.types.is_large_list(t.value_type)
                or pa.types.is_fixed_size_list(t.value_type)):
            raise ValidationError(f"no layer column: expected {lay.experts!r} to hold one list of expert ids per "
                                  f"layer (a list of lists); got {t}. Name the layer column with --map layer=COLUMN",
                                  source=src, field=lay.experts)
        if outer.null_count:
            raise c.fail("missing value", int(np.flatnonzero(np.asarray(outer.is_null()))[0]), lay.experts)
        n_layer_rows = outer.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
        rec_row = np.repeat(rows, n_layer_rows)
        layer = np.arange(rec_row.size, dtype=np.int64) - np.repeat(np.cumsum(n_layer_rows) - n_layer_rows,
                                                                     n_layer_rows)
        ex_values, ex_lengths = c.lists(lay.experts, arr=outer.flatten(), rows=rec_row)
        gv = gl = None
        if lay.gates:
            gouter = c.get(lay.gates)
            if not (pa.types.is_list(gouter.type) or pa.types.is_large_list(gouter.type)
                    or pa.types.is_fixed_size_list(gouter.type)):
                raise c.fail(f"expected one list of gate weights per layer; got {gouter.type}", None, lay.gates)
            glen = gouter.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
            if not np.array_equal(glen, n_layer_rows):
                i = int(np.flatnonzero(glen != n_layer_rows)[0])
                raise c.fail(f"expected {n_layer_rows[i]} gate lists (one per layer); got {glen[i]}", i, lay.gates)
            gv, gl = c.lists(lay.gates, as_float=True, arr=gouter.flatten(), rows=rec_row)
    else:
        rec_row = rows
        layer = c.ints(lay.layer)  # type: ignore[arg-type]
        ex_values, ex_lengths = c.lists(lay.experts)
        gv = gl = None
        if lay.gates:
            gv, gl = c.lists(lay.gates, as_float=True)

    def per_rec(a: np.ndarray) -> np.ndarray:
        return a[rec_row] if per_token else a

    # requests
    if lay.request is None:
        req = np.zeros(rec_row.size, np.int64)
        names = [lay.request_value or ""]
    else:
        arr = c.get(lay.request)
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        if pa.types.is_integer(arr.type):
            arr = pc.cast(arr, pa.string())
        elif not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            raise c.fail(f"expected request ids (strings or integers); got a column of {arr.type}", None, lay.request)
        enc = arr.dictionary_encode()
        req = per_rec(enc.indices.to_numpy(zero_copy_only=False).astype(np.int64))
        names = enc.dictionary.to_pylist()
    position = per_rec(c.ints(lay.position)) if lay.position else None
    phase_text: dict[int, str] = {}
    if lay.phase:
        arr = c.get(lay.phase)
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            raise c.fail(f"expected 'decode' or 'prefill'; got a column of {arr.type}", None, lay.phase)
        codes = np.full(n, -1, np.int8)
        for code, name in enumerate(PHASES):
            codes[np.asarray(pc.equal(arr, name))] = code
        if (codes < 0).any():
            i = int(np.flatnonzero(codes < 0)[0])
            phase_text[int(np.searchsorted(rec_row, i)) if per_token else i] = repr(arr[i].as_py())
        phase = per_rec(codes)
    else:
        phase = np.full(rec_row.size, default_phase, np.int8)
    token_id = None
    if lay.token_id:  # a missing token id is unknown (-1), as in the trace
        arr = table[lay.token_id].combine_chunks()
        arr = arr.fill_null(-1) if arr.null_count < len(arr) else None
        token_id = None if arr is None else per_rec(c.ints(lay.token_id, arr=arr))
    category = None
    cat_names: list[str] = []
    if lay.category:
        arr = c.get(lay.category)
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        arr = pc.cast(arr, pa.string())
        enc = arr.dictionary_encode()
        category = per_rec(enc.indices.to_numpy(zero_copy_only=False).astype(np.int64))
        cat_names = enc.dictionary.to_pylist()
    elif file_category is not None:
        category = np.zeros(rec_row.size, np.int64)
        cat_names = [file_category]
    return Records(request=req, request_names=names, position=position, layer=layer, ex_values=ex_values,
                   ex_lengths=ex_lengths, gate_values=gv, gate_lengths=gl, phase=phase, token_id=token_id,
                   file=np.zeros(rec_row.size, np.int32), row=rec_row, sources=[src], record_number=[record_number],
                   fields=fields, category=category, category_names=cat_names, phase_text=phase_text)


# ----------------------------------------------------------------------------- the importer
def import_columnar(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    mapping: dict[str, str] | str | None = None,
    n_layers: int | None = None,
    n_experts: int | None = None,
    top_k: int | None = None,
    phase: str = "decode",
    category_from: str | None = None,
    skip_bad_rows: bool = False,
    provenance: dict[str, Any] | None = None,
) -> tuple[RoutingTrace, ImportReport]:
    """Read routing rows from Parquet, CSV or JSON Lines files with a column mapping.

    Parameters
    ----------
    paths
        Files (``.parquet``/``.pq``, ``.csv``, ``.jsonl``/``.json``/``.ndjson``), or a directory of them.
    mapping
        ``{field: column}`` or the ``--map`` text ``"request=req_id,experts=topk_ids"``; see the module
        docstring for the fields, their defaults, ``@file`` and ``@const:NAME``.
    n_layers, n_experts, top_k
        The model's shape; each one left ``None`` is inferred and named in the report.
    phase
        The phase of rows without a phase column (``"decode"`` or ``"prefill"``).
    category_from
        ``"file"`` (the file's name) or a column holding each request's category; written to the
        trace's ``provenance["categories"]``.
    skip_bad_rows
        Count and skip records that fail a check instead of raising.
    provenance
        Extra metadata for the trace manifest.
    """
    _check_shape_args(n_layers, n_experts, top_k)
    default_phase = phase_code(phase)
    if isinstance(mapping, str) or mapping is None:
        mapping = parse_map(mapping)
    files = file_list(paths, ["*.parquet", "*.pq", "*.csv", "*.jsonl", "*.json", "*.ndjson"])
    _unique_stems(files, mapping)
    parts = []
    n_rows = 0
    for f in files:
        kind = file_kind(f)
        try:
            table, number = read_any(f, kind)
        except _JsonFallback:
            message, line = _json_reason(f)
            raise ValidationError(message, source=str(f), record=line) from None
        lay = resolve_layout(table.column_names, mapping, str(f), f.stem, category_from)
        parts.append(table_records(table, lay, str(f), number, default_phase,
                                   f.stem if category_from == "file" else None))
        n_rows += table.num_rows
        del table
    recs = concat_records(parts)
    notes = []
    if "phase" not in recs.fields:
        notes.append(f"no phase column: every token imported as {phase} (--phase)")
    if recs.position is None:
        notes.append("no position column: a row's position is its rank among the rows of the same request and "
                     "layer, in file order")
    reading = (f"one record per {'token (a list of ids per layer)' if 'layer' not in recs.fields else 'token and layer'}; "
               "replayed as recorded, in position order per request")
    return assemble(recs, fmt="columnar", n_layers=n_layers, n_experts=n_experts, top_k=top_k,
                    skip_bad_rows=skip_bad_rows, provenance=provenance, notes=notes, n_rows=n_rows, reading=reading,
                    categories_from=category_from)


def _unique_stems(files: Sequence[Path], mapping: dict[str, str]) -> None:
    if mapping.get("request") not in (None, "@file"):
        return
    seen: dict[str, Path] = {}
    for f in files:
        if f.stem in seen and seen[f.stem] != f:
            raise ValidationError(f"two files give the same request id {f.stem!r} (also {seen[f.stem]}); rename one "
                                  "or map a request column", source=str(f))
        seen[f.stem] = f


def _json_reason(path: Path) -> tuple[str, int | None]:
    """Why pyarrow could not read a JSON Lines file, as one line naming the record."""
    import json

    with open(path, encoding="utf-8-sig", errors="replace") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                return f"not valid JSON ({exc.msg}); the line may be truncated", line_no
            if not isinstance(rec, dict):
                return f"expected a JSON object; got {type(rec).__name__}", line_no
    return "a field changes type between records (e.g. a number in one record, a string in another)", None
