"""The numba replay engine against its naive twin (``tests/naive.py``).

* Twin comparisons: on many seeded random streams, every policy x semantics x
  scope x tie-break (several seeds) x capacity (rho and explicit, 0 up to more
  than the universe) must give the same counts, totals and per layer.
* Properties of the engine on random streams (Belady optimality, least-stale
  == lru, demand, static-same-trace identity, conservation).
* Hand-computed golden streams (2-9 events), derivations in the comments.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from fractions import Fraction

import naive
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, replay

# (policy, lfu_in_cache_counters).  The option is documented for lfu only; lfru
# with the option set must behave exactly like lfru without it.
VARIANTS = [(p, False) for p in naive.POLICIES] + [("lfu", True), ("lfru", True)]
TIE_SEEDS = [("id", 0), ("id", 7), ("random", 0), ("random", 1), ("random", 12345)]


# Scale every example budget, e.g. TWIN_EXAMPLES_SCALE=20 for a long soak run.
SCALE = float(os.environ.get("TWIN_EXAMPLES_SCALE", "1"))


def hyp(n):
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def make_stream(L, N, k, rows):
    """rows: list of (step, layer, experts, active), already ordered by (step, layer)."""
    return EventStream.from_lists(
        n_layers=L,
        n_experts=N,
        top_k=k,
        steps=[r[0] for r in rows],
        layers=[r[1] for r in rows],
        experts=[list(r[2]) for r in rows],
        active=[r[3] for r in rows],
    )


def engine(stream, policy, *, calibration=None, **kw):
    kw.setdefault("rho", 0.4)
    cfg = ReplayConfig(policy=policy, **kw)
    res = replay(stream, cfg, calibration=calibration)
    by_layer = sorted(res.per_layer, key=lambda r: r.layer)
    assert [r.layer for r in by_layer] == list(range(stream.n_layers))
    return {
        "hits": int(res.hits),
        "demand_misses": int(res.demand_misses),
        "initial_load": int(res.initial_load),
        "transferred": int(res.transferred),
        "logical": int(res.logical),
        "union": int(res.union),
        "per_layer_hits": [int(r.hits) for r in by_layer],
        "per_layer_demand_misses": [int(r.demand_misses) for r in by_layer],
        "per_layer_initial_load": [int(r.initial_load) for r in by_layer],
        "per_layer_capacity": (
            [int(r.capacity) for r in by_layer]
            if kw.get("scope", "per-layer") == "per-layer"
            else None
        ),
    }


def twin(stream, policy, *, calibration=None, **kw):
    kw.setdefault("rho", 0.4)
    return naive.naive_replay(stream, policy, calibration=calibration, **kw)


def describe(stream):
    rows = naive.events_of(stream)
    return (
        f"L={stream.n_layers} N={stream.n_experts} k={stream.top_k} "
        f"active={[int(a) for a in stream.active]} events={rows}"
    )


# ---------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------


@st.composite
def stream_rows(draw, L, N, k, max_steps=9):
    # (step, layer) positions: a random subset (about 70%) of a steps x layers grid,
    # so steps have gaps and layers go missing; ordered by (step, layer)
    n_steps = draw(st.integers(1, max_steps))
    keys = [
        (step, layer)
        for step in range(n_steps)
        for layer in range(L)
        if draw(st.integers(0, 9)) < 7
    ]
    if not keys:
        keys = [(n_steps - 1, L - 1)]
    # a small popular subset per layer keeps streams skewed (reuse, ties, evictions)
    popular = [
        draw(st.lists(st.integers(0, N - 1), min_size=1, max_size=min(2, N), unique=True))
        for _ in range(L)
    ]
    rows = []
    for step, layer in keys:
        active = draw(st.integers(1, 4))
        elem = st.one_of(
            st.sampled_from(popular[layer]),
            st.sampled_from(popular[layer]),
            st.integers(0, N - 1),
        )
        experts = draw(st.lists(elem, min_size=1, max_size=min(N, active * k), unique=True))
        rows.append((step, layer, experts, active))
    return rows


@st.composite
def streams(draw, with_calibration=False):
    L = draw(st.integers(1, 3))
    N = draw(st.integers(1, 6))
    k = draw(st.integers(1, N))
    stream = make_stream(L, N, k, draw(stream_rows(L, N, k)))
    if not with_calibration:
        return stream
    cal = make_stream(L, N, k, draw(stream_rows(L, N, k, max_steps=4)))
    return stream, cal


@st.composite
def capacity_kw(draw, L, N, scope):
    """Either a rho (float in [0,1], often on a .5 rounding boundary) or an
    explicit capacity from 0 to more than the universe."""
    kind = draw(st.sampled_from(["rho", "rho-grid", "explicit"]))
    if kind == "rho":
        return {"rho": draw(st.floats(0.0, 1.0, allow_nan=False))}
    if kind == "rho-grid":
        i = draw(st.integers(0, 2 * L * N))
        return {"rho": i / (2 * L * N)}
    if scope == "per-layer":
        return {"capacity": tuple(draw(st.lists(st.integers(0, N + 2), min_size=L, max_size=L)))}
    return {"capacity": draw(st.integers(0, L * N + 2))}


# ---------------------------------------------------------------------------
# twin comparisons
# ---------------------------------------------------------------------------


def _compare_all(data, stream, cal, semantics_list):
    L, N = stream.n_layers, stream.n_experts
    for scope in naive.SCOPES:
        caps = [data.draw(capacity_kw(L, N, scope)) for _ in range(2)]
        for cap in caps:
            for semantics in semantics_list:
                for tie_break, seed in TIE_SEEDS:
                    for policy, in_cache in VARIANTS:
                        kw = dict(
                            scope=scope,
                            semantics=semantics,
                            tie_break=tie_break,
                            seed=seed,
                            lfu_in_cache_counters=in_cache,
                            **cap,
                        )
                        cal_arg = cal if policy == "static" else None
                        want = twin(stream, policy, calibration=cal_arg, **kw)
                        got = engine(stream, policy, calibration=cal_arg, **kw)
                        assert got == want, (
                            f"policy={policy} {kw}\nstream: {describe(stream)}\n"
                            f"calibration: {describe(cal) if cal_arg is not None else None}\n"
                            f"engine={got}\ntwin  ={want}"
                        )


@hyp(200)
@given(st.data(), streams(with_calibration=True))
def test_twin_event_atomic(data, pair):
    stream, cal = pair
    _compare_all(data, stream, cal, ["event-atomic"])


@hyp(200)
@given(st.data(), streams(with_calibration=True))
def test_twin_sequential(data, pair):
    stream, cal = pair
    _compare_all(data, stream, cal, ["sequential-ascending", "sequential-random"])


@hyp(150)
@given(st.data(), streams(with_calibration=True))
def test_twin_warmup_events(data, pair):
    """Warm-up events fill the cache but are not counted: engine == twin for every policy and semantics."""
    stream, cal = pair
    warm = data.draw(st.integers(0, stream.n_events))
    scope = data.draw(st.sampled_from(naive.SCOPES))
    cap = data.draw(capacity_kw(stream.n_layers, stream.n_experts, scope))
    semantics = data.draw(st.sampled_from(naive.SEMANTICS))
    tie_break, seed = data.draw(st.sampled_from(TIE_SEEDS))
    for policy, in_cache in VARIANTS:
        kw = dict(scope=scope, semantics=semantics, tie_break=tie_break, seed=seed,
                  lfu_in_cache_counters=in_cache, warmup_events=warm, **cap)
        cal_arg = cal if policy == "static" else None
        want = twin(stream, policy, calibration=cal_arg, **kw)
        got = engine(stream, policy, calibration=cal_arg, **kw)
        assert got == want, f"policy={policy} {kw}\nstream: {describe(stream)}\nengine={got}\ntwin  ={want}"


def test_warmup_causal_equals_full_minus_prefix():
    """For a causal policy the counted window equals full-stream counts minus the prefix's (a second, independent relation)."""

    rng = np.random.default_rng(5)
    rows = [(s, l, sorted(rng.choice(8, size=3, replace=False).tolist())) for s in range(30) for l in range(2)]
    def mk(rs):
        return EventStream.from_lists(2, 8, 2, steps=[r[0] for r in rs], layers=[r[1] for r in rs],
                                      experts=[r[2] for r in rs], active=[2] * len(rs))
    full, prefix = mk(rows), mk(rows[:24])
    for policy in ("lru", "lfu", "lfru", "least-stale"):
        cfg = ReplayConfig(policy, capacity=(3, 3), tie_break="id")
        a, b = replay(full, cfg), replay(prefix, cfg)
        w = replay(full, ReplayConfig(policy, capacity=(3, 3), tie_break="id", warmup_events=24))
        assert (w.hits, w.demand_misses) == (a.hits - b.hits, a.demand_misses - b.demand_misses)
        assert w.union == full.union - prefix.union and w.n_events == full.n_events - 24


