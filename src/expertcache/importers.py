"""Importers for routing data that other tools publish, into :class:`~expertcache.trace.RoutingTrace`.

Two foreign layouts are read (issue 4, item 6):

``mixtral-jsonl``
    JSON Lines, one row per (request, token, layer), as published for
    Mixtral-8x7B::

        {"dataset": "gsm8k", "problem_id": 0, "layer": 0, "experts": [7, 0],
         "gating_probs": [0.80, 0.20], "token_idx": 0}

    ``token_pos`` is accepted instead of ``token_idx``; the request id is
    ``"{dataset}/{problem_id}"``; ``gating_probs`` become the trace's gates.
``deepseek-csv``
    One CSV file per prompt with the header
    ``Layer ID,Batch Number,Token,Activated Expert IDs``, as published for
    DeepSeek-V2-Lite. The expert list is a string, ``"[3, 17, 42]"`` or
    ``"3 17 42"``. ``Batch Number`` is read as the forward pass of the
    generation (the first ``prefill_batches`` passes are the prompt, every later
    one a decode step); inside a (batch, layer) group the rows come in token
    order, so the i-th row of every layer of a batch is the same token.

What the data do not say is inferred and reported in an :class:`ImportReport`:

* ``L``: the distinct layer ids seen, mapped in ascending order to MoE layers
  ``0..L-1`` (dense layers never appear in such files; a gap in the ids is
  reported, because a layer absent from the whole file cannot be told apart
  from a dense one). Pass ``n_layers`` to use the ids as they are.
* ``N``: ``max expert id + 1``. This is only a **lower bound**: an expert that
  was never selected is invisible. Pass ``n_experts`` for the real value.
* ``k``: the number of experts per row (the most common length; rows of another
  length are bad rows).

A token whose layers are not all present is an *incomplete step*: it is
counted, a few examples are kept, and it is dropped, never padded. Rows that
cannot be read raise :class:`~expertcache.errors.ValidationError` (file, line,
field), or with ``skip_bad_rows=True`` are counted and skipped.
"""

from __future__ import annotations

import csv
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ValidationError
from .jsonl import iter_records
from .trace import DECODE, PHASES, PREFILL, RoutingTrace

__all__ = ["ImportReport", "import_mixtral_jsonl", "import_deepseek_csv", "FORMATS"]

#: Foreign formats this module reads (names used by ``expertcache trace import --format``).
FORMATS = ("mixtral-jsonl", "deepseek-csv")
_MAX_EXAMPLES = 5
_DEEPSEEK_COLUMNS = ("Layer ID", "Batch Number", "Token", "Activated Expert IDs")


@dataclass(frozen=True)
class ImportReport:
    """What an import read, inferred, and dropped.

    Attributes
    ----------
    format
        ``"mixtral-jsonl"`` or ``"deepseek-csv"``.
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
        Data rows read (JSON objects / CSV rows, blank lines excluded).
    n_bad_rows, bad_row_examples
        Rows skipped because they could not be read (only with ``skip_bad_rows``), with up to 5 examples.
    n_requests
        Requests in the trace (requests left with no complete step are not counted).
    n_steps
        Complete steps (token rows) in the trace.
    n_incomplete_steps, incomplete_examples
        Steps dropped because some layer had no row, with up to 5 examples.
    n_position_gaps
        Requests whose source token positions skip numbers (whole tokens absent from the file).
    has_gates
        Whether the trace carries gate weights.
    notes
        Free-text remarks: what was assumed and why.
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

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict."""
        return asdict(self)


# ----------------------------------------------------------------------------- shared assembly
@dataclass(slots=True)
class _Row:
    """One parsed source row: a (request, step, layer) routing decision."""

    request: str
    step: tuple[int, int]  # sort key of the step inside its request (position-like)
    position: int
    phase: int
    layer: int  # the source's layer id
    experts: tuple[int, ...]
    gates: tuple[float, ...] | None
    token_id: int
    where: str  # "file:line" for messages


