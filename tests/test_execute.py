"""expertcache execute, part 1: the controller, the schedule and the executed stream (no torch needed).

The online controller (src/expertcache/execute/controller.py) is driven unit by unit over seeded random
streams and compared with both the replay engine and the naive twin (tests/naive.py), for every policy,
both semantics the executor has (event-atomic, sequential-ascending) and both scopes. The executor's
schedule is compared with the one ``expertcache events build`` uses.
"""

from __future__ import annotations

import naive
import numpy as np
import pytest

from expertcache.events import ArrivalOffsets, EventStream, build_events
from expertcache.execute.controller import NEVER, CacheController, pinned_blocks, tie_ranks
from expertcache.execute.equality import noisy_advice
from expertcache.execute.schedule import fcfs_forwards
from expertcache.execute.stream import executed_stream
from expertcache.replay import ReplayConfig, capacities_for_rho, replay, total_capacity
from expertcache.trace import RoutingTrace, read_trace


def random_stream(seed: int, L: int = 3, N: int = 8, k: int = 2, n_steps: int = 40) -> EventStream:
    rng = np.random.default_rng(seed)
    steps, layers, experts, active = [], [], [], []
    for s in range(n_steps):
        a = int(rng.integers(1, 5))
        for layer in range(L):
            sel = {int(e) for _ in range(a) for e in rng.choice(N, size=k, replace=False, p=_skew(N, seed))}
            steps.append(s)
            layers.append(layer)
            experts.append(sorted(sel))
            active.append(a)
    return EventStream.from_lists(L, N, k, steps, layers, experts, active)


def _skew(N: int, seed: int) -> np.ndarray:
    w = 1.0 / (1.0 + np.arange(N)) ** 0.8
    w = np.random.default_rng(seed + 99).permutation(w)
    return w / w.sum()


def drive(stream: EventStream, policy: str, semantics: str, scope: str, rho: float, seed: int,
          calibration: EventStream | None = None, advice=None) -> tuple[list[int], list[int], list[int]]:
    """Feed ``stream`` to a CacheController unit by unit, exactly as the executor does."""
    L, N = stream.n_layers, stream.n_experts
    caps = ([total_capacity(rho, L, N)] if scope == "global" else capacities_for_rho(rho, L, N).tolist())
    tie = tie_ranks("random", seed, L * N)
    units = []
    for i in range(stream.n_events):
        layer = int(stream.layer[i])
        blocks = [layer * N + int(e) for e in stream.members(i)]
        if semantics == "event-atomic":
            units.append((int(stream.step[i]), layer, tuple(blocks)))
        else:
            units.extend((int(stream.step[i]), layer, (b,)) for b in blocks)
    nxt_table = {}
    seen: dict[int, int] = {}
    for t in range(len(units) - 1, -1, -1):
        for b in units[t][2]:
            nxt_table[(t, b)] = seen.get(b, NEVER)
            seen[b] = t
    next_use = None
    if policy in ("belady", "belady-forced"):
        next_use = lambda t, b: nxt_table[(t, b)]  # noqa: E731
    elif policy == "predicted-next-use":
        base = np.r_[0, np.cumsum([len(u[2]) for u in units])]
        next_use = lambda t, b: int(advice.next_use[base[t] + units[t][2].index(b)])  # noqa: E731
    pinned = None
    if policy == "static":
        pinned = pinned_blocks(np.bincount(calibration.block, minlength=L * N), caps, L, N, scope, tie)
    c = CacheController(policy, L, N, caps, scope, tie, pinned=pinned, next_use=next_use)
    hits, misses = [0] * L, [0] * L
    for step, layer, blocks in units:
        h, m = c.classify(layer, blocks)
        hits[layer] += len(h)
        misses[layer] += len(m)
        before = set(c.resident(layer))
        out = c.retain(layer, step, blocks)
        # a resident leaves only at retention (step 3), and then only if it is outranked
        assert out.evicted <= before and out.admitted | out.bypassed == set(m)
        assert c.resident(layer) == (before | set(blocks)) - out.evicted - out.bypassed
        assert len(c.resident(layer)) <= c.capacities[c.partition(layer)]
    return hits, misses, c.initial_load()