@hyp(80)
@given(st.data(), streams())
def test_per_layer_totals_count_each_event_after_warmup(data, stream):
    """Each layer's union and logical accesses, counted event by event from ``naive.events_of`` (union: members;
    logical: ``active * k``) over the events after the warm-up, equal the record's, in every scope."""
    warm = data.draw(st.integers(0, stream.n_events + 2))
    scope = data.draw(st.sampled_from(naive.SCOPES))
    union = [0] * stream.n_layers
    logical = [0] * stream.n_layers
    for i, (_s, layer, members) in enumerate(naive.events_of(stream)):
        if i >= warm:
            union[layer] += len(members)
            logical[layer] += int(stream.active[i]) * stream.top_k
    res = replay(stream, ReplayConfig("lru", rho=0.5, scope=scope, warmup_events=min(warm, stream.n_events)))
    by_layer = sorted(res.per_layer, key=lambda r: r.layer)
    assert [r.union for r in by_layer] == union and [r.logical for r in by_layer] == logical
    assert res.union == sum(union) and res.logical == sum(logical)


# ---------------------------------------------------------------------------
# properties of the engine on random streams
# ---------------------------------------------------------------------------


def _modes(data, stream):
    L, N = stream.n_layers, stream.n_experts
    scope = data.draw(st.sampled_from(naive.SCOPES))
    semantics = data.draw(st.sampled_from(naive.SEMANTICS))
    tie_break, seed = data.draw(st.sampled_from(TIE_SEEDS))
    cap = data.draw(capacity_kw(L, N, scope))
    return dict(scope=scope, semantics=semantics, tie_break=tie_break, seed=seed, **cap)


