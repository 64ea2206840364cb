"""EventStream: what a cache sees under a service discipline (§2.1, docs/design.md §1, §4).

An event ``(s, l)`` is a scheduling step at one MoE layer; its expert set
``E(s, l)`` is the union of the top-k selections of the active requests, with
per-member multiplicity (how many active requests chose the expert) and gate
mass (the sum of their gate weights). Events are stored in compressed-sparse-row
form ordered by ``(s, l)``: the members of event ``i`` are
``expert[offsets[i]:offsets[i + 1]]``, in ascending expert id.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import IntegrityError, ValidationError
from ..jsonl import check_shape, int_field, int_list, iter_records
from ..storage import (
    atomic_directory,
    check_model_shape,
    open_table,
    read_manifest,
    require_columns,
    write_manifest,
    write_table,
)
from ..trace.model import _first

__all__ = ["EventStream", "concat_streams", "import_events_jsonl", "dump_events_jsonl", "read_events"]

_KIND = "event_stream"
_EVENTS = "events.parquet"
#: What one row of ``events.parquet`` is (its Parquet metadata, docs/design.md §3).
EVENTS_ROW = ("one event (step, layer): the distinct experts the active requests route to at that layer "
              "in that step, with how many requests route to each")


@dataclass(frozen=True, eq=False)
class EventStream:
    """Ordered events ``(s, l)`` with their expert sets, in CSR form.

    Attributes
    ----------
    n_layers, n_experts, top_k
        Model shape ``L, N, k``.
    step
        ``int64[n_events]``: scheduler step of each event (gaps allowed).
    layer
        ``int32[n_events]``: MoE layer of each event; ``(step, layer)`` strictly increasing.
    active
        ``int32[n_events]``: ``|A(s)|``, the number of active requests.
    logical
        ``int64[n_events]``: pre-deduplication expert assignments (``|A(s)|*k`` for decode).
    offsets
        ``int64[n_events + 1]``: CSR offsets into the member arrays.
    expert
        ``int16[n_union]``: member expert ids, ascending within an event.
    multiplicity
        ``int32[n_union]``: active requests that selected each member.
    gate_mass
        ``float32[n_union]`` summed gate weights of each member, or ``None`` if unknown.
    provenance
        Build parameters and source, stored in the manifest.
    """

    n_layers: int
    n_experts: int
    top_k: int
    step: np.ndarray
    layer: np.ndarray
    active: np.ndarray
    logical_per_event: np.ndarray
    offsets: np.ndarray
    expert: np.ndarray
    multiplicity: np.ndarray
    gate_mass: np.ndarray | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate_stream(self, "EventStream")

    @classmethod
    def _trusted(cls, *args: Any, **kwargs: Any) -> EventStream:
        """A stream from arrays already checked (:func:`read_events`) or built valid by construction (the
        schedulers): the per-event checks run (they are O(events)), the passes over every member do not."""
        obj = cls.__new__(cls)
        names = [f for f in cls.__dataclass_fields__]
        values = dict(zip(names, args, strict=False))
        values.update(kwargs)
        values.setdefault("gate_mass", None)
        values.setdefault("provenance", {})
        for name in names:
            object.__setattr__(obj, name, values[name])
        _validate_stream(obj, "EventStream", members=False)
        return obj

    # ------------------------------------------------------------------ sizes
    @property
    def n_events(self) -> int:
        """Number of events."""
        return int(self.step.shape[0])

    @property
    def n_blocks(self) -> int:
        """Size of the block universe, ``L*N``."""
        return self.n_layers * self.n_experts

    @property
    def union(self) -> int:
        """``sum |E(s,l)|``: distinct blocks touched, summed over events."""
        return int(self.expert.shape[0])

    @property
    def logical(self) -> int:
        """Expert assignments before intra-event deduplication (§2.4)."""
        return int(self.logical_per_event.sum())

    @property
    def event_size(self) -> np.ndarray:
        """``int64[n_events]``: ``|E(s,l)|`` of each event."""
        return np.diff(self.offsets)

    @property
    def event_of_access(self) -> np.ndarray:
        """``int64[n_union]``: the event index of every union access."""
        return np.repeat(np.arange(self.n_events, dtype=np.int64), self.event_size)

    @property
    def block(self) -> np.ndarray:
        """``int64[n_union]``: global block id ``l*N + e`` of every union access."""
        return np.repeat(self.layer.astype(np.int64), self.event_size) * self.n_experts + self.expert

    def members(self, i: int) -> np.ndarray:
        """Expert ids of event ``i`` (ascending)."""
        return self.expert[self.offsets[i]:self.offsets[i + 1]]

    # ----------------------------------------------------------- construction
    @classmethod
    def from_lists(
        cls,
        n_layers: int,
        n_experts: int,
        top_k: int,
        steps: Sequence[int],
        layers: Sequence[int],
        experts: Sequence[Sequence[int]],
        active: Sequence[int],
        multiplicity: Sequence[Sequence[int]] | None = None,
        gate_mass: Sequence[Sequence[float]] | None = None,
        provenance: dict[str, Any] | None = None,
    ) -> EventStream:
        """Build a stream from plain per-event lists (events must be in ``(step, layer)`` order).

        Members of each event may come in any order; they are stored ascending,
        with multiplicity and gate mass permuted alongside. Without
        ``multiplicity`` each member counts once and ``logical`` is still
        ``active*k`` per event.
        """
        sizes = np.array([len(e) for e in experts], dtype=np.int64)
        offsets = np.zeros(len(experts) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        flat = np.array([x for e in experts for x in e], dtype=np.int64)
        order = _sort_within(flat, offsets)
        mult = (np.array([x for m in multiplicity for x in m], dtype=np.int64)
                if multiplicity is not None else np.ones(flat.shape[0], dtype=np.int64))
        if mult.shape != flat.shape:
            raise ValidationError("multiplicity must have one entry per expert of each event", field="multiplicity")
        gm = None
        if gate_mass is not None:
            gm = np.array([x for g in gate_mass for x in g], dtype=np.float64)
            if gm.shape != flat.shape:
                raise ValidationError("gate_mass must have one entry per expert of each event", field="gate_mass")
            gm = gm[order].astype(np.float32)
        act = np.asarray(active, dtype=np.int64)
        if flat.size and (flat.min() < np.iinfo(np.int16).min or flat.max() > np.iinfo(np.int16).max):
            raise ValidationError(f"expert id must be in [0, {n_experts})", field="experts")
        return cls(
            int(n_layers), int(n_experts), int(top_k),
            np.asarray(steps, dtype=np.int64), np.asarray(layers, dtype=np.int32),
            act.astype(np.int32), act * int(top_k), offsets, flat[order].astype(np.int16),
            mult[order].astype(np.int32), gm, dict(provenance or {}),
        )

    def __repr__(self) -> str:
        """A summary (shape and sizes); the arrays are in the attributes and :meth:`to_arrow`."""
        steps = f"{int(self.step[0])}..{int(self.step[-1])}" if self.n_events else "-"
        return (f"EventStream(L={self.n_layers}, N={self.n_experts}, k={self.top_k}, n_events={self.n_events}, "
                f"steps={steps}, union={self.union}, logical={self.logical}, "
                f"gate_mass={self.gate_mass is not None}, provenance=<{len(self.provenance)} keys>)")

    # ------------------------------------------------------------ dataframes
    def to_arrow(self) -> pa.Table:
        """One row per event, the columns of ``events.parquet``: step, layer, active, logical and the
        member lists ``experts``, ``multiplicity`` (and ``gate_mass`` when known)."""
        cols: dict[str, pa.Array] = {
            "step": pa.array(self.step, pa.int64()),
            "layer": pa.array(self.layer, pa.int32()),
            "active": pa.array(self.active, pa.int32()),
            "logical": pa.array(self.logical_per_event, pa.int64()),
            "experts": pa.ListArray.from_arrays(pa.array(self.offsets.astype(np.int32)),
                                                pa.array(self.expert, pa.int16())),
            "multiplicity": pa.ListArray.from_arrays(pa.array(self.offsets.astype(np.int32)),
                                                     pa.array(self.multiplicity, pa.int32())),
        }
        if self.gate_mass is not None:
            cols["gate_mass"] = pa.ListArray.from_arrays(pa.array(self.offsets.astype(np.int32)),
                                                         pa.array(self.gate_mass, pa.float32()))
        return pa.table(cols)

    def to_pandas(self) -> Any:
        """:meth:`to_arrow` as a pandas DataFrame (needs pandas: ``pip install pandas``)."""
        from ..frames import arrow_to_pandas

        return arrow_to_pandas(self.to_arrow())

    # ---------------------------------------------------------------- storage
    def save(self, out: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write ``events.parquet`` + ``manifest.json`` to ``out``, atomically."""
        table = self.to_arrow()
        with atomic_directory(out, overwrite=overwrite) as tmp:
            entry = write_table(tmp, _EVENTS, table, EVENTS_ROW,
                                shape=(self.n_layers, self.n_experts, self.top_k))
            write_manifest(tmp, {
                "kind": _KIND,
                "n_layers": self.n_layers, "n_experts": self.n_experts, "top_k": self.top_k,
                "n_events": self.n_events, "union": self.union, "logical": self.logical,
                "has_gate_mass": self.gate_mass is not None,
                "provenance": self.provenance,
                "files": {_EVENTS: entry},
            })
        return Path(out)


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a Python loop (int64): e.g.
    the access indices of a selection of events, ``concat_ranges(stream.offsets[ev], stream.event_size[ev])``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if ends.size else 0, dtype=np.int64) + np.repeat(
        np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths)


