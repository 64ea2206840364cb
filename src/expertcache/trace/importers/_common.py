"""What every importer shares: the import report, the record columns and their one vectorised assembly.

Every reader (JSON Lines through pyarrow or record by record, CSV, Parquet) turns its files into
:class:`Records`: one entry per (request, token, layer) routing decision, as flat numpy columns.
:func:`assemble` checks them (bounds, repeated ids, duplicates, phase order), groups them into
tokens, reports what was inferred, dropped or absent, and builds the :class:`RoutingTrace`. Its
cost is a few sorts of the record columns; nothing it allocates is larger than the records present
(a declared ``L`` or ``N`` far beyond the data allocates nothing).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ValidationError
from ..model import DECODE, PHASES, PREFILL, RoutingTrace

__all__ = ["ImportReport", "Records", "assemble", "MAX_EXPERTS", "MAX_LAYERS", "MAX_POSITION",
           "MAX_FIELD_BYTES"]

_MAX_EXAMPLES = 5
_MAX_GAPS = 1000
#: Largest ``N``: the trace stores expert ids as int16.
MAX_EXPERTS = 32768
#: Largest ``L``: the trace's layer column is int16.
MAX_LAYERS = 32767
#: Largest token position: the trace stores positions as int32.
MAX_POSITION = 2**31 - 1
#: Longest CSV field (or JSON Lines line of a per-layer record) accepted: routing fields are short.
MAX_FIELD_BYTES = 128 * 1024


@dataclass(frozen=True)
class ImportReport:
    """What an import read, inferred, and dropped.

    Attributes
    ----------
    format
        The ``--format`` name: ``"mixtral-jsonl"``, ``"deepseek-csv"``, ``"warp-jsonl"``,
        ``"columnar"``, ``"routes-jsonl"``.
    sources
        The files read, in order.
    n_layers, n_experts, top_k
        The shape of the resulting trace.
    inferred
        Which of ``"n_layers"``, ``"n_experts"``, ``"top_k"`` were inferred from the data
        (the others were given by the caller).
    n_experts_is_lower_bound
        True when ``n_experts`` was inferred as ``max id + 1`` (unseen experts are invisible).
    layer_ids
        The source's layer id of each trace layer ``0..L-1``.
    n_rows
        Data records read (JSON objects / CSV or Parquet rows, blank lines excluded).
    n_bad_rows, bad_row_examples
        Rows skipped because they could not be read (only with ``skip_bad_rows``), with up to 5 examples.
    n_requests
        Requests in the trace (requests left with no complete step are not counted).
    n_steps
        Complete steps (token rows) in the trace.
    n_incomplete_steps, incomplete_examples
        Tokens dropped because some layer had no row (interior ones and trailing ones), with up to
        5 examples.
    n_position_gaps
        Requests whose token positions skip numbers: whole tokens absent from the source, or an
        interior token dropped for a missing layer.
    has_gates
        Whether the trace carries gate weights.
    notes
        Free-text remarks: what was assumed and why.
    n_gap_tokens, gaps, gap_examples
        Interior tokens (a later position of the same request is complete) dropped because a layer
        had no row: the trace has a hole there. ``gaps`` lists ``(request, position)`` (the first
        1000), ``gap_examples`` up to 5 readable lines naming the missing layers.
    reading
        What one imported token means and what replaying it means (e.g. teacher-forced decode).
    categories_from
        Where ``provenance["categories"]`` came from (``"file"`` or a column name), or ``None``.
    """

    format: str
    sources: tuple[str, ...]
    n_layers: int
    n_experts: int
    top_k: int
    inferred: tuple[str, ...]
    n_experts_is_lower_bound: bool
    layer_ids: tuple[int, ...]
    n_rows: int
    n_bad_rows: int
    bad_row_examples: tuple[str, ...]
    n_requests: int
    n_steps: int
    n_incomplete_steps: int
    incomplete_examples: tuple[str, ...]
    n_position_gaps: int
    has_gates: bool
    notes: tuple[str, ...] = field(default_factory=tuple)
    n_gap_tokens: int = 0
    gaps: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    gap_examples: tuple[str, ...] = field(default_factory=tuple)
    reading: str = ""
    categories_from: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict."""
        out = asdict(self)
        out["gaps"] = [list(g) for g in self.gaps]
        return out


