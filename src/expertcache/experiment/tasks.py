"""Tasks of a spec run: conditions that share an event stream, and the pure function that computes them.

Conditions that share an event stream (input, selection, order seed, warm-up,
discipline, batch, offsets) form one :class:`Task`, so each stream is built once
per task; inside a task, conditions that differ only in ``rho`` are one
:func:`expertcache.replay.replay_curve` call (one pass or separate replays, whichever is measured cheaper).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ValidationError
from .spec import PlannedCondition, canonical_json

__all__ = ["Task", "METRICS", "ConditionStream", "plan_tasks", "run_task", "select_indices",
           "condition_requests", "build_condition_stream", "split_requests"]

#: Metrics stored per condition (rotation conditions add the last four), in table order. Counts cover
#: the counted events; ``warmup_events`` is how many events before them only filled the cache.
METRICS = ("transferred", "demand_misses", "hits", "initial_load", "logical", "union", "n_events",
           "capacity_total", "miss_fraction", "steady_miss_fraction", "union_over_logical", "warmup_events",
           "mean_batch", "max_interval", "deadline_violations", "p99_latency_steps")


@dataclass(frozen=True)
class Task:
    """One unit of work: a stream (``stream``: the condition fields that define it) and its curves.

    ``curves`` holds ``(replay fields, ((condition_id, rho), ...))`` per curve.
    """

    stream: tuple[tuple[str, Any], ...]
    curves: tuple[tuple[tuple[tuple[str, Any], ...], tuple[tuple[str, float], ...]], ...]

    @property
    def n_conditions(self) -> int:
        return sum(len(c[1]) for c in self.curves)


_STREAM_FIELDS = ("input", "selection", "order_seed", "warm", "warm_requests", "window_requests", "discipline",
                  "batch", "admitted", "window", "scheduler", "offsets", "offsets_seed")
_CURVE_FIELDS = ("policy", "scope", "semantics", "tie_break", "tie_seed", "lfu_in_cache_counters")


def plan_tasks(pending: Sequence[PlannedCondition], max_conditions: int = 64) -> list[Task]:
    """Group pending conditions by stream, then by curve; split streams into tasks of at most
    ``max_conditions`` conditions (a curve is never split). Deterministic in the input order."""
    by_stream: OrderedDict[tuple, OrderedDict[tuple, list[tuple[str, float]]]] = OrderedDict()
    for p in pending:
        c = p.condition
        sk = tuple((f, getattr(c, f)) for f in _STREAM_FIELDS)
        ck = tuple((f, getattr(c, f)) for f in _CURVE_FIELDS)
        by_stream.setdefault(sk, OrderedDict()).setdefault(ck, []).append((p.condition_id, c.rho))
    tasks = []
    for sk, curves in by_stream.items():
        batch: list = []
        n = 0
        for ck, members in curves.items():
            if batch and n + len(members) > max_conditions:
                tasks.append(Task(sk, tuple(batch)))
                batch, n = [], 0
            batch.append((ck, tuple(members)))
            n += len(members)
        if batch:
            tasks.append(Task(sk, tuple(batch)))
    return tasks


# ----------------------------------------------------------------------------- worker side
#: Entries kept per worker: decode-only traces are few and reused by every task; tasks come grouped
#: by stream (:func:`plan_tasks`), so a few streams suffice (a Qwen3-30B-A3B-sized stream is ~50 MB).
_CACHE_LIMIT = 16
_STREAM_LIMIT = 4
_TRACES: OrderedDict[str, Any] = OrderedDict()
_STREAMS: OrderedDict[tuple, Any] = OrderedDict()


def _cached(cache: OrderedDict, key: Any, make: Callable[[], Any], limit: int = _CACHE_LIMIT) -> Any:
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = make()
    cache[key] = value
    while len(cache) > limit:
        cache.popitem(last=False)
    return value


def _trace(path: str, manifest_sha256: str):
    """The trace at ``path``, decode rows only (cached per worker)."""
    from ..trace import read_trace

    return _cached(_TRACES, (path, manifest_sha256), lambda: _decode_only(read_trace(path)))


def _decode_only(trace):
    """``trace`` without its prefill rows: every discipline of a spec schedules decode tokens only
    (:func:`expertcache.events.build_events`, :func:`expertcache.events.rotation.rotation_events`), and a
    trace with prefills of a few thousand tokens per request is mostly prefill rows. Request
    indices and ids are unchanged, so selections mean the same requests."""
    from ..trace import DECODE, RoutingTrace

    keep = trace.phase == DECODE
    if keep.all():
        return trace
    return RoutingTrace(trace.n_layers, trace.n_experts, trace.top_k, trace.request_ids, trace.request[keep],
                        trace.phase[keep], trace.position[keep], trace.experts[keep],
                        None if trace.gates is None else trace.gates[keep], trace.token_id[keep], trace.provenance,
                        *(None if a is None else a[keep] for a in (trace.probs, trace.entropy, trace.margin)))


def select_indices(trace, selection: str, order_seed: int | None, selections: dict[str, dict],
                   salt: tuple[int, ...] = ()) -> np.ndarray:
    """Request indices of ``selection`` in ``trace``, permuted by ``order_seed`` (within each concat part).

    Part ``i`` is permuted by ``numpy.random.default_rng([order_seed, i, *salt])``; a warm-up
    selection uses ``salt=(1,)`` so its order is drawn independently of the window's.
    """
    parts = _selection_parts(trace, selection, selections)
    out = []
    for i, (idx, head) in enumerate(parts):
        if order_seed is not None:
            idx = idx[np.random.default_rng([int(order_seed), i, *salt]).permutation(idx.shape[0])]
        if head is not None:
            if head > idx.shape[0]:
                raise ValidationError(f"selection {selection!r} asks for the first {head} requests of a part "
                                      f"holding {idx.shape[0]}", field="selection")
            idx = idx[:head]
        out.append(idx)
    flat = np.concatenate(out)
    if np.unique(flat).shape[0] != flat.shape[0]:
        raise ValidationError(f"selection {selection!r} names a request twice (concat parts overlap)",
                              field="selection")
    return flat


def _selection_parts(trace, name: str, selections: dict[str, dict]) -> list[tuple[np.ndarray, int | None]]:
    sel = selections[name]
    kind, params = sel["kind"], dict(sel["params"])
    n = trace.n_requests
    if kind == "all":
        return [(np.arange(n, dtype=np.int64), None)]
    if kind == "range":
        a, b = params["range"]
        if b > n:
            raise ValidationError(f"selection {name!r} = range [{a}, {b}) exceeds the trace's {n} requests",
                                  field="selection")
        return [(np.arange(a, b, dtype=np.int64), None)]
    if kind == "indices":
        idx = np.asarray(params["indices"], dtype=np.int64)
        if idx.max() >= n:
            raise ValidationError(f"selection {name!r}: index {int(idx.max())} >= the trace's {n} requests",
                                  field="selection")
        return [(idx, None)]
    if kind == "request_ids":
        lookup = {r: i for i, r in enumerate(trace.request_ids)}
        missing = [r for r in params["request_ids"] if r not in lookup]
        if missing:
            raise ValidationError(f"selection {name!r}: request id {missing[0]!r} is not in the trace",
                                  field="selection")
        return [(np.array([lookup[r] for r in params["request_ids"]], dtype=np.int64), None)]
    if kind == "sample":
        base = _flat(trace, params.get("from", "all"), selections)
        k = int(params["sample"])
        if k > base.shape[0]:
            raise ValidationError(f"selection {name!r} samples {k} of {base.shape[0]} requests", field="selection")
        pick = np.sort(np.random.default_rng(int(params.get("seed", 0))).choice(base.shape[0], k, replace=False))
        return [(base[pick], None)]
    out = []
    for part in params["concat"]:
        pname, _, head = part.partition(":")
        out.append((_flat(trace, pname, selections), int(head) if head else None))
    return out


def _flat(trace, name: str, selections: dict[str, dict]) -> np.ndarray:
    """A referenced selection's requests in stored order, the ``:N`` heads of its own parts applied."""
    return np.concatenate([idx if head is None else idx[:head]
                           for idx, head in _selection_parts(trace, name, selections)])


