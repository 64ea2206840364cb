"""FCFS continuous batching: arrival offsets, the decode schedule, and the events it produces (§2.1, §3.2).

Requests are admitted in arrival order (then input order) while fewer than
``B`` are active; each active request executes one decode token per step.
The schedule ``(step, request, token)`` then becomes an :class:`EventStream`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..trace.model import DECODE, RoutingTrace
from .stream import EventStream

_log = logging.getLogger(__name__)

__all__ = ["ArrivalOffsets", "ARRIVAL_KINDS", "fcfs_schedule", "build_events", "fcfs_decode_schedule", "events_before_request",
           "decode_rows", "events_from_schedule"]


#: Largest arrival offset (steps): arrivals stay well inside int64 for any number of requests.
MAX_OFFSET = 2 ** 40


@dataclass(frozen=True)
class ArrivalOffsets:
    """Arrival steps of requests under continuous batching (docs/design.md §4).

    Attributes
    ----------
    kind
        ``"zero"`` (all arrive at step 0), ``"stagger"`` (request ``i`` arrives
        at ``i*stagger``), ``"random"`` (uniform integers in ``[low, high]``
        drawn from ``numpy.random.default_rng(seed)``), ``"poisson"`` (a Poisson
        process of ``rate`` arrivals per step: exponential gaps of mean
        ``1/rate`` from ``default_rng(seed)``, request ``i`` arriving at the
        floor of the ``i+1``-th arrival time) or ``"file"`` (the arrival step of
        every request read from ``path``).
    stagger, low, high, seed, rate, path
        Parameters of the respective kinds.
    times, ids
        ``file``: the arrival steps read, and the request ids they belong to
        (``None`` when the file lists them in the trace's request order).
    """

    kind: str = "zero"
    stagger: int = 0
    low: int = 0
    high: int = 0
    seed: int = 0
    rate: float = 0.0
    path: str = ""
    times: tuple[int, ...] = ()
    ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValidationError(f"offsets kind must be one of {', '.join(ARRIVAL_KINDS)}; got {self.kind!r}",
                                  field="offsets")
        if self.stagger < 0:
            raise ValidationError(f"stagger must be >= 0; got {self.stagger}", field="offsets")
        if self.kind == "random" and not 0 <= self.low <= self.high:
            raise ValidationError(f"random offsets need 0 <= low <= high; got {self.low}:{self.high}", field="offsets")
        if max(self.stagger, self.low, self.high) > MAX_OFFSET:
            raise ValidationError(f"arrival offsets must be at most {MAX_OFFSET} steps; got "
                                  f"{max(self.stagger, self.low, self.high)}", field="offsets")
        if self.kind == "poisson" and not (math.isfinite(self.rate) and 0 < self.rate <= 1e6):
            raise ValidationError(f"a Poisson arrival rate must be in (0, 1e6] requests per step; got {self.rate}",
                                  field="offsets")

    @property
    def seeded(self) -> bool:
        """Whether the arrivals depend on ``seed``."""
        return self.kind in ("random", "poisson")

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> ArrivalOffsets:
        """Parse ``zero``, ``stagger:D``, ``random:LO:HI``, ``poisson:RATE`` or ``file:PATH`` (CLI syntax)."""
        text = text.strip()
        if text.startswith("file:") and len(text) > 5:
            return _read_arrivals(text[5:])
        parts = text.split(":")
        try:
            if parts == ["zero"]:
                return cls("zero")
            if parts[0] == "stagger" and len(parts) == 2:
                return cls("stagger", stagger=int(parts[1]))
            if parts[0] == "random" and len(parts) == 3:
                return cls("random", low=int(parts[1]), high=int(parts[2]), seed=seed)
            if parts[0] == "poisson" and len(parts) == 2:
                return cls("poisson", rate=float(parts[1]), seed=seed)
        except ValueError:
            pass
        raise ValidationError(f"expected zero, stagger:D, random:LO:HI (integers), poisson:RATE (requests per "
                              f"step) or file:PATH; got {text!r}", field="offsets")

    def arrivals(self, n_requests: int, request_ids: Sequence[str] | None = None) -> np.ndarray:
        """``int64[n_requests]`` arrival step of each request, in input order.

        ``request_ids`` (the trace's, in input order) lets a ``file`` keyed by request id be matched.
        """
        if self.kind == "zero":
            return np.zeros(n_requests, dtype=np.int64)
        if self.kind == "stagger":
            return np.arange(n_requests, dtype=np.int64) * self.stagger
        rng = np.random.default_rng(self.seed)
        if self.kind == "random":
            return rng.integers(self.low, self.high, size=n_requests, endpoint=True).astype(np.int64)
        if self.kind == "poisson":
            times = np.cumsum(rng.exponential(1.0 / self.rate, size=n_requests))
            if times.size and times[-1] > MAX_OFFSET:
                raise ValidationError(f"a Poisson rate of {self.rate:g} per step puts the last of {n_requests} "
                                      f"arrivals beyond {MAX_OFFSET} steps; use a higher rate", field="offsets")
            return np.floor(times).astype(np.int64)
        if self.ids is None:
            if len(self.times) != n_requests:
                raise ValidationError(f"the file lists {len(self.times)} arrival steps; the trace has {n_requests} "
                                      "requests (list one per request, in the trace's order, or key them by "
                                      "request_id)", source=self.path, field="arrival_step")
            return np.asarray(self.times, dtype=np.int64)
        if request_ids is None:
            raise ValidationError("arrivals keyed by request_id need the trace's request ids", source=self.path)
        by_id = dict(zip(self.ids, self.times, strict=True))
        missing = [r for r in request_ids if r not in by_id]
        if missing:
            raise ValidationError(f"no arrival step for request {missing[0]!r} ({len(missing)} of the trace's "
                                  f"{len(request_ids)} requests are missing)", source=self.path, field="request_id")
        return np.asarray([by_id[r] for r in request_ids], dtype=np.int64)

    def describe(self) -> str:
        return {"zero": "zero", "stagger": f"stagger:{self.stagger}", "random": f"random:{self.low}:{self.high}",
                "poisson": f"poisson:{self.rate:g}", "file": f"file:{self.path}"}[self.kind]


#: Arrival processes of :class:`ArrivalOffsets`.
ARRIVAL_KINDS = ("zero", "stagger", "random", "poisson", "file")
_MAX_ARRIVAL_FILE = 64 << 20
_MAX_ARRIVAL_STEP = MAX_OFFSET


def _read_arrivals(path: str) -> ArrivalOffsets:
    """Arrival steps from a CSV file: ``request_id,arrival_step`` with that header, or one step per line."""
    import csv

    p = Path(path)
    if not p.is_file():
        raise ValidationError("no such arrivals file: expected a CSV of request_id,arrival_step (or one arrival "
                              "step per line, in the trace's request order)", source=path)
    if p.stat().st_size > _MAX_ARRIVAL_FILE:
        raise ValidationError(f"an arrivals file is at most {_MAX_ARRIVAL_FILE >> 20} MiB; got "
                              f"{p.stat().st_size} bytes", source=path)
    try:
        rows = list(csv.reader(p.read_text(encoding="utf-8-sig").splitlines()))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValidationError(f"not a readable CSV: {exc}", source=path) from None
    rows = [r for r in rows if r and any(c.strip() for c in r)]
    keyed = bool(rows) and [c.strip() for c in rows[0]] == ["request_id", "arrival_step"]
    if rows and not keyed and [c.strip() for c in rows[0]] == ["arrival_step"]:
        rows = rows[1:]
    elif keyed:
        rows = rows[1:]
    if not rows:
        raise ValidationError("no arrival steps in the file", source=path)
    ids, times = [], []
    for n, row in enumerate(rows, start=2 if keyed else 1):
        if len(row) != (2 if keyed else 1):
            raise ValidationError(f"expected {'request_id,arrival_step' if keyed else 'one arrival step'}; got "
                                  f"{','.join(row)[:60]!r}", source=path, record=n)
        value = row[-1].strip()
        try:
            step = int(value)
        except ValueError:
            step = -1
        if not 0 <= step <= _MAX_ARRIVAL_STEP:
            raise ValidationError(f"an arrival step is an integer in [0, 2**40]; got {value[:40]!r}", source=path,
                                  record=n, field="arrival_step")
        times.append(step)
        if keyed:
            ids.append(row[0].strip())
    if keyed and len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValidationError(f"request {dup!r} has more than one arrival step", source=path, field="request_id")
    return ArrivalOffsets("file", path=str(path), times=tuple(times), ids=tuple(ids) if keyed else None)


def fcfs_schedule(lengths: np.ndarray, arrivals: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FCFS continuous batching: which request executes which of its tokens at which step.

    Requests are ordered by ``(arrival, input order)``; at step ``s`` running
    requests stay and free slots up to ``batch`` are filled by arrived waiting
    requests; each active request executes its next token; it leaves after its
    last. Steps with no active request produce nothing (time jumps to the next
    arrival).

    Returns
    -------
    step, request, token
        ``int64`` arrays, one entry per executed token, ordered by step.
    """
    order = np.lexsort((np.arange(lengths.shape[0]), arrivals))
    order = order[lengths[order] > 0]
    out_step: list[np.ndarray] = []
    out_req: list[np.ndarray] = []
    out_tok: list[np.ndarray] = []
    running: list[tuple[int, int, int]] = []  # (request, start_step, length)
    queue = 0
    s = 0
    while queue < order.shape[0] or running:
        if not running and arrivals[order[queue]] > s:
            s = int(arrivals[order[queue]])
        while len(running) < batch and queue < order.shape[0] and arrivals[order[queue]] <= s:
            r = int(order[queue])
            running.append((r, s, int(lengths[r])))
            queue += 1
        # advance to the next change: a completion or (if slots are free) an arrival
        until = min(start + n for _, start, n in running)
        if len(running) < batch and queue < order.shape[0]:
            until = min(until, max(s + 1, int(arrivals[order[queue]])))
        span = until - s
        for r, start, _ in running:
            out_step.append(np.arange(s, until, dtype=np.int64))
            out_req.append(np.full(span, r, dtype=np.int64))
            out_tok.append(np.arange(s - start, until - start, dtype=np.int64))
        s = until
        running = [x for x in running if x[1] + x[2] > s]
    step = np.concatenate(out_step)
    req = np.concatenate(out_req)
    tok = np.concatenate(out_tok)
    idx = np.lexsort((req, step))
    return step[idx], req[idx], tok[idx]


def build_events(trace: RoutingTrace, batch: int, offsets: ArrivalOffsets | None = None) -> EventStream:
    """Turn the decode routing of ``trace`` into events under FCFS continuous batching.

    Parameters
    ----------
    trace
        The routing trace; only decode tokens are scheduled.
    batch
        Concurrency ``B`` (maximum active requests per step), ``>= 1``.
    offsets
        Arrival offsets; all zero by default.

    Returns
    -------
    EventStream
        One event per (step, layer) with an active request; multiplicity and
        gate mass summed over the active requests (gate mass only if the trace
        has gates).
    """
    step, req, tok, prov = fcfs_decode_schedule(trace, batch, offsets)
    return events_from_schedule(trace, step, req, tok, prov)


def fcfs_decode_schedule(trace: RoutingTrace, batch: int, offsets: ArrivalOffsets | None = None
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """The FCFS schedule :func:`build_events` uses (``step, req, tok``) and the stream's provenance."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValidationError(f"batch must be a positive integer; got {batch!r}", field="batch")
    offsets = offsets or ArrivalOffsets()
    lengths, _ = decode_rows(trace)
    step, req, tok = fcfs_schedule(lengths, offsets.arrivals(trace.n_requests, trace.request_ids), int(batch))
    prov = {
        "source": "routing_trace",
        "trace_provenance": trace.provenance,
        "discipline": "fcfs-continuous-batching",
        "batch": int(batch),
        "offsets": offsets.describe(),
        "offsets_seed": offsets.seed if offsets.seeded else None,
        "phase": "decode",
        "n_requests": int((lengths > 0).sum()),
    }
    return step, req, tok, prov


def events_before_request(stream: EventStream, step: np.ndarray, req: np.ndarray, first_request: int) -> int:
    """Events of ``stream`` before the first step that serves request ``first_request`` or a later one.

    ``step, req`` is the schedule ``stream`` was built from (e.g. :func:`fcfs_schedule`). With the
    requests of a warm-up placed before ``first_request``, the result is the
    ``ReplayConfig.warmup_events`` that counts from the first step of the window (§8.1).
    """
    served = step[req >= first_request]
    if served.size == 0:
        raise ValidationError(f"no request from index {first_request} on has a decode token; the window is empty")
    return int(np.searchsorted(stream.step, int(served.min()), side="left"))


def decode_rows(trace: RoutingTrace) -> tuple[np.ndarray, np.ndarray]:
    """Decode tokens per request (``int64[n_requests]``) and each request's first decode row.

    Rows are grouped by request and position-sorted, so the decode rows of a request are contiguous.
    """
    rows = np.flatnonzero(trace.phase == DECODE)
    if rows.size == 0:
        raise ValidationError("the trace has no decode tokens to schedule; a trace imported with "
                              "'expertcache trace import --phase prefill' holds prefill only: import it again "
                              "with --phase decode (the default), which reads teacher-forced tokens such as a "
                              "deepseek-csv forward pass as decode positions")
    lengths = np.bincount(trace.request[rows], minlength=trace.n_requests).astype(np.int64)
    first = np.full(trace.n_requests, -1, dtype=np.int64)
    has = lengths > 0
    first[has] = rows[np.r_[0, np.cumsum(lengths)[:-1]][has]]
    return lengths, first


def events_from_schedule(trace: RoutingTrace, step: np.ndarray, req: np.ndarray, tok: np.ndarray,
                         provenance: dict[str, Any]) -> EventStream:
    """Events of a schedule: request ``req[i]`` executes its decode token ``tok[i]`` at ``step[i]``.

    Any service discipline reduces to such a schedule; the union, multiplicity
    and gate mass of each (step, layer) follow from it. A schedule sorted by step
    is built one step at a time by a kernel, into arrays of its own (their
    unused ends given back); any other sorts every (token, layer, slot) entry.
    """
    L, N, k = trace.n_layers, trace.n_experts, trace.top_k
    _, first = decode_rows(trace)
    step = np.asarray(step, dtype=np.int64)
    exec_rows = first[req] + tok
    in_order = exec_rows.shape[0] > 0 and bool((np.diff(step) >= 0).all())
    build = _sorted_schedule_events if in_order else _schedule_events
    ev_ids, csr, expert, mult, gm, active = build(trace, step, exec_rows)
    ev_step = ev_ids // L
    _log.info("FCFS events: %d events over %d steps at B = %d (%d union accesses)", csr.shape[0] - 1,
              int(ev_step[-1]) + 1 if ev_step.size else 0, int(provenance.get("batch", 0) or 0), int(csr[-1]))
    # valid by construction from a validated trace: (step, layer) ascending, members distinct and ascending,
    # multiplicities in [1, active] summing to active * k; no second pass over every member
    return EventStream._trusted(L, N, k, ev_step.astype(np.int64), (ev_ids % L).astype(np.int32), active,
                                active.astype(np.int64) * k, csr, expert, mult, gm, dict(provenance))


def _sorted_schedule_events(trace: RoutingTrace, step: np.ndarray, exec_rows: np.ndarray) -> tuple:
    """:func:`_schedule_events` of rows sorted by step, one step at a time by
    :func:`._kernels.step_layer_events` (the same arrays, without the per-entry sort keys). The members' arrays
    are allocated for every (token, layer, slot) entry and shrunk in place to the union (:func:`_trimmed`): the
    pages past it, never written, take no memory, and no second copy is made (where chunks of the schedule were
    built apart and joined, the chunks and their join were held at once: ``expertcache report`` on the Qwen3-sized
    trace peaked at 1,405 MiB, now 1,181, by ``python benchmarks/bench_commands.py --only report``)."""
    from ._kernels import step_layer_events

    L, N, k = trace.n_layers, trace.n_experts, trace.top_k
    n_exec = exec_rows.shape[0]
    n_steps = int(np.count_nonzero(np.diff(step))) + 1 if n_exec else 0
    n_entries = n_exec * L * k
    ev_ids = np.empty(n_steps * L, dtype=np.int64)
    active = np.empty(n_steps * L, dtype=np.int32)
    csr = np.empty(n_steps * L + 1, dtype=np.int64)
    expert = np.empty(n_entries, dtype=np.int16)
    mult = np.empty(n_entries, dtype=np.int32)
    has_gates = trace.gates is not None
    gm = np.empty(n_entries if has_gates else 0, dtype=np.float32)
    gates = trace.gates if has_gates else np.zeros((0, L, k), dtype=np.float32)
    n_ev, n_u = step_layer_events(np.ascontiguousarray(step, dtype=np.int64),
                                  np.ascontiguousarray(exec_rows, dtype=np.int64), trace.experts, gates, has_gates,
                                  N, ev_ids, csr, expert, mult, gm, active)
    return (_trimmed(ev_ids, n_ev), _trimmed(csr, n_ev + 1), _trimmed(expert, n_u), _trimmed(mult, n_u),
            _trimmed(gm, n_u) if has_gates else None, _trimmed(active, n_ev))


def _trimmed(a: np.ndarray, n: int) -> np.ndarray:
    """``a[:n]`` as an array of its own: ``a`` (owning its data, referenced nowhere else) shrunk in place, its end
    given back to the allocator."""
    a.resize(n, refcheck=False)
    return a


def _schedule_events(trace: RoutingTrace, step: np.ndarray, exec_rows: np.ndarray) -> tuple:
    """Event ids (``step*L + layer``), CSR offsets, members, multiplicity, gate mass and ``|A(s)|``
    of the executed rows ``exec_rows`` at ``step`` (complete steps only)."""
    L, N, k = trace.n_layers, trace.n_experts, trace.top_k
    n_exec = exec_rows.shape[0]
    # one entry per (executed token, layer, slot): sort by (step, layer, expert)
    e = trace.experts[exec_rows].reshape(-1)
    key = (np.repeat(step, L * k) * L + np.tile(np.repeat(np.arange(L, dtype=np.int64), k), n_exec)) * N + e
    order = np.argsort(key, kind="stable")
    key_sorted = key[order]
    del key
    new = np.r_[True, key_sorted[1:] != key_sorted[:-1]]
    starts_u = np.flatnonzero(new)
    mult = np.diff(np.r_[starts_u, key_sorted.shape[0]]).astype(np.int32)
    uk = key_sorted[starts_u]
    del key_sorted
    expert = (uk % N).astype(np.int16)
    ev_key = uk // N
    ev_starts = np.flatnonzero(np.r_[True, ev_key[1:] != ev_key[:-1]])
    ev_ids = ev_key[ev_starts]
    csr = np.r_[ev_starts, uk.shape[0]].astype(np.int64)
    gm = None
    if trace.gates is not None:
        g = trace.gates[exec_rows].reshape(-1)[order].astype(np.float64)
        gm = np.add.reduceat(g, starts_u).astype(np.float32) if starts_u.size else np.zeros(0, np.float32)
    steps_u, per_step = np.unique(step, return_counts=True)
    active = per_step[np.searchsorted(steps_u, ev_ids // L)].astype(np.int32)
    return ev_ids, csr, expert, mult, gm, active


