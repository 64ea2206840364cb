"""Proactive-load-aware replay: CLR's cache operators on the event-atomic contract (§2.2; CLR §3.2–§3.3, §4.1).

One replay charges both kinds of transfer a prefetching system pays — each
demand miss and each proactive insertion is one full expert block — and
reports CLR's metrics (``Hit = 1 - D/A``, ``AdjHit = (A - D)/(A + P)``,
``Load/token = (D + P) S_expert / T``) beside the evaluation paper's
effective miss fraction ``m = (D + P) / logical`` on the same counts
(docs/design.md §2). See ``docs/prefetch.md``.

Per event ``i`` at layer ``l`` (capacity ``c_l``):

1. pre-access refinement with budget ``R`` on ``Advice.prefetch_score[i]`` (CLR Alg. 2);
2. access of ``E(i)`` against the snapshot: hits and demand misses ``D``;
3. the update: misses admitted and the cache cut back to ``c_l`` by a base
   policy key (``lru``, ``lfu``, ``lfru``, ``lrfu``) or by ``U_B`` on
   ``Advice.priority[i]`` (CLR Alg. 1: demand-loaded experts inserted, the
   lowest-priority resident outside ``E(i)`` evicted).

Events outside ``count_mask`` (or before ``warmup_events``) run the same
mechanism but are not counted: a prefill-initialised cache is a stream of
prefill events followed by decode events (:func:`prefill_then_decode`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..events import EventStream, concat_streams
from . import _kernels_belady_lanes as KBL
from . import _kernels_bits as KB
from .engine import TIE_BREAKS, _tie_order, _tie_ranks, capacities_for_rho

__all__ = ["PRIORITIES", "ProactiveConfig", "ProactiveLayerCounts", "ProactiveResult", "replay_proactive",
           "replay_proactive_hits", "ProactiveTrace", "prefill_then_decode", "decode_tokens"]

#: Retention priority sources: base policy keys, or the advice priority (``U_B``).
PRIORITIES = ("lru", "lfu", "lfru", "lrfu", "advice")


@dataclass(frozen=True)
class ProactiveConfig:
    """One proactive replay configuration (per-layer scope).

    Attributes
    ----------
    priority
        Retention key after each event: ``lru``, ``lfu``, ``lfru`` (keys of
        :mod:`expertcache.replay`, same definitions), ``lrfu`` (Lee et al.: CRF with
        ``F(x) = 2**(-lrfu_lambda * x)`` on the per-layer event clock) or ``advice``
        (CLR's ``U_B`` on ``Advice.priority``).
    rho
        Residency fraction; per-layer quotas from :func:`capacities_for_rho`.
    capacity
        Explicit capacity per layer (CLR's ``B``), overriding ``rho``.
    prefetch_budget
        ``R``: candidates of ``Advice.prefetch_score[i]`` examined before event ``i``
        (0 = no pre-access refinement).
    tie_break, seed
        Ties of retention keys and of the lowest-scored resident: ``"random"`` (seeded
        per-block rank) or ``"id"`` (lower expert id retained), as in :class:`ReplayConfig`.
    warmup_events
        Events before this index update the cache but are not counted.
    lrfu_lambda
        LRFU decay ``lambda`` in ``[0, 1]`` (0 = LFU-like, 1 = LRU-like); 0.5 by default.
    expert_bytes
        ``S_expert``, bytes per expert block, for Load/token in bytes; ``None`` reports
        Load/token in blocks per token.
    """

    priority: str = "lru"
    rho: float = 0.4
    capacity: tuple[int, ...] | None = None
    prefetch_budget: int = 0
    tie_break: str = "random"
    seed: int = 0
    warmup_events: int = 0
    lrfu_lambda: float = 0.5
    expert_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValidationError(f"priority must be one of {', '.join(PRIORITIES)}; got {self.priority!r}",
                                  field="priority")
        if isinstance(self.rho, bool) or not isinstance(self.rho, (int, float)) or math.isnan(self.rho) \
                or not 0.0 <= self.rho <= 1.0:
            raise ValidationError(f"rho must be a number in [0, 1]; got {self.rho!r}", field="rho")
        if self.capacity is not None:
            caps = tuple(self.capacity) if not isinstance(self.capacity, (int, np.integer)) else None
            if caps is None or any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0
                                   for c in caps):
                raise ValidationError(f"capacity must be one non-negative integer per layer; got {self.capacity!r}",
                                      field="capacity")
        for name in ("prefetch_budget", "warmup_events", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValidationError(f"{name} must be a non-negative integer; got {v!r}", field=name)
        if self.tie_break not in TIE_BREAKS:
            raise ValidationError(f"tie_break must be one of {', '.join(TIE_BREAKS)}; got {self.tie_break!r}",
                                  field="tie_break")
        if isinstance(self.lrfu_lambda, bool) or not isinstance(self.lrfu_lambda, (int, float)) \
                or math.isnan(self.lrfu_lambda) or not 0.0 <= self.lrfu_lambda <= 1.0:
            raise ValidationError(f"lrfu_lambda must be in [0, 1]; got {self.lrfu_lambda!r}", field="lrfu_lambda")
        if self.expert_bytes is not None and (isinstance(self.expert_bytes, bool)
                                              or not isinstance(self.expert_bytes, (int, np.integer))
                                              or self.expert_bytes <= 0):
            raise ValidationError(f"expert_bytes must be a positive integer; got {self.expert_bytes!r}",
                                  field="expert_bytes")


@dataclass(frozen=True)
class ProactiveLayerCounts:
    """Counted events of one layer."""

    layer: int
    capacity: int
    accesses: int
    hits: int
    demand_misses: int
    proactive_loads: int
    useful_prefetches: int
    logical: int


@dataclass(frozen=True)
class ProactiveResult:
    """Counts of one proactive replay, and CLR's metrics on them (§4.1 of CLR; docs/design.md §2).

    Attributes
    ----------
    priority, prefetch_budget, rho, capacity_total, tie_break, seed, warmup_events, expert_bytes
        The configuration.
    accesses
        ``A``: union accesses of the counted events.
    hits, demand_misses
        ``A - D`` and ``D``.
    proactive_loads
        ``P``: blocks inserted by pre-access refinement during counted events.
    useful_prefetches
        Proactive loads (of counted events) hit at least once before leaving the cache.
    logical
        Pre-deduplication assignments of the counted events (§2.4).
    tokens
        ``T``: tokens produced by the counted events (``|A(s)|`` summed over their steps).
    n_events
        Counted events.
    per_layer
        One :class:`ProactiveLayerCounts` per layer.
    """

    priority: str
    prefetch_budget: int
    rho: float | None
    capacity_total: int
    tie_break: str
    seed: int
    warmup_events: int
    expert_bytes: int | None
    accesses: int
    hits: int
    demand_misses: int
    proactive_loads: int
    useful_prefetches: int
    logical: int
    tokens: int
    n_events: int
    per_layer: tuple[ProactiveLayerCounts, ...]

    @property
    def transferred(self) -> int:
        """``D + P``: every block moved during the counted events."""
        return self.demand_misses + self.proactive_loads

    @property
    def hit(self) -> float:
        """``Hit = 1 - D/A`` (hard hit rate)."""
        return 1.0 - self.demand_misses / self.accesses if self.accesses else 0.0

    @property
    def adj_hit(self) -> float:
        """``AdjHit = (A - D) / (A + P)``: proactive loads enlarge the denominator."""
        d = self.accesses + self.proactive_loads
        return (self.accesses - self.demand_misses) / d if d else 0.0

    @property
    def load_per_token(self) -> float:
        """``(D + P) * S_expert / T`` in bytes (blocks per token when ``expert_bytes`` is None)."""
        size = self.expert_bytes if self.expert_bytes is not None else 1
        return self.transferred * size / self.tokens if self.tokens else 0.0

    @property
    def load_unit(self) -> str:
        """Unit of :attr:`load_per_token`."""
        return "bytes/token" if self.expert_bytes is not None else "blocks/token"

    @property
    def miss_fraction(self) -> float:
        """The evaluation paper's effective miss fraction on the same run: ``m = (D + P) / logical`` (§2.4)."""
        return self.transferred / self.logical if self.logical else 0.0

    @property
    def wasted_prefetches(self) -> int:
        """Proactive loads never hit before leaving the cache (or the end of the stream)."""
        return self.proactive_loads - self.useful_prefetches

    def to_dict(self, per_layer: bool = True) -> dict[str, Any]:
        """A JSON-ready dict with the derived metrics."""
        out = asdict(self)
        if per_layer:
            out["per_layer"] = [asdict(x) for x in self.per_layer]
        else:
            del out["per_layer"]
        out.update(transferred=self.transferred, hit=self.hit, adj_hit=self.adj_hit,
                   load_per_token=self.load_per_token, load_unit=self.load_unit,
                   miss_fraction=self.miss_fraction, wasted_prefetches=self.wasted_prefetches)
        return out


def decode_tokens(stream: EventStream, counted: np.ndarray) -> int:
    """``T``: ``|A(s)|`` summed over the distinct steps that hold a counted event."""
    if not counted.any():
        return 0
    steps, first = np.unique(stream.step[counted], return_index=True)
    return int(stream.active[counted][first].astype(np.int64).sum())


def _count_mask(stream: EventStream, warmup: int, count_mask) -> np.ndarray:
    mask = np.ones(stream.n_events, dtype=np.bool_)
    if count_mask is not None:
        m = np.asarray(count_mask)
        if m.dtype != np.bool_ or m.shape != (stream.n_events,):
            raise ValidationError(f"count_mask must be bool with one entry per event ({stream.n_events}); "
                                  f"got {m.dtype} {m.shape}", field="count_mask")
        mask &= m
    if warmup > stream.n_events:
        raise ValidationError(f"warmup_events ({warmup}) exceeds the stream's {stream.n_events} events",
                              field="warmup_events")
    mask[:warmup] = False
    return mask


def replay_proactive(stream: EventStream, config: ProactiveConfig, advice=None,
                     count_mask: np.ndarray | None = None) -> ProactiveResult:
    """Replay ``stream`` with pre-access refinement and a retention key; charge every transfer.

    Parameters
    ----------
    stream
        The event stream (per-layer scope).
    config
        Retention key, capacity, candidate budget ``R``, ties, warm-up.
    advice
        :class:`expertcache.nextuse.Advice` with ``priority`` (needed when
        ``config.priority == "advice"``) and/or ``prefetch_score`` (needed when
        ``prefetch_budget > 0``), both ``float32[n_events, N]``.
    count_mask
        ``bool[n_events]``: events to count (combined with ``warmup_events``).

    Examples
    --------
    >>> s = EventStream.from_lists(1, 4, 2, steps=[0, 1, 2], layers=[0, 0, 0],
    ...                            experts=[[0, 1], [1, 2], [0, 1]], active=[1, 1, 1])
    >>> r = replay_proactive(s, ProactiveConfig("lru", capacity=(2,), tie_break="id"))
    >>> (r.accesses, r.hits, r.demand_misses, r.proactive_loads)
    (6, 2, 4, 0)
    """
    return _replay_proactive(stream, config, advice, count_mask, None)


@dataclass(frozen=True)
class ProactiveTrace:
    """What a proactive replay did, access by access and event by event (for the timing model).

    Attributes
    ----------
    hit
        ``bool[stream.union]``: the access hit (aligned to ``stream.expert``; warm-up events too).
    prefetch_offsets
        ``int64[n_events + 1]``: CSR offsets into :attr:`prefetch_expert`.
    prefetch_expert
        ``int32[n_prefetches]``: the experts pre-access refinement inserted before each event, in insertion
        order (warm-up events too; only counted events' insertions are ``proactive_loads``).
    """

    hit: np.ndarray
    prefetch_offsets: np.ndarray
    prefetch_expert: np.ndarray


def replay_proactive_hits(stream: EventStream, config: ProactiveConfig, advice=None,
                          count_mask: np.ndarray | None = None) -> tuple[ProactiveResult, ProactiveTrace]:
    """:func:`replay_proactive`, plus which accesses hit and which blocks were prefetched before each event.

    Both come from the same kernel run as the counts: ``trace.hit`` over the counted events sums to
    ``result.hits`` and the prefetches of the counted events number ``result.proactive_loads``.

    >>> import numpy as np
    >>> from expertcache.nextuse import Advice
    >>> s = EventStream.from_lists(1, 4, 1, steps=[0, 1], layers=[0, 0], experts=[[0], [2]], active=[1, 1])
    >>> pf = np.full((2, 4), np.nan, dtype=np.float32); pf[1, 2] = 1.0
    >>> r, t = replay_proactive_hits(s, ProactiveConfig("lru", capacity=(1,), prefetch_budget=1),
    ...                              Advice(prefetch_score=pf))
    >>> t.hit.astype(int).tolist(), t.prefetch_offsets.tolist(), t.prefetch_expert.tolist(), r.useful_prefetches
    ([0, 1], [0, 0, 1], [2], 1)
    """
    return _replay_proactive(stream, config, advice, count_mask, True)


def _replay_proactive(stream: EventStream, config: ProactiveConfig, advice, count_mask: np.ndarray | None,
                      record: bool | None):
    from . import _proactive as KP

    L, N = stream.n_layers, stream.n_experts
    if config.capacity is not None:
        caps = np.asarray(config.capacity, dtype=np.int64)
        if caps.shape != (L,):
            raise ValidationError(f"capacity needs one entry per layer ({L}); got {caps.shape[0]}", field="capacity")
    else:
        caps = capacities_for_rho(config.rho, L, N)
    need = []
    if config.priority == "advice":
        need.append("priority")
    if config.prefetch_budget > 0:
        need.append("prefetch_score")
    empty = np.zeros((0, 0), dtype=np.float32)
    if need:
        if advice is None:
            raise ValidationError(f"this replay reads advice ({', '.join(need)}); pass advice from a producer "
                                  "(expertcache.prefetch) or set priority to a base policy and the budget to 0",
                                  field="advice")
        advice.validate(stream, need=tuple(need))
    priority = advice.priority if "priority" in need else empty
    prefetch = advice.prefetch_score if "prefetch_score" in need else empty
    counted = _count_mask(stream, int(config.warmup_events), count_mask)
    tie = _tie_ranks(config.tie_break, int(config.seed), L * N)
    hits, misses, proactive, useful = (np.zeros(L, dtype=np.int64) for _ in range(4))
    code = {"lru": KP.PKEY_LRU, "lfu": KP.PKEY_LFU, "lfru": KP.PKEY_LFRU, "lrfu": KP.PKEY_LRFU,
            "advice": KP.PKEY_ADVICE}[config.priority]
    if record:
        width = min(int(config.prefetch_budget), N) if prefetch.shape[0] else 0
        hit_flag = np.zeros(stream.expert.shape[0], dtype=np.uint8)
        pf_expert = np.zeros((stream.n_events, width), dtype=np.int32)
        pf_n = np.zeros(stream.n_events, dtype=np.int64)
    else:
        hit_flag, pf_expert, pf_n = np.zeros(0, np.uint8), np.zeros((0, 0), np.int32), np.zeros(0, np.int64)
    count_from = int(np.argmax(counted)) if counted.any() else stream.n_events    # counted a suffix: warm-up
    if (config.prefetch_budget == 0 and config.priority in ("lru", "lfu", "lrfu") and N <= KB.MAX_BITS_EXPERTS
            and bool(counted[count_from:].all())
            and (config.priority != "lrfu" or stream.offsets.shape[0] <= KB.MAX_LRFU_EVENTS)):
        # no pre-access refinement: the demand replay of expertcache.replay, whose event-atomic per-layer
        # bitset loops make the same decisions (same keys, lower tie rank leaves first; LRFU's clock counts a
        # layer's events in both)
        _, tie_pos = _tie_order(tie, L, N)
        if config.priority == "lru":
            KBL.replay_lru_layers(stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos, count_from, hits,
                                  misses, hit_flag)
        elif config.priority == "lfu":
            KBL.replay_lfu_layers(stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos, False,
                                  count_from, hits, misses, hit_flag)
        else:
            KB.replay_lrfu_bits(stream.offsets, stream.expert, stream.layer, N, L, caps, tie_pos,
                                float(config.lrfu_lambda), count_from, hits, misses, hit_flag)
    else:
        KP.replay_proactive(stream.offsets, stream.expert, stream.layer, N, L, caps, tie, code,
                            float(config.lrfu_lambda), priority, prefetch, int(config.prefetch_budget), counted,
                            hits, misses, proactive, useful, hit_flag, pf_expert, pf_n)
    layer_logical = np.bincount(stream.layer[counted], weights=stream.logical_per_event[counted],
                                minlength=L).astype(np.int64)
    per_layer = tuple(ProactiveLayerCounts(l, int(caps[l]), int(hits[l] + misses[l]), int(hits[l]), int(misses[l]),
                                           int(proactive[l]), int(useful[l]), int(layer_logical[l]))
                      for l in range(L))
    result = ProactiveResult(
        priority=config.priority, prefetch_budget=int(config.prefetch_budget),
        rho=None if config.capacity is not None else float(config.rho), capacity_total=int(caps.sum()),
        tie_break=config.tie_break, seed=int(config.seed), warmup_events=int(config.warmup_events),
        expert_bytes=config.expert_bytes,
        accesses=int(hits.sum() + misses.sum()), hits=int(hits.sum()), demand_misses=int(misses.sum()),
        proactive_loads=int(proactive.sum()), useful_prefetches=int(useful.sum()),
        logical=int(layer_logical.sum()), tokens=decode_tokens(stream, counted), n_events=int(counted.sum()),
        per_layer=per_layer,
    )
    if not record:
        return result
    offsets = np.zeros(stream.n_events + 1, dtype=np.int64)
    np.cumsum(pf_n, out=offsets[1:])
    flat = pf_expert[np.arange(pf_expert.shape[1])[None, :] < pf_n[:, None]] if pf_expert.shape[1] else \
        np.zeros(0, np.int32)
    return result, ProactiveTrace(hit_flag.astype(bool), offsets, flat.astype(np.int32))


def prefill_then_decode(prefill: EventStream, decode: EventStream) -> tuple[EventStream, int]:
    """One stream of ``prefill`` events followed by ``decode`` events, and the warm-up length.

    Replay it with ``warmup_events`` set to the returned count: the decode phase
    starts from the cache the prefill left (CLR §4.1: "decode is initialized with
    the prefill cache"). Decode steps are shifted past the last prefill step
    (:func:`expertcache.events.concat_streams`).
    """
    stream = concat_streams(prefill, decode, {"source": "prefill_then_decode", "prefill": prefill.provenance,
                                              "decode": decode.provenance, "warmup_events": int(prefill.n_events)})
    return stream, prefill.n_events
