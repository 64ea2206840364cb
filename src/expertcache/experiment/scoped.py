"""Scoped experiments of the evaluation paper (§9.1, §9.3), each with its scope block (checklist D4).

* :func:`static_vs_dynamic` — a calibration-frozen static pin list against LFRU and Belady across
  concurrency (Table 19 shape), initial load counted.
* :func:`service_disciplines` — the same request set under continuous batching and deadline rotation
  (Table 20 shape): the service discipline alone can flip static versus dynamic.
* :func:`affinity_experiment` — residency policies replayed on each rotation scheduler's trajectory
  (§8.3, Table 18 shape).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .._threads import thread_map
from ..events import ArrivalOffsets, EventStream, build_events
from ..events.rotation import SCHEDULERS, RotationConfig, RotationStats, rotation_events
from ..replay import ReplayConfig, replay, replay_curve
from ..trace import RoutingTrace

__all__ = ["scope_block", "StaticRow", "static_vs_dynamic", "DisciplineRow", "service_disciplines", "AffinityRow",
           "affinity_experiment", "per_step_transferred", "nearest_rank", "SHARE_MIN_GAIN", "small_trace_warnings"]


def scope_block(trace: RoutingTrace, rho: float, concurrency: str, discipline: str, fairness: str) -> dict[str, Any]:
    """The D4 scope of a mechanism experiment: model, rho, concurrency, discipline, fairness, lossless."""
    prov = trace.provenance
    return {"model": prov.get("model", prov.get("generator", "not reported")), "rho": rho,
            "concurrency": concurrency, "discipline": discipline, "fairness": fairness, "lossless": True,
            "cache_scope": "per-layer", "replay": "event-atomic"}


@dataclass(frozen=True)
class StaticRow:
    """One concurrency: static pinned (frozen from calibration) vs LFRU and Belady."""

    batch: int
    static: float
    lfru: float
    belady: float
    static_vs_lfru: float

    def to_dict(self) -> dict:
        return asdict(self)


def _calibration_events(calibration: RoutingTrace | EventStream, batch: int) -> EventStream:
    """A calibration trace's FCFS decode events at ``batch``; a calibration stream as it is (its own B)."""
    return calibration if isinstance(calibration, EventStream) else build_events(calibration, batch)


def static_vs_dynamic(trace: RoutingTrace, calibration: RoutingTrace | EventStream, batches: Sequence[int] = (2, 4, 8, 16),
                      rho: float = 0.4, tie_break: str = "random", seed: int = 0
                      ) -> tuple[list[StaticRow], dict[str, Any]]:
    """Table 19 shape. ``static_vs_lfru = (m_lfru - m_static) / m_lfru`` (negative: static is worse)."""
    rows = []
    for b in batches:
        s = build_events(trace, b)
        cal = _calibration_events(calibration, b)
        m = {p: replay(s, ReplayConfig(p, rho=rho, tie_break=tie_break, seed=seed), cal).miss_fraction
             for p in ("static", "lfru", "belady")}
        rows.append(StaticRow(int(b), m["static"], m["lfru"], m["belady"], (m["lfru"] - m["static"]) / m["lfru"]))
    scope = scope_block(trace, rho, f"B in {list(batches)}", "continuous batching (FCFS)", "n/a")
    scope["static_fit"] = "calibration trace, frozen; initial load counted"
    scope["tie_break"] = f"{tie_break} (seed {seed})" if tie_break == "random" else tie_break
    scope["warnings"] = small_trace_warnings(trace, max(batches))
    return rows, scope


@dataclass(frozen=True)
class DisciplineRow:
    """One service discipline on the same request set."""

    discipline: str
    mean_batch: float
    static: float
    lfru: float
    static_vs_lfru: float

    def to_dict(self) -> dict:
        return asdict(self)