@hyp(250)
@given(st.data(), streams(with_calibration=True))
def test_belady_is_optimal(data, pair):
    stream, cal = pair
    for _ in range(3):
        kw = _modes(data, stream)
        results = {}
        for policy, in_cache in VARIANTS:
            results[(policy, in_cache)] = engine(
                stream,
                policy,
                calibration=cal if policy == "static" else None,
                lfu_in_cache_counters=in_cache,
                **kw,
            )
        best = results[("belady", False)]["transferred"]
        for name, r in results.items():
            assert best <= r["transferred"], (name, kw, describe(stream))
        assert best <= results[("belady-forced", False)]["transferred"]


@hyp(250)
@given(st.data(), streams(with_calibration=True))
def test_conservation_and_identities(data, pair):
    stream, cal = pair
    logical = sum(int(a) for a in stream.active) * stream.top_k
    union = sum(len(m) for _s, _l, m in naive.events_of(stream))
    assert stream.logical == logical
    assert stream.union == union
    for _ in range(3):
        kw = _modes(data, stream)
        for policy, in_cache in VARIANTS:
            r = engine(
                stream,
                policy,
                calibration=cal if policy == "static" else None,
                lfu_in_cache_counters=in_cache,
                **kw,
            )
            assert r["hits"] + r["demand_misses"] == union, (policy, kw)
            assert r["transferred"] == r["demand_misses"] + r["initial_load"], (policy, kw)
            assert r["logical"] == logical and r["union"] == union
            assert sum(r["per_layer_hits"]) == r["hits"]
            assert sum(r["per_layer_demand_misses"]) == r["demand_misses"]
            assert sum(r["per_layer_initial_load"]) == r["initial_load"]
            if policy not in ("static", "static-same-trace"):
                assert r["initial_load"] == 0
        # least-stale equals lru exactly, with warm-up events too (the engine runs it on lru's kernels, so the
        # twin's own least-stale, compared in test_twin_*, is what shows it is least-stale)
        warm = data.draw(st.integers(0, stream.n_events))
        assert engine(stream, "least-stale", **kw) == engine(stream, "lru", **kw), kw
        assert engine(stream, "least-stale", warmup_events=warm, **kw) == engine(stream, "lru", warmup_events=warm,
                                                                                    **kw), (kw, warm)
        # demand: every union access transfers
        d = engine(stream, "demand", **kw)
        assert d["transferred"] == union and d["hits"] == 0