POLICIES = ["lru", "least-stale", "lfu", "lfru", "lrfu", "demand", "static", "belady", "belady-forced"]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("semantics", ["event-atomic", "sequential-ascending"])
@pytest.mark.parametrize("scope", ["per-layer", "global"])
def test_controller_equals_replay_and_naive_twin(policy, semantics, scope):
    for seed in range(3):
        stream = random_stream(seed)
        calib = random_stream(seed + 50)
        for rho in (0.2, 0.45):
            hits, misses, initial = drive(stream, policy, semantics, scope, rho, seed, calibration=calib)
            res = replay(stream, ReplayConfig(policy, rho=rho, scope=scope, semantics=semantics, seed=seed),
                         calibration=calib if policy == "static" else None)
            assert hits == [x.hits for x in res.per_layer]
            assert misses == [x.demand_misses for x in res.per_layer]
            assert initial == [x.initial_load for x in res.per_layer]
            tw = naive.naive_replay(stream, policy, rho=rho, scope=scope, semantics=semantics, seed=seed,
                                    calibration=calib if policy == "static" else None)
            assert misses == tw["per_layer_demand_misses"] and hits == tw["per_layer_hits"]


@pytest.mark.parametrize("scope", ["per-layer", "global"])
def test_controller_predicted_next_use_equals_replay(scope):
    for seed in range(3):
        stream = random_stream(seed)
        adv = noisy_advice(stream, seed=seed)
        hits, misses, _ = drive(stream, "predicted-next-use", "event-atomic", scope, 0.3, seed, advice=adv)
        res = replay(stream, ReplayConfig("predicted-next-use", rho=0.3, scope=scope, seed=seed), advice=adv)
        assert misses == [x.demand_misses for x in res.per_layer] and hits == [x.hits for x in res.per_layer]


def test_noisy_advice_is_valid_and_imperfect():
    stream = random_stream(7)
    adv = noisy_advice(stream, seed=1)
    ev = stream.event_of_access
    assert adv.next_use.dtype == np.int32 and (adv.next_use > ev).all()
    exact = noisy_advice(stream, spread=0)
    # with no noise it is the true next use: replay's own oracle (belady) gives the same counts
    for rho in (0.2, 0.5):
        a = replay(stream, ReplayConfig("predicted-next-use", rho=rho), advice=exact)
        b = replay(stream, ReplayConfig("belady", rho=rho))
        assert [x.demand_misses for x in a.per_layer] == [x.demand_misses for x in b.per_layer]
    assert (adv.next_use != exact.next_use).mean() > 0.3
    assert ((adv.next_use == NEVER) == (exact.next_use == NEVER)).all()


def test_controller_hand_derived():
    """One layer, c = 2, LRU with id ties, event-atomic: counts derived by hand."""
    # events: {0,1} {1,2} {0,1} {3} {0,3}
    tie = tie_ranks("id", 0, 4)
    c = CacheController("lru", 1, 4, [2], "per-layer", tie)
    seq = [(0, 1), (1, 2), (0, 1), (3,), (0, 3)]
    got = []
    for s, u in enumerate(seq):
        h, m = c.classify(0, u)
        c.retain(0, s, u)
        got.append((len(h), len(m)))
    # {0,1} miss 2 -> C={0,1}; {1,2}: hit 1, miss 1 -> K={0,1,2}, last: 0@0, 1@1, 2@1 -> keep {1,2}
    # {0,1}: hit 1 (1), miss 1 (0) -> K={0,1,2}: 0@2, 1@2, 2@1 -> keep {0,1}
    # {3}: miss -> K={0,1,3}: 0@2, 1@2, 3@3 -> keep 3 and the larger tie of 0/1 (id ties: lower id) -> {0,3}
    # {0,3}: 2 hits
    assert got == [(0, 2), (1, 1), (1, 1), (0, 1), (2, 0)]
    assert c.resident(0) == {0, 3}
    # event larger than the quota: all three execute (workspace), two stay
    h, m = c.classify(0, (0, 1, 2))
    out = c.retain(0, 5, (0, 1, 2))
    assert (len(h), len(m)) == (1, 2) and len(c.resident(0)) == 2 and out.evicted == {3}


