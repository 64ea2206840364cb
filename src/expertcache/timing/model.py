"""From blocks to time: an event stream's replay put on a device timeline under a hardware profile.

The replay decides, event by event, which experts hit and which must be transferred
(:func:`expertcache.replay.replay_hits`); the timing model only schedules those decisions on two resources, the
compute unit and the host-to-device link, so its transfer and hit counts are the replay's by construction.

Per forward step the step's own cost is paid first; then, layer by layer:

1. the layer's dense work (attention, norms, the router): ``dense_fixed + dense_per_token * tokens``; the
   layer's routing is known when it ends;
2. the layer's experts compute, each ``expert_fixed + expert_per_token * routed tokens``, one after another;
3. every missing expert is transferred once (``latency + bytes / channel bandwidth`` on one of the copy
   channels) before it computes. The contract says how transfers meet compute:

   * ``fused`` with an overlapping link (a GPU's copy engines): the misses are issued in ascending expert id
     as soon as the routing is known; the hits compute meanwhile; each miss computes once it has landed;
   * ``fused`` with a blocking link (``overlap: false``, e.g. a CPU executor's memcpy): the misses are copied
     first, compute waits for them, then every expert computes;
   * ``serialized`` (what sequential replay models): one expert at a time in ascending id, loaded if missing,
     then computed.

"Stall" is time the compute unit waits for expert weights. Not modelled: KV-cache traffic competing for the
link, several devices, kernel-launch overheads beyond the fixed costs (see docs/timing.md). Prefetches from advice
are put on the same timeline by :func:`expertcache.timing.prefetch.simulate_prefetch`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from ..analysis.traffic import recorded_block_bytes
from ..errors import ValidationError
from ..events import EventStream
from ..replay import ReplayConfig, ReplayResult, replay_hits
from ..replay.proactive import ProactiveResult
from . import _kernels as K
from .profile import HardwareProfile

__all__ = ["CONTRACTS", "TimingResult", "Timeline", "simulate", "nearest_rank", "recorded_expert_bytes", "build_result",
           "layer_tokens"]

CONTRACTS = ("fused", "serialized")
_SEMANTICS = {"fused": "event-atomic", "serialized": "sequential-ascending"}


@dataclass(frozen=True)
class Timeline:
    """Per-event and per-step times of one simulation (seconds from the start of the stream)."""

    event_start: np.ndarray
    event_routed: np.ndarray
    event_end: np.ndarray
    event_stall: np.ndarray
    event_link: np.ndarray
    step: np.ndarray
    step_start: np.ndarray
    step_end: np.ndarray
    step_tokens: np.ndarray
    step_counted: np.ndarray

    def window(self, first_step: int, n_steps: int) -> dict[str, np.ndarray]:
        """The events of ``n_steps`` steps from the ``first_step``-th step on (for a figure)."""
        lo = int(np.searchsorted(self.step_start, self.step_start[min(first_step, self.step.shape[0] - 1)]))
        steps = self.step[lo:lo + n_steps]
        return {"steps": steps, "start": self.step_start[lo:lo + n_steps], "end": self.step_end[lo:lo + n_steps]}


@dataclass(frozen=True)
class TimingResult:
    """Counts (the replay's) and times of one policy under one profile and contract.

    Times cover the counted events (warm-up events fill the cache and advance no clock that is reported).
    ``tpot_*`` are over output tokens: every token a step produces waits that step's duration.
    """

    policy: str
    contract: str
    semantics: str
    scope: str
    rho: float | None
    capacity_total: int
    profile: str
    copy_streams: int
    transferred: int
    demand_misses: int
    hits: int
    initial_load: int
    output_tokens: int
    n_steps: int
    time_s: float
    tpot_mean_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    tokens_per_s: float
    stall_s: float
    stall_share: float
    link_busy_s: float
    link_busy_share: float
    expert_bytes: int | None
    bytes_per_token: float | None
    replay: ReplayResult | ProactiveResult = field(repr=False, compare=False)
    timeline: Timeline = field(repr=False, compare=False)
    #: With prefetches (:func:`expertcache.timing.prefetch.simulate_prefetch`): the candidate budget ``R``, when
    #: they are issued, and the proactive loads ``P`` (``transferred = demand_misses + P``) split into timely
    #: (landed before their expert was to compute), late (the compute unit waited ``prefetch_late_stall_s`` in
    #: all for them) and useless (never hit before leaving the cache: the replay's wasted prefetches).
    prefetch_budget: int = 0
    issue: str | None = None
    prefetch_loads: int = 0
    prefetch_timely: int = 0
    prefetch_late: int = 0
    prefetch_useless: int = 0
    prefetch_late_stall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The scalar fields as a JSON-ready dict (no arrays)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("replay", "timeline")}


def nearest_rank(values: np.ndarray, q: float, weights: np.ndarray | None = None) -> float:
    """The nearest-rank ``q``-quantile (``q`` in (0, 1]): the smallest value with at least ``q`` of the mass.

    >>> nearest_rank(np.array([4.0, 1.0, 3.0, 2.0]), 0.5)
    2.0
    >>> nearest_rank(np.array([1.0, 9.0]), 0.99, weights=np.array([99, 1]))
    1.0
    """
    if values.shape[0] == 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    w = np.ones(values.shape[0]) if weights is None else weights[order].astype(np.float64)
    cum = np.cumsum(w)
    rank = math.ceil(q * cum[-1] - 1e-9)
    return float(values[order][int(np.searchsorted(cum, max(rank, 1)))])


def simulate(stream: EventStream, config: ReplayConfig, profile: HardwareProfile, *, contract: str = "fused",
             calibration: EventStream | None = None, expert_bytes: int | None = None) -> TimingResult:
    """Replay ``stream`` under ``config`` and put the result on a timeline under ``profile``.

    Parameters
    ----------
    stream
        The event stream.
    config
        Policy, capacity and scope; its ``semantics`` must match the contract (``event-atomic`` for ``fused``,
        ``sequential-ascending`` for ``serialized``) and is set from it when left at the default.
    profile
        The hardware profile (:func:`expertcache.timing.load_profile`).
    contract
        ``"fused"`` or ``"serialized"``.
    calibration
        The calibration stream of the ``static`` policy.
    expert_bytes
        Bytes per expert block; default: the profile's, else the stream's recorded ``expert_block_bytes``.
    """
    if contract not in CONTRACTS:
        raise ValidationError(f"contract must be one of {', '.join(CONTRACTS)}; got {contract!r}", field="contract")
    semantics = _SEMANTICS[contract]
    if config.semantics != semantics:
        if config.semantics != "event-atomic":
            raise ValidationError(f"the {contract} contract is {semantics} replay; got semantics "
                                  f"{config.semantics!r}", field="semantics")
        config = ReplayConfig(**{**asdict(config), "semantics": semantics})
    nbytes = expert_bytes or profile.expert_bytes or recorded_expert_bytes(stream)
    if nbytes is None:
        raise ValidationError("the expert block size is unknown: give the profile an expert_bytes, pass "
                              "--expert-bytes, or build the stream from a trace that records expert_block_bytes",
                              field="expert_bytes")
    result, hit = replay_hits(stream, config, calibration=calibration)
    costs = profile.per_layer(stream.n_layers)
    n = stream.n_events
    out = [np.zeros(n, dtype=np.float64) for _ in range(5)]
    K.timeline(stream.offsets, stream.multiplicity, hit.view(np.uint8), stream.step.astype(np.int64),
               stream.layer, layer_tokens(stream), costs, float(profile.step_fixed_s),
               float(profile.step_per_token_s), float(profile.transfer_s(int(nbytes))), int(profile.copy_streams),
               _contract_code(contract, profile), *out)
    counted_ev = np.arange(n) >= int(config.warmup_events)
    return build_result(stream, profile, out, counted_ev, int(nbytes), result.transferred,
                        policy=config.policy, contract=contract, semantics=semantics, scope=config.scope,
                        rho=config.rho, capacity_total=result.capacity_total, demand_misses=result.demand_misses,
                        hits=result.hits, initial_load=result.initial_load, replay=result)


def layer_tokens(stream: EventStream) -> np.ndarray:
    """``int64[n_events]``: tokens each event's layer processes (routed tokens / k)."""
    return (stream.logical_per_event // max(stream.top_k, 1)).astype(np.int64)


def build_result(stream: EventStream, profile: HardwareProfile, out: list[np.ndarray], counted_ev: np.ndarray,
                 nbytes: int, transferred: int, **fields: Any) -> TimingResult:
    """A :class:`TimingResult` from the timeline kernel's per-event outputs (``out``: start, routed, end, stall,
    link) over the counted events ``counted_ev`` (a step counts when its first event does); ``fields`` are the
    counts and labels of the replay."""
    start, routed, end, stall, link = out
    n = stream.n_events
    # steps: the first event of each step opens it; its end is its last event's end
    first = np.flatnonzero(np.r_[True, stream.step[1:] != stream.step[:-1]]) if n else np.zeros(0, np.int64)
    last = np.r_[first[1:] - 1, n - 1] if n else np.zeros(0, np.int64)
    step_start = np.r_[0.0, end[last[:-1]]] if n else np.zeros(0)  # a step begins when the previous ended
    step_end = end[last] if n else np.zeros(0)
    step_tokens = stream.active[first].astype(np.int64) if n else np.zeros(0, np.int64)
    step_counted = counted_ev[first] if n else np.zeros(0, np.bool_)
    dur = step_end - step_start
    counted_dur = dur[step_counted]
    counted_tok = step_tokens[step_counted]
    time_s = float(counted_dur.sum())
    out_tokens = int(counted_tok.sum())
    stall_s = float(stall[counted_ev].sum())
    link_s = float(link[counted_ev].sum()) / profile.copy_streams
    timeline = Timeline(start, routed, end, stall, link, stream.step[first] if n else np.zeros(0, np.int64),
                        step_start, step_end, step_tokens, step_counted)
    return TimingResult(
        profile=profile.name, copy_streams=int(profile.copy_streams), transferred=int(transferred),
        output_tokens=out_tokens, n_steps=int(step_counted.sum()), time_s=time_s,
        # each token of a step waits that step: token-weighted statistics of the step durations
        tpot_mean_s=float((counted_dur * counted_tok).sum() / out_tokens) if out_tokens else 0.0,
        tpot_p50_s=nearest_rank(counted_dur, 0.5, counted_tok), tpot_p99_s=nearest_rank(counted_dur, 0.99, counted_tok),
        tokens_per_s=out_tokens / time_s if time_s > 0 else 0.0,
        stall_s=stall_s, stall_share=stall_s / time_s if time_s > 0 else 0.0, link_busy_s=link_s,
        link_busy_share=link_s / time_s if time_s > 0 else 0.0, expert_bytes=int(nbytes),
        bytes_per_token=transferred * int(nbytes) / out_tokens if out_tokens else None, timeline=timeline,
        **fields)


def _contract_code(contract: str, profile: HardwareProfile) -> int:
    if contract == "serialized":
        return K.SERIALIZED
    return K.FUSED_OVERLAP if profile.overlap else K.FUSED_BLOCKING


#: The expert block size the stream (or the trace it was built from) records, if any (one reader for replay,
#: report and timing).
recorded_expert_bytes = recorded_block_bytes