def _quotas(L, N, scope, kw):
    """Independent capacity computation (integers only where possible)."""
    if "capacity" in kw:
        c = kw["capacity"]
        return list(c) if scope == "per-layer" else [c]
    total = math.floor(kw["rho"] * L * N + 0.5)
    if scope == "global":
        return [total]
    base, extra = divmod(total, L)
    return [base + (1 if layer < extra else 0) for layer in range(L)]


@hyp(300)
@given(st.data(), streams())
def test_static_same_trace_identity(data, stream):
    L, N = stream.n_layers, stream.n_experts
    hist = Counter()
    for i in range(stream.n_events):
        layer = int(stream.layer[i])
        for e in stream.expert[int(stream.offsets[i]) : int(stream.offsets[i + 1])]:
            hist[(layer, int(e))] += 1
    union = sum(hist.values())
    kw = _modes(data, stream)
    quotas = _quotas(L, N, kw["scope"], kw)
    if kw["scope"] == "per-layer":
        covered = 0
        for layer in range(L):
            counts = sorted((hist[(layer, e)] for e in range(N)), reverse=True)
            covered += sum(counts[: quotas[layer]])
        pinned = sum(min(c, N) for c in quotas)
    else:
        counts = sorted((hist[(layer, e)] for layer in range(L) for e in range(N)), reverse=True)
        covered = sum(counts[: quotas[0]])
        pinned = min(quotas[0], L * N)
    r = engine(stream, "static-same-trace", **kw)
    assert Fraction(r["demand_misses"], union) == 1 - Fraction(covered, union), kw
    assert r["initial_load"] == pinned
    assert r["transferred"] == r["demand_misses"] + pinned


@hyp(150)
@given(st.data(), streams())
def test_unbounded_capacity_only_cold_misses(data, stream):
    L, N = stream.n_layers, stream.n_experts
    distinct = len({(layer, e) for _s, layer, m in naive.events_of(stream) for e in m})
    scope = data.draw(st.sampled_from(naive.SCOPES))
    semantics = data.draw(st.sampled_from(naive.SEMANTICS))
    extra = data.draw(st.integers(0, 3))
    cap = tuple([N + extra] * L) if scope == "per-layer" else L * N + extra
    for policy in ("lru", "least-stale", "lfu", "lfru", "belady", "belady-forced"):
        r = engine(stream, policy, scope=scope, semantics=semantics, capacity=cap)
        assert r["demand_misses"] == distinct, (policy, scope, semantics)


# ---------------------------------------------------------------------------
# golden streams (hand-derived)
# ---------------------------------------------------------------------------


def both(stream, policy, **kw):
    """Run engine and twin; they must agree; return the engine's counts."""
    kw.setdefault("tie_break", "id")
    got = engine(stream, policy, **kw)
    want = twin(stream, policy, **kw)
    assert got == want
    return got


def test_golden_lru_event_atomic_vs_sequential_repeat():
    # L=1, N=3, c=1, tie id (lower id kept).  Events {0,1}, {0,1}.
    # event-atomic: t0 misses 0,1; K={0,1} both last=0 -> keep 0 (id tie).
    #               t1 hit 0, miss 1.                    => hits 1, misses 3
    # sequential-ascending: units 0,1,0,1; each access evicts the other
    #               (last of the current access is newest)  => hits 0, misses 4
    s = make_stream(1, 3, 2, [(0, 0, [1, 0], 1), (1, 0, [0, 1], 1)])
    ea = both(s, "lru", capacity=(1,), semantics="event-atomic")
    sa = both(s, "lru", capacity=(1,), semantics="sequential-ascending")
    assert (ea["hits"], ea["demand_misses"]) == (1, 3)
    assert (sa["hits"], sa["demand_misses"]) == (0, 4)