def small_trace_warnings(trace: RoutingTrace, batch: int, admitted: int | None = None) -> list[str]:
    """Defaults that degenerate on a trace this small: more slots than requests (B8/B4 of the checklist read wrong)."""
    n = trace.n_requests
    out = []
    if admitted is not None and n < admitted:
        out.append(f"the trace has {n} requests but {admitted} admitted sessions were asked for: rotation can never "
                   f"fill its admission pool (lower --admitted)")
    if n < batch:
        out.append(f"the trace has {n} requests but B = {batch}: at most {n} are ever active, so rows for B >= {n} "
                   "are the same schedule")
    elif admitted is not None and n < 2 * admitted:
        out.append(f"the trace has {n} requests, fewer than twice the {admitted} admitted sessions: the rotation "
                   "trajectory is mostly its ramp-up and drain")
    return out


def service_disciplines(trace: RoutingTrace, calibration: RoutingTrace | EventStream, batch: int = 8, admitted: int = 24,
                        window: int = 4, rho: float = 0.4, tie_break: str = "random", seed: int = 0
                        ) -> tuple[list[DisciplineRow], dict[str, Any]]:
    """Table 20 shape: continuous batching at ``batch`` vs rotation (``admitted``/``batch``, ``window``)."""
    cal = _calibration_events(calibration, batch)
    cont = build_events(trace, batch)
    rot, stats = rotation_events(trace, RotationConfig(admitted, batch, window))
    rows = []
    for name, s in (("continuous batching", cont), (f"rotation {admitted}/{batch}, W={window}", rot)):
        m = {p: replay(s, ReplayConfig(p, rho=rho, tie_break=tie_break, seed=seed), cal).miss_fraction
             for p in ("static", "lfru")}
        mean_batch = float(s.active[s.layer == s.layer.min()].mean())
        rows.append(DisciplineRow(name, mean_batch, m["static"], m["lfru"], (m["lfru"] - m["static"]) / m["lfru"]))
    scope = scope_block(trace, rho, f"B = {batch}", "continuous batching vs deadline rotation",
                        f"rotation: W = {window}, max interval {stats.max_interval}")
    scope["tie_break"] = f"{tie_break} (seed {seed})" if tie_break == "random" else tie_break
    scope["warnings"] = small_trace_warnings(trace, batch, admitted)
    return rows, scope


# ------------------------------------------------------------------ §8.1 warm-cache workload transition
#: Causal policies whose best result is the reference of a transition gap.
CAUSAL = ("lru", "lfu", "lfru")


@dataclass(frozen=True)
class TransitionUnit:
    """One directed transition A -> B at one window size, rho and request-order seed (§8.1).

    The stream is ``warm`` requests of A, then ``window`` requests of B, under FCFS continuous
    batching; the cache is warmed by every event before the first step that serves a B request and
    counted from that step on. ``miss_fraction`` holds ``m`` per policy over the counted window;
    ``cold`` is the best causal ``m`` on the same B requests replayed alone (no warm cache).
    ``gap = (m_best_causal - m_belady) / m_best_causal`` with Belady planning over the whole stream.
    """

    source: str
    target: str
    window: int
    rho: float
    seed: int
    warmup_events: int
    counted_events: int
    miss_fraction: dict[str, float]
    best_causal: str
    gap: float
    cold: float

    def to_dict(self) -> dict:
        return asdict(self)


def _best(m: dict[str, float]) -> str:
    return min(CAUSAL, key=lambda p: (m[p], p))


#: The window sizes of §8.1.
PAPER_WINDOWS = (10, 25, 50, 100)


