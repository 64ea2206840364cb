"""The replay engine: validation, unit construction and counting around the kernels (§2.2–§2.4, §4).

See ``docs/semantics.md`` for the exact contract every rule here implements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ValidationError
from ..events import EventStream
from . import _kernels as K
from .keys import KEY_STABLE
from .policies import get_policy
from .result import LayerCounts, ReplayResult

__all__ = ["ReplayConfig", "replay", "capacities_for_rho", "total_capacity", "SEMANTICS", "SCOPES",
           "TIE_BREAKS", "static_pinned_set"]

SEMANTICS = ("event-atomic", "sequential-ascending", "sequential-random")
SCOPES = ("per-layer", "global")
TIE_BREAKS = ("random", "id")


@dataclass(frozen=True)
class ReplayConfig:
    """One replay configuration.

    Attributes
    ----------
    policy
        A registered policy name (:func:`expertcache.replay.policy_names`).
    rho
        Residency fraction of the block universe, in ``[0, 1]``.
    scope
        ``"per-layer"`` (quota per layer, DESIGN.md §2) or ``"global"`` (one pool).
    semantics
        ``"event-atomic"`` (Definition 2), ``"sequential-ascending"`` or ``"sequential-random"`` (§4).
    tie_break
        ``"random"`` (per-block priority drawn once from ``seed``) or ``"id"`` (lower id retained).
    seed
        Seed of the tie ranks and of the sequential-random order.
    capacity
        Explicit capacity overriding ``rho``: an int (global scope) or one int
        per layer (per-layer scope); may exceed the universe.
    lfu_in_cache_counters
        LFU counters restart when a block leaves the cache (default: persist).
    """

    policy: str = "lru"
    rho: float = 0.4
    scope: str = "per-layer"
    semantics: str = "event-atomic"
    tie_break: str = "random"
    seed: int = 0
    capacity: int | tuple[int, ...] | None = None
    lfu_in_cache_counters: bool = False

    def __post_init__(self) -> None:
        get_policy(self.policy)
        if isinstance(self.rho, bool) or not isinstance(self.rho, (int, float)) or not (0.0 <= self.rho <= 1.0) \
                or math.isnan(self.rho):
            raise ValidationError(f"rho must be a number in [0, 1]; got {self.rho!r}", field="rho")
        if self.scope not in SCOPES:
            raise ValidationError(f"scope must be one of {', '.join(SCOPES)}; got {self.scope!r}", field="scope")
        if self.semantics not in SEMANTICS:
            raise ValidationError(f"semantics must be one of {', '.join(SEMANTICS)}; got {self.semantics!r}",
                                  field="semantics")
        if self.tie_break not in TIE_BREAKS:
            raise ValidationError(f"tie_break must be one of {', '.join(TIE_BREAKS)}; got {self.tie_break!r}",
                                  field="tie_break")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValidationError(f"seed must be a non-negative integer; got {self.seed!r}", field="seed")
        if self.capacity is not None:
            caps = (self.capacity,) if isinstance(self.capacity, (int, np.integer)) else tuple(self.capacity)
            if any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0 for c in caps):
                raise ValidationError(f"capacity must be non-negative integers; got {self.capacity!r}",
                                      field="capacity")
            if self.scope == "global" and not isinstance(self.capacity, (int, np.integer)):
                raise ValidationError("global scope takes one integer capacity", field="capacity")
            if self.scope == "per-layer" and isinstance(self.capacity, (int, np.integer)):
                raise ValidationError("per-layer scope takes one capacity per layer (a sequence)",
                                      field="capacity")


def total_capacity(rho: float, n_layers: int, n_experts: int) -> int:
    """``floor(rho*L*N + 0.5)`` (DESIGN.md §2)."""
    return int(math.floor(rho * n_layers * n_experts + 0.5))


def capacities_for_rho(rho: float, n_layers: int, n_experts: int) -> np.ndarray:
    """Per-layer quotas: ``total // L`` each, plus one for the first ``total % L`` layers.

    Qwen3-30B-A3B (48 layers x 128 experts) at rho = 0.4: 2458 blocks, 52 for layers 0-9, 51 after.

    >>> caps = capacities_for_rho(0.4, 48, 128)
    >>> int(caps.sum()), caps[8:12].tolist()
    (2458, [52, 52, 51, 51])
    """
    total = total_capacity(rho, n_layers, n_experts)
    caps = np.full(n_layers, total // n_layers, dtype=np.int64)
    caps[: total % n_layers] += 1
    return caps


def _tie_ranks(tie_break: str, seed: int, n_blocks: int) -> np.ndarray:
    if tie_break == "id":
        return n_blocks - np.arange(n_blocks, dtype=np.int64)
    return np.random.default_rng(seed).permutation(n_blocks).astype(np.int64)


def _units(stream: EventStream, semantics: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unit_offsets, unit_block, unit_event) for the requested semantics."""
    block = stream.block
    if semantics == "event-atomic":
        return stream.offsets, block, np.arange(stream.n_events, dtype=np.int64)
    if semantics == "sequential-random":
        rng = np.random.default_rng([seed, 1])
        block = block.copy()
        off = stream.offsets
        for i in range(stream.n_events):
            seg = block[off[i]:off[i + 1]]
            block[off[i]:off[i + 1]] = seg[rng.permutation(seg.shape[0])]
    n = block.shape[0]
    return np.arange(n + 1, dtype=np.int64), block, stream.event_of_access


