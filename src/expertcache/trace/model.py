"""RoutingTrace: what a model did, per request, position and MoE layer (docs/design.md §1, §3).

In memory a trace is columnar, one row per routed token (request, phase,
position) with the per-layer top-k expert ids and gate weights as dense
``(n_tokens, L, k)`` arrays. On disk it is a directory with ``routes.parquet``
(one row per token and layer, the same fields as the JSON Lines interchange
format) and ``manifest.json``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import IntegrityError, ValidationError
from ..storage import (
    atomic_directory,
    check_model_shape,
    open_table,
    read_manifest,
    require_columns,
    write_manifest,
    write_table,
)

_log = logging.getLogger(__name__)

__all__ = ["RoutingTrace", "PHASES", "PREFILL", "DECODE", "read_trace", "validate_trace", "select_requests"]

#: Phase codes stored in ``RoutingTrace.phase``.
PHASES = ("prefill", "decode")
PREFILL, DECODE = 0, 1
_KIND = "routing_trace"
_ROUTES = "routes.parquet"
#: What one row of ``routes.parquet`` is (its Parquet metadata, docs/design.md §3).
ROUTES_ROW = "one (token, layer): the top-k experts the router chose for that token at that layer"


@dataclass(frozen=True, eq=False)
class RoutingTrace:
    """Per-token routing of a set of requests through ``L`` MoE layers.

    Rows are grouped by request (in input order) and sorted by position
    inside each request.

    Attributes
    ----------
    n_layers, n_experts, top_k
        ``L`` MoE layers, ``N`` routed experts per layer, ``k`` experts per token.
    request_ids
        Request identifiers, in input (arrival) order.
    request
        ``int32[n_tokens]``: index into ``request_ids`` of each row.
    phase
        ``int8[n_tokens]``: 0 = prefill, 1 = decode.
    position
        ``int32[n_tokens]``: token position inside its request (strictly increasing per request).
    experts
        ``int16[n_tokens, L, k]``: selected expert ids, distinct per (token, layer).
    gates
        ``float32[n_tokens, L, k]`` gate weights aligned with ``experts``, or ``None``.
    token_id
        ``int64[n_tokens]``: emitted token id, -1 where unknown.
    provenance
        Free-form metadata stored in the manifest (model id, revision, generator, ...).
    probs
        Optional ``float32[n_tokens, L, k]``: router probability of each selected expert
        (``expertcache collect`` records it; docs/collect.md defines it per architecture).
    entropy
        Optional ``float32[n_tokens, L]``: entropy (nats) of the router's distribution.
    margin
        Optional ``float32[n_tokens, L]``: largest minus second-largest router probability.
    """

    n_layers: int
    n_experts: int
    top_k: int
    request_ids: tuple[str, ...]
    request: np.ndarray
    phase: np.ndarray
    position: np.ndarray
    experts: np.ndarray
    gates: np.ndarray | None
    token_id: np.ndarray
    provenance: dict[str, Any] = field(default_factory=dict)
    probs: np.ndarray | None = None
    entropy: np.ndarray | None = None
    margin: np.ndarray | None = None

    def __post_init__(self) -> None:
        validate_trace(self, source="RoutingTrace")

    @classmethod
    def _trusted(cls, *args: Any, **kwargs: Any) -> RoutingTrace:
        """A trace whose routes are rows of a checked trace (:func:`select_requests`): the per-token checks run
        (request, phase, position, contiguity: O(tokens)), the passes over every route (expert ranges and
        distinctness, finite gates: O(tokens * L * k), a sort among them) do not."""
        obj = cls.__new__(cls)
        names = list(cls.__dataclass_fields__)
        values = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
        values["provenance"] = {}
        values.update(zip(names, args, strict=False))
        values.update(kwargs)
        for name in names:
            object.__setattr__(obj, name, values[name])
        validate_trace(obj, source="RoutingTrace", routes=False)
        return obj

    @property
    def n_tokens(self) -> int:
        """Number of routed token rows (all phases)."""
        return int(self.request.shape[0])

    @property
    def n_requests(self) -> int:
        """Number of requests."""
        return len(self.request_ids)

    def decode_rows(self, request_index: int) -> np.ndarray:
        """Row indices of the decode tokens of one request, in position order."""
        return np.flatnonzero((self.request == request_index) & (self.phase == DECODE))

    def to_table(self) -> pa.Table:
        """The ``routes.parquet`` table: one row per (token, layer), token-major."""
        n, L, k = self.n_tokens, self.n_layers, self.top_k
        rows = n * L
        req_idx = np.repeat(self.request, L)
        columns: dict[str, pa.Array] = {
            "request_id": pa.DictionaryArray.from_arrays(
                pa.array(req_idx, pa.int32()), pa.array(list(self.request_ids), pa.string())
            ),
            "phase": pa.DictionaryArray.from_arrays(
                pa.array(np.repeat(self.phase, L).astype(np.int32)), pa.array(list(PHASES))
            ),
            "position": pa.array(np.repeat(self.position, L), pa.int32()),
            "layer": pa.array(np.tile(np.arange(L, dtype=np.int16), n), pa.int16()),
            "experts": pa.FixedSizeListArray.from_arrays(
                pa.array(self.experts.reshape(-1), pa.int16()), k
            ),
        }
        if self.gates is not None:
            columns["gates"] = pa.FixedSizeListArray.from_arrays(
                pa.array(self.gates.reshape(-1), pa.float32()), k
            )
        tok = np.repeat(self.token_id, L)
        columns["token_id"] = pa.array(tok, pa.int64(), mask=tok < 0)
        if self.probs is not None:
            columns["probs"] = pa.FixedSizeListArray.from_arrays(
                pa.array(self.probs.reshape(-1), pa.float32()), k
            )
        if self.entropy is not None:
            columns["entropy"] = pa.array(self.entropy.reshape(-1), pa.float32())
        if self.margin is not None:
            columns["margin"] = pa.array(self.margin.reshape(-1), pa.float32())
        table = pa.table(columns)
        assert table.num_rows == rows
        return table

    def to_arrow(self) -> pa.Table:
        """:meth:`to_table`: one row per (token, layer), the columns of ``routes.parquet``."""
        return self.to_table()

    def to_pandas(self) -> Any:
        """:meth:`to_arrow` as a pandas DataFrame (needs pandas: ``pip install pandas``)."""
        from ..frames import arrow_to_pandas

        return arrow_to_pandas(self.to_table())

    def __repr__(self) -> str:
        """A summary (shape and sizes); the arrays are in the attributes and :meth:`to_arrow`."""
        extra = [name for name in ("gates", "probs", "entropy", "margin") if getattr(self, name) is not None]
        return (f"RoutingTrace(L={self.n_layers}, N={self.n_experts}, k={self.top_k}, n_requests={self.n_requests}, "
                f"n_tokens={self.n_tokens}, decode_tokens={int((self.phase == DECODE).sum())}, "
                f"arrays=experts{''.join(', ' + e for e in extra)}, provenance=<{len(self.provenance)} keys>)")

    def save(self, out: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the trace as a directory (``routes.parquet`` + ``manifest.json``), atomically."""
        n, L, k = self.n_tokens, self.n_layers, self.top_k
        table = self.to_table()
        with atomic_directory(out, overwrite=overwrite) as tmp:
            entry = write_table(tmp, _ROUTES, table, ROUTES_ROW, shape=(L, self.n_experts, k))
            write_manifest(
                tmp,
                {
                    "kind": _KIND,
                    "n_layers": L,
                    "n_experts": self.n_experts,
                    "top_k": k,
                    "n_requests": self.n_requests,
                    "n_tokens": n,
                    "has_gates": self.gates is not None,
                    "provenance": self.provenance,
                    "files": {_ROUTES: entry},
                },
            )
        return Path(out)