@dataclass(frozen=True)
class ConditionStream:
    """The event stream of a condition's stream fields.

    Attributes
    ----------
    stream
        The events.
    stats
        Rotation statistics (``RotationStats``), or ``None`` for other disciplines.
    warmup_events
        Events that only fill the cache (``ReplayConfig.warmup_events``): those before the first
        step serving a window request for a warm-transition condition, the manifest's
        ``warmup_events`` for a stored stream (as ``expertcache replay`` applies it), else 0.
    """

    stream: Any
    stats: Any
    warmup_events: int


def condition_requests(trace, stream: dict[str, Any], selections: dict[str, dict]
                       ) -> tuple[np.ndarray | None, np.ndarray]:
    """Request indices of a condition on a trace input: ``(warm-up or None, window)``, in service order."""
    idx = select_indices(trace, stream["selection"], stream["order_seed"], selections)
    if stream.get("window_requests") is not None:
        idx = idx[:stream["window_requests"]]
    if stream.get("warm") is None:
        return None, idx
    warm = select_indices(trace, stream["warm"], stream["order_seed"], selections, salt=(1,))
    if stream.get("warm_requests") is not None:
        warm = warm[:stream["warm_requests"]]
    shared = np.intersect1d(warm, idx)
    if shared.size:
        raise ValidationError(f"warm-up selection {stream['warm']!r} and window selection {stream['selection']!r} "
                              f"share {shared.size} request(s) (e.g. index {int(shared[0])}); a transition needs "
                              "disjoint selections", field="warm")
    return warm, idx


