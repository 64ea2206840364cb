"""The replay engine: validation, unit construction and counting around the kernels (§2.2–§2.4, §4).

See ``docs/semantics.md`` for the exact contract every rule here implements.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..errors import ValidationError
from ..events import EventStream
from . import _kernels as K
from . import _kernels_belady_buckets as KBB
from . import _kernels_belady_lanes as KBL
from . import _kernels_bits as KB
from . import _kernels_lfru as KL
from . import _kernels_lfru_cands as KC
from . import _kernels_lfru_groups as KG
from . import _kernels_lfru_slots as KS
from . import _kernels_lfu_buckets as KLB
from . import _kernels_lrfu_global as KLR
from . import _kernels_lrfu_slots as KLQ
from . import _kernels_lrfu_window as KLW
from . import _kernels_lru_events as KLE
from . import _kernels_order as KO
from . import _kernels_ranked as KR
from . import _kernels_seq as KQ
from .keys import KEY_BELADY_FORCED, KEY_LEAST_STALE, KEY_LFRU, KEY_LFU, KEY_LRFU, KEY_STABLE
from .policies import Policy, get_policy
from .result import LayerCounts, ReplayResult

__all__ = ["ReplayConfig", "replay", "replay_hits", "replay_curve", "one_pass_supported", "curve_pays", "capacities_for_rho", "total_capacity", "SEMANTICS", "SCOPES",
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
        ``"per-layer"`` (quota per layer, docs/design.md §2) or ``"global"`` (one pool).
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
    lrfu_lambda
        LRFU decay ``lambda`` in ``[0, 1]`` (Lee et al.: ``F(x) = 2**(-lambda*x)`` on the per-layer
        unit clock; 0 ranks like LFU, 1 close to LRU); 0.5 by default.
    warmup_events
        The first ``warmup_events`` events are replayed (they fill the cache)
        but not counted: hits, misses, union and logical cover the rest. This
        is how a prefill-initialised cache (CLR §4.1) and the measurement
        window after a workload transition (§8.1) are expressed.
    """

    policy: str = "lru"
    rho: float = 0.4
    scope: str = "per-layer"
    semantics: str = "event-atomic"
    tie_break: str = "random"
    seed: int = 0
    capacity: int | tuple[int, ...] | None = None
    lfu_in_cache_counters: bool = False
    lrfu_lambda: float = 0.5
    warmup_events: int = 0

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
        if isinstance(self.lrfu_lambda, bool) or not isinstance(self.lrfu_lambda, (int, float)) \
                or math.isnan(self.lrfu_lambda) or not 0.0 <= self.lrfu_lambda <= 1.0:
            raise ValidationError(f"lrfu_lambda must be a number in [0, 1]; got {self.lrfu_lambda!r}",
                                  field="lrfu_lambda")
        if isinstance(self.warmup_events, bool) or not isinstance(self.warmup_events, (int, np.integer)) \
                or self.warmup_events < 0:
            raise ValidationError(f"warmup_events must be a non-negative integer; got {self.warmup_events!r}",
                                  field="warmup_events")
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


#: The empty per-access flag array: kernels record no hit flags.
_NO_FLAGS = np.zeros(0, dtype=np.uint8)


def total_capacity(rho: float, n_layers: int, n_experts: int) -> int:
    """``floor(rho*L*N + 0.5)`` (docs/design.md §2)."""
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


def _advice_next_use(stream: EventStream, config: ReplayConfig, advice) -> np.ndarray:
    """Validate advice for ``stream`` and return its next-use array (the key Belady's machinery reads)."""
    if advice is None:
        raise ValidationError(f"policy {config.policy!r} needs advice from a predictor "
                              "(expertcache nextuse eval ... --advice-out FILE, then replay --advice FILE)",
                              field="advice")
    if config.semantics != "event-atomic":
        raise ValidationError("advice is defined per event-atomic unit; use --semantics event-atomic",
                              field="semantics")
    if getattr(advice, "next_use", None) is None:
        raise ValidationError(f"policy {config.policy!r} reads next-use advice; this advice file holds only "
                              "priority/prefetch scores (replay it with `expertcache prefetch replay`)",
                              field="advice")
    nxt = np.asarray(advice.next_use)
    if nxt.shape != (stream.union,) or nxt.dtype != np.int32:
        raise ValidationError(f"advice must be int32 with one entry per union access ({stream.union}); "
                              f"got {nxt.dtype} {nxt.shape}", field="advice")
    if (nxt <= stream.event_of_access).any():
        raise ValidationError("advice next uses must lie after the access's own event", field="advice")
    return nxt


