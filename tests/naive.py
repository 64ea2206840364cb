"""Naive twin of ``expertcache.replay``, written from ``docs/semantics.md`` alone.

Deliberately simple and slow: Python sets, dicts and ``sorted()`` with tuple
keys.  No numba, no incremental data structures, no clever passes.  The only
thing taken from ``expertcache`` is the public read-only arrays of an
``EventStream`` (``n_layers``, ``n_experts``, ``top_k``, ``n_events``,
``step``, ``layer``, ``active``, ``offsets``, ``expert``).

Use :func:`naive_replay`; it returns a plain dict of counts.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

POLICIES = (
    "demand",
    "lru",
    "least-stale",
    "lfu",
    "lfru",
    "lrfu",
    "belady",
    "belady-forced",
    "static",
    "static-same-trace",
)
SEMANTICS = ("event-atomic", "sequential-ascending", "sequential-random")
SCOPES = ("per-layer", "global")
TIE_BREAKS = ("id", "random")

NEVER = math.inf


# ---------------------------------------------------------------------------
# reading the stream
# ---------------------------------------------------------------------------


#: The last streams' events, units and tie ranks, by the streams' contents (the twin tests replay each stream some
#: hundred times; read, never changed, by their callers). Cleared past :data:`_MEMO_SIZE` entries.
_MEMO: dict = {}
_MEMO_SIZE = 256


def _memo(key, make):
    """``make()``, or what it gave for ``key`` before."""
    if key not in _MEMO:
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.clear()
        _MEMO[key] = make()
    return _MEMO[key]


def _contents(stream) -> tuple:
    """A key of the stream's contents (two streams with it replay alike)."""
    return (int(stream.n_layers), int(stream.n_experts), *((a.dtype.str, np.ascontiguousarray(a).tobytes()) for a in (
        stream.offsets, stream.expert, stream.step, stream.layer)))


def events_of(stream):
    """List of ``(step, layer, members)`` with members in stored order."""
    return _memo(("events", _contents(stream)), lambda: _events_of(stream))


def _events_of(stream):
    out = []
    for i in range(int(stream.n_events)):
        lo = int(stream.offsets[i])
        hi = int(stream.offsets[i + 1])
        members = [int(e) for e in stream.expert[lo:hi]]
        out.append((int(stream.step[i]), int(stream.layer[i]), members))
    return out


def units_of(stream, semantics, seed):
    """The replay units: list of ``(step, layer, [global block ids])``."""
    return _memo(("units", semantics, seed, _contents(stream)), lambda: _units_of(stream, semantics, seed))


def _units_of(stream, semantics, seed):
    n = int(stream.n_experts)
    units = []
    if semantics == "event-atomic":
        for step, layer, members in events_of(stream):
            units.append((step, layer, [layer * n + e for e in members]))
    elif semantics == "sequential-ascending":
        for step, layer, members in events_of(stream):
            for e in sorted(members):
                units.append((step, layer, [layer * n + e]))
    elif semantics == "sequential-random":
        rng = np.random.default_rng([seed, 1])
        for step, layer, members in events_of(stream):
            order = rng.permutation(len(members))
            for j in order:
                units.append((step, layer, [layer * n + members[int(j)]]))
    else:
        raise ValueError(f"unknown semantics {semantics!r}")
    return units


def union_counts(stream):
    """Union accesses per global block id: number of events containing it."""
    n = int(stream.n_experts)
    counts = Counter()
    for _step, layer, members in events_of(stream):
        for e in members:
            counts[layer * n + e] += 1
    return counts


# ---------------------------------------------------------------------------
# configuration pieces
# ---------------------------------------------------------------------------


def capacities(n_layers, n_experts, scope, rho=None, capacity=None):
    """Capacity of each partition (L entries per-layer, one entry global)."""
    if capacity is None:
        total = math.floor(rho * n_layers * n_experts + 0.5)
        if scope == "per-layer":
            return [
                total // n_layers + (1 if li < total % n_layers else 0) for li in range(n_layers)
            ]
        return [total]
    if scope == "per-layer":
        caps = [int(c) for c in capacity]
        assert len(caps) == n_layers
        return caps
    return [int(capacity)]


def tie_ranks(n_layers, n_experts, tie_break, seed):
    """Dict block -> distinct tie rank (larger is retained among equal keys)."""
    key = ("tie", n_layers, n_experts, tie_break, seed)
    return _memo(key, lambda: _tie_ranks(n_layers, n_experts, tie_break, seed))


def _tie_ranks(n_layers, n_experts, tie_break, seed):
    size = n_layers * n_experts
    if tie_break == "id":
        return {b: size - b for b in range(size)}
    if tie_break == "random":
        perm = np.random.default_rng(seed).permutation(size)
        return {b: int(perm[b]) for b in range(size)}
    raise ValueError(f"unknown tie_break {tie_break!r}")


def partition_blocks(n_layers, n_experts, scope):
    """Blocks of each partition."""
    if scope == "per-layer":
        return [[li * n_experts + e for e in range(n_experts)] for li in range(n_layers)]
    return [list(range(n_layers * n_experts))]


# ---------------------------------------------------------------------------
# the replay
# ---------------------------------------------------------------------------