def _sort_within(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Permutation sorting ``flat`` ascending inside each CSR segment."""
    seg = np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets))
    return np.lexsort((flat, seg))


def _validate_stream(s: EventStream, source: str, members: bool = True) -> None:
    L, N, k = s.n_layers, s.n_experts, s.top_k
    for name, value in (("n_layers", L), ("n_experts", N), ("top_k", k)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValidationError(f"must be a positive integer; got {value!r}", source=source, field=name)
    if N > np.iinfo(np.int16).max:
        raise ValidationError(f"at most {np.iinfo(np.int16).max} experts per layer are supported; got {N}",
                              source=source, field="n_experts")
    check_model_shape(L, N, k, source=source)
    n = s.step.shape[0]
    for name in ("layer", "active", "logical_per_event"):
        if getattr(s, name).shape != (n,):
            raise ValidationError(f"expected shape ({n},)", source=source, field=name)
    if s.offsets.shape != (n + 1,) or s.offsets[0] != 0 or s.offsets[-1] != s.expert.shape[0]:
        raise ValidationError("offsets must be a CSR offset array over expert", source=source, field="offsets")
    for name in ("multiplicity",) + (("gate_mass",) if s.gate_mass is not None else ()):
        if getattr(s, name).shape != s.expert.shape:
            raise ValidationError("expected one entry per member", source=source, field=name)
    if n == 0:
        raise ValidationError("the stream holds no events", source=source)
    _check_events(s.step, s.layer, s.active, s.offsets, s.expert, s.multiplicity, s.gate_mass,
                  s.logical_per_event, L, N, k, source, members)


def _check_events(step, layer, active, offsets, expert, mult, gate_mass, logical, L, N, k, source,
                  members: bool = True) -> None:
    """Vectorised checks of event arrays; errors name the 1-based record (event row). ``members=False``
    skips the per-member checks (ids, distinctness, multiplicities, gate mass) of arrays known valid."""
    def rec(i: int) -> int:
        return int(i) + 1

    first = _first

    i = first(step < 0)
    if i is not None:
        raise ValidationError(f"step must be >= 0; got {step[i]}", source=source, record=rec(i), field="step")
    i = first((layer < 0) | (layer >= L))
    if i is not None:
        raise ValidationError(f"layer must be in [0, {L}); got {layer[i]}", source=source, record=rec(i), field="layer")
    i = first(active < 1)
    if i is not None:
        raise ValidationError(f"active must be >= 1; got {active[i]}", source=source, record=rec(i), field="active")
    if step.shape[0] > 1:
        d_step = step[1:] - step[:-1]
        same = (d_step == 0) & (layer[1:] == layer[:-1])
        i = first(same)
        if i is not None:
            raise ValidationError(f"duplicate (step, layer) = ({step[i + 1]}, {layer[i + 1]})", source=source,
                                  record=rec(i + 1), field="layer")
        i = first((d_step < 0) | ((d_step == 0) & (layer[1:] < layer[:-1])))
        if i is not None:
            raise ValidationError(f"events must be ordered by (step, layer); ({step[i + 1]}, {layer[i + 1]}) "
                                  f"follows ({step[i]}, {layer[i]})", source=source, record=rec(i + 1), field="step")
    sizes = np.diff(offsets)
    i = first(sizes < 1)
    if i is not None:
        raise ValidationError("an event needs at least one expert", source=source, record=rec(i), field="experts")
    i = first(sizes > np.minimum(N, logical))
    if i is not None:
        raise ValidationError(f"{sizes[i]} distinct experts exceed min(N, active*k) = {min(N, int(logical[i]))}",
                              source=source, record=rec(i), field="experts")
    if not members:
        return

    def event_of(j: int) -> int:
        return int(np.searchsorted(offsets, j, side="right")) - 1

    # per-member checks a chunk of members at a time: temporaries stay O(chunk), never O(union)
    j = _first_chunked(expert.shape[0], lambda lo, hi: (expert[lo:hi] < 0) | (expert[lo:hi] >= N))
    if j is not None:
        raise ValidationError(f"expert id must be in [0, {N}); got {expert[j]}", source=source,
                              record=rec(event_of(j)), field="experts")
    if expert.shape[0] > 1:
        def repeats(lo: int, hi: int) -> np.ndarray:
            # member j + 1 (j in [lo, hi)) repeats or descends within its event (event starts excluded)
            bad = expert[lo + 1:hi + 1] <= expert[lo:hi]
            starts = offsets[np.searchsorted(offsets, lo + 1):np.searchsorted(offsets, hi + 1)]
            bad[starts - 1 - lo] = False
            return bad

        j = _first_chunked(expert.shape[0] - 1, repeats)
        if j is not None:
            raise ValidationError(f"expert ids of an event must be distinct; {expert[j + 1]} repeats",
                                  source=source, record=rec(event_of(j + 1)), field="experts")

    def bad_mult(lo: int, hi: int) -> np.ndarray:
        # each member's event's active count: the events over [lo, hi) repeated by their members in it
        e0 = int(np.searchsorted(offsets, lo, side="right")) - 1
        e1 = int(np.searchsorted(offsets, hi, side="left"))
        cut = np.clip(offsets[e0:e1 + 1], lo, hi)
        m = mult[lo:hi]
        return (m < 1) | (m > np.repeat(active[e0:e1], np.diff(cut)))

    j = _first_chunked(mult.shape[0], bad_mult)
    if j is not None:
        raise ValidationError(f"multiplicity must be in [1, active]; got {mult[j]}", source=source,
                              record=rec(event_of(j)), field="multiplicity")
    if gate_mass is not None:
        j = _first_chunked(gate_mass.shape[0], lambda lo, hi: ~np.isfinite(gate_mass[lo:hi]))
        if j is not None:
            raise ValidationError("gate mass must be finite (NaN or inf found)", source=source,
                                  record=rec(event_of(j)), field="gate_mass")


#: Members checked per pass of the per-member checks (bounds their temporaries to a few MB).
_CHECK_CHUNK = 1 << 16


#: Members summed per pass of :func:`_event_sums` (whole events; its int64 temporaries stay a few MB).
_SUM_MEMBERS = 1 << 18


def _event_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``int64[n_events]``: the sum of ``values`` over each event (every event non-empty), in int64 whatever the
    stored type, about :data:`_SUM_MEMBERS` members at a time: ``np.add.reduceat`` widens its whole input to
    int64 first (8 bytes per member at once; summing in a narrower stored type could overflow on a crafted file).
    """
    n = offsets.shape[0] - 1
    out = np.zeros(n, dtype=np.int64)
    e0 = 0
    while e0 < n:
        e1 = min(max(int(np.searchsorted(offsets, offsets[e0] + _SUM_MEMBERS, side="right")) - 1, e0 + 1), n)
        lo = offsets[e0]
        out[e0:e1] = np.add.reduceat(values[lo:offsets[e1]], offsets[e0:e1] - lo, dtype=np.int64)
        e0 = e1
    return out


def _first_chunked(n: int, bad) -> int | None:
    """The first index in ``[0, n)`` where ``bad(lo, hi)`` (a bool array over ``[lo, hi)``) is True, or None."""
    for lo in range(0, n, _CHECK_CHUNK):
        hi = min(n, lo + _CHECK_CHUNK)
        i = _first(bad(lo, hi))
        if i is not None:
            return lo + i
    return None


def read_events(directory: str | os.PathLike[str], *, gate_mass: bool = True) -> EventStream:
    """Load a stream directory written by :meth:`EventStream.save`, verifying hashes and contents.

    ``gate_mass=False`` leaves a stored ``gate_mass`` column unread (the stream's ``gate_mass`` is then ``None``):
    for a reader that never uses it, such as a replay (4 bytes per union access less resident; the file's hash is
    still checked, its gate mass values are not).

    Every column is checked once, vectorised, before conversion (docs/safety.md): integer types
    without nulls for ``step``, ``layer``, ``active``, ``logical`` and the member lists, values within
    the stored types, ``logical = active * k`` per event, multiplicities in ``[1, active]`` summing to
    ``logical`` (or all 1 where they are unknown), and the event, union and logical counts the
    manifest declares; the model shape is bounded (:func:`expertcache.storage.check_model_shape`).
    """
    directory = Path(directory)
    manifest = read_manifest(directory, _KIND)
    L, N, k = manifest["n_layers"], manifest["n_experts"], manifest["top_k"]
    pf = open_table(directory, manifest, _EVENTS)
    src = str(directory / _EVENTS)
    schema = pf.schema_arrow
    require_columns(schema.empty_table(), {"step": "int", "layer": "int", "active": "int", "logical": "int",
                                           "experts": "list of ints", "multiplicity": "list of ints"}, src)
    n_rows = pf.metadata.num_rows
    declared = manifest.get("n_events")
    if declared is not None and declared != n_rows:
        raise ValidationError(f"manifest declares {declared!r}; the data holds {n_rows} events",
                              source=src, field="n_events")
    # the member lists are decoded a row group and a column at a time into their final arrays (in the
    # stored types), so the peak is the stream itself plus one row group's column, never the whole table twice
    try:
        # the per-event columns are decoded first (checked below, in the usual order): their reader's
        # temporaries are free again before the member arrays exist
        table = pf.read(columns=["step", "layer", "active", "logical"], use_threads=False)
        offsets, flat = _member_column(pf, "experts", None, src)
        if flat.dtype == np.uint64 and flat.size and int(flat.max()) >= N:     # as a whole-table read says it
            raise ValidationError(f"expert id must be in [0, {N}); got {int(flat.max())}", source=src,
                                  field="experts")
        _, mult = _member_column(pf, "multiplicity", offsets, src)
        gm = None
        if "gate_mass" in schema.names:
            if gate_mass:
                gm = _member_column(pf, "gate_mass", offsets, src)[1].astype(np.float32, copy=False)
            else:                      # left unread: its type checked as a read would check it
                _float_lists(schema.field("gate_mass").type, src, "gate_mass")
        if table.num_rows != n_rows:
            raise IntegrityError(f"expected {n_rows} rows; found {table.num_rows}", source=src)
        arrays = {name: _int_array(table[name], src, name, hi)
                  for name, hi in (("step", 2 ** 62), ("layer", L), ("active", 2 ** 31 - 1),
                                   ("logical", 2 ** 62))}
        del table
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError,
            OverflowError, OSError) as exc:
        if isinstance(exc, ValidationError):
            raise
        raise ValidationError(f"unexpected column type ({exc})", source=src) from None
    i = _first(arrays["active"] < 1)
    if i is not None:
        raise ValidationError(f"active must be >= 1; got {arrays['active'][i]}", source=src, record=i + 1,
                              field="active")
    i = _first(arrays["logical"] != arrays["active"] * k)
    if i is not None:
        raise ValidationError(f"logical must be active * k = {int(arrays['active'][i]) * k}; got "
                              f"{arrays['logical'][i]}", source=src, record=i + 1, field="logical")
    _check_events(arrays["step"], arrays["layer"], arrays["active"], offsets, flat, mult, gm,
                  arrays["logical"], L, N, k, src)
    sizes = np.diff(offsets)
    sums = _event_sums(mult, offsets)
    ones = sums == sizes        # every multiplicity 1 (they are >= 1, checked above): unknown multiplicities
    i = _first((sums != arrays["logical"]) & ~ones)
    if i is not None:
        raise ValidationError(f"multiplicities must sum to logical = active * k = {arrays['logical'][i]} (or all "
                              f"be 1 where unknown); got {sums[i]}", source=src, record=i + 1, field="multiplicity")
    for key, got in (("union", int(flat.shape[0])), ("logical", int(arrays["logical"].sum()))):
        declared = manifest.get(key)
        if declared is not None and declared != got:
            raise ValidationError(f"manifest declares {declared!r}; the data holds {got}", source=src, field=key)
    # every check above ran once, on the stored types; the stream is built without a second pass
    return EventStream._trusted(L, N, k, arrays["step"], arrays["layer"].astype(np.int32),
                                arrays["active"].astype(np.int32), arrays["logical"], offsets,
                                flat.astype(np.int16, copy=False), mult.astype(np.int32, copy=False), gm,
                                manifest.get("provenance", {}))