# ----------------------------------------------------------------------------- record columns
@dataclass
class Records:
    """Routing records of one import, as flat columns (one entry per (request, token, layer)).

    Attributes
    ----------
    request
        ``int64[n]`` index into ``request_names``.
    request_names
        Request ids in order of first appearance.
    position
        ``int64[n]`` token position, or ``None``: then a record's position is its rank among the
        records of the same (request, layer), in record order.
    layer
        ``int64[n]`` the source's layer id.
    ex_values, ex_lengths
        Expert ids of every record, concatenated (``int64``), and each record's count.
    gate_values, gate_lengths
        Gate weights likewise (``float64``), or ``None`` when the source has none; a record without
        gates has length -1.
    phase
        ``int8[n]``: 0 prefill, 1 decode, -1 unreadable (``phase_text`` holds the value shown).
    token_id
        ``int64[n]`` or ``None`` (unknown, -1).
    category
        ``int64[n]`` index into ``category_names``, or ``None``; -1 where missing.
    file, row
        ``int32[n]`` index of the source file and ``int64[n]`` 0-based record of that file (before any
        expansion of per-token rows), for messages.
    record_number
        One function per file: 0-based record -> the 1-based number messages show (a line number
        for text files, a row number for Parquet).
    fields
        Source field name of each logical field, for messages (``"experts"`` -> ``"topk_ids"``).
    bad
        ``bool[n]`` records a reader already found unreadable, with ``bad_messages[i]`` (message, field).
    """

    request: np.ndarray
    request_names: list[str]
    position: np.ndarray | None
    layer: np.ndarray
    ex_values: np.ndarray
    ex_lengths: np.ndarray
    gate_values: np.ndarray | None
    gate_lengths: np.ndarray | None
    phase: np.ndarray
    token_id: np.ndarray | None
    file: np.ndarray
    row: np.ndarray
    sources: list[str]
    record_number: list[Callable[[int], int]]
    fields: dict[str, str] = field(default_factory=dict)
    category: np.ndarray | None = None
    category_names: list[str] = field(default_factory=list)
    bad: np.ndarray | None = None
    bad_messages: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    phase_text: dict[int, str] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.layer.shape[0])

    def where(self, i: int) -> tuple[str, int]:
        """(source file, 1-based record number) of record ``i``."""
        f = int(self.file[i])
        return self.sources[f], int(self.record_number[f](int(self.row[i])))

    def name(self, logical: str) -> str:
        return self.fields.get(logical, logical)


def concat_records(parts: Sequence[Records]) -> Records:
    """One :class:`Records` of several files' records (request and category names merged by value)."""
    if len(parts) == 1:
        return parts[0]
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    req, cat, files, offs = [], [], [], 0
    sources: list[str] = []
    numbers: list[Callable[[int], int]] = []
    bad_messages: dict[int, tuple[str, str | None]] = {}
    phase_text: dict[int, str] = {}
    for p in parts:
        remap = np.array([names.setdefault(r, len(names)) for r in p.request_names], dtype=np.int64)
        req.append(remap[p.request] if p.n else p.request)
        if p.category is not None:
            cmap = np.array([cats.setdefault(c, len(cats)) for c in p.category_names] + [-1], dtype=np.int64)
            cat.append(cmap[p.category])
        else:
            cat.append(np.full(p.n, -1, np.int64))
        files.append(p.file + len(sources))
        sources.extend(p.sources)
        numbers.extend(p.record_number)
        bad_messages.update({i + offs: m for i, m in p.bad_messages.items()})
        phase_text.update({i + offs: m for i, m in p.phase_text.items()})
        offs += p.n
    has_pos = [p.position is not None for p in parts]
    if any(has_pos) and not all(has_pos):
        raise ValidationError("some files give token positions and others do not; import them separately")
    has_gates = any(p.gate_values is not None for p in parts)

    def gates(p: Records) -> tuple[np.ndarray, np.ndarray]:
        if p.gate_values is None:
            return np.zeros(0, np.float64), np.full(p.n, -1, np.int64)
        return p.gate_values, p.gate_lengths  # type: ignore[return-value]

    has_tok = any(p.token_id is not None for p in parts)
    out = Records(
        request=np.concatenate(req), request_names=list(names),
        position=np.concatenate([p.position for p in parts]) if all(has_pos) else None,  # type: ignore[misc]
        layer=np.concatenate([p.layer for p in parts]),
        ex_values=np.concatenate([p.ex_values for p in parts]),
        ex_lengths=np.concatenate([p.ex_lengths for p in parts]),
        gate_values=np.concatenate([gates(p)[0] for p in parts]) if has_gates else None,
        gate_lengths=np.concatenate([gates(p)[1] for p in parts]) if has_gates else None,
        phase=np.concatenate([p.phase for p in parts]),
        token_id=(np.concatenate([p.token_id if p.token_id is not None else np.full(p.n, -1, np.int64)
                                  for p in parts]) if has_tok else None),
        file=np.concatenate(files).astype(np.int32), row=np.concatenate([p.row for p in parts]),
        sources=sources, record_number=numbers, fields=dict(parts[0].fields),
        category=np.concatenate(cat) if any(p.category is not None for p in parts) else None,
        category_names=list(cats),
        bad=np.concatenate([p.bad if p.bad is not None else np.zeros(p.n, bool) for p in parts]),
        bad_messages=bad_messages, phase_text=phase_text)
    return out