def build_condition_stream(context: dict[str, Any], stream: dict[str, Any]) -> ConditionStream:
    """The event stream, rotation stats and warm-up event count of a condition's stream fields."""
    from ..events import read_events
    from ..trace import select_requests

    inp = context["inputs"][stream["input"]]
    if stream["discipline"] == "stream":
        s = read_events(inp["path"])
        return ConditionStream(s, None, int(s.provenance.get("warmup_events", 0) or 0))
    trace = _trace(inp["path"], inp["manifest_sha256"])
    warm, idx = condition_requests(trace, stream, context["selections"])
    if warm is None:
        s, stats = _schedule(select_requests(trace, idx, note=f"selection {stream['selection']}"), stream)
        return ConditionStream(s, stats, 0)
    sub = select_requests(trace, np.concatenate([warm, idx]),
                          note=f"warm-up {stream['warm']} then window {stream['selection']}")
    s, _ = _schedule(sub, stream)
    return ConditionStream(s, None, _events_before_request(s, sub, warm.shape[0], stream))


def split_requests(spec, conditions) -> set[tuple[str, str]]:
    """The data ``conditions`` read: ``(input path, request id)`` per request of a trace input (window
    and warm-up), ``(stream path, "*")`` for a stream input (its requests are not known individually)."""
    context = spec.context()
    out: set[tuple[str, str]] = set()
    seen: set[tuple] = set()
    for c in conditions:
        inp = context["inputs"][c.input]
        if c.discipline == "stream":
            out.add((inp["path"], "*"))
            continue
        key = c.stream_key()
        if key in seen:
            continue
        seen.add(key)
        trace = _trace(inp["path"], inp["manifest_sha256"])
        fields = {f: getattr(c, f) for f in _STREAM_FIELDS}
        for idx in condition_requests(trace, fields, context["selections"]):
            if idx is not None:
                out.update((inp["path"], trace.request_ids[i]) for i in idx.tolist())
    return out