#: Events decoded per batch by :func:`_member_column`: the reader's temporaries stay a few MB.
_READ_ROWS = 1 << 11


def _member_column(pf: Any, name: str, offsets: np.ndarray | None, src: str) -> tuple[np.ndarray, np.ndarray]:
    """CSR offsets and flat values of the list column ``name`` of ``pf``, decoded :data:`_READ_ROWS` events at
    a time (a whole column chunk of a large stream decodes through temporaries several times its size).

    ``offsets=None`` reads the ``experts`` column (a list of integers, its offsets returned); otherwise the
    column must have one entry per expert of each event (the given offsets) and integer (``multiplicity``)
    or floating-point (``gate_mass``) values. The values keep their stored type. The checks and messages
    are those of a whole-table read.
    """
    integer = name != "gate_mass"
    col_type = pf.schema_arrow.field(name).type
    if not (pa.types.is_list(col_type) or pa.types.is_large_list(col_type)):
        if offsets is None:
            raise ValidationError(f"expected a list column; got {col_type}", source=src, field=name)
        raise ValidationError("must have one entry per expert of each event", source=src, field=name)
    value_type = col_type.value_type
    if offsets is None and not pa.types.is_integer(value_type):
        raise ValidationError(f"expected integer ids; got {value_type}", source=src, field=name)
    md = pf.metadata
    columns = [c for c in range(md.num_columns) if md.schema.column(c).path.split(".")[0] == name]
    bound = sum(md.row_group(g).column(columns[0]).num_values for g in range(md.num_row_groups)) \
        if columns else 0
    values = np.empty(bound, dtype=value_type.to_pandas_dtype())
    out_offsets = np.zeros(md.num_rows + 1, dtype=np.int64) if offsets is None else offsets
    row = 0
    n_values = 0
    for batch in pf.iter_batches(batch_size=_READ_ROWS, columns=[name], use_threads=False):
        for chunk in (batch.column(0),):
            if chunk.null_count:
                if offsets is None:
                    raise ValidationError("null event", source=src, field=name)
                raise ValidationError("must have one entry per expert of each event", source=src, field=name)
            o = chunk.offsets.to_numpy().astype(np.int64)
            local = o - o[0]
            n = chunk.__len__()
            if offsets is None:
                out_offsets[row + 1:row + n + 1] = n_values + local[1:]
            elif not np.array_equal(offsets[row:row + n + 1] - offsets[row], local):
                raise ValidationError("must have one entry per expert of each event", source=src, field=name)
            flat = chunk.flatten()
            if flat.null_count:
                raise ValidationError("null entries are not allowed", source=src, field=name)
            if offsets is not None and integer and not pa.types.is_integer(flat.type):
                raise ValidationError(f"expected integers; got {flat.type}", source=src, field=name)
            if offsets is not None and not integer and not pa.types.is_floating(flat.type):
                raise ValidationError(f"expected floating-point numbers; got {flat.type}", source=src, field=name)
            m = len(flat)
            if n_values + m > values.shape[0]:      # a footer that undercounts: grow (never on valid files)
                values = np.concatenate([values[:n_values], np.empty(n_values + m - values.shape[0],
                                                                     dtype=values.dtype)])
            values[n_values:n_values + m] = flat.to_numpy(zero_copy_only=False)
            n_values += m
            row += n
    if offsets is not None and n_values != offsets[-1]:
        raise ValidationError("must have one entry per expert of each event", source=src, field=name)
    return out_offsets, values[:n_values]