class _Collector:
    """Gathers rows, applies the bad-row policy, and assembles a trace plus report."""

    def __init__(self, fmt: str, sources: Sequence[str], skip_bad_rows: bool) -> None:
        self.fmt = fmt
        self.sources = tuple(sources)
        self.skip_bad_rows = skip_bad_rows
        self.rows: list[_Row] = []
        self.n_rows = 0
        self.n_bad = 0
        self.bad_examples: list[str] = []
        self.notes: list[str] = []
        self.gap_requests: set[str] = set()  # requests with tokens known to be absent (set by a reader)

    def bad(self, message: str, src: str, line: int, field_name: str | None = None) -> None:
        """A row that cannot be read: raise, or count and skip it."""
        err = ValidationError(message, source=src, record=line, field=field_name)
        if not self.skip_bad_rows:
            raise ValidationError(f"{message} (pass skip_bad_rows / --skip-bad-rows to skip such rows)",
                                  source=src, record=line, field=field_name)
        self.n_bad += 1
        if len(self.bad_examples) < _MAX_EXAMPLES:
            self.bad_examples.append(str(err))

    def build(self, n_layers: int | None, n_experts: int | None, top_k: int | None,
              provenance: dict[str, Any] | None) -> tuple[RoutingTrace, ImportReport]:
        inferred: list[str] = []
        rows = self.rows
        src0 = self.sources[0] if len(self.sources) == 1 else f"{len(self.sources)} files"
        if not rows:
            raise ValidationError("no readable routing rows found", source=src0)

        # k: the given value, or the most common row length; other lengths are bad rows.
        if top_k is None:
            lengths = Counter(len(r.experts) for r in rows)
            top_k = max(lengths.items(), key=lambda kv: (kv[1], -kv[0]))[0]
            inferred.append("top_k")
            if len(lengths) > 1:
                self.notes.append(f"rows list {sorted(lengths)} experts; k={top_k} is the most common length")
        keep: list[_Row] = []
        for r in rows:
            if len(r.experts) != top_k:
                src, line = r.where.rsplit(":", 1)
                self.bad(f"expected {top_k} expert ids (k); got {len(r.experts)}", src, int(line), "experts")
            elif n_experts is not None and max(r.experts) >= n_experts:
                src, line = r.where.rsplit(":", 1)
                self.bad(f"expert id must be in [0, {n_experts}) (--experts); got {max(r.experts)}", src,
                         int(line), "experts")
            else:
                keep.append(r)
        rows = keep

        # L: the given value (ids used as they are), or the distinct ids in ascending order.
        if n_layers is None:
            layer_ids = tuple(sorted({r.layer for r in rows}))
            inferred.append("n_layers")
            if layer_ids and layer_ids != tuple(range(layer_ids[0], layer_ids[0] + len(layer_ids))):
                self.notes.append(f"layer ids {list(layer_ids)} are not contiguous: a layer absent from the whole "
                                  "file cannot be told from a dense layer; pass --layers to use the ids as they are")
            if layer_ids and layer_ids[0] != 0:
                self.notes.append(f"layer ids {layer_ids[0]}..{layer_ids[-1]} mapped to MoE layers "
                                  f"0..{len(layer_ids) - 1} (dense first layers never appear in such files)")
        else:
            layer_ids = tuple(range(n_layers))
            keep = []
            for r in rows:
                if r.layer >= n_layers:
                    src, line = r.where.rsplit(":", 1)
                    self.bad(f"layer must be in [0, {n_layers}) (--layers); got {r.layer}", src, int(line), "layer")
                else:
                    keep.append(r)
            rows = keep
        if not rows:
            raise ValidationError("no readable routing rows found", source=src0)
        L = len(layer_ids)
        layer_of = {lid: i for i, lid in enumerate(layer_ids)}

        if n_experts is None:
            n_experts = max(max(r.experts) for r in rows) + 1
            inferred.append("n_experts")
            self.notes.append(f"N={n_experts} is max expert id + 1, a lower bound (experts never selected are "
                              "invisible); pass --experts with the model's real count")
        if top_k > n_experts:
            raise ValidationError(f"k={top_k} exceeds N={n_experts}; pass --experts", source=src0)

        has_gates = all(r.gates is not None for r in rows)
        if not has_gates and any(r.gates is not None for r in rows):
            self.notes.append("gate weights present on some rows only: the trace carries no gates")

        # Group rows into steps: (request, step key) -> layer -> row. A second row for a layer is a bad row.
        req_order: dict[str, int] = {}
        steps: dict[tuple[str, tuple[int, int]], dict[int, _Row]] = {}
        for r in rows:
            req_order.setdefault(r.request, len(req_order))
            slot = steps.setdefault((r.request, r.step), {})
            li = layer_of[r.layer]
            if li in slot:
                src, line = r.where.rsplit(":", 1)
                self.bad(f"duplicate row for request {r.request!r}, token {r.position}, layer {r.layer} "
                         f"(first at {slot[li].where})", src, int(line), "layer")
                continue
            first = next(iter(slot.values()), None)
            if first is not None and first.phase != r.phase:
                src, line = r.where.rsplit(":", 1)
                self.bad(f"phase differs from another layer of the same token ({PHASES[first.phase]})", src,
                         int(line), "phase")
                continue
            slot[li] = r

        # Positions that skip numbers: whole tokens absent from the source.
        positions: dict[str, list[int]] = {}
        for (rid, _), slot in steps.items():
            positions.setdefault(rid, []).append(next(iter(slot.values())).position)
        gaps = {rid for rid, pos in positions.items() if max(pos) - min(pos) + 1 != len(set(pos))}
        n_gaps = len(gaps | self.gap_requests)

        n_incomplete = 0
        incomplete: list[str] = []
        per_request: dict[str, list[tuple[tuple[int, int], dict[int, _Row]]]] = {}
        for (rid, key), slot in steps.items():
            if len(slot) != L:
                n_incomplete += 1
                if len(incomplete) < _MAX_EXAMPLES:
                    missing = [layer_ids[i] for i in range(L) if i not in slot]
                    pos = next(iter(slot.values())).position
                    incomplete.append(f"request {rid!r} token {pos}: layer(s) {_short(missing)} missing")
                continue
            per_request.setdefault(rid, []).append((key, slot))
        if not per_request:
            raise ValidationError(f"no complete step: every token misses at least one of the {L} layers "
                                  f"{_short(list(layer_ids))}; e.g. {incomplete[0] if incomplete else ''}",
                                  source=src0)

        request_ids = tuple(sorted(per_request, key=req_order.__getitem__))
        n = sum(len(v) for v in per_request.values())
        req = np.empty(n, np.int32)
        phase = np.empty(n, np.int8)
        position = np.empty(n, np.int32)
        token = np.empty(n, np.int64)
        experts = np.empty((n, L, top_k), np.int16)
        gates = np.empty((n, L, top_k), np.float32) if has_gates else None
        i = 0
        for ri, rid in enumerate(request_ids):
            last_phase = PREFILL
            for _, slot in sorted(per_request[rid], key=lambda kv: kv[0]):
                first = slot[0]
                if first.phase < last_phase:
                    raise ValidationError(f"request {rid!r}: a prefill token (position {first.position}) comes "
                                          "after a decode token", source=first.where.rsplit(":", 1)[0])
                last_phase = first.phase
                req[i], phase[i], position[i] = ri, first.phase, first.position
                token[i] = first.token_id
                for li in range(L):
                    experts[i, li] = slot[li].experts
                    if gates is not None:
                        gates[i, li] = slot[li].gates  # type: ignore[assignment]
                i += 1
        report = ImportReport(
            format=self.fmt, sources=self.sources, n_layers=L, n_experts=int(n_experts), top_k=int(top_k),
            inferred=tuple(inferred), n_experts_is_lower_bound="n_experts" in inferred, layer_ids=layer_ids,
            n_rows=self.n_rows, n_bad_rows=self.n_bad, bad_row_examples=tuple(self.bad_examples),
            n_requests=len(request_ids), n_steps=n, n_incomplete_steps=n_incomplete,
            incomplete_examples=tuple(incomplete), n_position_gaps=n_gaps, has_gates=has_gates,
            notes=tuple(self.notes))
        prov = dict(provenance or {})
        prov.setdefault("format", self.fmt)
        prov.setdefault("source", [os.path.basename(s) for s in self.sources])
        prov["import"] = {key: value for key, value in report.to_dict().items()
                          if key not in ("sources", "bad_row_examples", "incomplete_examples")}
        trace = RoutingTrace(L, int(n_experts), int(top_k), request_ids, req, phase, position, experts, gates,
                             token, provenance=prov)
        return trace, report