class RowBuffer:
    """Collects records parsed one by one (the record-by-record readers) into :class:`Records` columns."""

    def __init__(self, source: str, record_number: Callable[[int], int] | None = None,
                 fields: dict[str, str] | None = None) -> None:
        self.source = source
        self.record_number = record_number or (lambda r: r)  # rows are stored as their line number
        self.fields = fields or {}
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.req: list[int] = []
        self.pos: list[int] = []
        self.layer: list[int] = []
        self.ex: list[int] = []
        self.exn: list[int] = []
        self.gv: list[float] = []
        self.gn: list[int] = []
        self.phase: list[int] = []
        self.tok: list[int] = []
        self.cat: list[int] = []
        self.row: list[int] = []
        self.bad_messages: dict[int, tuple[str, str | None]] = {}
        self.has_pos = True
        self.any_gates = False
        self.any_tok = False
        self.any_cat = False

    def bad(self, row: int, message: str, field_name: str | None) -> None:
        """An unreadable record: kept as a placeholder so :func:`assemble` applies the bad-row policy in order."""
        self.bad_messages[len(self.req)] = (message, field_name)
        self.add(row, "", 0, 0, (), None, DECODE, -1, None)

    def add(self, row: int, request: str, position: int | None, layer: int, experts: Sequence[int],
            gates: Sequence[float] | None, phase: int, token_id: int = -1, category: str | None = None) -> None:
        self.req.append(self.names.setdefault(request, len(self.names)))
        if position is None:
            self.has_pos = False
            position = 0
        self.pos.append(position)
        self.layer.append(layer)
        self.ex.extend(experts)
        self.exn.append(len(experts))
        if gates is None:
            self.gn.append(-1)
        else:
            self.any_gates = True
            self.gv.extend(gates)
            self.gn.append(len(gates))
        self.phase.append(phase)
        self.tok.append(token_id)
        self.any_tok |= token_id >= 0
        if category is None:
            self.cat.append(-1)
        else:
            self.any_cat = True
            self.cat.append(self.cats.setdefault(category, len(self.cats)))
        self.row.append(row)

    def records(self) -> Records:
        n = len(self.req)
        bad = np.zeros(n, bool)
        if self.bad_messages:
            bad[list(self.bad_messages)] = True
        names = list(self.names)
        return Records(
            request=np.array(self.req, np.int64), request_names=names,
            position=np.array(self.pos, np.int64) if self.has_pos else None,
            layer=np.array(self.layer, np.int64),
            ex_values=np.array(self.ex, np.int64), ex_lengths=np.array(self.exn, np.int64),
            gate_values=np.array(self.gv, np.float64) if self.any_gates else None,
            gate_lengths=np.array(self.gn, np.int64) if self.any_gates else None,
            phase=np.array(self.phase, np.int8), token_id=np.array(self.tok, np.int64) if self.any_tok else None,
            file=np.zeros(n, np.int32), row=np.array(self.row, np.int64), sources=[self.source],
            record_number=[self.record_number], fields=self.fields,
            category=np.array(self.cat, np.int64) if self.any_cat else None, category_names=list(self.cats),
            bad=bad, bad_messages=self.bad_messages)


# ----------------------------------------------------------------------------- faults
class _Faults:
    """The bad-row policy over whole columns: the earliest fault raises, or every faulty record is skipped."""

    def __init__(self, recs: Records, skip: bool, strict_hint: bool) -> None:
        self.recs = recs
        self.skip = skip
        self.hint = strict_hint
        self.bad = np.zeros(recs.n, bool) if recs.bad is None else recs.bad.copy()
        self.found: list[tuple[int, int, str, str | None]] = []  # (record, order, message, field)
        for i, (msg, fld) in recs.bad_messages.items():
            self.found.append((i, 0, msg, fld))

    def check(self, mask: np.ndarray, message: Callable[[int], str], field_name: str | None,
              rows: np.ndarray | None = None) -> None:
        """Records where ``mask`` holds (``rows[mask]`` when the mask is over a subset) are faulty."""
        idx = np.flatnonzero(mask)
        if rows is not None:
            idx = rows[idx]
        idx = idx[~self.bad[idx]] if idx.size else idx
        if not idx.size:
            return
        idx = np.sort(idx)
        for i in idx[:_MAX_EXAMPLES]:
            self.found.append((int(i), len(self.found) + 1, message(int(i)), field_name))
        self.bad[idx] = True

    def fatal(self, i: int, message: str, field_name: str | None) -> None:
        """A fault no policy skips: raise it for record ``i``."""
        src, rec = self.recs.where(i)
        raise ValidationError(message, source=src, record=rec, field=self.recs.name(field_name) if field_name else None)

    def raise_first(self) -> None:
        if not self.found or self.skip:
            return
        i, _, msg, fld = min(self.found)
        src, rec = self.recs.where(i)
        hint = " (pass skip_bad_rows / --skip-bad-rows to skip such rows)" if self.hint else ""
        raise ValidationError(msg + hint, source=src, record=rec, field=self.recs.name(fld) if fld else None)

    def examples(self) -> tuple[int, tuple[str, ...]]:
        out = []
        for i, _, msg, fld in sorted(self.found)[:_MAX_EXAMPLES]:
            src, rec = self.recs.where(i)
            out.append(str(ValidationError(msg, source=src, record=rec,
                                           field=self.recs.name(fld) if fld else None)))
        return int(self.bad.sum()), tuple(out)