def _float_lists(col_type: pa.DataType, src: str, name: str) -> None:
    """Refuse a column type other than a list of floating-point numbers, with :func:`_member_column`'s messages
    (for a column left unread)."""
    if not (pa.types.is_list(col_type) or pa.types.is_large_list(col_type)):
        raise ValidationError("must have one entry per expert of each event", source=src, field=name)
    if not pa.types.is_floating(col_type.value_type):
        raise ValidationError(f"expected floating-point numbers; got {col_type.value_type}", source=src, field=name)


def _int_array(column: pa.ChunkedArray, src: str, name: str, hi: int) -> np.ndarray:
    """An integer column without nulls as int64, values below ``hi`` (lower bounds: :func:`_check_events`)."""
    col = column.combine_chunks()
    if not pa.types.is_integer(col.type):
        raise ValidationError(f"expected an integer column; got {col.type}", source=src, field=name)
    if col.null_count:
        raise ValidationError("null entries are not allowed", source=src, field=name)
    if pa.types.is_uint64(col.type) and (pc.max(col).as_py() or 0) >= hi:
        raise ValidationError(f"must be < {hi}; got {pc.max(col).as_py()}", source=src, field=name)
    values = col.to_numpy(zero_copy_only=False).astype(np.int64)
    i = _first(values >= hi)
    if i is not None:
        raise ValidationError(f"must be < {hi}; got {values[i]}", source=src, record=i + 1, field=name)
    return values