def static_pinned_set(calibration: EventStream, capacity: np.ndarray, scope: str, tie: np.ndarray) -> np.ndarray:
    """Pinned-block mask: per partition, the ``c`` blocks with most union accesses (ties by tie rank)."""
    n_blocks = calibration.n_blocks
    counts = np.bincount(calibration.block, minlength=n_blocks)
    pinned = np.zeros(n_blocks, dtype=bool)
    N = calibration.n_experts
    parts = [np.arange(n_blocks)] if scope == "global" else [np.arange(l * N, (l + 1) * N)
                                                             for l in range(calibration.n_layers)]
    for p, blocks in enumerate(parts):
        c = int(min(capacity[p], blocks.shape[0]))
        if c == 0:
            continue
        order = np.lexsort((-tie[blocks], -counts[blocks]))  # most accessed first, then larger tie rank
        pinned[blocks[order[:c]]] = True
    return pinned


def replay(stream: EventStream, config: ReplayConfig, calibration: EventStream | None = None) -> ReplayResult:
    """Replay ``stream`` under ``config`` and return the counts.

    Parameters
    ----------
    stream
        The event stream to replay.
    config
        Policy, capacity, scope, semantics and ties.
    calibration
        Stream the ``static`` policy fits its pinned set on (same ``L, N``).

    Examples
    --------
    >>> from expertcache.events import EventStream
    >>> s = EventStream.from_lists(1, 4, 2, steps=[0, 1, 2], layers=[0, 0, 0],
    ...                            experts=[[0, 1], [1, 2], [0, 1]], active=[1, 1, 1])
    >>> r = replay(s, ReplayConfig("lru", capacity=(2,), tie_break="id"))
    >>> (r.hits, r.demand_misses, r.transferred, r.logical)
    (2, 4, 4, 6)
    """
    policy = get_policy(config.policy)
    L, N = stream.n_layers, stream.n_experts
    n_blocks = L * N
    if config.capacity is not None:
        caps = np.atleast_1d(np.asarray(config.capacity, dtype=np.int64))
        if config.scope == "per-layer" and caps.shape[0] != L:
            raise ValidationError(f"per-layer capacity needs {L} entries (one per layer); got {caps.shape[0]}",
                                  field="capacity")
    elif config.scope == "global":
        caps = np.array([total_capacity(config.rho, L, N)], dtype=np.int64)
    else:
        caps = capacities_for_rho(config.rho, L, N)
    capacity_total = int(caps.sum())
    tie = _tie_ranks(config.tie_break, int(config.seed), n_blocks)
    n_parts = caps.shape[0]
    ev_part = np.zeros(stream.n_events, dtype=np.int64) if config.scope == "global" else stream.layer.astype(np.int64)
    layer_union = np.bincount(stream.layer, weights=stream.event_size, minlength=L).astype(np.int64)
    layer_logical = np.bincount(stream.layer, weights=stream.logical_per_event, minlength=L).astype(np.int64)
    initial = np.zeros(L, dtype=np.int64)

    if policy.kind == "static":
        if policy.name == "static":
            if calibration is None:
                raise ValidationError("policy 'static' needs a calibration stream (--calibration STREAM_DIR); "
                                      "use 'static-same-trace' for the same-trace diagnostic", field="calibration")
            if (calibration.n_layers, calibration.n_experts) != (L, N):
                raise ValidationError(f"calibration stream has L={calibration.n_layers}, N={calibration.n_experts}; "
                                      f"the replayed stream has L={L}, N={N}", field="calibration")
            fit = calibration
        else:
            fit = stream
        pinned = static_pinned_set(fit, caps, config.scope, tie)
        hit_mask = pinned[stream.block]
        layer_of_access = np.repeat(stream.layer, stream.event_size)
        hits_l = np.bincount(layer_of_access, weights=hit_mask, minlength=L).astype(np.int64)
        miss_l = layer_union - hits_l
        initial = np.bincount(np.arange(n_blocks) // N, weights=pinned, minlength=L).astype(np.int64)
    else:
        if policy.kind == "demand":
            caps = np.zeros(n_parts, dtype=np.int64)
            capacity_total = 0
        unit_off, unit_block, unit_event = _units(stream, config.semantics, int(config.seed))
        unit_part = ev_part[unit_event]
        unit_cycle = stream.step[unit_event]
        first_of_cycle = np.searchsorted(unit_cycle, unit_cycle, side="left")
        unit_coff = np.arange(unit_cycle.shape[0], dtype=np.int64) - first_of_cycle
        access_next = (K.next_use(unit_off, unit_block, n_blocks) if policy.needs_next_use
                       else np.zeros(unit_block.shape[0], dtype=np.int64))
        hits_l = np.zeros(L, dtype=np.int64)
        miss_l = np.zeros(L, dtype=np.int64)
        kernel = K.replay_heap if policy.key_code in KEY_STABLE else K.replay_scan
        kernel(unit_off, unit_block, unit_part, stream.layer.astype(np.int64)[unit_event], unit_cycle, unit_coff, access_next, caps, tie,
                       n_blocks, policy.key_code, bool(config.lfu_in_cache_counters and policy.name == "lfu"),
                       hits_l, miss_l)
    per_layer = tuple(
        LayerCounts(l, int(caps[l]) if config.scope == "per-layer" else -1, int(hits_l[l]), int(miss_l[l]),
                    int(initial[l]), int(layer_union[l]), int(layer_logical[l]))
        for l in range(L)
    )
    demand = int(miss_l.sum())
    init = int(initial.sum())
    return ReplayResult(
        policy=config.policy, semantics=config.semantics, scope=config.scope,
        rho=None if config.capacity is not None else float(config.rho),
        tie_break=config.tie_break, seed=int(config.seed), capacity_total=capacity_total,
        transferred=demand + init, initial_load=init, demand_misses=demand, hits=int(hits_l.sum()),
        logical=stream.logical, union=stream.union, n_events=stream.n_events, per_layer=per_layer,
    )