def _short(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")


def _check_shape_args(n_layers: int | None, n_experts: int | None, top_k: int | None) -> None:
    for name, value, hi in (("--layers", n_layers, MAX_LAYERS), ("--experts", n_experts, MAX_EXPERTS),
                            ("--top-k", top_k, MAX_EXPERTS)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise ValidationError(f"{name} must be a positive integer; got {value!r}")
        if value is not None and value > hi:
            why = "the trace's layer column is int16" if name == "--layers" else "the trace stores int16 expert ids"
            raise ValidationError(f"{name} must be at most {hi} ({why}); got {value}")
    if top_k is not None and n_experts is not None and top_k > n_experts:
        raise ValidationError(f"--top-k must be <= --experts ({n_experts}); got {top_k}")


def _expert_ids(value: Any) -> tuple[int, ...] | str:
    """Non-negative expert ids below :data:`MAX_EXPERTS` from a JSON list; an error message otherwise."""
    if not isinstance(value, list) or not value:
        return f"expected a non-empty list of expert ids; got {value!r:.60}"
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
        return f"expected non-negative integer expert ids; got {value!r:.60}"
    big = [v for v in value if v >= MAX_EXPERTS]
    if big:
        return f"expert id must be < {MAX_EXPERTS} (the trace stores int16 ids); got {big[0]:.6g}"
    return tuple(value)


def _non_decreasing(a: np.ndarray) -> bool:
    return bool(a.shape[0] < 2 or (a[1:] >= a[:-1]).all())


def _lex_sorted(r: np.ndarray, p: np.ndarray, l: np.ndarray) -> bool:
    """Whether the rows are in ``(r, p, l)`` order already (ties kept in row order, as ``np.lexsort`` would)."""
    if r.shape[0] < 2:
        return True
    dr, dp, dl = r[1:] - r[:-1], p[1:] - p[:-1], l[1:] - l[:-1]
    return bool(((dr > 0) | ((dr == 0) & ((dp > 0) | ((dp == 0) & (dl >= 0))))).all())


#: Records a block where :func:`assemble` sorts or copies their ``k`` ids or gates (int64 / float64) in pieces, so that
#: those temporaries take ``k * 8 * _BLOCK_ROWS`` bytes (16 MiB at k = 8), not eight bytes per id of the import.
_BLOCK_ROWS = 1 << 18


def _rows_with_repeats(ex: np.ndarray) -> np.ndarray:
    """``bool[n]``: the rows of ``ex`` (``n x k``) holding an id twice, a sorted copy made :data:`_BLOCK_ROWS` rows
    at a time.

    >>> _rows_with_repeats(np.array([[3, 1, 3], [0, 1, 2]])).tolist()
    [True, False]
    """
    out = np.zeros(ex.shape[0], bool)
    for a in range(0, ex.shape[0], _BLOCK_ROWS):
        srt = np.sort(ex[a:a + _BLOCK_ROWS], axis=1)
        out[a:a + _BLOCK_ROWS] = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
    return out


def _group_starts(*keys: np.ndarray) -> np.ndarray:
    """For arrays sorted by ``keys``: True where a new group starts."""
    n = keys[0].shape[0]
    new = np.zeros(n, bool)
    if n:
        new[0] = True
        for k in keys:
            new[1:] |= k[1:] != k[:-1]
    return new


# ----------------------------------------------------------------------------- assembly
def assemble(recs: Records, *, fmt: str, n_layers: int | None, n_experts: int | None, top_k: int | None,
             strict: bool = False, skip_bad_rows: bool = False, provenance: dict[str, Any] | None = None,
             notes: Sequence[str] = (), n_rows: int | None = None, reading: str = "",
             categories_from: str | None = None, monotone_positions: bool = False,
             drop_unaligned: np.ndarray | None = None, record_provenance: bool = True
             ) -> tuple[RoutingTrace, ImportReport]:
    """Check ``recs``, group them into tokens and build the trace and its report.

    Parameters
    ----------
    recs
        The records of every source file.
    fmt
        Format name recorded in the report and the provenance.
    n_layers, n_experts, top_k
        The shape; each ``None`` is inferred (distinct layer ids; max id + 1, a lower bound; the
        commonest row length).
    strict
        This project's own format: a token missing a layer, a row of another length, gates on some
        rows only, are errors rather than drops.
    skip_bad_rows
        Count and skip unreadable records instead of raising at the earliest one.
    monotone_positions
        Records of a request must come in non-decreasing position order (the routes format's rule).
    drop_unaligned
        ``bool[n]`` records a reader could not align to a position (dropped; their tokens are incomplete).
    record_provenance
        Add the format, sources, reading and the report to the provenance (``False``: keep
        ``provenance`` as given, plus any categories).
    """
    _check_shape_args(n_layers, n_experts, top_k)
    notes = list(notes)
    inferred: list[str] = []
    n = recs.n
    src0 = recs.sources[0] if len(recs.sources) == 1 else f"{len(recs.sources)} files"
    n_rows = n if n_rows is None else n_rows
    if n == 0:
        raise ValidationError("no readable routing rows found", source=src0)
    faults = _Faults(recs, skip_bad_rows, strict_hint=not strict)
    lengths = recs.ex_lengths
    starts = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])

    # ---- k: given, or the commonest row length; rows of another length are faulty.
    ok = ~faults.bad & (lengths > 0)
    if top_k is None:
        if not ok.any():
            faults.check(lengths == 0, lambda i: "expected a non-empty list of expert ids", "experts")
            faults.raise_first()
            raise ValidationError("no readable routing rows found", source=src0)
        vals, cnt = np.unique(lengths[ok], return_counts=True)
        top_k = int(vals[np.argmax(cnt)])  # ties: the smallest length (np.argmax returns the first)
        if top_k > MAX_EXPERTS:
            raise ValidationError(f"rows list {top_k} experts; at most {MAX_EXPERTS} are possible", source=src0)
        inferred.append("top_k")
        if vals.size > 1:
            notes.append(f"rows list {vals.tolist()} experts; k={top_k} is the most common length")
    k = int(top_k)
    faults.check(lengths == 0, lambda i: "expected a non-empty list of expert ids", "experts")
    faults.check(lengths != k, lambda i: f"expected {k} expert ids (k); got {int(lengths[i])}", "experts")
    rows_k = np.flatnonzero(lengths == k)
    if rows_k.size == n:
        ex = recs.ex_values.reshape(n, k)
    else:
        take = (starts[rows_k][:, None] + np.arange(k)[None, :]).reshape(-1)
        ex = recs.ex_values[take].reshape(-1, k)
    bound = n_experts if n_experts is not None else MAX_EXPERTS
    neg = (ex < 0).any(axis=1)
    faults.check(neg, lambda i: f"expected non-negative integer expert ids; got {_ids(recs, starts, i)}",
                 "experts", rows_k)
    high = (ex >= bound).any(axis=1)
    if n_experts is not None:
        faults.check(high, lambda i: f"expert id must be in [0, {n_experts}) (--experts); got "
                                     f"{int(_row_ex(recs, starts, i).max())}", "experts", rows_k)
    else:
        faults.check(high, lambda i: f"expert id must be < {MAX_EXPERTS} (the trace stores int16 ids); got "
                                     f"{int(_row_ex(recs, starts, i).max())}", "experts", rows_k)
    faults.check(_rows_with_repeats(ex),
                 lambda i: f"expert ids of one token and layer must be distinct; got {_ids(recs, starts, i)}",
                 "experts", rows_k)

    # ---- gates
    has_gates = recs.gate_values is not None
    if has_gates:
        gl = recs.gate_lengths
        assert gl is not None and recs.gate_values is not None
        with_gates = gl >= 0
        if strict and not with_gates.all() and with_gates.any():
            first = int(np.flatnonzero(~with_gates)[0] if with_gates[0] else np.flatnonzero(with_gates)[0])
            faults.fatal(first, "gates must be given on every record or on none", "gates")
        gstarts = np.zeros(n + 1, np.int64)
        np.cumsum(np.maximum(gl, 0), out=gstarts[1:])
        faults.check(with_gates & (gl != lengths),
                     lambda i: f"expected {int(lengths[i])} gate weights aligned with the expert ids; got "
                               f"{int(gl[i])}", "gates")
        finite = np.isfinite(recs.gate_values)
        if not finite.all():
            rec_of = np.repeat(np.arange(n), np.maximum(gl, 0))
            m = np.zeros(n, bool)
            m[rec_of[~finite]] = True
            faults.check(m, lambda i: "gate weights must be finite numbers (NaN or inf found)", "gates")
        if not with_gates.all():
            if with_gates.any():
                notes.append("gate weights present on some rows only: the trace carries no gates")
            has_gates = False

    # ---- layers, positions, phases, token ids
    layer = recs.layer
    faults.check(layer < 0, lambda i: f"expected a non-negative integer; got {int(layer[i])}", "layer")
    if n_layers is not None:
        faults.check(layer >= n_layers, lambda i: f"layer must be in [0, {n_layers}) (--layers); got "
                                                  f"{int(layer[i])}", "layer")
    else:
        faults.check(layer >= MAX_LAYERS, lambda i: f"layer id must be < {MAX_LAYERS}; got {int(layer[i])}",
                     "layer")
    pos = recs.position
    if pos is not None:
        faults.check(pos < 0, lambda i: f"expected a non-negative integer; got {int(pos[i])}", "position")
        faults.check(pos > MAX_POSITION, lambda i: f"position must be at most {MAX_POSITION}; got {int(pos[i])}",
                     "position")
    phase = recs.phase
    faults.check(phase < 0, lambda i: f"expected 'decode' or 'prefill'; got {recs.phase_text.get(i, '?')}",
                 "phase")
    tok = recs.token_id
    if tok is not None:
        faults.check(tok < -1, lambda i: f"expected a non-negative integer; got {int(tok[i])}", "token_id")
    faults.raise_first()

    keep = ~faults.bad
    if drop_unaligned is not None:
        keep &= ~drop_unaligned
    idx = np.flatnonzero(keep)
    if idx.size == 0:
        raise ValidationError("no readable routing rows found", source=src0)

    # ---- L
    if n_layers is None:
        layer_ids = tuple(int(v) for v in np.unique(layer[~faults.bad]))  # unaligned rows still name their layer
        inferred.append("n_layers")
        if layer_ids != tuple(range(layer_ids[0], layer_ids[0] + len(layer_ids))):
            notes.append(f"layer ids {_short(list(layer_ids))} are not contiguous: a layer absent from the whole "
                         "file cannot be told from a dense layer; pass --layers to use the ids as they are")
        if layer_ids[0] != 0:
            notes.append(f"layer ids {layer_ids[0]}..{layer_ids[-1]} mapped to MoE layers "
                         f"0..{len(layer_ids) - 1} (dense first layers never appear in such files)")
    else:
        layer_ids = tuple(range(n_layers))
    L = len(layer_ids)
    li_all = np.searchsorted(np.array(layer_ids, np.int64), layer)

    # ---- N
    ex_of = np.full(n, -1, np.int64)  # record -> row of ``ex``
    ex_of[rows_k] = np.arange(rows_k.size)
    if n_experts is None:
        n_experts = int(ex[ex_of[idx]].max()) + 1
        inferred.append("n_experts")
        notes.append(f"N={n_experts} is max expert id + 1, a lower bound (experts never selected are "
                     "invisible); pass --experts with the model's real count")
    if k > n_experts:
        raise ValidationError(f"k={k} exceeds N={n_experts}; pass --experts", source=src0)

    req = recs.request
    # ---- positions: given, or the rank among the records of the same (request, layer)
    if pos is None:
        order = np.lexsort((idx, li_all[idx], req[idx]))
        o = idx[order]
        new = _group_starts(req[o], li_all[o])
        grp_start = np.flatnonzero(new)
        rank = np.arange(o.size) - np.repeat(grp_start, np.diff(np.r_[grp_start, o.size]))
        pos = np.zeros(n, np.int64)
        pos[o] = rank
    if monotone_positions:
        ri = req[idx]
        o = idx if _non_decreasing(ri) else idx[np.argsort(ri, kind="stable")]
        same = req[o][1:] == req[o][:-1]
        dec = np.flatnonzero(same & (pos[o][1:] < pos[o][:-1]))
        if dec.size:
            i, prev = int(o[dec[0] + 1]), int(o[dec[0]])
            _, prev_line = recs.where(prev)
            faults.fatal(i, f"positions must not decrease within a request; got {int(pos[i])} after "
                            f"{int(pos[prev])} (line {prev_line})", "position")

    # ---- tokens: sort records by (request, position, layer, record); files written in that order skip the sort
    r_i, p_i, l_i = req[idx], pos[idx], li_all[idx]
    o = idx if _lex_sorted(r_i, p_i, l_i) else idx[np.lexsort((idx, l_i, p_i, r_i))]
    del r_i, p_i, l_i
    r_o, p_o, l_o = req[o], pos[o], li_all[o]
    dup = ~_group_starts(r_o, p_o, l_o)
    if dup.any():
        first_of = np.maximum.accumulate(np.where(dup, 0, np.arange(o.size)))
        d_rows = o[dup]
        firsts = o[first_of[dup]]
        first_map = dict(zip(d_rows.tolist(), firsts.tolist(), strict=True))
        m = np.zeros(n, bool)
        m[d_rows] = True

        def dup_msg(i: int) -> str:
            f = first_map[i]
            fsrc, fline = recs.where(f)
            return (f"duplicate record for request {recs.request_names[int(req[i])]!r}, "
                    f"{'position' if strict else 'token'} {int(pos[i])}, layer {int(layer[i])} "
                    f"(first at {fsrc}:{fline})")
        faults.check(m, dup_msg, "layer")
        keep_o = ~dup
        o, r_o, p_o, l_o = o[keep_o], r_o[keep_o], p_o[keep_o], l_o[keep_o]
    tstart = _group_starts(r_o, p_o)
    tok_of = np.cumsum(tstart) - 1  # token index (among all tokens seen) of each sorted record
    n_tok_all = int(tstart.sum())
    first_rec = o[tstart]
    # phase must agree across the layers of a token (the first record in file order decides)
    ph_o = phase[o]
    # a token's records are contiguous in ``o``: per-token reductions are reduceat over its segments
    first_in_file = np.minimum.reduceat(o, np.flatnonzero(tstart)) if o.size else np.zeros(0, np.int64)
    ref_phase = phase[first_in_file][tok_of]
    differs = ph_o != ref_phase
    if differs.any():
        m = np.zeros(n, bool)
        m[o[differs]] = True
        faults.check(m, lambda i: _phase_msg(i, o, tok_of, first_in_file, phase, strict), "phase")
        keep_o = ~differs
        o, r_o, p_o, l_o, tok_of = o[keep_o], r_o[keep_o], p_o[keep_o], l_o[keep_o], tok_of[keep_o]
    if tok is not None:
        t_o = tok[o]
        known = t_o >= 0
        seg = np.flatnonzero(np.r_[True, tok_of[1:] != tok_of[:-1]]) if o.size else np.zeros(0, np.int64)
        ref = np.full(n_tok_all, -1, np.int64)
        lo = np.full(n_tok_all, np.iinfo(np.int64).max, np.int64)
        if o.size:
            ref[tok_of[seg]] = np.maximum.reduceat(t_o, seg)  # unknown ids are -1 and never win the max
            lo[tok_of[seg]] = np.minimum.reduceat(np.where(known, t_o, np.iinfo(np.int64).max), seg)
        clash = known & (t_o != lo[tok_of])
        if clash.any():
            faults.fatal(int(o[clash].min()), "token_id differs between layers of the same position", "token_id")
        tok_token = ref
    else:
        tok_token = np.full(n_tok_all, -1, np.int64)
    faults.raise_first()
    n_bad, bad_examples = faults.examples()

    # ---- completeness per token; interior incomplete tokens are gaps
    n_layers_seen = np.bincount(tok_of, minlength=n_tok_all)
    t_req = req[first_rec]
    t_pos = pos[first_rec]
    complete = n_layers_seen == L
    if strict and not complete.all():
        t = int(np.flatnonzero(~complete)[0])
        have = set(l_o[tok_of == t].tolist())
        missing = next(li for li in range(L) if li not in have)
        raise ValidationError(f"request {recs.request_names[int(t_req[t])]!r}, position {int(t_pos[t])}: layer "
                              f"{layer_ids[missing]} has no record (every position needs all {L} layers)",
                              source=src0, field=recs.name("layer"))
    # last complete position per request
    R = len(recs.request_names)
    last_complete = np.full(R, -1, np.int64)
    if complete.any():
        np.maximum.at(last_complete, t_req[complete], t_pos[complete])
    interior = ~complete & (t_pos < last_complete[t_req])
    incomplete_examples: list[str] = []
    gap_examples: list[str] = []
    gaps: list[tuple[str, int]] = []
    if not complete.all():
        miss_tokens = np.flatnonzero(~complete)
        for t in miss_tokens[:_MAX_EXAMPLES].tolist():
            have = set(l_o[tok_of == t].tolist())
            missing = [layer_ids[li] for li in range(L) if li not in have]
            incomplete_examples.append(f"request {recs.request_names[int(t_req[t])]!r} token {int(t_pos[t])}: "
                                       f"layer(s) {_short(missing)} missing")
        for t in np.flatnonzero(interior)[:_MAX_GAPS].tolist():
            rid = recs.request_names[int(t_req[t])]
            gaps.append((rid, int(t_pos[t])))
            if len(gap_examples) < _MAX_EXAMPLES:
                have = set(l_o[tok_of == t].tolist())
                missing = [layer_ids[li] for li in range(L) if li not in have]
                gap_examples.append(f"request {rid!r} position {int(t_pos[t])}: layer(s) {_short(missing)} missing "
                                    "while later positions are complete; dropped, so the trace has a gap here")
    # requests whose positions (all tokens seen) skip numbers, or with an interior dropped token
    pmin = np.full(R, np.iinfo(np.int64).max, np.int64)
    pmax = np.full(R, -1, np.int64)
    np.minimum.at(pmin, t_req, t_pos)
    np.maximum.at(pmax, t_req, t_pos)
    cnt = np.bincount(t_req, minlength=R)
    seen = cnt > 0
    gap_req = seen & (pmax - pmin + 1 != cnt)
    if interior.any():
        gap_req[np.unique(t_req[interior])] = True
    n_gaps = int(gap_req.sum())

    if not complete.any():
        eg = incomplete_examples[0] if incomplete_examples else ""
        raise ValidationError(f"no complete step: every token misses at least one of the {L} layers "
                              f"{_short(list(layer_ids))}; e.g. {eg}", source=src0)

    # ---- the trace: complete tokens, requests in first-appearance order
    keep_tok = np.flatnonzero(complete)  # already sorted by (request index, position)
    new_index = np.full(n_tok_all, -1, np.int64)
    new_index[keep_tok] = np.arange(keep_tok.size)
    rec_keep = complete[tok_of]
    T = keep_tok.size
    experts = np.empty((T, L, k), np.int16)
    ti = new_index[tok_of[rec_keep]]
    lk = l_o[rec_keep]
    kept = o[rec_keep]
    gv = recs.gate_values if has_gates else None
    gates = np.empty((T, L, k), np.float32) if gv is not None else None
    for a in range(0, kept.shape[0], _BLOCK_ROWS):      # a block of records at a time: the copies' temporaries
        b = a + _BLOCK_ROWS                             # (k ids or gates a record, 8 bytes each) stay small
        experts[ti[a:b], lk[a:b]] = ex[ex_of[kept[a:b]]].astype(np.int16)
        if gates is not None and gv is not None:
            take = (gstarts[kept[a:b]][:, None] + np.arange(k)[None, :]).reshape(-1)
            gates[ti[a:b], lk[a:b]] = gv[take].reshape(-1, k).astype(np.float32)
    used_req = np.unique(t_req[keep_tok])  # request indices are first-appearance order
    remap = np.full(R, -1, np.int32)
    remap[used_req] = np.arange(used_req.size, dtype=np.int32)
    request_ids = tuple(recs.request_names[int(r)] for r in used_req)
    tr_req = remap[t_req[keep_tok]]
    tr_phase = phase[first_in_file[keep_tok]].astype(np.int8)
    tr_pos = t_pos[keep_tok].astype(np.int32)
    tr_tok = tok_token[keep_tok].astype(np.int64)
    same = tr_req[1:] == tr_req[:-1]
    back = np.flatnonzero(same & (tr_phase[1:] < tr_phase[:-1]))
    if back.size:
        row = int(first_rec[keep_tok[back[0] + 1]])
        src, rec = recs.where(row)
        raise ValidationError(f"request {request_ids[int(tr_req[back[0] + 1])]!r}: a prefill token (position "
                              f"{int(tr_pos[back[0] + 1])}) comes after a decode token", source=src, record=rec,
                              field=recs.name("phase"))

    # ---- categories
    prov = dict(provenance or {})
    if categories_from is not None:
        if recs.category is None:
            raise ValidationError(f"no category found in the data (--category-from {categories_from})", source=src0,
                                  field=categories_from)
        cat = recs.category
        used = rec_keep_rows = o[rec_keep]
        c = cat[used]
        rr = req[used]
        missing = c < 0
        if missing.any():
            i = int(used[np.flatnonzero(missing)[0]])
            src, rec = recs.where(i)
            raise ValidationError(f"expected a category for every record (--category-from {categories_from}); "
                                  "got none", source=src, record=rec, field=categories_from)
        lo = np.full(R, np.iinfo(np.int64).max, np.int64)
        hi = np.full(R, -1, np.int64)
        np.minimum.at(lo, rr, c)
        np.maximum.at(hi, rr, c)
        clash = np.flatnonzero((hi >= 0) & (lo != hi))
        if clash.size:
            r = int(clash[0])
            rows_r = rec_keep_rows[rr == r]
            i = int(rows_r[np.flatnonzero(cat[rows_r] != lo[r])[0]])
            src, rec = recs.where(i)
            raise ValidationError(f"request {recs.request_names[r]!r} has two categories "
                                  f"({recs.category_names[int(lo[r])]!r} and {recs.category_names[int(cat[i])]!r}); "
                                  "a request needs one category", source=src, record=rec, field=categories_from)
        prov["categories"] = {recs.request_names[int(r)]: recs.category_names[int(lo[r])] for r in used_req}

    report = ImportReport(
        format=fmt, sources=tuple(recs.sources), n_layers=L, n_experts=int(n_experts), top_k=k,
        inferred=tuple(inferred), n_experts_is_lower_bound="n_experts" in inferred, layer_ids=layer_ids,
        n_rows=int(n_rows), n_bad_rows=n_bad, bad_row_examples=bad_examples if skip_bad_rows else (),
        n_requests=len(request_ids), n_steps=int(T), n_incomplete_steps=int((~complete).sum()),
        incomplete_examples=tuple(incomplete_examples), n_position_gaps=n_gaps, has_gates=has_gates,
        notes=tuple(notes), n_gap_tokens=int(interior.sum()), gaps=tuple(gaps), gap_examples=tuple(gap_examples),
        reading=reading, categories_from=categories_from)
    if record_provenance:
        _record(prov, fmt, recs, reading, report)
    trace = RoutingTrace(L, int(n_experts), k, request_ids, tr_req, tr_phase, tr_pos, experts, gates, tr_tok,
                         provenance=prov)
    return trace, report


