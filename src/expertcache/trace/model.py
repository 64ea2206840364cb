"""RoutingTrace: what a model did, per request, position and MoE layer (docs/design.md §1, §3).

In memory a trace is columnar, one row per routed token (request, phase,
position) with the per-layer top-k expert ids and gate weights as dense
``(n_tokens, L, k)`` arrays. On disk it is a directory with ``routes.parquet``
(one row per token and layer, the same fields as the JSON Lines interchange
format) and ``manifest.json``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ValidationError
from ..storage import (
    atomic_directory,
    read_manifest,
    read_table,
    require_columns,
    write_manifest,
    write_table,
)

__all__ = ["RoutingTrace", "PHASES", "PREFILL", "DECODE", "read_trace", "validate_trace", "select_requests"]

#: Phase codes stored in ``RoutingTrace.phase``.
PHASES = ("prefill", "decode")
PREFILL, DECODE = 0, 1
_KIND = "routing_trace"
_ROUTES = "routes.parquet"


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

    def save(self, out: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the trace as a directory (``routes.parquet`` + ``manifest.json``), atomically."""
        n, L, k = self.n_tokens, self.n_layers, self.top_k
        table = self.to_table()
        with atomic_directory(out, overwrite=overwrite) as tmp:
            entry = write_table(tmp, _ROUTES, table)
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


def validate_trace(trace: RoutingTrace, source: str) -> None:
    """Check shapes, dtypes and value ranges of a trace; raise ValidationError with the first fault."""
    L, N, k = trace.n_layers, trace.n_experts, trace.top_k
    for name, value in (("n_layers", L), ("n_experts", N), ("top_k", k)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValidationError(f"must be a positive integer; got {value!r}", source=source, field=name)
    if k > N:
        raise ValidationError(f"top_k must be <= n_experts ({N}); got {k}", source=source, field="top_k")
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


def _first(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


def read_trace(directory: str | os.PathLike[str]) -> RoutingTrace:
    """Load a trace directory written by :meth:`RoutingTrace.save`, verifying hashes and contents."""
    directory = Path(directory)
    manifest = read_manifest(directory, _KIND)
    L, N, k = manifest["n_layers"], manifest["n_experts"], manifest["top_k"]
    table = read_table(directory, manifest, _ROUTES)
    src = str(directory / _ROUTES)
    require_columns(table, {"request_id": "request id", "phase": "prefill|decode", "position": "int",
                            "layer": "int", "experts": f"list of {k} ints"}, src)
    rows = table.num_rows
    if rows % L:
        raise ValidationError(f"expected a multiple of L={L} rows (one per token and layer); got {rows}", source=src)
    n = rows // L
    try:
        layer = table["layer"].to_numpy()
        expect_layer = np.tile(np.arange(L), n)
        row = _first(layer != expect_layer)
        if row is not None:
            raise ValidationError(f"expected layer {expect_layer[row]} (rows are token-major, layers 0..L-1); "
                                  f"got {layer[row]}", source=src, record=row + 1, field="layer")
        experts = _fixed_list(table["experts"], k, src, "experts").reshape(n, L, k).astype(np.int16)
        gates = None
        if "gates" in table.column_names:
            gates = _fixed_list(table["gates"], k, src, "gates").reshape(n, L, k).astype(np.float32)
        first_rows = pa.array(np.arange(0, rows, L, dtype=np.int64))    # one row per token, not per (token, layer)
        req_col = table["request_id"].take(first_rows).combine_chunks()
        if pa.types.is_dictionary(req_col.type):
            req_col = req_col.cast(pa.string())
        req_strings = req_col.to_pylist()
        request_ids = tuple(dict.fromkeys(req_strings))
        lookup = {r: i for i, r in enumerate(request_ids)}
        request = np.fromiter((lookup[r] for r in req_strings), dtype=np.int32, count=n)
        phase_col = table["phase"].take(first_rows).combine_chunks()
        if pa.types.is_dictionary(phase_col.type):
            phase_col = phase_col.cast(pa.string())
        phase_names = phase_col.to_pylist()
        bad = [i for i, p in enumerate(phase_names) if p not in PHASES]
        if bad:
            raise ValidationError(f"phase must be 'prefill' or 'decode'; got {phase_names[bad[0]]!r}",
                                  source=src, record=bad[0] * L + 1, field="phase")
        phase = np.array([PHASES.index(p) for p in phase_names], dtype=np.int8)
        position = table["position"].to_numpy()[::L].astype(np.int32)
        if "token_id" in table.column_names:
            token_id = table["token_id"].fill_null(-1).to_numpy()[::L].astype(np.int64)
        else:
            token_id = np.full(n, -1, dtype=np.int64)
        probs = entropy = margin = None
        if "probs" in table.column_names:
            probs = _fixed_list(table["probs"], k, src, "probs").reshape(n, L, k).astype(np.float32)
        if "entropy" in table.column_names:
            entropy = table["entropy"].to_numpy().reshape(n, L).astype(np.float32)
        if "margin" in table.column_names:
            margin = table["margin"].to_numpy().reshape(n, L).astype(np.float32)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise ValidationError(f"unexpected column type ({exc})", source=src) from None
    return RoutingTrace(L, N, k, request_ids, request, phase, position, experts, gates, token_id,
                        provenance=manifest.get("provenance", {}), probs=probs, entropy=entropy, margin=margin)


def _fixed_list(column: pa.ChunkedArray, k: int, src: str, name: str) -> np.ndarray:
    arr = column.combine_chunks()
    if arr.null_count:
        raise ValidationError("null entries are not allowed", source=src, field=name)
    if pa.types.is_fixed_size_list(arr.type):
        if arr.type.list_size != k:
            raise ValidationError(f"expected lists of top_k={k}; got {arr.type.list_size}", source=src, field=name)
        return arr.flatten().to_numpy(zero_copy_only=False)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        lengths = arr.value_lengths().to_numpy(zero_copy_only=False)
        row = _first(lengths != k)
        if row is not None:
            raise ValidationError(f"expected {k} entries (top_k); got {lengths[row]}", source=src,
                                  record=row + 1, field=name)
        return arr.flatten().to_numpy(zero_copy_only=False)
    raise ValidationError(f"expected a list column; got {arr.type}", source=src, field=name)


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
    return RoutingTrace(trace.n_layers, trace.n_experts, trace.top_k,
                        tuple(trace.request_ids[i] for i in indices), remap[trace.request[rows]],
                        trace.phase[rows], trace.position[rows], trace.experts[rows],
                        None if trace.gates is None else trace.gates[rows], trace.token_id[rows], prov,
                        *(None if a is None else a[rows] for a in (trace.probs, trace.entropy, trace.margin)))