def test_golden_lru_event_atomic_protects_hits():
    # L=1, N=3, c=2, tie id.  Events {0,1}, {1,2}, {0,1}.
    # event-atomic:
    #   t0 U={0,1}: 2 misses, C={0,1}
    #   t1 U={1,2}: hit 1, miss 2; K={0,1,2} last 0:0 1:1 2:1 -> evict 0, C={1,2}
    #   t2 U={0,1}: hit 1, miss 0                          => hits 2, misses 4
    # sequential-ascending: units 0,1 | 1,2 | 0,1
    #   t0 miss 0 C={0}; t1 miss 1 C={0,1}; t2 hit 1 (last 1:2)
    #   t3 miss 2: last 0:0 1:2 2:3 -> evict 0, C={1,2}
    #   t4 miss 0: last 1:2 2:3 0:4 -> evict 1, C={0,2}
    #   t5 miss 1                                           => hits 1, misses 5
    s = make_stream(1, 3, 2, [(0, 0, [0, 1], 1), (1, 0, [1, 2], 1), (2, 0, [0, 1], 1)])
    ea = both(s, "lru", capacity=(2,), semantics="event-atomic")
    sa = both(s, "lru", capacity=(2,), semantics="sequential-ascending")
    assert (ea["hits"], ea["demand_misses"], ea["transferred"]) == (2, 4, 4)
    assert (sa["hits"], sa["demand_misses"], sa["transferred"]) == (1, 5, 5)
    assert ea["logical"] == 6 and ea["union"] == 6


def test_golden_belady_bypass_vs_forced():
    # L=1, N=2, c=1.  Events {0}, {1}, {0}.
    # belady: t0 C={0}; t1 miss 1, next 0:2, 1:inf -> keep 0, bypass 1; t2 hit 0
    #         => hits 1, misses 2
    # belady-forced: t1 the miss 1 must be admitted -> evict 0; t2 miss 0
    #         => hits 0, misses 3
    s = make_stream(1, 2, 1, [(0, 0, [0], 1), (1, 0, [1], 1), (2, 0, [0], 1)])
    for semantics in naive.SEMANTICS:
        b = both(s, "belady", capacity=(1,), semantics=semantics)
        f = both(s, "belady-forced", capacity=(1,), semantics=semantics)
        assert (b["hits"], b["demand_misses"]) == (1, 2)
        assert (f["hits"], f["demand_misses"]) == (0, 3)
        # the same in the global pool of 1 block
        bg = both(s, "belady", capacity=1, scope="global", semantics=semantics)
        assert (bg["hits"], bg["demand_misses"]) == (1, 2)


def test_golden_belady_forced_admission_order():
    # L=1, N=4, k=3, c=2, event-atomic.  Events {0}, {1,2,3}, {0,3}, {2}.
    # belady-forced (key (is_miss, -next)):
    #   t0 miss 0, C={0}
    #   t1 misses 1,2,3; next 0:2 1:inf 2:3 3:2
    #      keys 1:(1,-inf) 2:(1,-3) 3:(1,-2) 0:(0,-2) -> C={3,2}   (0 evicted)
    #   t2 U={0,3}: hit 3, miss 0; next 0:inf 3:inf 2:3
    #      keys 0:(1,-inf) 2:(0,-3) 3:(0,-inf) -> C={0,2}
    #   t3 U={2}: hit                                      => hits 2, misses 5
    # belady (key -next):
    #   t1 keys 0:-2 1:-inf 2:-3 3:-2 -> C={0,3}  (1 and 2 bypassed)
    #   t2 two hits; t3 miss 2                             => hits 2, misses 5
    # lru: t1 K={0,1,2,3} last 0:0 others 1 -> keep 1,2 (id tie); t2 misses 0,3 ->
    #   K={0,1,2,3} last 0,3:2 -> C={0,3}; t3 miss 2       => hits 0, misses 7
    s = make_stream(
        1,
        4,
        3,
        [(0, 0, [0], 1), (1, 0, [3, 1, 2], 1), (2, 0, [0, 3], 1), (3, 0, [2], 1)],
    )
    f = both(s, "belady-forced", capacity=(2,), semantics="event-atomic")
    b = both(s, "belady", capacity=(2,), semantics="event-atomic")
    lru = both(s, "lru", capacity=(2,), semantics="event-atomic")
    assert (f["hits"], f["demand_misses"]) == (2, 5)
    assert (b["hits"], b["demand_misses"]) == (2, 5)
    assert (lru["hits"], lru["demand_misses"]) == (0, 7)