def concat_streams(first: EventStream, second: EventStream, provenance: dict[str, Any] | None = None) -> EventStream:
    """``first`` then ``second`` as one stream; the steps of ``second`` follow the last step of ``first``.

    The usual use is a warm-up prefix: replay the result with
    ``ReplayConfig(warmup_events=first.n_events)`` to count only ``second``.
    """
    if (first.n_layers, first.n_experts, first.top_k) != (second.n_layers, second.n_experts, second.top_k):
        raise ValidationError(f"cannot join streams of different shapes: L,N,k = {first.n_layers},"
                              f"{first.n_experts},{first.top_k} and {second.n_layers},{second.n_experts},"
                              f"{second.top_k}")
    shift = (int(first.step[-1]) + 1 - int(second.step[0])) if first.n_events and second.n_events else 0
    gm = (np.concatenate([first.gate_mass, second.gate_mass])
          if first.gate_mass is not None and second.gate_mass is not None else None)
    return EventStream(
        first.n_layers, first.n_experts, first.top_k,
        np.concatenate([first.step, second.step + shift]), np.concatenate([first.layer, second.layer]),
        np.concatenate([first.active, second.active]),
        np.concatenate([first.logical_per_event, second.logical_per_event]),
        np.concatenate([first.offsets, second.offsets[1:] + first.offsets[-1]]),
        np.concatenate([first.expert, second.expert]),
        np.concatenate([first.multiplicity, second.multiplicity]), gm,
        dict(provenance if provenance is not None else second.provenance),
    )