def warm_transition(trace: RoutingTrace, categories: Any, windows: Sequence[int] | None = None,
                    rhos: Sequence[float] = (0.2, 0.3, 0.4), seeds: Sequence[int] = (0, 1, 2), batch: int = 8,
                    warm: int | None = None, pairs: Sequence[tuple[str, str]] | None = None,
                    threshold: float = 0.10, jobs: int = 1) -> tuple[list[TransitionUnit], dict[str, Any]]:
    """Directed A -> B transitions over windows of N requests (§8.1, Table 17 row 2).

    ``categories`` is what :func:`expertcache.trace.labels.request_categories` accepts (a mapping, a labels
    file, or ``None`` for the trace's own). Every ordered pair of distinct categories is a transition
    unless ``pairs`` names some. ``warm`` A requests warm the cache (default: the largest window).
    Requests are drawn in a seeded order; a window larger than the target category is an error.
    Without ``windows``, the paper's (10, 25, 50, 100) that the smallest category can fill are used
    (or that category's size, if even 10 is too many); the scope block names what was dropped. ``jobs``
    threads replay the units side by side (the same units, in the same order).
    """
    import numpy as np

    from ..errors import ValidationError
    from ..events import decode_rows, events_before_request, events_from_schedule, fcfs_schedule
    from ..trace import select_requests
    from ..trace.labels import request_categories

    codes, names = request_categories(trace, categories)
    if len(names) < 2:
        raise ValidationError(f"a transition needs two categories; the labels hold {len(names)}")
    dropped: list[int] = []
    if windows is None:
        smallest = int(np.bincount(codes).min())
        windows = [w for w in PAPER_WINDOWS if w <= smallest] or [smallest]
        dropped = [w for w in PAPER_WINDOWS if w not in windows]
    windows = sorted({int(w) for w in windows})
    if not windows or windows[0] < 1:
        raise ValidationError(f"windows must be positive request counts; got {windows}", field="windows")
    n_warm = int(warm if warm is not None else windows[-1])
    pairs = list(pairs) if pairs is not None else [(a, b) for a in names for b in names if a != b]
    members = {n: np.flatnonzero(codes == i) for i, n in enumerate(names)}
    for a, b in pairs:
        for c, need in ((a, n_warm), (b, windows[-1])):
            if c not in members:
                raise ValidationError(f"unknown category {c!r}; the labels hold {', '.join(names)}")
            if members[c].size < need:
                raise ValidationError(f"category {c!r} has {members[c].size} requests; the transition needs "
                                      f"{need} (lower --windows/--warm or collect more requests)")
    # every unit's requests in a seeded order per category; B's first w requests replayed from cold, per rho,
    # are the same for every A, so built and replayed once per (seed, B, w)
    orders = {}
    for seed in seeds:
        rng = np.random.default_rng([int(seed), 8, 1])
        orders[int(seed)] = {n: rng.permutation(members[n]) for n in names}
    tasks = [(int(seed), a, b, w) for seed in seeds for a, b in pairs for w in windows]
    cold_keys = list(dict.fromkeys((seed, b, w) for seed, _, b, w in tasks))

    def cold(key: tuple) -> dict[float, float]:
        seed, b, w = key
        cold_stream = build_events(select_requests(trace, orders[seed][b][:w]), batch)
        cold_curves = [replay_curve(cold_stream, ReplayConfig(p), rhos) for p in CAUSAL]
        return {rho: min(c[i].miss_fraction for c in cold_curves) for i, rho in enumerate(rhos)}

    def unit(task: tuple) -> list[TransitionUnit]:
        seed, a, b, w = task
        order = orders[seed]
        idx = np.concatenate([order[a][:n_warm], order[b][:w]])
        sub = select_requests(trace, idx, note=f"transition {a}->{b}, window {w}, seed {seed}")
        lengths, _ = decode_rows(sub)
        step, req, tok = fcfs_schedule(lengths, np.zeros(sub.n_requests, np.int64), batch)
        stream = events_from_schedule(sub, step, req, tok, {"discipline": "fcfs-continuous-batching",
                                                            "batch": int(batch)})
        n_warmup = events_before_request(stream, step, req, n_warm)
        # every rho of a policy at once (one pass where it is cheaper; Belady's event bitsets shared)
        curves = {p: replay_curve(stream, ReplayConfig(p, warmup_events=n_warmup), rhos) for p in (*CAUSAL, "belady")}
        out = []
        for i, rho in enumerate(rhos):
            m = {p: curves[p][i].miss_fraction for p in curves}
            best = _best(m)
            gap = (m[best] - m["belady"]) / m[best] if m[best] else 0.0
            out.append(TransitionUnit(a, b, w, float(rho), seed, n_warmup, stream.n_events - n_warmup, m, best, gap,
                                      cold_of[seed, b, w][rho]))
        return out

    # the units in threads where asked (the kernels release the GIL): each is a function of its requests alone,
    # so the units are the same, in the same order
    with thread_map(jobs) as run:
        cold_of = dict(zip(cold_keys, run(cold, cold_keys), strict=True))
        units = [u for us in run(unit, tasks) for u in us]
    scope = scope_block(trace, list(rhos), f"B = {batch}", "continuous batching (FCFS)", "n/a")
    if dropped:
        scope["windows_dropped"] = f"{dropped} (the smallest category holds fewer requests)"
    scope.update(transitions=len(pairs), windows=windows, warm_requests=n_warm, seeds=list(seeds),
                 units=len(units), criterion=f"gap >= {threshold:.0%}",
                 units_meeting=sum(u.gap >= threshold for u in units),
                 offline_bound="belady over the whole stream (warm-up included), counted on the window")
    return units, scope