def test_golden_lfu_persistent_vs_in_cache_counters():
    # L=1, N=2, k=1, c=1, tie id (expert 0 wins ties).
    # Accesses (one per event): 1 1 1 0 0 0 0 1 0
    # persistent counters:
    #   t0 miss 1 (f1=1)  t1 hit (2)  t2 hit (3)
    #   t3 miss 0 f0=1 bypass; t4 miss 0 f0=2 bypass
    #   t5 miss 0 f0=3 = f1 -> tie, keep 0, evict 1;  t6 hit 0 (f0=4)
    #   t7 miss 1 f1=4 = f0 -> keep 0, bypass 1;       t8 hit 0
    #   => hits 4 (t1 t2 t6 t8), misses 5
    # in-cache counters (reset on eviction/bypass):
    #   t0 miss 1, t1 t2 hits (f1=3)
    #   t3..t6: miss 0 with f0=1 < 3, bypassed, f0 reset to 0 each time
    #   t7 hit 1; t8 miss 0 bypassed          => hits 3 (t1 t2 t7), misses 6
    seq = [1, 1, 1, 0, 0, 0, 0, 1, 0]
    s = make_stream(1, 2, 1, [(i, 0, [e], 1) for i, e in enumerate(seq)])
    p = both(s, "lfu", capacity=(1,))
    c = both(s, "lfu", capacity=(1,), lfu_in_cache_counters=True)
    assert (p["hits"], p["demand_misses"]) == (4, 5)
    assert (c["hits"], c["demand_misses"]) == (3, 6)


def test_golden_static_pinned_and_capacity_from_rho():
    # L=2, N=3, rho=0.5: total = floor(3 + 0.5) = 3 -> c = (2, 1).
    # Replayed stream: layer 0 accesses 0,0,1,2 ; layer 1 accesses 2,2,0.
    # static-same-trace, tie id: layer 0 pins {0 (2 uses), 1 (1 use, id tie over 2)},
    #   layer 1 pins {2}.  Hits: layer0 0,0,1 = 3 ; layer1 2,2 = 2.
    #   misses: layer0 {2} = 1, layer1 {0} = 1; initial load 3 => transferred 5.
    # static with calibration (layer 0 uses only 2, layer 1 only 0):
    #   layer 0 pins {2, 0} (2 has 1 use, then 0 by id), layer 1 pins {0}.
    #   hits: layer0 0,0,2 = 3, layer1 0 = 1; misses layer0 1 (expert 1), layer1 2
    rows = [
        (0, 0, [0], 1),
        (0, 1, [2], 1),
        (1, 0, [0, 1], 2),
        (1, 1, [2, 0], 2),
        (2, 0, [2], 1),
    ]
    s = make_stream(2, 3, 1, rows)
    cal = make_stream(2, 3, 1, [(0, 0, [2], 1), (0, 1, [0], 1)])
    st_ = both(s, "static-same-trace", rho=0.5)
    assert st_["per_layer_capacity"] == [2, 1]
    assert st_["per_layer_hits"] == [3, 2]
    assert st_["per_layer_demand_misses"] == [1, 1]
    assert st_["per_layer_initial_load"] == [2, 1]
    assert (st_["initial_load"], st_["transferred"]) == (3, 5)
    sc = both(s, "static", rho=0.5, calibration=cal)
    assert sc["per_layer_hits"] == [3, 1]
    assert sc["per_layer_demand_misses"] == [1, 2]
    assert sc["transferred"] == 3 + 3