def test_schedule_decode_part_equals_build_events():
    trace = read_trace("src/expertcache/data/example_model_trace")
    for B in (1, 3, 8):
        for offsets in (ArrivalOffsets(), ArrivalOffsets("stagger", stagger=5),
                        ArrivalOffsets("random", low=0, high=200, seed=3)):
            ex = executed_stream(trace, B, offsets)
            ref = build_events(trace, B, offsets)
            dec = np.flatnonzero(ex.phase == 1)
            assert dec.shape[0] == ref.n_events
            assert np.array_equal(ex.stream.active[dec], ref.active)
            assert np.array_equal(ex.stream.layer[dec], ref.layer)
            sizes = np.diff(ex.stream.offsets)[dec]
            assert np.array_equal(sizes, ref.event_size)
            flat = np.concatenate([ex.stream.members(i) for i in dec])
            assert np.array_equal(flat, ref.expert)
            # one prefill forward (L events) per request, each before that request's first decode
            assert int((ex.phase == 0).sum()) == trace.n_requests * trace.n_layers
            first_dec = {}
            first_pre = {}
            for f_idx, fwd in enumerate(ex.forwards):
                for r in fwd.requests:
                    (first_pre if fwd.kind == "prefill" else first_dec).setdefault(r, f_idx)
            assert all(first_pre[r] < first_dec[r] for r in first_dec)


def test_schedule_requests_without_decode_and_arrival_gaps():
    # request 1 stops at its first token (0 decode rows); request 3 arrives late
    fw = fcfs_forwards([2, 0, 1, 2], [0, 0, 0, 10], batch=2)
    got = [(f.kind, f.step, f.requests, f.tokens) for f in fw]
    assert got == [("prefill", 0, (0,), ()), ("prefill", 0, (1,), ()), ("prefill", 0, (2,), ()),
                   ("decode", 0, (0, 2), (0, 0)), ("decode", 1, (0,), (1,)),
                   ("prefill", 10, (3,), ()), ("decode", 10, (3,), (0,)), ("decode", 11, (3,), (1,))]


def test_executed_stream_prefill_events_count_every_prompt_token():
    L, N, k = 2, 6, 2
    rows = []
    for r, (P, D) in enumerate([(3, 2), (2, 0), (1, 3)]):
        for t in range(P + D):
            rows.append((r, 0 if t < P else 1, t, [[(r + t + l) % N, (r + 2 * t + l + 1) % N] for l in range(L)]))
    experts = np.array([[[int(x) for x in pair] for pair in row[3]] for row in rows], dtype=np.int16)
    for i in range(experts.shape[0]):
        for l in range(L):
            if experts[i, l, 0] == experts[i, l, 1]:
                experts[i, l, 1] = (experts[i, l, 1] + 1) % N
    tr = RoutingTrace(L, N, k, ("a", "b", "c"), np.array([r[0] for r in rows], np.int32),
                      np.array([r[1] for r in rows], np.int8), np.array([r[2] for r in rows], np.int32),
                      experts, None, np.full(len(rows), -1, np.int64))
    ex = executed_stream(tr, 2)
    pre = ex.phase == 0
    assert ex.stream.logical_per_event[pre].sum() == (3 + 2 + 1) * L * k
    assert ex.stream.n_events == (3 + 3) * L   # 3 prefill forwards, decode steps: {a,c} {a,c} {c}
