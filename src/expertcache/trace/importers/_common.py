"""What every importer shares: the import report, the row collector and the shape checks."""


from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ...errors import ValidationError
from ..model import PHASES, PREFILL, RoutingTrace

__all__ = ["ImportReport"]

_MAX_EXAMPLES = 5


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