def _tie_order(tie: np.ndarray, n_layers: int, n_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, block ids by ascending tie rank (``int64[L, N]``), and each block's position there."""
    local = np.argsort(tie.reshape(n_layers, n_experts), axis=1, kind="stable")
    order = local + (np.arange(n_layers, dtype=np.int64) * n_experts)[:, None]
    tie_pos = np.empty(n_layers * n_experts, dtype=np.int64)
    tie_pos[order.ravel()] = np.tile(np.arange(n_experts, dtype=np.int64), n_layers)
    return order, tie_pos


def _member_order(stream: EventStream, semantics: str, seed: int) -> np.ndarray:
    """Member expert ids in access order: ascending (as stored), or shuffled per event for sequential-random
    (the order of ``seg[rng.permutation(len(seg))]`` event by event, ``rng = np.random.default_rng([seed, 1])``)."""
    if semantics != "sequential-random":
        return stream.expert

    def shuffled() -> np.ndarray:
        expert = stream.expert.copy()
        KO.shuffle_events(stream.offsets, expert, _order_words(seed))
        return expert

    return _reused("order", (stream.offsets, stream.expert), int(seed), shuffled)


def _order_words(seed: int) -> np.ndarray:
    """The PCG64 state of the sequential-random order of ``seed`` (:func:`._kernels_order.pcg64_words`)."""
    return KO.pcg64_words(np.random.default_rng([seed, 1]).bit_generator)


def _seq_loop(config: ReplayConfig, policy: Policy, n_experts: int, n_access: int) -> bool:
    """Whether :func:`_loop_generic` runs ``policy`` on a sequential per-layer loop of :mod:`._kernels_seq`
    (``lfu``, ``lrfu``, ``lfru``; ``lfru``'s float32 clock takes streams of fewer than ``2**24`` accesses)."""
    if (config.semantics == "event-atomic" or config.scope == "global" or n_experts > KB.MAX_BITS_EXPERTS
            or policy.loop not in ("heap", "scan")):
        return False
    if policy.key_code == KEY_LFRU:
        return n_access + 1 <= KB.MAX_LFRU_EVENTS
    return policy.key_code in (KEY_LFU, KEY_LRFU)


def _shuffles_inside(config: ReplayConfig, policy: Policy, stream: EventStream) -> bool:
    """Whether the loop shuffles each event itself, so that its inputs keep the stream's member order:
    sequential-random ``lru`` and ``least-stale`` (lru's loops, either scope) and the sequential
    per-layer loops of ``lfu``, ``lrfu`` and ``lfru`` (:func:`_seq_loop`); :func:`._kernels_order.shuffled_replay`
    runs each of them."""
    return config.semantics == "sequential-random" and (
        policy.loop == "list" or _seq_loop(config, policy, stream.n_experts, stream.union))


def _sequential(config: ReplayConfig, offsets, expert, run) -> None:
    """A sequential loop by ranges (``run``, ``_kernels_seq.*_seq_ranges``) over the stream's member order as
    given: shuffled chunk by chunk on a second thread for sequential-random (:func:`._kernels_order.shuffled_replay`),
    else in one call."""
    if config.semantics != "sequential-random":
        return run(expert, 0, offsets.shape[0] - 1)
    seed = int(config.seed)
    order = _kept("order", (offsets, expert), seed)     # shuffled by an earlier replay within reuse_belady_inputs
    if order is not None:
        return run(order, 0, offsets.shape[0] - 1)
    _keep("order", (offsets, expert), seed, KO.shuffled_replay(offsets, expert, _order_words(seed), run))


def _kernel_inputs(stream: EventStream, config: ReplayConfig, needs_next_use: bool, ordered: bool = True) -> tuple:
    """The stream-side arguments shared by every kernel, for ``config``'s semantics and scope (``ordered``:
    members in access order, else as stored, for a loop that shuffles them itself)."""
    atomic = config.semantics == "event-atomic"
    n_units = stream.n_events if atomic else stream.union
    if n_units >= int(K.NEVER):
        raise ValidationError(f"streams of more than {int(K.NEVER) - 1} units are not supported; split the stream")
    expert = _member_order(stream, config.semantics, int(config.seed)) if ordered else stream.expert
    layer = stream.layer
    access_next = (_next_use(stream.offsets, expert, layer, stream.n_experts, stream.n_layers, atomic)
                   if needs_next_use else np.empty(0, dtype=np.int32))
    return (stream.offsets, expert, layer, stream.step, stream.n_experts, stream.n_layers,
            config.scope == "global", atomic, access_next)


def static_pinned_set(calibration: EventStream, capacity: np.ndarray, scope: str, tie: np.ndarray) -> np.ndarray:
    """Pinned-block mask: per partition, the ``c`` blocks with most union accesses (ties by tie rank)."""
    n_blocks = calibration.n_blocks
    counts = K.block_counts(calibration.offsets, calibration.expert, calibration.layer, calibration.n_experts,
                            calibration.n_layers)
    N = calibration.n_experts
    size = n_blocks if scope == "global" else N                  # blocks of a partition (one, or one a layer)
    part = np.arange(n_blocks, dtype=np.int64) // size
    order = np.lexsort((-tie, -counts, part))        # by partition, most accessed first, then larger tie rank
    rank = np.empty(n_blocks, dtype=np.int64)        # each block's place in its partition's order
    rank[order] = np.arange(n_blocks, dtype=np.int64) - part[order] * size
    return rank < np.asarray(capacity, dtype=np.int64)[part]


def replay(stream: EventStream, config: ReplayConfig, calibration: EventStream | None = None,
           advice=None) -> ReplayResult:
    """Replay ``stream`` under ``config`` and return the counts.

    Parameters
    ----------
    stream
        The event stream to replay.
    config
        Policy, capacity, scope, semantics and ties.
    calibration
        Stream the ``static`` policy fits its pinned set on (same ``L, N``).
    advice
        :class:`expertcache.nextuse.Advice` for policies that read predictions
        (``predicted-next-use``): a predicted next unit per access, event-atomic only.

    Examples
    --------
    >>> from expertcache.events import EventStream
    >>> s = EventStream.from_lists(1, 4, 2, steps=[0, 1, 2], layers=[0, 0, 0],
    ...                            experts=[[0, 1], [1, 2], [0, 1]], active=[1, 1, 1])
    >>> r = replay(s, ReplayConfig("lru", capacity=(2,), tie_break="id"))
    >>> (r.hits, r.demand_misses, r.transferred, r.logical)
    (2, 4, 4, 6)
    """
    return _replay(stream, config, calibration, advice, None)


def replay_hits(stream: EventStream, config: ReplayConfig, calibration: EventStream | None = None,
                advice=None) -> tuple[ReplayResult, np.ndarray]:
    """:func:`replay`, plus which accesses hit: ``bool[stream.union]`` aligned to ``stream.expert``.

    The flags come from the same kernel run as the counts, so ``flags[counted].sum() == result.hits`` for the
    accesses of counted events (warm-up events are flagged too). Members are in the stream's own (ascending)
    order, so only ``event-atomic`` and ``sequential-ascending`` are accepted. The timing model reads the
    flags to put each event's hits and misses on a timeline.

    >>> from expertcache.events import EventStream
    >>> s = EventStream.from_lists(1, 4, 2, steps=[0, 1, 2], layers=[0, 0, 0],
    ...                            experts=[[0, 1], [1, 2], [0, 1]], active=[1, 1, 1])
    >>> r, hit = replay_hits(s, ReplayConfig("lru", capacity=(2,), tie_break="id"))
    >>> hit.astype(int).tolist(), r.hits
    ([0, 0, 1, 0, 0, 1], 2)
    """
    if config.semantics == "sequential-random":
        raise ValidationError("per-access hits follow the stream's member order: use event-atomic or "
                              "sequential-ascending", field="semantics")
    flags = np.zeros(stream.expert.shape[0], dtype=np.uint8)
    result = _replay(stream, config, calibration, advice, flags)
    return result, flags.astype(bool)


def _replay(stream: EventStream, config: ReplayConfig, calibration: EventStream | None, advice,
            hit_flag: np.ndarray | None) -> ReplayResult:
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
    tie = _tie_ranks(config.tie_break, int(config.seed), n_blocks)
    n_parts = caps.shape[0]
    if config.warmup_events > stream.n_events:
        raise ValidationError(f"warmup_events ({config.warmup_events}) exceeds the stream's {stream.n_events} events",
                              field="warmup_events")
    layer_union, layer_logical = _layer_totals(stream, config.warmup_events)
    initial = np.zeros(L, dtype=np.int64)

    if policy.kind == "static":
        if policy.needs_calibration:
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
        hits_l = np.zeros(L, dtype=np.int64)
        K.replay_static(stream.offsets, stream.expert, stream.layer, N, pinned.view(np.uint8), config.warmup_events,
                        hits_l, _NO_FLAGS if hit_flag is None else hit_flag)
        miss_l = layer_union - hits_l
        initial = pinned.reshape(L, N).sum(axis=1, dtype=np.int64)
    elif policy.kind == "demand":      # nothing is kept: every union access of a counted event misses, in any
        caps = np.zeros(n_parts, dtype=np.int64)        # order (what lru's loops gave at a capacity of 0, after a
        hits_l = np.zeros(L, dtype=np.int64)            # shuffle under sequential-random)
        miss_l = layer_union.copy()
        if hit_flag is not None:
            hit_flag[:] = 0
    else:
        hits_l = np.zeros(L, dtype=np.int64)
        miss_l = np.zeros(L, dtype=np.int64)
        walk = _belady_loop(config, policy, N, caps, stream.offsets) == "walk"     # needs no next-use array
        args = _kernel_inputs(stream, config, policy.needs_next_use and not walk,
                              ordered=not _shuffles_inside(config, policy, stream))
        if policy.needs_advice:
            args = (*args[:-1], _advice_next_use(stream, config, advice))
        _LOOPS[policy.loop](args, config, policy, caps, tie, hits_l, miss_l, _NO_FLAGS if hit_flag is None else hit_flag)
    return _result(stream, config, caps, hits_l, miss_l, initial, layer_union, layer_logical)


def _loop_list(args: tuple, config: ReplayConfig, policy: Policy, caps, tie, hits, misses, hit_flag) -> None:
    offsets, expert, layer, _, n_experts, n_layers, global_scope, atomic, _ = args
    if not atomic:         # one unit per access: int32 lists (_kernels_seq), a random order shuffled beside them
        run = KQ.lru_seq_ranges(offsets, layer, n_experts, n_layers, caps, config.warmup_events, hits, misses,
                                hit_flag, global_scope)
        return _sequential(config, offsets, expert, run)
    order, tie_pos = _tie_order(tie, n_layers, n_experts)          # event-atomic from here on
    if not global_scope and n_experts <= KB.MAX_BITS_EXPERTS:  # lanes of unit keys or recency buckets
        return KBL.replay_lru_layers(offsets, expert, layer, n_experts, n_layers, caps, tie_pos, config.warmup_events,
                                     hits, misses, hit_flag)
    if global_scope and KLE.fits(offsets.shape[0] - 1, int(offsets[-1] - offsets[0]), n_experts):
        return KLE.replay_lru_events(offsets, expert, layer, n_experts, n_layers, caps, order, tie_pos,
                                     config.warmup_events, hits, misses, hit_flag)
    K.replay_lru(offsets, expert, layer, n_experts, n_layers, global_scope, True, caps, order, tie_pos,
                 config.warmup_events, hits, misses, hit_flag)


def _belady_loop(config: ReplayConfig, policy: Policy, n_experts: int, caps: np.ndarray, offsets: np.ndarray) -> str:
    """Which per-layer bitset loop replays Belady (event-atomic, per layer, ``N <= 1,024``): ``"lanes"``
    (``_kernels_belady_lanes``, next uses in dense lanes; advice too), ``"walk"`` (``_kernels_bits.replay_belady_walk``,
    which needs no next-use array) where :func:`._kernels_belady_lanes.lanes_pay` says the walk is faster, or ``""``
    (neither)."""
    if not (policy.loop == "belady" and config.semantics == "event-atomic" and config.scope == "per-layer"
            and n_experts <= KB.MAX_BITS_EXPERTS):
        return ""
    n_events = max(offsets.shape[0] - 1, 1)
    if policy.needs_advice or KBL.lanes_pay(n_experts, caps, float(offsets[-1] - offsets[0]) / n_events):
        return "lanes"
    return "walk"


_REUSED: dict[str, list[tuple]] = {"bitsets": [], "next": [], "order": []}   # the last two of each (keys, result)
_REUSE_LOCK = threading.Lock()
_REUSE_DEPTH = [0]                  # open reuse_belady_inputs() scopes


@contextmanager
def reuse_belady_inputs() -> Iterator[None]:
    """Within this scope, replays keep what they build from a stream for the last two streams: Belady's next-use
    arrays (per semantics and member order) and the walk's event bitsets (per tie order), and sequential-random's
    shuffled member order (per seed), so that later replays of the stream skip the shuffle.

    Belady and Belady-forced, a curve's capacities, a report's policies and its decompositions replay one stream
    under one tie order and seed several times, and these depend on nothing else. The scope is for code that
    does not change a stream's arrays in place between those replays (entries are matched by array identity);
    the kept arrays are dropped when the outermost scope closes.
    """
    with _REUSE_LOCK:
        _REUSE_DEPTH[0] += 1
    try:
        yield
    finally:
        with _REUSE_LOCK:
            _REUSE_DEPTH[0] -= 1
            if _REUSE_DEPTH[0] == 0:
                for kept in _REUSED.values():
                    kept.clear()


def _kept(kind: str, arrays: tuple, extra) -> object:
    """Within :func:`reuse_belady_inputs`, the result kept for the same ``arrays`` (by identity) and ``extra`` (an
    array compared by value, or a scalar); else None."""
    def same(a, b) -> bool:
        if isinstance(a, np.ndarray):
            return a.shape == b.shape and bool((a == b).all())
        return a == b

    with _REUSE_LOCK:
        for keys, x, res in _REUSED[kind] if _REUSE_DEPTH[0] > 0 else ():
            if all(k is a for k, a in zip(keys, arrays, strict=True)) and same(x, extra):
                return res
    return None


def _keep(kind: str, arrays: tuple, extra, res) -> None:
    """Within :func:`reuse_belady_inputs`, keep ``res`` for ``arrays`` and ``extra`` (the last two of each kind);
    else nothing."""
    with _REUSE_LOCK:
        if _REUSE_DEPTH[0] > 0:
            _REUSED[kind].insert(0, (arrays, extra.copy() if isinstance(extra, np.ndarray) else extra, res))
            del _REUSED[kind][2:]


def _reused(kind: str, arrays: tuple, extra, build) -> object:
    """``build()``, or within :func:`reuse_belady_inputs` the result kept for the same ``arrays`` and ``extra``
    (:func:`_kept`; a result built there is kept)."""
    res = _kept(kind, arrays, extra)
    if res is None:
        res = build()
        _keep(kind, arrays, extra, res)
    return res


def _event_bitsets(offsets, expert, layer, n_experts: int, n_layers: int, tie_pos: np.ndarray) -> tuple:
    """:func:`._kernels_bits.event_bitsets`, reused inside :func:`reuse_belady_inputs` (read only)."""
    return _reused("bitsets", (offsets, expert, layer), tie_pos,
                   lambda: KB.event_bitsets(offsets, expert, layer, n_experts, n_layers, tie_pos))


def _next_use(offsets, expert, layer, n_experts: int, n_layers: int, atomic: bool) -> np.ndarray:
    """:func:`._kernels.next_use`, reused inside :func:`reuse_belady_inputs` (read only)."""
    return _reused("next", (offsets, expert, layer), bool(atomic),
                   lambda: K.next_use(offsets, expert, layer, n_experts, n_layers, atomic))


def _loop_belady(args: tuple, config: ReplayConfig, policy: Policy, caps, tie, hits, misses, hit_flag) -> None:
    offsets, expert, layer, _, n_experts, n_layers, global_scope, atomic, access_next = args
    forced = policy.key_code == KEY_BELADY_FORCED
    loop = _belady_loop(config, policy, n_experts, caps, offsets)
    if loop == "lanes":
        # per layer: each block's next use in a dense lane, an overflow decided by vector reductions over the
        # layer's lanes (docs/performance.md, *Session 48*)
        _, tie_pos = _tie_order(tie, n_layers, n_experts)
        return KBL.replay_belady_lanes(offsets, expert, layer, n_experts, n_layers, caps, tie_pos, access_next, forced,
                                       config.warmup_events, hits, misses, hit_flag)
    if loop == "walk":                 # it builds no next-use array
        _, tie_pos = _tie_order(tie, n_layers, n_experts)
        bitsets = _event_bitsets(offsets, expert, layer, n_experts, n_layers, tie_pos)
        if KB.replay_belady_walk(offsets, expert, layer, n_experts, n_layers, caps, tie_pos, forced,
                                 config.warmup_events, hits, misses, hit_flag, bitsets=bitsets):
            return None
        # the walk ran over its budget (a stream whose kept experts recur far ahead): the heap loop, from scratch
        hits[:] = 0
        misses[:] = 0
        hit_flag[:] = 0
        access_next = _next_use(offsets, expert, layer, n_experts, n_layers, atomic)
        args = (*args[:-1], access_next)
    if global_scope and not policy.needs_advice and (KBB.fits(offsets.shape[0] - 1, n_experts) if atomic
                                                     else KBB.units_fit(int(offsets[-1]), n_layers)):
        # one pool: residents in buckets by next use, the farthest three leading-zero counts away (event-atomic:
        # bitsets over tie positions a bucket; one unit per access: a unit's bucket is its own block), where the heap
        # loop sifted at every access (docs/performance.md, *Session 41*)
        g_order, g_pos = _tie_order(tie, 1, tie.shape[0])
        if not atomic:
            return KBB.replay_belady_units(offsets, expert, layer, n_experts, n_layers, access_next, caps, g_order,
                                           g_pos, forced, config.warmup_events, hits, misses, hit_flag)
        order, tie_pos = _tie_order(tie, n_layers, n_experts)
        return KBB.replay_belady_buckets(offsets, expert, layer, n_experts, n_layers, access_next, caps, order,
                                         tie_pos, g_order, g_pos, forced, config.warmup_events, hits, misses,
                                         hit_flag)
    if not atomic and not global_scope and n_experts <= KB.MAX_BITS_EXPERTS:
        # one unit per access, per layer: packed keys in slots, the largest held through an event, where the heap
        # loop sifted at every access (docs/performance.md, *Session 41*)
        _, tie_pos = _tie_order(tie, n_layers, n_experts)
        return KQ.replay_belady_seq(offsets, expert, layer, n_experts, n_layers, caps, tie_pos, access_next, forced,
                                    config.warmup_events, hits, misses, hit_flag)
    if n_layers * n_experts >= (1 << 23):   # the int64 key packs the tie rank into 23 bits
        return _loop_generic(args, config, policy, caps, tie, hits, misses, hit_flag)
    K.replay_belady(offsets, expert, layer, n_experts, n_layers, global_scope, atomic, access_next, caps, tie, forced,
                    config.warmup_events, hits, misses, hit_flag)


def _loop_generic(args: tuple, config: ReplayConfig, policy: Policy, caps, tie, hits, misses,
                  hit_flag=_NO_FLAGS) -> None:
    offsets, expert, layer, step, n_experts, n_layers, global_scope, atomic, _ = args
    reset = bool(config.lfu_in_cache_counters and policy.name == "lfu")
    seq = _seq_loop(config, policy, n_experts, expert.shape[0])     # (the member order as stored where random)
    if policy.key_code == KEY_LFU and atomic and not global_scope and n_experts <= KB.MAX_BITS_EXPERTS:
        _, tie_pos = _tie_order(tie, n_layers, n_experts)      # counts and residents over tie positions
        return KBL.replay_lfu_layers(offsets, expert, layer, n_experts, n_layers, caps, tie_pos, reset,
                                     config.warmup_events, hits, misses, hit_flag)      # lanes or bit-sliced counts
    if seq and policy.key_code == KEY_LFRU:
        # one unit per access: residents in slots, the two lowest float32 keys found by one vector pass
        _, tie_pos = _tie_order(tie, n_layers, n_experts)
        return _sequential(config, offsets, expert, KQ.lfru_seq_ranges(offsets, layer, n_experts, n_layers, caps,
                                                                      tie_pos, config.warmup_events, hits, misses,
                                                                      hit_flag))
    if (policy.key_code == KEY_LFRU and atomic and not global_scope and n_experts <= KB.MAX_BITS_EXPERTS
            and offsets.shape[0] <= KB.MAX_LFRU_EVENTS):
        # its float32 counts and units (events): below 2**24; sequential per-layer lfru took the branch above
        _, tie_pos = _tie_order(tie, n_layers, n_experts)      # counts, last units and residents over tie positions
        return KB.replay_lfru_bits(offsets, expert, layer, n_experts, n_layers, caps, tie_pos, config.warmup_events,
                                   hits, misses, hit_flag)
    n_events = max(offsets.shape[0] - 1, 1)
    if (policy.key_code == KEY_LFRU and global_scope and atomic and offsets.shape[0] <= KS.MAX_EVENTS
            and caps[0] <= KS.slots_per_member(n_events / max(n_layers, 1)) * expert.shape[0] / n_events
            and caps[0] + n_experts + 128 < KS.MAX_SLOTS):
        # a small global cache, event-atomic: dense slots, two exact cuts from one vector pass
        return KS.replay_lfru_slots(offsets, expert, layer, n_experts, n_layers, caps, tie, config.warmup_events,
                                    hits, misses, hit_flag)
    if policy.key_code == KEY_LFRU and global_scope and not atomic:
        # one global pool, one unit per access: dense slots, the lowest among candidates made every few units
        return KC.replay_lfru_cands(offsets, expert, layer, n_experts, n_layers, caps, tie, config.warmup_events,
                                    hits, misses, hit_flag)
    if policy.key_code == KEY_LFRU and global_scope:
        # one global pool, event-atomic: residents in frequency groups, only the pool of low keys re-ranked
        return KG.replay_lfru_groups(offsets, expert, layer, n_experts, n_layers, atomic, caps, tie,
                                     config.warmup_events, hits, misses, hit_flag)
    if (policy.key_code == KEY_LRFU and atomic and not global_scope and n_experts <= KB.MAX_BITS_EXPERTS
            and offsets.shape[0] <= KB.MAX_LRFU_EVENTS):       # its int32 last units
        _, tie_pos = _tie_order(tie, n_layers, n_experts)      # keys and residents over tie positions
        return KB.replay_lrfu_bits(offsets, expert, layer, n_experts, n_layers, caps, tie_pos, _lam(config, policy),
                                   config.warmup_events, hits, misses, hit_flag)
    if seq:
        # one unit per access: packed keys per tie position, one vector minimum per eviction
        _, tie_pos = _tie_order(tie, n_layers, n_experts)
        if policy.key_code == KEY_LFU:
            run = KQ.lfu_seq_ranges(offsets, layer, n_experts, n_layers, caps, tie_pos, reset, config.warmup_events,
                                    hits, misses, hit_flag)
        else:
            run = KQ.lrfu_seq_ranges(offsets, layer, n_experts, n_layers, caps, tie_pos, _lam(config, policy),
                                     config.warmup_events, hits, misses, hit_flag)
        return _sequential(config, offsets, expert, run)
    if policy.key_code == KEY_LFU and global_scope and KLB.fits(n_layers * n_experts, int(caps[0]),
                                                                 int(K._max_unit(offsets, atomic))):
        # one pool, either semantics: residents in count buckets (bitsets over tie positions), the lowest two
        # tzcnt away, where the heap loop sifted at every access
        _, tie_pos = _tie_order(tie, 1, tie.shape[0])      # positions among all blocks: one "layer" of L N
        return KLB.replay_lfu_buckets(offsets, expert, layer, n_experts, n_layers, atomic, caps, tie_pos, reset,
                                      config.warmup_events, hits, misses, hit_flag)
    if policy.key_code == KEY_LRFU and global_scope:
        _, tie_pos = _tie_order(tie, 1, tie.shape[0])
        lam = _lam(config, policy)
        if not atomic and KLW.window(lam) <= KLW.MAX_WINDOW:
            # one access a unit: each layer's lowest key among its oldest residents, the layers in a tournament
            return KLW.replay_lrfu_window(offsets, expert, layer, n_experts, n_layers, caps, tie_pos, lam,
                                          config.warmup_events, hits, misses, hit_flag)
        if atomic and KLQ.fits(offsets.shape[0] - 1, expert.shape[0], int(caps[0])):
            # a small cache for its events: dense slots, float32 values and vector cuts, as per-layer lrfu
            # (benchmarks/lrfu_slots.py)
            return KLQ.replay_lrfu_slots(offsets, expert, layer, n_experts, n_layers, caps, tie_pos, lam,
                                         config.warmup_events, hits, misses, hit_flag)
        # one pool, either semantics: only the low keys ordered (a sorted run and a side list), where the heap loop
        # sifted at every access (benchmarks/lrfu_global.py)
        return KLR.replay_lrfu_global(offsets, expert, layer, n_experts, n_layers, atomic, caps, tie_pos,
                                      _lam(config, policy), config.warmup_events, hits, misses, hit_flag)
    bits = _ranked_bits(policy.key_code, offsets, step, n_layers * n_experts, atomic)
    if bits is not None:
        # where event-atomic units per layer are a large share of the quota, keep the residents sorted and
        # merge each unit in; otherwise (small units, one access per unit, one large global pool) keep them
        # in heaps. lfru's drifting key is re-ranked at every overflow.
        rest = (policy.key_code, *bits, reset, _lam(config, policy), config.warmup_events, hits, misses, hit_flag)
        if policy.key_code == KEY_LFRU:   # per layer where the bitset loop does not apply: select per unit
            KL.replay_select(offsets, expert, layer, n_experts, n_layers, global_scope, atomic, caps, tie,
                             config.warmup_events, hits, misses, hit_flag)
        elif atomic and not global_scope and caps.max() <= _SORTED_UP_TO[policy.key_code] * expert.shape[0] / max(
                offsets.shape[0] - 1, 1):
            order, tie_pos = _tie_order(tie, n_layers, n_experts)
            KR.replay_sorted(offsets, expert, layer, step, n_experts, n_layers, global_scope, atomic, caps, tie,
                             order, tie_pos, *rest)
        else:
            KR.replay_ranked(offsets, expert, layer, step, n_experts, n_layers, global_scope, atomic, caps, tie, *rest)
        return
    kernel = K.replay_heap if policy.key_code in KEY_STABLE else K.replay_scan
    kernel(*args, caps, tie, policy.key_code, reset,
           _lam(config, policy), config.warmup_events, hits, misses, hit_flag)


#: Event-atomic per-layer replays keep residents sorted (``replay_sorted``) while the largest quota is at most
#: this many times the mean event size, and use heaps (``replay_ranked``) beyond: the measured crossover
#: (``python benchmarks/replay_throughput.py --kernel-choice``).
_SORTED_UP_TO = {KEY_LFU: 2.0, KEY_LRFU: 2.0, KEY_LEAST_STALE: 4.0}


def _ranked_bits(key_code: int, offsets: np.ndarray, step: np.ndarray, n_blocks: int,
                 atomic: bool) -> tuple[int, int] | None:
    """``(tie_bits, coff_bits)`` packing ``key_code``'s key into one int64 for ``_kernels_ranked``.

    ``None`` where the key is not replayed there (the rest runs in ``_kernels.replay_heap`` or
    ``replay_scan``) or does not fit 63 bits (then ``replay_heap`` too): lfu needs 31 bits of count above
    the tie rank, least-stale its cycle number and offset in the cycle (lrfu and lfru keep the tie apart).
    """
    if key_code not in (KEY_LFU, KEY_LRFU, KEY_LEAST_STALE, KEY_LFRU):
        return None
    tie_bits = int(n_blocks).bit_length()        # tie ranks are at most n_blocks
    if key_code != KEY_LEAST_STALE:
        return (tie_bits, 0) if key_code != KEY_LFU or tie_bits + 31 <= 63 else None
    n_events = offsets.shape[0] - 1
    if n_events == 0:
        return tie_bits, 0
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])        # first event of each cycle
    units = np.diff(np.r_[first, n_events]) if atomic else np.diff(offsets[np.r_[first, n_events]])
    coff_bits = int(units.max() - 1).bit_length()
    cycle_bits = int(first.shape[0] - 1).bit_length()
    return (tie_bits, coff_bits) if tie_bits + coff_bits + cycle_bits <= 63 else None