def validate_trace(trace: RoutingTrace, source: str, routes: bool = True) -> None:
    """Check shapes, dtypes and value ranges of a trace; raise ValidationError with the first fault.

    ``routes=False`` skips the passes over every route (expert ids in range and distinct, gates finite), for routes
    taken from a checked trace."""
    L, N, k = trace.n_layers, trace.n_experts, trace.top_k
    for name, value in (("n_layers", L), ("n_experts", N), ("top_k", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValidationError(f"must be a positive integer; got {value!r}", source=source, field=name)
    if k > N:
        raise ValidationError(f"top_k must be <= n_experts ({N}); got {k}", source=source, field="top_k")
    check_model_shape(L, N, k, source=source)
    n = trace.request.shape[0]
    expected = {
        "request": (n,),
        "phase": (n,),
        "position": (n,),
        "token_id": (n,),
        "experts": (n, L, k),
    }
    if trace.gates is not None:
        expected["gates"] = (n, L, k)
    if trace.probs is not None:
        expected["probs"] = (n, L, k)
    for name, value in (("entropy", trace.entropy), ("margin", trace.margin)):
        if value is not None:
            expected[name] = (n, L)
    for name, shape in expected.items():
        arr = getattr(trace, name)
        if not isinstance(arr, np.ndarray) or arr.shape != shape:
            got = getattr(arr, "shape", type(arr).__name__)
            raise ValidationError(f"expected an array of shape {shape}; got {got}", source=source, field=name)
    if n == 0:
        raise ValidationError("the trace holds no routed tokens", source=source)
    row = _first(~((trace.request >= 0) & (trace.request < len(trace.request_ids))))
    if row is not None:
        raise ValidationError("request index out of range", source=source, record=row + 1, field="request")
    row = _first(~np.isin(trace.phase, (PREFILL, DECODE)))
    if row is not None:
        raise ValidationError("phase must be 0 (prefill) or 1 (decode)", source=source, record=row + 1, field="phase")
    row = _first(trace.position < 0)
    if row is not None:
        raise ValidationError(f"position must be >= 0; got {trace.position[row]}", source=source,
                              record=row + 1, field="position")
    if routes:
        _validate_routes(trace, N, source)
    # Rows grouped by request, positions strictly increasing inside a request.
    same = trace.request[1:] == trace.request[:-1]
    row = _first(same & (trace.position[1:] <= trace.position[:-1]))
    if row is not None:
        raise ValidationError(
            f"positions must strictly increase within a request; got {trace.position[row + 1]} "
            f"after {trace.position[row]}", source=source, record=row + 2, field="position")
    starts = trace.request[np.r_[True, ~same]]
    if np.unique(starts).shape[0] != starts.shape[0]:
        raise ValidationError("rows of a request must be contiguous", source=source, field="request")
    row = _first(same & (trace.phase[1:] < trace.phase[:-1]))
    if row is not None:
        raise ValidationError("a prefill token cannot follow a decode token of the same request",
                              source=source, record=row + 2, field="phase")


def _validate_routes(trace: RoutingTrace, N: int, source: str) -> None:
    """Every route's expert ids in ``[0, N)`` and distinct, its gates finite."""
    bad = (trace.experts < 0) | (trace.experts >= N)
    row = _first(bad.any(axis=(1, 2)))
    if row is not None:
        raise ValidationError(f"expert id must be in [0, {N}); got {trace.experts[row][bad[row]][0]}",
                              source=source, record=row + 1, field="experts")
    srt = np.sort(trace.experts, axis=2)
    row = _first((srt[:, :, 1:] == srt[:, :, :-1]).any(axis=(1, 2)))
    if row is not None:
        raise ValidationError("expert ids of one token and layer must be distinct", source=source,
                              record=row + 1, field="experts")
    if trace.gates is not None:
        row = _first(~np.isfinite(trace.gates).all(axis=(1, 2)))
        if row is not None:
            raise ValidationError("gate weights must be finite numbers (NaN or inf found)", source=source,
                                  record=row + 1, field="gates")


def _first(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


def read_trace(directory: str | os.PathLike[str]) -> RoutingTrace:
    """Load a trace directory written by :meth:`RoutingTrace.save`, verifying hashes and contents.

    Every column is checked once, vectorised, before it is converted (docs/safety.md): its Arrow type
    (integers where ids and positions are stored, floats for weights), no nulls (``token_id`` may be
    null = unknown), values within the stored type and the model (expert ids in ``[0, N)``, positions
    in ``[0, 2**31)``, token ids in ``[0, 2**63)``), per-token columns equal on the ``L`` rows of a
    token, and the row and request counts the manifest declares.
    """
    directory = Path(directory)
    manifest = read_manifest(directory, _KIND)
    L, N, k = manifest["n_layers"], manifest["n_experts"], manifest["top_k"]
    _log.info("reading trace %s (L = %s, N = %s, k = %s)", directory, L, N, k)
    src = str(directory / _ROUTES)
    table = _Columns(open_table(directory, manifest, _ROUTES), src)
    require_columns(table.empty_table(), {"request_id": "request id", "phase": "prefill|decode", "position": "int",
                                          "layer": "int", "experts": f"list of {k} ints"}, src)
    rows = table.num_rows
    if rows % L:
        raise ValidationError(f"expected a multiple of L={L} rows (one per token and layer); got {rows}", source=src)
    n = rows // L
    for key, want in (("n_tokens", n),):
        declared = manifest.get(key)
        if declared is not None and declared != want:
            raise ValidationError(f"manifest declares {declared!r}; the data holds {want}", source=src, field=key)
    try:
        layer = _int_column(table, "layer", 0, L, src)
        expect_layer = np.tile(np.arange(L), n)
        row = _first(layer != expect_layer)
        if row is not None:
            raise ValidationError(f"expected layer {expect_layer[row]} (rows are token-major, layers 0..L-1); "
                                  f"got {layer[row]}", source=src, record=row + 1, field="layer")
        experts = _fixed_list(table["experts"], k, src, "experts", integer=(0, N)).reshape(n, L, k).astype(
            np.int16, copy=False)            # (a new array already: converted only where stored wider)
        gates = None
        if "gates" in table.column_names:
            gates = _fixed_list(table["gates"], k, src, "gates").reshape(n, L, k).astype(np.float32, copy=False)
        request_ids, request = _request_column(table["request_id"], n, L, src)
        phase_col = table["phase"].combine_chunks()
        if phase_col.null_count:
            raise ValidationError("null entries are not allowed", source=src, record=_first_null(phase_col),
                                  field="phase")
        if pa.types.is_dictionary(phase_col.type):
            phase_col = phase_col.cast(pa.string())
        if not (pa.types.is_string(phase_col.type) or pa.types.is_large_string(phase_col.type)):
            raise ValidationError(f"expected 'prefill' or 'decode' strings; got {phase_col.type}", source=src,
                                  field="phase")
        phase_all = np.full(rows, -1, dtype=np.int8)
        for code, name in enumerate(PHASES):
            phase_all[pc.equal(phase_col, name).to_numpy(zero_copy_only=False)] = code
        row = _first(phase_all < 0)
        if row is not None:
            raise ValidationError(f"phase must be 'prefill' or 'decode'; got {_clip(phase_col[row].as_py())}",
                                  source=src, record=row + 1, field="phase")
        _same_per_token(phase_all, n, L, src, "phase")
        phase = phase_all[::L]
        position_all = _int_column(table, "position", 0, 2 ** 31, src)
        _same_per_token(position_all, n, L, src, "position")
        position = position_all[::L].astype(np.int32)
        if "token_id" in table.column_names:
            tok_all = _int_column(table, "token_id", 0, 2 ** 63, src, nullable=True)
            _same_per_token(tok_all, n, L, src, "token_id")
            token_id = tok_all[::L]
        else:
            token_id = np.full(n, -1, dtype=np.int64)
        probs = entropy = margin = None
        if "probs" in table.column_names:
            probs = _fixed_list(table["probs"], k, src, "probs").reshape(n, L, k).astype(np.float32, copy=False)
        if "entropy" in table.column_names:
            entropy = _float_column(table, "entropy", src).reshape(n, L)
        if "margin" in table.column_names:
            margin = _float_column(table, "margin", src).reshape(n, L)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError) as exc:
        raise ValidationError(f"unexpected column type ({_clip(str(exc))})", source=src) from None
    declared = manifest.get("n_requests")
    if declared is not None and declared != len(request_ids):
        raise ValidationError(f"manifest declares {declared!r}; the data holds {len(request_ids)} requests",
                              source=src, field="n_requests")
    pa.default_memory_pool().release_unused()
    return RoutingTrace(L, N, k, request_ids, request, phase, position, experts, gates, token_id,
                        provenance=manifest.get("provenance", {}), probs=probs, entropy=entropy, margin=margin)


#: Rows of the routes table decoded at a time (:class:`_Columns`).
_READ_ROWS = 1 << 16


class _Columns:
    """The routes table, read one column at a time when a column is asked for and not kept (the checks and
    conversions of :func:`read_trace` take each column once): the peak holds one column's decoding beside the
    arrays already built, where a whole-table read held every column (about 470 MB for a 98 MB file of 2.65 M
    rows, more than three times the trace's arrays; docs/performance.md, *Session 42*)."""

    def __init__(self, pf: Any, src: str) -> None:
        self._pf, self._src = pf, src
        self.column_names = list(pf.schema_arrow.names)
        self.num_rows = pf.metadata.num_rows

    def empty_table(self) -> pa.Table:
        """A table of no rows with the file's columns (what :func:`require_columns` reads)."""
        return self._pf.schema_arrow.empty_table()

    def __getitem__(self, name: str) -> pa.ChunkedArray:
        try:                                                 # a batch at a time: one batch's decoding buffers
            chunks = [b.column(0) for b in self._pf.iter_batches(batch_size=_READ_ROWS, columns=[name],
                                                                  use_threads=False)]
            col = pa.chunked_array(chunks, type=self._pf.schema_arrow.field(name).type)
        except (pa.ArrowInvalid, OSError) as exc:
            raise IntegrityError(f"not a readable Parquet file ({exc})", source=self._src) from None
        pa.default_memory_pool().release_unused()          # the decoding's buffers back to the system
        return col


def _clip(text: Any, n: int = 80) -> str:
    text = repr(text) if not isinstance(text, str) else text
    return text if len(text) <= n else text[:n - 3] + "..."


def _first_null(arr: pa.Array) -> int | None:
    row = _first(~np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
    return None if row is None else row + 1


def _int_column(table: pa.Table, name: str, lo: int, hi: int, src: str, nullable: bool = False) -> np.ndarray:
    """An integer column as int64, checked: integer Arrow type, no nulls (or -1 for them), values in [lo, hi)."""
    col = table[name].combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if not pa.types.is_integer(col.type):
        raise ValidationError(f"expected an integer column; got {col.type}", source=src, field=name)
    valid = None
    if col.null_count:
        if not nullable:
            raise ValidationError("null entries are not allowed", source=src, record=_first_null(col), field=name)
        valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        col = col.fill_null(lo)
    if pa.types.is_uint64(col.type):
        mx = pc.max(col).as_py()
        if mx is not None and mx >= hi:
            row = _first(np.asarray(pc.greater_equal(col, pa.scalar(hi, pa.uint64())).to_numpy(
                zero_copy_only=False), dtype=bool))
            raise ValidationError(f"must be in [{lo}, {hi}); got {mx}", source=src,
                                  record=None if row is None else row + 1, field=name)
    values = col.to_numpy(zero_copy_only=False).astype(np.int64)
    bad = (values < lo) | (values >= hi) if hi <= 2 ** 63 - 1 else values < lo
    row = _first(bad)
    if row is not None:
        raise ValidationError(f"must be in [{lo}, {hi}); got {values[row]}", source=src, record=row + 1, field=name)
    if valid is not None:
        values[~valid] = -1
    return values


def _float_column(table: pa.Table, name: str, src: str) -> np.ndarray:
    col = table[name].combine_chunks()
    if not pa.types.is_floating(col.type):
        raise ValidationError(f"expected a float column; got {col.type}", source=src, field=name)
    if col.null_count:
        raise ValidationError("null entries are not allowed", source=src, record=_first_null(col), field=name)
    return col.to_numpy(zero_copy_only=False).astype(np.float32)


def _same_per_token(values: np.ndarray, n: int, L: int, src: str, name: str) -> None:
    """The ``L`` rows of a token carry the same per-token value; the first that differs is named."""
    if L == 1:
        return
    grid = values.reshape(n, L)
    diff = grid[:, 1:] != grid[:, :1]
    tok = _first(diff.any(axis=1))
    if tok is not None:
        j = int(np.flatnonzero(diff[tok])[0]) + 1
        raise ValidationError(f"differs between the layers of one token ({grid[tok, 0]} at layer 0, "
                              f"{grid[tok, j]} at layer {j})", source=src, record=tok * L + j + 1, field=name)


def _request_column(column: pa.ChunkedArray, n: int, L: int, src: str) -> tuple[tuple[str, ...], np.ndarray]:
    """Request ids (strings, no nulls, the same on a token's L rows) and each token's request index."""
    col = column.combine_chunks()
    if col.null_count:
        raise ValidationError("null request id (every row needs one)", source=src, record=_first_null(col),
                              field="request_id")
    if pa.types.is_dictionary(col.type):
        if not (pa.types.is_string(col.type.value_type) or pa.types.is_large_string(col.type.value_type)):
            raise ValidationError(f"expected strings; got {col.type}", source=src, field="request_id")
        # the codes through the stored dictionary (its values encoded once: a dictionary may repeat a value),
        # where casting every row to a string first made one string a row
        enc = pc.dictionary_encode(col.dictionary)
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)[
            col.indices.to_numpy(zero_copy_only=False)]
    else:
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            raise ValidationError(f"expected strings; got {col.type}", source=src, field="request_id")
        enc = pc.dictionary_encode(col)
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    _same_per_token(codes, n, L, src, "request_id")
    codes = codes[::L]
    uniq, first_at, inverse = np.unique(codes, return_index=True, return_inverse=True)
    order = np.argsort(first_at, kind="stable")           # ids in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    names = enc.dictionary.to_pylist()
    request_ids = tuple(names[int(c)] for c in uniq[order])
    return request_ids, rank[inverse].astype(np.int32)


def _fixed_list(column: pa.ChunkedArray, k: int, src: str, name: str,
                integer: tuple[int, int] | None = None) -> np.ndarray:
    """The flat values of a list column of ``k`` entries per row: integers in ``integer = (lo, hi)``
    (checked before any narrowing cast), or floats (NaN allowed only where the caller checks); a new array of the
    stored type (:func:`_values`: a fixed-size list column's chunks copied once, not combined first)."""
    if column.null_count:
        raise ValidationError("null entries are not allowed", source=src, record=_first_null(column.combine_chunks()),
                              field=name)
    typ = column.type
    if pa.types.is_fixed_size_list(typ):
        if typ.list_size != k:
            raise ValidationError(f"expected lists of top_k={k}; got {typ.list_size}", source=src, field=name)
        flat = pa.chunked_array([c.flatten() for c in column.chunks], type=typ.value_type)
    elif pa.types.is_list(typ) or pa.types.is_large_list(typ):
        arr = column.combine_chunks()
        lengths = arr.value_lengths().to_numpy(zero_copy_only=False)
        row = _first(lengths != k)
        if row is not None:
            raise ValidationError(f"expected {k} entries (top_k); got {lengths[row]}", source=src,
                                  record=row + 1, field=name)
        flat = pa.chunked_array([arr.flatten()])
    else:
        raise ValidationError(f"expected a list column; got {typ}", source=src, field=name)
    if flat.null_count:
        pos = _first(~_values(pc.is_valid(flat)))
        raise ValidationError("null entries are not allowed", source=src,
                              record=None if pos is None else pos // k + 1, field=name)
    if integer is not None:
        if not pa.types.is_integer(flat.type):
            raise ValidationError(f"expected integer ids; got {flat.type}", source=src, field=name)
        lo, hi = integer
        if pa.types.is_uint64(flat.type) and (pc.max(flat).as_py() or 0) >= 2 ** 63:
            raise ValidationError(f"must be in [{lo}, {hi}); got {pc.max(flat).as_py()}", source=src, field=name)
        values = _values(flat)                         # in the stored type (the bounds compare exactly in any
        bad = values < lo                              # integer type): no int64 copy, 4x an int16 column
        bad |= values >= hi
        pos = _first(bad)
        if pos is not None:
            raise ValidationError(f"expert id must be in [{lo}, {hi}); got {values[pos]}", source=src,
                                  record=pos // k + 1, field=name)
        return values
    if not pa.types.is_floating(flat.type):
        raise ValidationError(f"expected floating-point numbers; got {flat.type}", source=src, field=name)
    return _values(flat)


def _values(flat: pa.ChunkedArray) -> np.ndarray:
    """The values of a chunked array without nulls as one new numpy array of their stored type, each chunk copied
    into it once (where combining the chunks copied them, and converting the read-only view of the result copied
    them again: ``read_trace``'s experts and gates, docs/performance.md, *Session 67*)."""
    out = np.empty(len(flat), dtype=flat.type.to_pandas_dtype())
    at = 0
    for chunk in flat.chunks:
        out[at:at + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
        at += len(chunk)
    return out


def select_requests(trace: RoutingTrace, indices: np.ndarray | list[int], note: str = "") -> RoutingTrace:
    """A new trace holding only the requests ``indices`` (in the given order)."""
    indices = [int(i) for i in indices]
    if not indices or any(i < 0 or i >= trace.n_requests for i in indices):
        raise ValidationError(f"request indices must be in [0, {trace.n_requests}) and non-empty", field="requests")
    rows = np.concatenate([np.flatnonzero(trace.request == i) for i in indices])
    remap = np.full(trace.n_requests, -1, dtype=np.int32)
    remap[indices] = np.arange(len(indices), dtype=np.int32)
    prov = dict(trace.provenance)
    if note:
        prov["selection"] = note
    # rows of a checked trace: only the per-token checks run again (a repeated index fails them: its rows are
    # not contiguous)
    return RoutingTrace._trusted(trace.n_layers, trace.n_experts, trace.top_k,
                                 tuple(trace.request_ids[i] for i in indices), remap[trace.request[rows]],
                                 trace.phase[rows], trace.position[rows], trace.experts[rows],
                                 None if trace.gates is None else trace.gates[rows], trace.token_id[rows], prov,
                                 *(None if a is None else a[rows] for a in (trace.probs, trace.entropy, trace.margin)))