def naive_replay(
    stream,
    policy,
    *,
    rho=0.4,
    scope="per-layer",
    semantics="event-atomic",
    tie_break="random",
    seed=0,
    capacity=None,
    lfu_in_cache_counters=False,
    lrfu_lambda=0.5,
    calibration=None,
    warmup_events=0,
    hit_sets=None,
):
    L = int(stream.n_layers)
    N = int(stream.n_experts)
    k = int(stream.top_k)
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")

    caps = capacities(L, N, scope, rho=rho, capacity=capacity)
    if policy == "demand":
        caps = [0 for _ in caps]
    tie = tie_ranks(L, N, tie_break, seed)
    units = units_of(stream, semantics, seed)
    # the event each unit belongs to (units of warm-up events are replayed, not counted)
    unit_event = [i for i, (_s, _l, m) in enumerate(events_of(stream))
                  for _ in range(1 if semantics == "event-atomic" else len(m))]

    def part(block):
        return block // N if scope == "per-layer" else 0

    n_parts = len(caps)
    caches = [set() for _ in range(n_parts)]

    # ---- static: pinned sets, loaded before the first unit -----------------
    pinned_count = [0] * L  # initial load per layer
    if policy in ("static", "static-same-trace"):
        if policy == "static":
            if calibration is None:
                raise ValueError("static needs a calibration stream")
            counts = union_counts(calibration)
        else:
            counts = union_counts(stream)
        for p, blocks in enumerate(partition_blocks(L, N, scope)):
            ranked = sorted(blocks, key=lambda b: (counts[b], tie[b]), reverse=True)
            chosen = ranked[: caps[p]]
            caches[p] = set(chosen)
            for b in chosen:
                pinned_count[b // N] += 1

    # ---- naive next use: block -> sorted list of unit indices ---------------
    uses = {}
    for t, (_step, _layer, blocks) in enumerate(units):
        for b in blocks:
            uses.setdefault(b, []).append(t)

    def next_use_after(block, t):
        for u in uses[block]:
            if u > t:
                return u
        return NEVER

    # offset of a unit inside its scheduler step (least-stale)
    first_unit_of_step = {}
    for t, (step, _layer, _blocks) in enumerate(units):
        first_unit_of_step.setdefault(step, t)

    # LRFU (Lee et al.): every access at layer clock tau contributes 2**(-lambda * (now - tau)); the
    # layer clock counts the units of that layer so far. Candidates are compared at a common "now",
    # so the ranking is that of sum_i 2**(lambda * tau_i) (computed here from the full history).
    layer_clock = {}
    history = {}

    def lrfu_key(b):
        taus = history[b]
        top = max(taus)
        return lrfu_lambda * top + math.log2(sum(2.0 ** (lrfu_lambda * (x - top)) for x in taus))

    last = {}
    freq = {}
    nxt = {}
    cycle = {}
    offset = {}

    hits = [0] * L
    misses = [0] * L

    for t, (step, layer, blocks) in enumerate(units):
        p = part(blocks[0])
        C = caches[p]
        U = set(blocks)
        hit_set = U & C
        miss_set = U - C
        if hit_sets is not None:  # the caller wants each unit's hit blocks (per-access hit flags)
            hit_sets.append(hit_set)
        if unit_event[t] >= warmup_events:
            hits[layer] += len(hit_set)
            misses[layer] += len(miss_set)

        if policy in ("static", "static-same-trace"):
            continue  # never changed; misses bypass

        # step 2: policy state of every member
        clock_now = layer_clock.get(layer, 0)
        layer_clock[layer] = clock_now + 1
        for b in U:
            history.setdefault(b, []).append(clock_now)
            last[b] = t
            freq[b] = freq.get(b, 0) + 1
            nxt[b] = next_use_after(b, t)
            cycle[b] = step
            offset[b] = t - first_unit_of_step[step]

        # step 3: retention
        K = C | U
        c = caps[p]
        if len(K) <= c:
            caches[p] = K
            continue

        def key(b, t=t, miss_set=miss_set):
            if policy == "lru":
                return last[b]
            if policy == "least-stale":
                return (cycle[b], offset[b])
            if policy == "lfu":
                return freq[b]
            if policy == "lfru":
                age = t - last[b] + 1
                return float(freq[b]) / float(age)
            if policy == "lrfu":
                return lrfu_key(b)
            if policy == "belady":
                return -nxt[b]
            if policy == "belady-forced":
                return (1 if b in miss_set else 0, -nxt[b])
            if policy == "demand":
                return 0  # capacity 0: nothing is retained anyway
            raise AssertionError(policy)

        ranked = sorted(K, key=lambda b: (key(b), tie[b]), reverse=True)
        keep = set(ranked[:c])
        caches[p] = keep
        if policy == "lfu" and lfu_in_cache_counters:
            for b in K - keep:
                freq[b] = 0

    initial_load = sum(pinned_count)
    total_hits = sum(hits)
    total_misses = sum(misses)
    logical = sum(int(a) * k for a in list(stream.active)[warmup_events:])
    union = sum(len(m) for _s, _l, m in events_of(stream)[warmup_events:])
    return {
        "hits": total_hits,
        "demand_misses": total_misses,
        "initial_load": initial_load,
        "transferred": total_misses + initial_load,
        "logical": logical,
        "union": union,
        "per_layer_hits": hits,
        "per_layer_demand_misses": misses,
        "per_layer_initial_load": pinned_count,
        "per_layer_capacity": list(caps) if scope == "per-layer" else None,
    }