def import_events_jsonl(path: str | os.PathLike[str], n_layers: int, n_experts: int, top_k: int) -> EventStream:
    """Read event records ``{"step", "layer", "experts", "active"}`` (+ optional
    ``"multiplicity"``, ``"gate_mass"``) from JSON Lines, e.g. a hand-written stream.

    Records may come in any order; they are sorted by ``(step, layer)``.
    Logical assignments are ``active*k`` per event; given multiplicities must
    sum to it.
    """
    src = str(path)
    L, N, k = n_layers, n_experts, top_k
    check_shape(L, N, k)
    steps, layers, actives, lines = [], [], [], []
    experts: list[np.ndarray] = []
    mults: list[np.ndarray] = []
    gms: list[np.ndarray] = []
    has_gm: bool | None = None
    seen: dict[tuple[int, int], int] = {}
    for line_no, rec in iter_records(path):
        step = int_field(rec, "step", src, line_no, lo=0)
        layer = int_field(rec, "layer", src, line_no, lo=0, hi=L)
        active = int_field(rec, "active", src, line_no, lo=1)
        ex = int_list(rec, "experts", src, line_no, None, N)
        if ex.shape[0] > min(N, active * k):
            raise ValidationError(f"{ex.shape[0]} distinct experts exceed min(N, active*k) = {min(N, active * k)}",
                                  source=src, record=line_no, field="experts")
        if (step, layer) in seen:
            raise ValidationError(f"duplicate (step, layer) = ({step}, {layer}); first on line {seen[(step, layer)]}",
                                  source=src, record=line_no, field="layer")
        seen[(step, layer)] = line_no
        m = rec.get("multiplicity")
        if m is None:
            m_arr = np.ones(ex.shape[0], dtype=np.int32)
        else:
            if (not isinstance(m, list) or len(m) != ex.shape[0]
                    or any(isinstance(v, bool) or not isinstance(v, int) for v in m)):
                raise ValidationError(f"expected {ex.shape[0]} integers (one per expert)", source=src,
                                      record=line_no, field="multiplicity")
            m_arr = np.array(m, dtype=np.int64)
            if (m_arr < 1).any() or (m_arr > active).any():
                raise ValidationError(f"each multiplicity must be in [1, active={active}]", source=src,
                                      record=line_no, field="multiplicity")
            if int(m_arr.sum()) != active * k:
                raise ValidationError(f"multiplicities must sum to active*k = {active * k}; got {int(m_arr.sum())}",
                                      source=src, record=line_no, field="multiplicity")
        g = rec.get("gate_mass")
        if has_gm is None:
            has_gm = g is not None
        elif has_gm != (g is not None):
            raise ValidationError("gate_mass must be given on every record or on none", source=src,
                                  record=line_no, field="gate_mass")
        if g is not None:
            if not isinstance(g, list) or len(g) != ex.shape[0] or any(
                    isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in g):
                raise ValidationError(f"expected {ex.shape[0]} finite numbers (one per expert)", source=src,
                                      record=line_no, field="gate_mass")
            gms.append(np.array(g, dtype=np.float64))
        steps.append(step)
        layers.append(layer)
        actives.append(active)
        lines.append(line_no)
        experts.append(ex)
        mults.append(m_arr)
    if not steps:
        raise ValidationError("no event records found; expected one JSON object per line", source=src)
    order = np.lexsort((np.array(layers), np.array(steps)))
    return EventStream.from_lists(
        L, N, k, np.array(steps)[order], np.array(layers)[order], [experts[i] for i in order],
        np.array(actives)[order], multiplicity=[mults[i] for i in order],
        gate_mass=[gms[i] for i in order] if has_gm else None,
        provenance={"source": os.path.basename(src), "format": "events-jsonl"},
    )


def dump_events_jsonl(stream: EventStream) -> str:
    """Render a stream as event-record JSON Lines (the inverse of :func:`import_events_jsonl`)."""
    lines = []
    for i in range(stream.n_events):
        sl = slice(stream.offsets[i], stream.offsets[i + 1])
        rec: dict[str, Any] = {"step": int(stream.step[i]), "layer": int(stream.layer[i]),
                               "experts": stream.expert[sl].tolist(), "active": int(stream.active[i]),
                               "multiplicity": stream.multiplicity[sl].tolist()}
        if stream.gate_mass is not None:
            rec["gate_mass"] = [round(float(x), 6) for x in stream.gate_mass[sl]]
        lines.append(json.dumps(rec))
    return "\n".join(lines) + "\n"