def _events_before_request(s, trace, first_request: int, stream: dict[str, Any]) -> int:
    """Events of ``s`` before the first FCFS step that serves request ``first_request`` or a later one.

    The schedule is :func:`expertcache.events.fcfs_schedule` with the condition's arrivals, the one
    :func:`expertcache.events.build_events` used for ``s`` (as :func:`expertcache.experiment.scoped.warm_transition`).
    """
    from ..events import ArrivalOffsets, decode_rows, events_before_request, fcfs_schedule

    lengths, _ = decode_rows(trace)
    arrivals = ArrivalOffsets.parse(stream["offsets"], seed=stream["offsets_seed"] or 0).arrivals(
        trace.n_requests, trace.request_ids)
    step, req, _ = fcfs_schedule(lengths, arrivals, stream["batch"])
    if not (req >= first_request).any():
        raise ValidationError(f"the window requests of selection {stream['selection']!r} have no decode tokens",
                              field="selection")
    return events_before_request(s, step, req, first_request)


def _schedule(trace, stream: dict[str, Any]):
    from ..events import ArrivalOffsets, build_events
    from ..events.rotation import RotationConfig, rotation_events

    offs = ArrivalOffsets.parse(stream["offsets"], seed=stream["offsets_seed"] or 0)
    if stream["discipline"] == "rotation":
        return rotation_events(trace, RotationConfig(stream["admitted"], stream["batch"], stream["window"],
                                                     stream["scheduler"]), offs)
    return build_events(trace, stream["batch"], offs), None


def _calibration(context: dict[str, Any], stream: dict[str, Any]):
    """The calibration stream of the condition's input: stored as is, or its trace scheduled alike."""
    from ..events import read_events

    inp = context["inputs"][stream["input"]]
    if inp["calibration_kind"] == "stream":
        return read_events(inp["calibration"])
    return _schedule(_trace(inp["calibration"], inp["calibration_sha256"]), stream)[0]


def _context_key(context: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(context).encode()).hexdigest()


def run_task(context: dict[str, Any], task: Task) -> list[tuple[str, dict[str, float]]]:
    """Compute every condition of ``task``: ``(condition_id, {metric: value})`` each, in METRICS order
    (then the spec's timing metrics, :mod:`expertcache.experiment.timing`, when it has a ``[timing]`` table).

    Runs in a worker process (or Ray worker); built traces and streams are cached there.
    """
    from ..replay import ReplayConfig, get_policy, replay_curve

    ckey = _context_key(context)
    stream_fields = dict(task.stream)
    built = _cached(_STREAMS, (ckey, task.stream), lambda: build_condition_stream(context, stream_fields),
                    _STREAM_LIMIT)
    s, stats = built.stream, built.stats
    out = []
    for curve, members in task.curves:
        cf = dict(curve)
        base = ReplayConfig(cf["policy"], scope=cf["scope"], semantics=cf["semantics"], tie_break=cf["tie_break"],
                            seed=cf["tie_seed"], lfu_in_cache_counters=cf["lfu_in_cache_counters"],
                            warmup_events=built.warmup_events)
        cal = None
        if get_policy(cf["policy"]).needs_calibration:
            cal = _cached(_STREAMS, (ckey, "calibration", task.stream),
                          lambda: _calibration(context, stream_fields), _STREAM_LIMIT)
        results = replay_curve(s, base, [rho for _, rho in members], cal)
        for (cid, rho), r in zip(members, results, strict=True):
            values = [r.transferred, r.demand_misses, r.hits, r.initial_load, r.logical, r.union, r.n_events,
                      r.capacity_total, r.miss_fraction, r.steady_miss_fraction, r.union_over_logical,
                      r.warmup_events]
            if stats is not None:
                values += [stats.mean_batch, stats.max_interval, stats.deadline_violations, stats.p99_latency_steps]
            metrics = {m: float(v) for m, v in zip(METRICS, values, strict=False)}
            if "timing" in context:
                from dataclasses import replace

                from .timing import timing_values

                metrics.update(timing_values(context["timing"], s, replace(base, rho=rho), cal))
            out.append((cid, metrics))
    return out