def _lam(config: ReplayConfig, policy: Policy) -> float:
    """The LRFU decay the kernels use, or -1 (no LRFU state is kept) for every other key."""
    return float(config.lrfu_lambda) if policy.key_code == KEY_LRFU else -1.0


def _loop_plugin(args: tuple, config: ReplayConfig, policy: Policy, caps, tie, hits, misses, hit_flag) -> None:
    """A policy registered from Python: the scan loop compiled around its key and update (docs/policies.md)."""
    from .plugins import initial_state, plugin_kernel

    offsets, expert, layer, _, n_experts, n_layers, global_scope, atomic, _ = args
    plugin_kernel(policy)(offsets, expert, layer, n_experts, n_layers, global_scope, atomic, caps, tie,
                          initial_state(policy, n_layers * n_experts), config.warmup_events, hits, misses, hit_flag)


#: Policy.loop -> the function that runs it (all make the same decision for a key).
_LOOPS = {"list": _loop_list, "belady": _loop_belady, "heap": _loop_generic, "scan": _loop_generic,
          "plugin": _loop_plugin}


def _layer_totals(stream: EventStream, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Union and logical accesses per layer (``int64[L]`` each) over events ``>= start``."""
    return K.layer_totals(stream.offsets, stream.layer, stream.logical_per_event, stream.n_layers, start)


def _result(stream: EventStream, config: ReplayConfig, caps: np.ndarray, hits_l: np.ndarray, miss_l: np.ndarray,
            initial: np.ndarray, layer_union: np.ndarray, layer_logical: np.ndarray) -> ReplayResult:
    """Assemble the record from per-layer counts."""
    per_layer = tuple(
        LayerCounts(l, int(caps[l]) if config.scope == "per-layer" else -1, int(hits_l[l]), int(miss_l[l]),
                    int(initial[l]), int(layer_union[l]), int(layer_logical[l]))
        for l in range(stream.n_layers)
    )
    demand = int(miss_l.sum())
    init = int(initial.sum())
    return ReplayResult(
        policy=config.policy, semantics=config.semantics, scope=config.scope,
        rho=None if config.capacity is not None else float(config.rho),
        tie_break=config.tie_break, seed=int(config.seed), capacity_total=int(caps.sum()),
        transferred=demand + init, initial_load=init, demand_misses=demand, hits=int(hits_l.sum()),
        logical=int(layer_logical.sum()), union=int(layer_union.sum()),
        n_events=stream.n_events - config.warmup_events, per_layer=per_layer,
        warmup_events=int(config.warmup_events),
    )


def one_pass_supported(config: ReplayConfig) -> bool:
    """Whether :func:`replay_curve` computes every capacity of ``config`` in one pass.

    True for stack policies (``Policy.stack``: a ranking independent of the
    capacity, with fixed tie ranks) under per-layer scope, either semantics.
    LFU with in-cache counters is not a stack policy (eviction resets depend on
    the capacity); global scope and warm-up events fall back to one replay per capacity.
    """
    policy = get_policy(config.policy)
    if not policy.stack or config.scope != "per-layer" or config.warmup_events:
        return False
    return not (config.lfu_in_cache_counters and policy.name == "lfu")


#: Measured time of one curve pass over the time of one replay at rho 0.4, by (policy, event-atomic),
#: for a largest rho of 0.1, 0.4 and 0.95 (the pass keeps stacks as deep as the largest capacity), on small
#: streams: the geometric mean over a drifting and a working-set stream of ~1 M and ~0.5 M accesses, printed by
#: ``python benchmarks/curves_and_sweeps.py --quick --cost-table`` (2026-12-03, after the lfru per-layer loop
#: became 0.8 of its time; event-atomic ``lfru`` again after its float32 pass, event-atomic ``lru``, ``lfu`` and
#: ``lrfu`` again after their replays got faster (session 18, ``--policy lru --policy lfu --policy lrfu``), each
#: the median of three runs; the sequential rows of ``lfu``, ``lfru`` and ``lrfu`` again, one run, after session 34
#: gave them loops of their own: ``--quick --cost-table --policy lfu --policy lfru --policy lrfu``, where a pass had
#: cost 0.9 / 4.5 / 10.4 of their old replays at 0.4; sequential ``lfru`` again, one run, after session 35 held its
#: slots in registers: ``--quick --cost-table --policy lfru``; sequential ``lru`` again, one run, after session 36
#: gave it a loop of its own, 0.48-0.62 of its replay's time: ``--quick --cost-table --policy lru``, where it read
#: 1.2 / 5.2 / 8.1); sequential ``lfu`` again, one run, after session 37 took the branch on each access's outcome out
#: of its loop: ``--quick --cost-table --policy lfu``, where it read 3.7 / 3.6 / 3.4); ``lfru`` and ``lrfu`` again,
#: one run, after session 38 made their sequential replays faster: ``--quick --cost-table --policy lfru --policy
#: lrfu``, where the sequential rows read 19.5 / 51.4 / 65.5 and 12.8 / 39.1 / 51.2, the event-atomic ones (kernels
#: unchanged, 7-11% above) 13.8 / 27.7 / 43.0 and 11.9 / 21.4 / 29.5); the sequential rows of ``lru``, ``lfru`` and
#: ``lrfu`` again, one run, after session 39 made their replays faster (``lru`` one event at a time, ``lfru`` at 64
#: slots, ``lrfu``'s margin once a range): ``--quick --cost-table --policy lru --policy lfru --policy lrfu``, where they
#: read 2.0 / 8.6 / 12.8, 21.3 / 55.8 / 72.3 and 15.9 / 47.0 / 60.7 (the event-atomic ones, kernels unchanged, within
#: 6%); sequential ``lru`` again, one run, after session 40 replayed it on ranks (0.2-0.65 of its replay's time):
#: ``--quick --cost-table --policy lru``, where it read 2.3 / 10.0 / 14.3; sequential ``belady`` again, one run, after
#: session 41 replayed it on slots (0.19-0.39 of its replay's time): ``--quick --cost-table --policy belady``, where it
#: read 10.6 / 21.3 / 25.8 (the event-atomic row, kernel unchanged, 10.7 / 19.1 / 26.0); sequential ``lfu`` again,
#: one run, after session 44 replayed it on a bound below each layer's smallest key (0.39-0.48 of its replay's time):
#: ``--quick --cost-table --policy lfu``, where it read 5.1 / 4.9 / 4.6 (the event-atomic row, kernel unchanged,
#: 10.3 / 10.2 / 9.3); sequential ``lrfu`` again, one run, after session 63 replayed it on ranks (0.44-0.57 of its
#: replay's time at rho 0.1-0.4): ``--quick --cost-table --policy lrfu``, where it read 16.8 / 49.1 / 64.3 (a second
#: run 27.7 / 81.1 / 104.0; the event-atomic row, kernel unchanged, 12.3 / 22.0 / 30.9); sequential ``lrfu`` again
#: after session 64 made those replays faster (0.67-0.95 of their time): two runs of ``--quick --cost-table --policy
#: lrfu``, 32.4 / 95.1 / 125.0 and 32.6 / 111.1 / 124.9, the larger at each rho kept, where it read 29.3 / 86.4 /
#: 113.5 (the event-atomic row, kernel unchanged, 12.6 / 22.5 / 31.4 and 12.8 / 22.6 / 31.7); sequential ``lfru``
#: again after session 65 made its replays faster (0.84-0.96 of their time): two runs of ``--quick --cost-table
#: --policy lfru``, 28.9 / 75.5 / 105.4 and 28.9 / 81.3 / 101.0, the larger at each rho kept, where it read 24.2 /
#: 63.9 / 82.4 (the event-atomic row, kernel unchanged, 14.5 / 29.4 / 48.7 and 14.7 / 29.2 / 45.5); re-measure when a
#: kernel changes.
#: :data:`CURVE_COST_LARGE` holds the same on the 10 M-access benchmark stream, and :func:`curve_cost` interpolates
#: between the two by the stream's length:
#: the ratios move with it (event-atomic ``lfu``, whose rank pass moves a block past every block sharing its
#: count, costs ~8 replays on the small streams and ~4 on the large one).
CURVE_COST: dict[tuple[str, bool], tuple[float, float, float]] = {
    ("lru", True): (3.2, 5.2, 7.2), ("lru", False): (3.4, 14.3, 21.2),
    ("lfu", True): (9.9, 9.8, 8.6), ("lfu", False): (7.8, 7.6, 7.2),
    ("lfru", True): (15.3, 30.1, 46.2), ("lfru", False): (28.9, 81.3, 105.4),
    ("lrfu", True): (12.9, 23.1, 32.0), ("lrfu", False): (32.6, 111.1, 125.0),
    ("belady", True): (10.7, 19.1, 26.5), ("belady", False): (23.7, 53.2, 63.5),
}
#: :data:`CURVE_COST` on the 10 M-access drifting stream (``python benchmarks/curves_and_sweeps.py
#: --cost-table``, its ``drifting`` rows; 2026-12-03; event-atomic ``lfru`` again after its float32 pass, by
#: ``--cost-table --policy lfru``, event-atomic ``lru``, ``lfu`` and ``lrfu`` after their replays got faster, by
#: ``--cost-table --policy lru --policy lfu --policy lrfu``; the sequential rows of ``lfu``, ``lfru`` and ``lrfu``
#: again in session 34, ``--cost-table --policy lfu --policy lfru --policy lrfu``; sequential ``lfru`` again in
#: session 35, ``--cost-table --policy lfru``; sequential ``lru`` again in session 36, ``--cost-table --policy lru``,
#: where it read 0.9 / 4.4 / 7.6; sequential ``lfu`` again in session 37, ``--cost-table --policy lfu``, where it read
#: 1.8 / 1.9 / 1.5; ``lfru`` and ``lrfu`` again in session 38, ``--cost-table --policy lfru --policy lrfu``, where the
#: sequential rows read 19.0 / 53.0 / 69.8 and 13.7 / 42.4 / 57.5, the event-atomic ones (kernels unchanged, 16-23%
#: above) 16.9 / 34.8 / 52.7 and 15.2 / 28.0 / 40.0); the sequential rows of ``lru``, ``lfru`` and ``lrfu`` again in
#: session 39, ``--cost-table --policy lru --policy lfru --policy lrfu``, where they read 1.9 / 8.5 / 13.6, 20.8 /
#: 57.9 / 76.9 and 16.4 / 51.8 / 69.1 (the event-atomic ones, kernels unchanged, within 11%); sequential ``lru`` again
#: in session 40 (its replay on ranks), ``--cost-table --policy lru``, where it read 2.2 / 9.8 / 15.7; sequential
#: ``belady`` again in session 41 (its replay on slots), ``--cost-table --policy belady``, where it read 8.6 / 19.8 /
#: 24.4 (the event-atomic row, kernel unchanged, 11.8 / 20.9 / 29.0, 12-18% below the table's); sequential ``lfu``
#: again in session 44 (its replay on a bound below each layer's smallest key), ``--cost-table --policy lfu``, where
#: it read 3.4 / 3.6 / 2.7 (the event-atomic row, kernel unchanged, 5.7 / 5.7 / 4.4, 14-26% above the table's);
#: sequential ``lrfu`` again in session 63 (its replay on ranks), ``--cost-table --policy lrfu``, where it read 17.4 /
#: 53.6 / 75.4 (the event-atomic row, kernel unchanged, 17.6 / 32.0 / 46.2); sequential ``lrfu`` again in session 64
#: (its replays faster), ``--cost-table --policy lrfu``, its drifting row, where it read 35.4 / 109.8 / 148.5;
#: sequential ``lfru`` again in session 65 (its replays faster), ``--cost-table --policy lfru``, its drifting row,
#: where it read 25.2 / 67.8 / 96.2 (the event-atomic drifting row, kernel unchanged, 21.9 / 43.0 / 70.2).
CURVE_COST_LARGE: dict[tuple[str, bool], tuple[float, float, float]] = {
    ("lru", True): (3.7, 6.0, 8.9), ("lru", False): (3.6, 16.4, 26.0),
    ("lfu", True): (4.7, 5.0, 3.5), ("lfu", False): (7.6, 8.0, 6.1),
    ("lfru", True): (20.8, 41.3, 64.4), ("lfru", False): (28.1, 78.8, 111.4),
    ("lrfu", True): (17.7, 32.1, 46.5), ("lrfu", False): (39.1, 121.1, 168.7),
    ("belady", True): (13.9, 25.6, 33.6), ("belady", False): (20.3, 49.3, 56.7),
}
#: Union accesses the two tables stand for: the geometric mean of the small streams' (1,003,220 and 484,407)
#: and the large stream's.
CURVE_COST_ACCESSES = (697_000.0, 10_035_555.0)
_COST_RHO = (0.1, 0.4, 0.95)


def curve_cost(config: ReplayConfig, top_rho: float, accesses: float | None = None) -> float | None:
    """Estimated time of one curve pass with largest rho ``top_rho`` over that of one replay (``None``: not measured).

    :data:`CURVE_COST` (small streams) and :data:`CURVE_COST_LARGE` (10 M accesses), each interpolated at
    ``top_rho``, then geometrically between the two by ``log(accesses)`` (clamped to the two streams' lengths;
    ``None``: the small streams').

    >>> round(curve_cost(ReplayConfig("lfu"), 0.4), 1), round(curve_cost(ReplayConfig("lfu"), 0.4, 1e8), 1)
    (9.8, 5.0)
    """
    loop = get_policy(config.policy).loop                  # the table is per kernel: least-stale runs lru's
    key = ("lru" if loop == "list" else config.policy, config.semantics == "event-atomic")
    small = CURVE_COST.get(key)
    if small is None:
        return None
    a = float(np.interp(top_rho, _COST_RHO, small))
    large = CURVE_COST_LARGE.get(key)
    if accesses is None or large is None:
        return a
    b = float(np.interp(top_rho, _COST_RHO, large))
    lo, hi = np.log(CURVE_COST_ACCESSES[0]), np.log(CURVE_COST_ACCESSES[1])
    x = (np.log(max(float(accesses), 1.0)) - lo) / (hi - lo)
    if x <= 0.0 or x >= 1.0:
        return a if x <= 0.0 else b
    return float(np.exp(np.log(a) + x * (np.log(b) - np.log(a))))


def curve_pays(config: ReplayConfig, rhos: Sequence[float], accesses: float | None = None) -> bool:
    """Whether one curve pass is estimated cheaper than one replay per distinct rho in ``rhos``.

    The estimate is :func:`curve_cost` at the largest rho for a stream of ``accesses`` union accesses
    (``None``: as the small streams), which must come to at most :data:`CURVE_MARGIN` of the ``n`` replays;
    a policy not measured takes separate replays. Only the time changes with the choice, never a count.

    >>> curve_pays(ReplayConfig("lru"), [i / 10 for i in range(1, 11)]), curve_pays(ReplayConfig("lru"), [0.1, 0.2])
    (True, False)
    """
    n = len(set(rhos))
    cost = curve_cost(config, max(rhos), accesses) if n >= 2 else None
    return cost is not None and cost < CURVE_MARGIN * n


#: The pass is taken where its estimated cost is below this share of one replay (at rho 0.4) per point: most
#: points of a curve lie below 0.4, where a replay is cheaper (event-atomic ``lru`` at rho 0.1-0.3: 0.65-0.76
#: of its time at 0.4), so the table's unit overstates the separate replays. Measured on the 1 M, 0.5 M and
#: 10 M streams, 5, 6 and 8 points (rho 0.1 up), ``lru`` and ``lfu``: 0.9 took the pass where it was 1.07x and
#: 1.12x the separate replays; 0.75 took it only where it was faster (docs/performance.md, *Per-layer lfru
#: within 2x*).
CURVE_MARGIN = 0.75


def replay_curve(stream: EventStream, config: ReplayConfig, rhos: Sequence[float],
                 calibration: EventStream | None = None, advice=None,
                 one_pass: bool | None = None) -> tuple[ReplayResult, ...]:
    """Replay ``stream`` at every residency fraction in ``rhos`` (a miss-ratio curve).

    For stack policies under per-layer scope (:func:`one_pass_supported`) one
    pass records each access's depth in the policy's priority stack (Mattson
    et al., 1970): an access at depth ``d`` hits every capacity ``c > d``, so
    all capacities follow from one histogram. That pass is taken where it is
    estimated cheaper than one replay per rho (:func:`curve_pays`). Results are
    identical to separate :func:`replay` calls either way (tests check this).

    Parameters
    ----------
    one_pass
        ``None``: the pass where :func:`curve_pays`; ``True``: the pass wherever it is supported;
        ``False``: separate replays.

    Returns
    -------
    tuple of ReplayResult
        One per ``rho``, in the given order (``config.rho`` is ignored).
    """
    configs = [ReplayConfig(**{**_fields(config), "rho": float(r), "capacity": None}) for r in rhos]
    if not configs:
        return ()
    if one_pass is None:
        one_pass = curve_pays(config, [c.rho for c in configs], stream.union)
    if not one_pass_supported(config) or not one_pass or len(configs) == 1:
        with reuse_belady_inputs():
            return tuple(replay(stream, c, calibration, advice) for c in configs)
    policy = get_policy(config.policy)
    L, N = stream.n_layers, stream.n_experts
    caps = np.stack([capacities_for_rho(c.rho, L, N) for c in configs])       # (n_rho, L)
    depth_cap = int(min(caps.max(), N))
    hist = np.zeros((L, depth_cap + 1), dtype=np.int64)
    tie = _tie_ranks(config.tie_break, int(config.seed), L * N)
    args = _kernel_inputs(stream, config, policy.needs_next_use)
    if policy.loop == "list":
        order, tie_pos = _tie_order(tie, L, N)
        offsets, expert, layer, _, _, _, global_scope, atomic, _ = args
        K.stack_depths_lru(offsets, expert, layer, N, L, global_scope, atomic, depth_cap, order, tie_pos, hist)
    elif policy.key_code == KEY_LFU:      # persistent counters (one_pass_supported): ranks among the seen blocks
        from ._kernels_lfu import lfu_stack_depths

        offsets, expert, layer, _, _, _, _, atomic, _ = args
        lfu_stack_depths(offsets, expert, layer, N, L, atomic, depth_cap, tie, hist)
    else:
        K.stack_depths(*args, depth_cap, tie, policy.key_code, _lam(config, policy), hist)
    return _curve_results(stream, configs, caps, hist)


def _curve_results(stream: EventStream, configs: list[ReplayConfig], caps: np.ndarray,
                   hist: np.ndarray) -> tuple[ReplayResult, ...]:
    """One result per config from a stack-depth histogram ``hist[l, d]`` (the last column: deeper or first use).

    Hits at capacity ``c`` are the accesses at depth ``< c``; ``caps[i]`` are ``configs[i]``'s per-layer quotas.
    """
    L = stream.n_layers
    depth_cap = hist.shape[1] - 1
    cum = np.concatenate([np.zeros((L, 1), dtype=np.int64), np.cumsum(hist[:, :depth_cap], axis=1)], axis=1)
    layer_union, layer_logical = _layer_totals(stream)
    out = []
    for cfg, cap in zip(configs, caps, strict=True):
        hits_l = cum[np.arange(L), np.minimum(cap, depth_cap)]
        out.append(_result(stream, cfg, cap, hits_l, layer_union - hits_l, np.zeros(L, dtype=np.int64),
                           layer_union, layer_logical))
    return tuple(out)


def _fields(config: ReplayConfig) -> dict:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}