def _record(prov: dict[str, Any], fmt: str, recs: Records, reading: str, report: ImportReport) -> None:
    prov.setdefault("format", fmt)
    prov.setdefault("source", [os.path.basename(s) for s in recs.sources])
    if reading:
        prov["reading"] = reading
    prov["import"] = {key: value for key, value in report.to_dict().items()
                      if key not in ("sources", "bad_row_examples", "incomplete_examples", "gaps", "gap_examples")}


def _phase_msg(i: int, o: np.ndarray, tok_of: np.ndarray, first_in_file: np.ndarray, phase: np.ndarray,
               strict: bool) -> str:
    j = int(np.flatnonzero(o == i)[0])
    ref = int(phase[first_in_file[tok_of[j]]])
    return f"phase differs from another layer of the same {'position' if strict else 'token'} ({PHASES[ref]})"


def _row_ex(recs: Records, starts: np.ndarray, i: int) -> np.ndarray:
    return recs.ex_values[starts[i]:starts[i + 1]]


def _ids(recs: Records, starts: np.ndarray, i: int) -> str:
    return f"{_row_ex(recs, starts, i).tolist()!r:.60}"


# ----------------------------------------------------------------------------- shared reader helpers
def file_list(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], patterns: Sequence[str]
              ) -> list[Path]:
    """Files of ``paths`` (a directory stands for its files matching ``patterns``, in name order)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted({f for pat in patterns for f in p.glob(pat)})
            if not found:
                raise ValidationError(f"directory holds no {' or '.join(patterns)} files", source=str(p))
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise ValidationError("no such file or directory", source=str(p))
    if not files:
        raise ValidationError("no input files given")
    return files


def phase_code(phase: str) -> int:
    """``"prefill"`` -> 0, ``"decode"`` -> 1; a ValidationError otherwise."""
    if phase not in PHASES:
        raise ValidationError(f"phase must be 'decode' or 'prefill'; got {phase!r}", field="phase")
    return PHASES.index(phase)


__all__ += ["concat_records", "RowBuffer", "file_list", "phase_code", "PREFILL", "DECODE"]


def guarded_record(line: str, src: str, line_no: int) -> dict[str, Any]:
    """One JSON Lines record through the shared guards (:func:`expertcache.jsonl.json_object`: nesting, 64-bit
    integers, lone surrogates), naming the field that holds an integer outside the 64-bit range."""
    import json

    from ...jsonl import json_object

    try:
        return json_object(line, src, line_no)
    except ValidationError as exc:
        if exc.field is None and "64-bit" in exc.detail:
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                raise exc from None
            for key, value in rec.items() if isinstance(rec, dict) else ():
                items = [value]
                while items and any(isinstance(v, list) for v in items):  # flatten nested lists (warp layers)
                    items = [x for v in items for x in (v if isinstance(v, list) else [v])]
                if any(isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63 for v in items):
                    raise ValidationError(exc.detail, source=src, record=line_no, field=key) from None
        raise
