"""The CLR Table 1 comparison on one trace: policy family x Hit / AdjHit / Load per token / params / availability.

Every baseline is replayed by :func:`expertcache.replay.proactive.replay_proactive`
on the same stream, capacity and budget, under one charging rule (each demand
miss and each proactive insertion is one full expert transfer). Predictors and
stores are fitted on a calibration trace disjoint from the evaluated one (by
default the even-indexed requests calibrate and the odd ones are evaluated).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._threads import thread_map
from ..errors import ValidationError
from ..events import EventStream
from ..replay.proactive import ProactiveConfig, ProactiveResult, replay_proactive
from ..trace import PREFILL, RoutingTrace, select_requests
from .produced import Produced, request_rows

#: Why the Least-Stale row is replayed with the LRU key (a finding in itself).
LEAST_STALE_NOTE = ("equals LRU without prefetch: with one event per (step, layer) and per-layer caches the "
                    "stalest step holds the least recently used block, so both evict the same block")

__all__ = ["LEAST_STALE_NOTE", "BASELINES", "CompareConfig", "CompareRow", "CompareReport", "compare", "split_trace", "plot_compare"]


@dataclass(frozen=True)
class Baseline:
    """A named row of the comparison."""

    name: str
    family: str
    description: str
    needs_trace: bool          # per-request routing, not just events
    uses_hidden: bool          # reads hidden states when the trace has them


#: Rows in table order (name -> baseline).
BASELINES: dict[str, Baseline] = {b.name: b for b in (
    Baseline("lru", "classic (update-only)", "least recently used", False, False),
    Baseline("lfu", "classic (update-only)", "least frequently used", False, False),
    Baseline("lrfu", "classic (update-only)", "LRFU, Lee et al., lambda", False, False),
    Baseline("least-stale", "MoE caching / prefetch", "SpecMD Least-Stale: evict the block of the stalest step",
             False, False),
    Baseline("moe-infinity", "MoE caching / prefetch", "activation-aware caching (EAM matching)", True, False),
    Baseline("promoe", "MoE caching / prefetch", "lookahead predictor l -> l+d", True, True),
    Baseline("finemoe", "MoE caching / prefetch", "expert-map search", True, True),
    Baseline("te-moe", "MoE caching / prefetch", "option-set persistence (set from the previous window)", False,
             False),
    Baseline("te-moe-oracle", "reference", "option-set persistence (set from the window's own routing)", False,
             False),
    Baseline("next-true", "reference", "prefetch the true experts of each event (oracle)", False, False),
)}


@dataclass(frozen=True)
class CompareConfig:
    """Settings shared by every row.

    Attributes
    ----------
    rho
        Residency fraction (per-layer quotas) when ``capacity`` is not given.
    capacity
        CLR's ``B``: experts per layer, the same for every layer.
    budget
        ``R`` for prefetching rows; ``None`` = ``round(0.75 * c)`` with ``c`` the smallest
        per-layer capacity (CLR's main setting: 75% of the cache).
    batch
        Concurrency ``B`` of FCFS continuous batching (CLR: 1).
    prefill_init
        Initialise each request's decode with its prefill (batch 1, traces with prompts);
        ``None`` = whenever possible.
    lookahead, store_size, option_steps, lrfu_lambda
        Baseline parameters (ProMoE ``d``, FineMoE / MoE-Infinity store bound, option length, LRFU ``lambda``).
    seed, tie_break
        Ties and the expert-map sample.
    expert_bytes
        ``S_expert`` for Load/token in bytes (blocks/token if ``None``).
    policies
        Subset of :data:`BASELINES` to run (all by default).
    """

    rho: float = 0.25
    capacity: int | None = None
    budget: int | None = None
    batch: int = 1
    prefill_init: bool | None = None
    lookahead: int = 3
    store_size: int = 1000
    option_steps: int = 4
    lrfu_lambda: float = 0.5
    seed: int = 0
    tie_break: str = "random"
    expert_bytes: int | None = None
    policies: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rho, bool) or not isinstance(self.rho, (int, float)) or math.isnan(self.rho) \
                or not 0.0 <= self.rho <= 1.0:
            raise ValidationError(f"rho must be a number in [0, 1]; got {self.rho!r}", field="rho")
        if self.policies is not None and not self.policies:
            raise ValidationError(f"policies must name at least one baseline of {', '.join(BASELINES)}",
                                  field="policies")
        for name in self.policies or ():
            if name not in BASELINES:
                raise ValidationError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}",
                                      field="policies")
        for name in ("batch", "lookahead", "store_size", "option_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValidationError(f"{name} must be a positive integer; got {v!r}", field=name)
        for name in ("capacity", "budget"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
                raise ValidationError(f"{name} must be a non-negative integer; got {v!r}", field=name)


@dataclass(frozen=True)
class CompareRow:
    """One baseline: its replay, or why it was skipped."""

    name: str
    family: str
    description: str
    result: ProactiveResult | None
    added_params: int | None
    store_entries: int
    availability: str
    note: str
    skipped: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: With a hardware profile (``compare(..., profile=P)``): the row's replay on the timeline, its prefetches
    #: issued at its decision availability (:func:`expertcache.timing.prefetch.simulate_prefetch`).
    timing: Any = None

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("result", "timing")}
        out["timing"] = self.timing.to_dict() if self.timing is not None else None
        if self.result is not None:
            r = self.result
            out.update(hit=r.hit, adj_hit=r.adj_hit, load_per_token=r.load_per_token, load_unit=r.load_unit,
                       miss_fraction=r.miss_fraction, accesses=r.accesses, demand_misses=r.demand_misses,
                       proactive_loads=r.proactive_loads, useful_prefetches=r.useful_prefetches,
                       tokens=r.tokens, prefetch_budget=r.prefetch_budget, priority=r.priority)
        return out


@dataclass(frozen=True)
class CompareReport:
    """The comparison table and what it was computed on.

    ``warmup_events`` counts the events replayed but not counted: each request's prefill
    (trace input with ``prefill_init``) or the warm-up a stream's provenance declares.
    """

    rows: tuple[CompareRow, ...]
    config: CompareConfig
    source: str
    n_eval_requests: int | None
    n_calibration_requests: int | None
    capacity_per_layer: tuple[int, ...]
    budget: int
    prefill_init: bool
    hidden: str
    batch: int | None = None
    warmup_events: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "config": asdict(self.config), "n_eval_requests": self.n_eval_requests,
                "n_calibration_requests": self.n_calibration_requests,
                "capacity_per_layer": list(self.capacity_per_layer), "budget": self.budget,
                "prefill_init": self.prefill_init, "hidden": self.hidden, "batch": self.batch,
                "warmup_events": self.warmup_events,
                "rows": [r.to_dict() for r in self.rows]}


def split_trace(trace: RoutingTrace) -> tuple[RoutingTrace, RoutingTrace, np.ndarray, np.ndarray]:
    """Odd-indexed requests evaluated, even-indexed ones calibrate (as in the demo); with their request indices."""
    if trace.n_requests < 2:
        raise ValidationError("a comparison on one trace needs at least 2 requests (even ones calibrate, odd "
                              "ones are evaluated), or pass a separate calibration trace", field="trace")
    idx = np.arange(trace.n_requests)
    ev_idx, cal_idx = idx[1::2], idx[0::2]
    return (select_requests(trace, ev_idx, "odd requests (evaluation)"),
            select_requests(trace, cal_idx, "even requests (calibration)"), ev_idx, cal_idx)


def compare(source: RoutingTrace | EventStream, config: CompareConfig = CompareConfig(),
            calibration: RoutingTrace | None = None, hidden: np.ndarray | None = None,
            hidden_calibration: np.ndarray | None = None, label: str = "",
            progress: Callable[[int], None] | None = None, profile: Any = None, jobs: int = 1) -> CompareReport:
    """Run every selected baseline on ``source`` and return the table.

    Parameters
    ----------
    source
        A routing trace (every baseline) or an event stream (baselines that need
        per-request routing are skipped, with the reason in the row).
    calibration
        Trace the predictors and stores are fitted on; by default the even
        requests of ``source`` (which then evaluates its odd requests).
    hidden, hidden_calibration
        Hidden states ``[n_tokens, L, d_model]`` aligned with ``source`` (and
        ``calibration`` if given); ``None`` = routing-derived features.
    progress
        Called once per finished row with the total.
    jobs
        Baselines run side by side in this many threads (numba's kernels and numpy's large operations release
        the GIL); each row depends on its baseline alone, so the rows are the same, in the same order. Up to
        ``jobs`` baselines' advice arrays (``float32[n_events, N]`` each) are held at once, where one run holds
        one baseline's.
    profile
        A :class:`expertcache.timing.HardwareProfile`: each row is also put on a timeline, its prefetches issued
        at its decision availability (:func:`expertcache.timing.prefetch.issue_for_availability`); the counts
        are the same replay's. Needs a block size (``config.expert_bytes``, the profile's, or the trace's).
    """
    from .activation import activation_aware
    from .context import advice_context
    from .expert_map import expert_map_search
    from .options import next_true, option_set
    from .predictor import lookahead

    names = config.policies or tuple(BASELINES)
    n_eval = n_cal = None
    ctx = None
    if isinstance(source, RoutingTrace):
        if calibration is None:
            trace, calibration, ev_idx, cal_idx = split_trace(source)
            if hidden is not None:
                hidden_calibration = hidden[request_rows(source, cal_idx)]
                hidden = hidden[request_rows(source, ev_idx)]
        else:
            trace = source
            if (calibration.n_layers, calibration.n_experts) != (trace.n_layers, trace.n_experts):
                raise ValidationError("calibration trace has a different L or N", field="calibration")
            if hidden is not None and hidden_calibration is None:
                hidden = None            # hidden features must exist on both sides
        has_prompts = bool((trace.phase == PREFILL).any())
        pinit = (config.batch == 1 and has_prompts) if config.prefill_init is None else config.prefill_init
        ctx = advice_context(trace, config.batch, pinit)
        stream, mask = ctx.stream, ctx.count_mask
        n_eval, n_cal = trace.n_requests, calibration.n_requests
    else:
        # a stream built with a prefill warm-up (`events build --prefill-init`) says so in its provenance;
        # its warm-up events fill the cache but are not counted, as in `expertcache replay`
        stream, hidden, hidden_calibration = source, None, None
        warm = int(stream.provenance.get("warmup_events", 0) or 0)
        if not 0 <= warm <= stream.n_events:
            raise ValidationError(f"the stream's provenance declares {warm} warm-up events but it holds "
                                  f"{stream.n_events}; rebuild it with `expertcache events build`",
                                  field="warmup_events")
        mask = np.arange(stream.n_events) >= warm if warm else None
        pinit = warm > 0
    L, N = stream.n_layers, stream.n_experts
    if config.capacity is not None:
        caps = (int(config.capacity),) * L
    else:
        from ..replay import capacities_for_rho

        caps = tuple(int(c) for c in capacities_for_rho(config.rho, L, N))
    budget = config.budget if config.budget is not None else int(math.floor(0.75 * min(caps) + 0.5))
    hidden_kind = "hidden states" if hidden is not None else "none (routing-derived features)"

    timings: dict[str, Any] = {}

    def run(produced: Produced, name: str = "") -> ProactiveResult:
        cfg = ProactiveConfig(produced.priority, capacity=caps, prefetch_budget=budget if produced.prefetch else 0,
                              tie_break=config.tie_break, seed=config.seed, lrfu_lambda=config.lrfu_lambda,
                              expert_bytes=config.expert_bytes)
        if profile is None:
            return replay_proactive(stream, cfg, produced.advice, count_mask=mask)
        from ..timing.prefetch import issue_for_availability, simulate_prefetch

        issue = issue_for_availability(produced.availability) or "prev-layer"    # update-only rows: nothing issued
        t = simulate_prefetch(stream, cfg, profile, produced.advice, issue=issue, count_mask=mask,
                              expert_bytes=config.expert_bytes)
        timings[name] = t
        return t.replay

    def row(name: str) -> CompareRow:
        """The row of one baseline: its advice produced, replayed and dropped (only the counts are kept)."""
        b = BASELINES[name]
        if b.needs_trace and ctx is None:
            return CompareRow(name, b.family, b.description, None, None, 0, "", "",
                              skipped="needs per-request routing (a routing trace), got an event stream")
        if name in ("lru", "lfu", "lrfu"):
            avail = "Curr. layer"
            p = Produced(None, name, False, availability=avail,
                         note=f"lambda = {config.lrfu_lambda}" if name == "lrfu" else "")
        elif name == "least-stale":
            # one event per (step, layer) and a cache per layer: a block's last step orders exactly as its
            # last use, so the stalest step's block is the least recently used one (same ties)
            p = Produced(None, "lru", False, availability="Curr. layer", note=LEAST_STALE_NOTE)
        elif name == "moe-infinity":
            p = activation_aware(ctx, calibration, config.store_size)
        elif name == "promoe":
            p = lookahead(ctx, calibration, config.lookahead, hidden, hidden_calibration)
        elif name == "finemoe":
            p = expert_map_search(ctx, calibration, config.store_size, seed=config.seed, hidden=hidden,
                                  hidden_calibration=hidden_calibration)
        elif name in ("te-moe", "te-moe-oracle"):
            p = option_set(stream, config.option_steps, "past" if name == "te-moe" else "future", mask)
        else:
            p = next_true(stream, mask)
        result = run(p, name)
        return CompareRow(name, b.family, b.description, result, p.added_params, p.store_entries,
                          p.availability, p.note, details=p.details, timing=timings.get(name))

    # baselines side by side in threads where asked: each row depends on its baseline alone, so the rows are the
    # same, in the same order (one thread: one baseline's advice arrays alive at a time)
    rows = []
    with thread_map(jobs) as each:
        for r in each(row, names):
            rows.append(r)
            if progress is not None:
                progress(len(names))
    batch = config.batch if ctx is not None else stream.provenance.get("batch")
    n_warm = 0 if mask is None else int((~mask).sum())
    return CompareReport(tuple(rows), config, label, n_eval, n_cal, caps, budget, bool(pinit), hidden_kind,
                         batch if isinstance(batch, int) else None, n_warm)


def plot_compare(report: CompareReport, path) -> Any:
    """Hit and AdjHit (bars) with Load/token (points, right axis) per baseline, written atomically.

    The format follows the suffix (``.png``, ``.pdf``, ``.svg``).
    """
    from pathlib import Path

    from ..plot import _pyplot, save_figure

    path = Path(path)
    if path.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise ValidationError(f"{path}: plot file must end in .png, .pdf or .svg", field="plot")
    rows = [r for r in report.rows if r.result is not None]
    if not rows:
        raise ValidationError("nothing to plot: every baseline was skipped", field="plot")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 4.5), layout="constrained")
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [100 * r.result.hit for r in rows], 0.4, label="Hit (%)", color="#9ecae1")
    ax.bar(x + 0.2, [100 * r.result.adj_hit for r in rows], 0.4, label="AdjHit (%)", color="#3182bd")
    ax.set_xticks(x, [r.name for r in rows], rotation=30, ha="right")
    ax.set_ylabel("percent")
    ax.set_ylim(0, 105)
    ax2 = ax.twinx()
    ax2.plot(x, [r.result.load_per_token for r in rows], "o", color="#e6550d", label="Load/token")
    ax2.set_ylabel(f"Load ({rows[0].result.load_unit})")
    ax2.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    lo, hi = min(report.capacity_per_layer), max(report.capacity_per_layer)
    cap = f"{lo}" if lo == hi else f"{lo}-{hi}"
    name = Path(report.source).name if report.source else "trace"      # never an absolute path in a figure
    ax.set_title(f"{name or 'trace'}: c = {cap} per layer, R = {report.budget}, batch {report.batch or '?'}",
                 fontsize=9)
    return save_figure(fig, path)