# ---------------------------------------------------------------- §8.2 semantic category partitioning
@dataclass(frozen=True)
class PartitionResult:
    """Hard per-category cache partitions at equal total capacity vs one shared cache (§8.2, Appendix B.4).

    ``slots[p]`` is partition ``p``'s per-layer capacity (layer 0; later layers differ by the
    quota remainder only for the last partition). ``predicted`` is the capacity-fragmentation
    estimate: the shared cache run at each partition's own slot count, weighted by the partition's
    share of logical assignments; ``measured - predicted`` is what sharing and duplication explain.
    ``warnings`` name partitions that cannot hold one request's top-k set (checklist D5).
    """

    partitions: tuple[tuple[str, ...], ...]
    slots: tuple[int, ...]
    shared_capacity: int
    logical_share: tuple[float, ...]
    per_step_union: tuple[float, ...]
    shared: float
    measured: float
    predicted: float
    transfer_change: float
    fragmentation_share: float | None
    warnings: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def category_partition(trace: RoutingTrace, categories: Any, groups: Sequence[Sequence[str]] | None = None,
                       slots: Sequence[int] | None = None, rho: float = 0.4, batch: int = 8, policy: str = "lfru",
                       seed: int = 0) -> tuple[PartitionResult, dict[str, Any]]:
    """Semantic category partitioning at equal total capacity (§8.2).

    ``groups`` lists the categories of each partition; every category must be in exactly one, or
    in none if a final catch-all is wanted (then name it ``["*"]``). ``slots`` gives the per-layer
    capacity of every partition but the last, which gets the rest of each layer's quota, so the
    total equals the shared cache's exactly. The same FCFS schedule drives both: each partition
    sees the events of its own requests (experts shared across partitions are loaded into each).
    Defaults: one partition per category, and the quota split evenly (the last takes the rest).
    """
    import numpy as np

    from ..errors import ValidationError
    from ..events import decode_rows, events_from_schedule, fcfs_schedule
    from ..replay import capacities_for_rho
    from ..trace.labels import request_categories

    codes, names = request_categories(trace, categories)
    L, N, k = trace.n_layers, trace.n_experts, trace.top_k
    caps = capacities_for_rho(rho, L, N)
    groups = [tuple(g) for g in groups] if groups is not None else [(n,) for n in names]
    if slots is None:
        slots = [int(caps.min()) // len(groups)] * (len(groups) - 1)
    if len(groups) < 2:
        raise ValidationError("partitioning needs at least two partitions", field="groups")
    if len(slots) != len(groups) - 1:
        raise ValidationError(f"give the slots of every partition but the last ({len(groups) - 1} numbers); "
                              f"got {len(slots)}", field="slots")
    named = [c for g in groups for c in g if c != "*"]
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise ValidationError(f"unknown categories {unknown}; the labels hold {', '.join(names)}", field="groups")
    if len(named) != len(set(named)):
        raise ValidationError("a category appears in two partitions", field="groups")
    rest = [c for c in names if c not in named]
    if rest and groups[-1] != ("*",):
        raise ValidationError(f"categories {rest} are in no partition; add them or end with the catch-all '*'",
                              field="groups")
    groups = [tuple(rest) if g == ("*",) else g for g in groups]
    fixed = np.array([int(s) for s in slots], dtype=np.int64)
    if (fixed < 0).any() or (caps.min() - fixed.sum()) < 0:
        raise ValidationError(f"slots {list(fixed)} exceed the per-layer quota {int(caps.min())} at rho={rho}",
                              field="slots")
    part_caps = [np.full(L, s, dtype=np.int64) for s in fixed] + [caps - fixed.sum()]

    lengths, _ = decode_rows(trace)
    step, req, tok = fcfs_schedule(lengths, np.zeros(trace.n_requests, dtype=np.int64), int(batch))
    shared_stream = events_from_schedule(trace, step, req, tok, {"discipline": "fcfs-continuous-batching"})
    shared = replay(shared_stream, ReplayConfig(policy, rho=rho, seed=seed))
    cat_of_req = np.array([names[c] for c in codes])
    measured_M, predicted, shares, unions, warnings = 0, 0.0, [], [], []
    for g, cap in zip(groups, part_caps, strict=True):
        mask = np.isin(cat_of_req[req], g)
        if not mask.any():
            raise ValidationError(f"partition {list(g)} has no decode tokens in this trace", field="groups")
        s = events_from_schedule(trace, step[mask], req[mask], tok[mask], {"partition": list(g)})
        measured_M += replay(s, ReplayConfig(policy, capacity=tuple(int(c) for c in cap), seed=seed)).transferred
        share = s.logical / shared_stream.logical
        alone = replay(shared_stream, ReplayConfig(policy, capacity=tuple(int(c) for c in cap), seed=seed))
        predicted += share * alone.miss_fraction
        shares.append(share)
        unions.append(float(s.event_size.mean()))
        if int(cap.min()) < k:
            warnings.append(f"partition {list(g)} holds {int(cap.min())} slots per layer < top-k = {k}: it cannot "
                            "retain one request's per-step expert set, so this design cannot produce a positive "
                            "result (§8.2, checklist D5)")
        elif cap.min() < unions[-1]:
            warnings.append(f"partition {list(g)} holds {int(cap.min())} slots per layer, below its mean per-step "
                            f"union {unions[-1]:.1f}: capacity, not sharing, will dominate")
    measured = measured_M / shared_stream.logical
    change = (measured - shared.miss_fraction) / shared.miss_fraction if shared.miss_fraction else 0.0
    excess = measured - shared.miss_fraction
    frag = (predicted - shared.miss_fraction) / excess if excess > 0 else None
    res = PartitionResult(tuple(groups), tuple(int(c.min()) for c in part_caps), int(caps.sum()), tuple(shares),
                          tuple(unions), shared.miss_fraction, measured, predicted, change, frag, tuple(warnings))
    scope = scope_block(trace, rho, f"B = {batch}", "continuous batching (FCFS)", "n/a")
    scope.update(policy=policy, capacity="equal total (the last partition takes each layer's remainder)")
    return res, scope


#: Below this |oracle gain| the share causal/oracle is a ratio of noise and prints as "n/a".
SHARE_MIN_GAIN = 0.005


def nearest_rank(values: Any, q: float = 99.0) -> float:
    """The smallest value with at least ``q`` percent of ``values`` at or below it (0 for no values)."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    return float(np.percentile(v, q, method="inverted_cdf")) if v.size else 0.0


def per_step_transferred(stream: EventStream, config: ReplayConfig,
                         calibration: EventStream | None = None) -> Any:
    """Demand-missed blocks per scheduling step (``int64[n_steps]``, step order): the miss-burst series.

    One replay with per-access hit flags (:func:`expertcache.replay.replay_hits`): a step's misses are the
    members of its events that did not hit. Every event is counted (``config.warmup_events`` is ignored).
    """
    import numpy as np

    from ..replay import replay_hits

    _, hit = replay_hits(stream, config, calibration)
    size = np.diff(stream.offsets)
    per_event = size - np.add.reduceat(hit.astype(np.int64), stream.offsets[:-1]) if stream.n_events else size
    per_event[size == 0] = 0
    _, starts = np.unique(stream.step, return_index=True)
    return np.add.reduceat(per_event, starts).astype(np.int64) if starts.size else np.zeros(0, np.int64)


@dataclass(frozen=True)
class AffinityRow:
    """Table 18 shape: one residency policy under the three schedulers (full-trajectory replays).

    ``p99_blocks`` holds, per scheduler, the nearest-rank p99 of the blocks demand-missed per step (the
    miss-burst tail, in blocks); ``delta_p99_causal`` is its relative change, causal vs FCFS, and depends on
    the policy. ``delta_latency_p99_causal`` is the p99 request-completion latency proxy (steps) of the
    schedule alone: the same for every policy.
    """

    policy: str
    fcfs: float
    causal: float
    oracle: float
    causal_gain: float
    oracle_gain: float
    share: float | None
    delta_p99_causal: float | None
    p99_blocks: dict[str, float]
    delta_latency_p99_causal: float

    def to_dict(self) -> dict:
        return asdict(self)


def affinity_experiment(trace: RoutingTrace, config: RotationConfig, rho: float = 0.4,
                        policies: tuple[str, ...] = ("lfru", "static"), scope: str = "per-layer",
                        calibration: EventStream | None = None, offsets: ArrivalOffsets | None = None,
                        tie_break: str = "random", seed: int = 0
                        ) -> tuple[list[AffinityRow], dict[str, RotationStats]]:
    """Replay each policy on the complete trajectory of each scheduler (§8.3): gains, share and Δp99.

    ``causal_gain = (m_fcfs - m_causal) / m_fcfs``; ``share = causal_gain / oracle_gain`` (``None`` when
    ``|oracle_gain| < SHARE_MIN_GAIN``); ``delta_p99_causal`` = relative change of the p99 of per-step
    demand-missed blocks, causal vs FCFS (``None`` when the FCFS p99 is 0). ``static`` is frozen: its pin
    list is fitted on ``calibration`` once and used on every trajectory; ``static-same-trace`` is the
    diagnostic refitted on each scheduler's own trajectory.
    """
    streams, stats = {}, {}
    for name in SCHEDULERS:
        cfg = RotationConfig(config.admitted, config.batch, config.window, name)
        streams[name], stats[name] = rotation_events(trace, cfg, offsets)
    rows = []
    lat = stats["causal_prev_route"].p99_latency_steps / stats["fcfs_deadline"].p99_latency_steps - 1.0
    for policy in policies:
        rc = ReplayConfig(policy, rho=rho, scope=scope, tie_break=tie_break, seed=seed)
        m = {name: replay(s, rc, calibration).miss_fraction for name, s in streams.items()}
        p99 = {name: nearest_rank(per_step_transferred(s, rc, calibration)) for name, s in streams.items()}
        f, c, o = m["fcfs_deadline"], m["causal_prev_route"], m["oracle_current_route"]
        cg = (f - c) / f if f else 0.0
        og = (f - o) / f if f else 0.0
        share = cg / og if abs(og) >= SHARE_MIN_GAIN else None
        dp = p99["causal_prev_route"] / p99["fcfs_deadline"] - 1.0 if p99["fcfs_deadline"] else None
        rows.append(AffinityRow(policy, f, c, o, cg, og, share, dp, p99, lat))
    return rows, stats