def test_golden_demand_and_oversized_capacity():
    # demand transfers every union access; capacity above the universe keeps everything.
    s = make_stream(1, 2, 2, [(0, 0, [0, 1], 1), (1, 0, [1], 1), (2, 0, [0, 1], 1)])
    d = both(s, "demand")
    assert (d["hits"], d["demand_misses"], d["transferred"]) == (0, 5, 5)
    for policy in ("lru", "lfu", "lfru", "belady", "belady-forced", "least-stale"):
        r = both(s, policy, capacity=(10,))
        assert (r["hits"], r["demand_misses"]) == (3, 2)
        g = both(s, policy, capacity=10, scope="global")
        assert (g["hits"], g["demand_misses"]) == (3, 2)


def test_golden_lrfu_lambda_moves_between_lfu_and_lru():
    """Hand-derived: accesses 0, 0, 1, 2, 0 (one per event, layer clock 0..4), capacity 2.

    At the event of 2 (clock 3) the keys log2(sum 2**(lam*tau)) are: block 0 (tau 0, 1), 1 (tau 2), 2 (tau 3).
    lam = 1:   0 -> log2(1 + 2) = 1.585, 1 -> 2, 2 -> 3: block 0 leaves (LRU-like), so the last access misses.
    lam = 0.2: 0 -> log2(1 + 2**0.2) = 1.103, 1 -> 0.4, 2 -> 0.6: block 1 leaves (LFU-like), the last access hits.
    """
    s = EventStream.from_lists(1, 3, 1, steps=[0, 1, 2, 3, 4], layers=[0] * 5,
                               experts=[[0], [0], [1], [2], [0]], active=[1] * 5)
    lru_like = replay(s, ReplayConfig("lrfu", capacity=(2,), tie_break="id", lrfu_lambda=1.0))
    lfu_like = replay(s, ReplayConfig("lrfu", capacity=(2,), tie_break="id", lrfu_lambda=0.2))
    assert (lru_like.hits, lru_like.demand_misses) == (1, 4)
    assert (lfu_like.hits, lfu_like.demand_misses) == (2, 3)


def test_lrfu_main_engine_equals_proactive_engine():
    """Two independent LRFU implementations (main heap kernel, proactive kernel) agree on a recorded stream."""
    from expertcache.events import build_events
    from expertcache.replay.proactive import ProactiveConfig, replay_proactive
    from expertcache.trace.examples import example_model_trace

    s = build_events(example_model_trace(), 8)
    for lam in (0.1, 0.5, 1.0):
        a = replay(s, ReplayConfig("lrfu", rho=0.3, lrfu_lambda=lam, seed=3))
        b = replay_proactive(s, ProactiveConfig("lrfu", rho=0.3, lrfu_lambda=lam, seed=3))
        assert (a.hits, a.demand_misses) == (b.hits, b.demand_misses), lam


def test_lrfu_small_caches_agree_with_the_twin_and_the_proactive_engine():
    """At rho = 0.05 on the recorded example-model stream, blocks whose CRFs agree to ~1e-13 compete for a
    slot. The engine keeps the CRF at the last access and ranks by ``log2(CRF) + lam * u``
    (``_kernels.crf_update`` / ``crf_key``), as the proactive engine does; the log-domain recursion it used
    before (``now + log2(1 + 2**(key - now))`` at every access) accumulated rounding and kept one block the twin
    and the proactive engine evict (2,045 hits against their 2,044 at lam = 1, B = 4)."""
    from expertcache.events import build_events
    from expertcache.replay.proactive import ProactiveConfig, replay_proactive
    from expertcache.trace.examples import example_model_trace

    s = build_events(example_model_trace(), 4)
    for lam in (0.5, 1.0):
        for scope in ("per-layer", "global"):
            a = replay(s, ReplayConfig("lrfu", rho=0.05, lrfu_lambda=lam, scope=scope))
            want = naive.naive_replay(s, "lrfu", rho=0.05, lrfu_lambda=lam, scope=scope)
            assert (a.hits, a.demand_misses) == (want["hits"], want["demand_misses"]), (lam, scope)
            if scope == "per-layer":
                b = replay_proactive(s, ProactiveConfig("lrfu", rho=0.05, lrfu_lambda=lam))
                assert (a.hits, a.demand_misses) == (b.hits, b.demand_misses), lam