def _short(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")


def _check_shape_args(n_layers: int | None, n_experts: int | None, top_k: int | None) -> None:
    for name, value in (("--layers", n_layers), ("--experts", n_experts), ("--top-k", top_k)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValidationError(f"{name} must be a positive integer; got {value!r}")
    if top_k is not None and n_experts is not None and top_k > n_experts:
        raise ValidationError(f"--top-k must be <= --experts ({n_experts}); got {top_k}")


def _expert_ids(value: Any) -> tuple[int, ...] | str:
    """Distinct non-negative expert ids from a JSON list; an error message otherwise."""
    if not isinstance(value, list) or not value:
        return f"expected a non-empty list of expert ids; got {value!r:.60}"
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
        return f"expected non-negative integer expert ids; got {value!r:.60}"
    if len(set(value)) != len(value):
        return f"expert ids of one token and layer must be distinct; got {value!r:.60}"
    return tuple(value)


# ----------------------------------------------------------------------------- Mixtral JSON Lines
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


# ----------------------------------------------------------------------------- DeepSeek CSV
_SPLIT = re.compile(r"[\s,]+")


def _parse_expert_list(text: str) -> tuple[int, ...] | str:
    """``"[3, 17, 42]"``, ``"3 17 42"`` or ``"3,17,42"`` -> ``(3, 17, 42)``; an error message otherwise."""
    body = text.strip()
    if body.startswith("[") and body.endswith("]") or body.startswith("(") and body.endswith(")"):
        body = body[1:-1]
    parts = [p for p in _SPLIT.split(body.strip()) if p]
    if not parts:
        return f"expected a list of expert ids like '[3, 17, 42]' or '3 17 42'; got {text!r:.60}"
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        return f"expected integer expert ids like '[3, 17, 42]' or '3 17 42'; got {text!r:.60}"
    return _expert_ids(ids)


def import_deepseek_csv(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    n_layers: int | None = None,
    n_experts: int | None = None,
    top_k: int | None = None,
    prefill_batches: int = 1,
    skip_bad_rows: bool = False,
    provenance: dict[str, Any] | None = None,
) -> tuple[RoutingTrace, ImportReport]:
    """Read per-prompt CSV files ``Layer ID,Batch Number,Token,Activated Expert IDs`` (DeepSeek-V2-Lite).

    Parameters
    ----------
    paths
        CSV files (one per prompt; the request id is the file name without ``.csv``), or a
        directory whose ``*.csv`` files are read in sorted name order.
    n_layers, n_experts, top_k
        The model's shape; each one left ``None`` is inferred and named in the report.
    prefill_batches
        How many leading batch numbers of each file are the prompt (prefill); later
        batches are decode steps. 0 imports everything as decode.
    skip_bad_rows
        Count and skip unreadable rows instead of raising.
    provenance
        Extra metadata for the trace manifest.

    Notes
    -----
    Token ``i`` of batch ``b`` is the ``i``-th row of each ``(b, layer)`` group. A
    layer that lists fewer tokens in a batch than the others leaves the batch's
    tokens unalignable beyond that count: those steps are reported as incomplete
    and dropped. ``Token`` becomes the token id only when every value of the file
    is an integer; otherwise ids are unknown (-1).
    """
    _check_shape_args(n_layers, n_experts, top_k)
    if isinstance(prefill_batches, bool) or not isinstance(prefill_batches, int) or prefill_batches < 0:
        raise ValidationError(f"must be a non-negative integer; got {prefill_batches!r}", field="prefill_batches")
    files = _csv_files(paths)
    col = _Collector("deepseek-csv", [str(f) for f in files], skip_bad_rows)
    stems: dict[str, str] = {}
    n_text_files = 0
    for f in files:
        rid = f.stem
        if rid in stems:
            raise ValidationError(f"two files give the same request id {rid!r} (also {stems[rid]}); "
                                  "rename one", source=str(f))
        stems[rid] = str(f)
        text_tokens = _read_deepseek_file(f, rid, col, prefill_batches)
        n_text_files += text_tokens
    if n_text_files:
        col.notes.append(f"{n_text_files} file(s) hold token text, not integer ids: token ids unknown (-1)")
    col.notes.append(f"'Batch Number' read as the generation's forward pass: the first {prefill_batches} "
                     "batch(es) of each file are prefill, later ones decode (--prefill-batches)")
    return col.build(n_layers, n_experts, top_k, provenance)


def _csv_files(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.csv"))
            if not found:
                raise ValidationError("directory holds no *.csv files", source=str(p))
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise ValidationError("no such file or directory", source=str(p))
    if not files:
        raise ValidationError("no CSV files given")
    return files


def _read_deepseek_file(path: Path, rid: str, col: _Collector, prefill_batches: int) -> int:
    """Parse one per-prompt CSV into ``col.rows``; return 1 if its Token column holds text."""
    src = str(path)
    try:
        handle = open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise ValidationError(f"cannot open ({exc.strerror})", source=src) from None
    parsed: list[tuple[int, int, int, str, tuple[int, ...]]] = []  # (line, layer, batch, token, experts)
    with handle:
        try:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise ValidationError(f"empty file; expected the header {','.join(_DEEPSEEK_COLUMNS)}", source=src)
            names = [h.strip().lower() for h in header]
            try:
                idx = [names.index(c.lower()) for c in _DEEPSEEK_COLUMNS]
            except ValueError:
                raise ValidationError(f"expected the header {','.join(_DEEPSEEK_COLUMNS)}; got {','.join(header)}",
                                      source=src, record=1) from None
            for row in reader:
                line = reader.line_num
                if not any(cell.strip() for cell in row):
                    continue
                col.n_rows += 1
                if len(row) < len(header):
                    col.bad(f"expected {len(header)} columns; got {len(row)}", src, line)
                    continue
                li, bi, ti, ei = (row[j] for j in idx)
                try:
                    layer = int(li)
                    if layer < 0:
                        raise ValueError
                except ValueError:
                    col.bad(f"expected a non-negative integer; got {li!r}", src, line, "Layer ID")
                    continue
                try:
                    batch = int(bi)
                    if batch < 0:
                        raise ValueError
                except ValueError:
                    col.bad(f"expected a non-negative integer; got {bi!r}", src, line, "Batch Number")
                    continue
                ex = _parse_expert_list(ei)
                if isinstance(ex, str):
                    col.bad(ex, src, line, "Activated Expert IDs")
                    continue
                parsed.append((line, layer, batch, ti, ex))
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text; expected CSV", source=src) from None
        except csv.Error as exc:
            raise ValidationError(f"malformed CSV ({exc})", source=src) from None
    tokens_are_ids = bool(parsed) and all(re.fullmatch(r"\s*\d+\s*", p[3]) for p in parsed)
    batches = sorted({p[2] for p in parsed})
    if batches and batches[-1] - batches[0] + 1 != len(batches):
        col.gap_requests.add(rid)
    batch_rank = {b: i for i, b in enumerate(batches)}
    # Token i of a batch is the i-th row of each (batch, layer) group.
    tokens: dict[tuple[int, int], list[str]] = {}  # (batch, layer) -> token column, in row order
    for _line, layer, batch, tok, _ex in parsed:
        tokens.setdefault((batch, layer), []).append(tok)
    widths: dict[int, int] = {}
    for (batch, _layer), toks in tokens.items():
        widths[batch] = max(widths.get(batch, 0), len(toks))
    # A layer listing fewer tokens than the others (or other tokens) in a batch cannot be aligned to
    # positions: its rows of that batch are left out, so the batch's steps are reported incomplete.
    unaligned: set[tuple[int, int]] = set()
    for b in batches:
        groups = {layer: toks for (batch, layer), toks in tokens.items() if batch == b}
        ref = Counter(tuple(t) for t in groups.values() if len(t) == widths[b]).most_common(1)[0][0]
        bad_layers = sorted(layer for layer, toks in groups.items() if tuple(toks) != ref)
        if bad_layers:
            unaligned.update((b, layer) for layer in bad_layers)
            col.notes.append(f"{path.name}: batch {b}: layer(s) {_short(bad_layers)} list other tokens than the "
                             f"other layers ({widths[b]}); that batch's tokens cannot be aligned and are dropped")
    offsets: dict[int, int] = {}  # batch -> position of its first token
    start = 0
    for b in batches:
        offsets[b] = start
        start += widths[b]
    counter: dict[tuple[int, int], int] = {}  # (batch, layer) -> rows so far
    for line, layer, batch, tok, ex in parsed:
        i = counter.get((batch, layer), 0)
        counter[(batch, layer)] = i + 1
        if (batch, layer) in unaligned:
            continue
        pos = offsets[batch] + i
        phase = PREFILL if batch_rank[batch] < prefill_batches else DECODE
        token_id = int(tok) if tokens_are_ids else -1
        col.rows.append(_Row(rid, (batch, i), pos, phase, layer, ex, None, token_id, f"{src}:{line}"))
    return 0 if tokens_are_ids or not parsed else 1
