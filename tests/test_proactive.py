"""Proactive-load-aware replay: CLR's worked example, the naive twin, and the charging contract."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_proactive import naive_proactive

from expertcache.errors import ValidationError
from expertcache.events import EventStream
from expertcache.nextuse import Advice, load_advice, save_advice
from expertcache.replay import ReplayConfig, replay
from expertcache.replay.proactive import ProactiveConfig, prefill_then_decode, replay_proactive

NAN = np.nan

# --------------------------------------------------------------------------------------------------
# CLR, "How It Works: A Concrete Example": N = 6, B = 2, K = 1, R = 2. The paper numbers experts 1..6;
# expert e of the paper is id e - 1 here.
#
# The cache C = {2, 5} is built by two warm-up events touching expert 2, then expert 5 (ids 1, 4),
# so under LRU expert 2 is the older resident. Event 2 routes to S = {3} (id 2); event 3 to {2}.
#
# Temporal router (Alg. 1), s^T = p^R + p^T = [0.10, 0.55, 0.65, 0.15, 0.40, 0.15]:
#   event 2: 3 is not in C -> one demand miss, D = 1. U_B inserts 3 and evicts the lowest-priority
#            resident outside S: expert 2 scores 0.55, expert 5 scores 0.40 -> 5 leaves, C' = {2, 3}.
#   event 3: expert 2 is resident -> hit ("If the next-token target places mass on expert 2, it hits").
#   Counted events 2-3: A = 2, D = 1, P = 0 -> Hit = 1 - 1/2 = 50%, AdjHit = (2 - 1)/(2 + 0) = 50%.
#   Event 2 alone: A = 1, D = 1 -> Hit = 0%, AdjHit = 0%.
#   LRU instead evicts the older resident, expert 2 -> event 3 misses too: D = 2, Hit = 0%.
#
# Spatio-temporal refinement (Alg. 2), s^ST = [0.20, 0.65, 0.70, 0.20, 0.45, 0.35]:
#   before event 2: Top2 = (3: 0.70, 2: 0.65). Expert 3 is not resident; the lowest resident under
#   s^ST is expert 5 (0.45 < 0.55 of expert 2); 0.70 > 0.45 -> insert 3, evict 5, P = 1.
#   Expert 2 is resident -> skipped. C~ = {2, 3}; the access {3} hits, D = 0.
#   Event 2 alone: A = 1, D = 0, P = 1 -> Hit = 100%, AdjHit = (1 - 0)/(1 + 1) = 50% (the paper's numbers).
#   With event 3 (no candidates, {2} hits): A = 2, D = 0, P = 1 -> Hit = 100%, AdjHit = 2/3.
# --------------------------------------------------------------------------------------------------
S_T = [0.10, 0.55, 0.65, 0.15, 0.40, 0.15]
S_ST = [0.20, 0.65, 0.70, 0.20, 0.45, 0.35]


def clr_stream() -> EventStream:
    return EventStream.from_lists(1, 6, 1, steps=[0, 1, 2, 3], layers=[0, 0, 0, 0],
                                  experts=[[1], [4], [2], [1]], active=[1, 1, 1, 1])


def clr_advice(prefetch: bool) -> Advice:
    prio = np.array([S_T] * 4, dtype=np.float32)
    pf = np.full((4, 6), NAN, dtype=np.float32)
    if prefetch:
        pf[2] = S_ST
    return Advice(priority=prio, prefetch_score=pf, provenance={"source": "CLR worked example"})


@pytest.mark.parametrize("tie_break", ["id", "random"])
def test_clr_worked_example_temporal(tie_break):
    s = clr_stream()
    cfg = ProactiveConfig("advice", capacity=(2,), warmup_events=2, tie_break=tie_break, seed=5)
    r = replay_proactive(s, cfg, clr_advice(False))
    assert (r.accesses, r.demand_misses, r.proactive_loads, r.hits) == (2, 1, 0, 1)
    assert r.hit == pytest.approx(0.5) and r.adj_hit == pytest.approx(0.5)
    only_event2 = np.array([False, False, True, False])
    r2 = replay_proactive(s, cfg, clr_advice(False), count_mask=only_event2)
    assert (r2.accesses, r2.demand_misses, r2.proactive_loads) == (1, 1, 0)
    assert r2.hit == 0.0 and r2.adj_hit == 0.0
    # LRU evicts expert 2 (the older resident), so event 3 misses as well
    lru = replay_proactive(s, ProactiveConfig("lru", capacity=(2,), warmup_events=2, tie_break=tie_break))
    assert (lru.accesses, lru.demand_misses) == (2, 2)
    # the priority really decides: reversed scores (5 above 2) evict expert 2 instead
    rev = clr_advice(False)
    p = rev.priority.copy()
    p[:, [1, 4]] = p[:, [4, 1]]
    r3 = replay_proactive(s, cfg, Advice(priority=p))
    assert r3.demand_misses == 2


@pytest.mark.parametrize("budget", [1, 2, 6])
def test_clr_worked_example_refinement(budget):
    s = clr_stream()
    cfg = ProactiveConfig("advice", capacity=(2,), prefetch_budget=budget, warmup_events=2, tie_break="id")
    only_event2 = np.array([False, False, True, False])
    r = replay_proactive(s, cfg, clr_advice(True), count_mask=only_event2)
    assert (r.accesses, r.demand_misses, r.proactive_loads, r.useful_prefetches) == (1, 0, 1, 1)
    assert r.hit == pytest.approx(1.0) and r.adj_hit == pytest.approx(0.5)
    both = replay_proactive(s, cfg, clr_advice(True))
    assert (both.accesses, both.demand_misses, both.proactive_loads) == (2, 0, 1)
    assert both.hit == pytest.approx(1.0) and both.adj_hit == pytest.approx(2 / 3)
    assert both.transferred == 1 and both.miss_fraction == pytest.approx(1 / 2)


def test_refinement_needs_a_strictly_higher_score():
    s = clr_stream()
    adv = clr_advice(True)
    pf = adv.prefetch_score.copy()
    pf[2] = [0.20, 0.65, 0.45, 0.20, 0.45, 0.35]   # expert 3 only ties the lowest resident (5): no insertion
    r = replay_proactive(s, ProactiveConfig("advice", capacity=(2,), prefetch_budget=2, warmup_events=2,
                                            tie_break="id"), Advice(priority=adv.priority, prefetch_score=pf))
    assert (r.proactive_loads, r.demand_misses) == (0, 1)


# ------------------------------------------------------------------------------------------ random streams
@st.composite
def streams(draw, max_layers=3, max_experts=8, max_steps=12):
    L = draw(st.integers(1, max_layers))
    N = draw(st.integers(2, max_experts))
    n_steps = draw(st.integers(1, max_steps))
    steps, layers, experts, active = [], [], [], []
    for s in range(n_steps):
        a = draw(st.integers(1, 3))
        for layer in range(L):
            if draw(st.integers(0, 5)) == 0:
                continue          # an event may be absent
            m = draw(st.lists(st.integers(0, N - 1), min_size=1, max_size=min(N, 2 * a), unique=True))
            steps.append(s)
            layers.append(layer)
            experts.append(m)
            active.append(a)
    if not steps:
        steps, layers, experts, active = [0], [0], [[0]], [1]
    caps = tuple(draw(st.integers(0, N)) for _ in range(L))
    return EventStream.from_lists(L, N, 2, steps, layers, experts, active), caps


def score_arrays(draw, n_events, N):
    vals = st.sampled_from([NAN, -np.inf, 0.0, 0.5, 1.0, 2.0, 3.0, np.inf])   # few values: many ties
    prio = np.array(draw(st.lists(vals, min_size=n_events * N, max_size=n_events * N)), dtype=np.float32)
    pf = np.array(draw(st.lists(vals, min_size=n_events * N, max_size=n_events * N)), dtype=np.float32)
    return prio.reshape(n_events, N), pf.reshape(n_events, N)


@given(data=st.data())
@settings(max_examples=150, deadline=None)
def test_engine_matches_naive_twin(data):
    stream, caps = data.draw(streams())
    prio, pf = score_arrays(data.draw, stream.n_events, stream.n_experts)
    priority = data.draw(st.sampled_from(["lru", "lfu", "lfru", "lrfu", "advice"]))
    budget = data.draw(st.integers(0, stream.n_experts))
    tie_break = data.draw(st.sampled_from(["id", "random"]))
    seed = data.draw(st.integers(0, 50))
    warmup = data.draw(st.integers(0, stream.n_events))
    lam = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=stream.n_events, max_size=stream.n_events)))
    cfg = ProactiveConfig(priority, capacity=caps, prefetch_budget=budget, tie_break=tie_break, seed=seed,
                          warmup_events=warmup, lrfu_lambda=lam)
    got = replay_proactive(stream, cfg, Advice(priority=prio, prefetch_score=pf), count_mask=mask)
    want = naive_proactive(stream, priority, caps, budget=budget, prio=prio, pf=pf, tie_break=tie_break,
                           seed=seed, warmup=warmup, lam=lam, count_mask=mask)
    assert (got.hits, got.demand_misses, got.proactive_loads, got.useful_prefetches, got.tokens) == (
        want["hits"], want["demand_misses"], want["proactive_loads"], want["useful_prefetches"], want["tokens"])
    assert [x.hits for x in got.per_layer] == want["per_layer_hits"]
    assert [x.proactive_loads for x in got.per_layer] == want["per_layer_proactive"]


@given(data=st.data())
@settings(max_examples=150, deadline=None)
def test_demand_rows_on_the_bitset_loops_match_the_twin_and_the_kernel(data):
    """lru / lfu / lrfu without refinement (budget 0) and counted events a suffix take expertcache.replay's bitset
    loops (lru's and lfu's lanes or their other loops, as the engine chooses): counts equal the naive twin, hit flags
    the proactive kernel's, on every event."""
    from expertcache.replay import _kernels_belady_lanes as KBL
    from expertcache.replay import _kernels_bits as KB
    from expertcache.replay import _proactive as KP
    from expertcache.replay.engine import _tie_ranks
    from expertcache.replay.proactive import replay_proactive_hits

    stream, caps = data.draw(streams())
    priority = data.draw(st.sampled_from(["lru", "lfu", "lrfu"]))
    lam = data.draw(st.sampled_from([0.0, 0.3, 0.5, 1.0]))
    tie_break = data.draw(st.sampled_from(["id", "random"]))
    seed = data.draw(st.integers(0, 50))
    warmup = data.draw(st.integers(0, stream.n_events))
    suffix = data.draw(st.integers(0, stream.n_events))
    mask = None if data.draw(st.booleans()) else np.arange(stream.n_events) >= suffix
    cfg = ProactiveConfig(priority, capacity=caps, tie_break=tie_break, seed=seed, warmup_events=warmup,
                          lrfu_lambda=lam)
    loops = {"lru": (KBL, "replay_lru_layers"), "lfu": (KBL, "replay_lfu_layers"), "lrfu": (KB, "replay_lrfu_bits")}
    calls = []
    module, name = loops[priority]
    real = getattr(module, name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, name, lambda *a: calls.append(1) or real(*a))
        got, trace = replay_proactive_hits(stream, cfg, count_mask=mask)
    assert calls                       # (the counted events here always form a suffix)
    want = naive_proactive(stream, priority, caps, budget=0, prio=None, pf=None, tie_break=tie_break, seed=seed,
                           warmup=warmup, lam=lam, count_mask=mask)
    assert (got.hits, got.demand_misses, got.proactive_loads, got.tokens) == (
        want["hits"], want["demand_misses"], 0, want["tokens"])
    assert [x.hits for x in got.per_layer] == want["per_layer_hits"]
    L, N = stream.n_layers, stream.n_experts
    counted = np.ones(stream.n_events, dtype=bool)
    flags = np.zeros(stream.union, dtype=np.uint8)
    z = np.zeros(L, dtype=np.int64)
    KP.replay_proactive(stream.offsets, stream.expert, stream.layer, N, L, np.asarray(caps, dtype=np.int64),
                        _tie_ranks(tie_break, seed, L * N),
                        {"lru": KP.PKEY_LRU, "lfu": KP.PKEY_LFU, "lrfu": KP.PKEY_LRFU}[priority], lam,
                        np.zeros((0, 0), np.float32), np.zeros((0, 0), np.float32), 0, counted, z.copy(), z.copy(),
                        z.copy(), z.copy(), flags, np.zeros((0, 0), np.int32), np.zeros(0, np.int64))
    assert (trace.hit == flags.astype(bool)).all()


@given(data=st.data())
@settings(max_examples=120, deadline=None)
def test_without_prefetch_base_keys_equal_the_main_engine(data):
    """No refinement + a base key = replay(..., policy) exactly (the same keys, ties and bypass rule)."""
    stream, caps = data.draw(streams())
    policy = data.draw(st.sampled_from(["lru", "lfu", "lfru"]))
    tie_break = data.draw(st.sampled_from(["id", "random"]))
    seed = data.draw(st.integers(0, 50))
    base = replay(stream, ReplayConfig(policy, capacity=caps, tie_break=tie_break, seed=seed))
    # a prefetch advice with budget 0 is never read
    pf = np.ones((stream.n_events, stream.n_experts), dtype=np.float32)
    got = replay_proactive(stream, ProactiveConfig(policy, capacity=caps, tie_break=tie_break, seed=seed),
                           Advice(prefetch_score=pf))
    assert (got.hits, got.demand_misses, got.proactive_loads) == (base.hits, base.demand_misses, 0)
    assert [x.demand_misses for x in got.per_layer] == [x.demand_misses for x in base.per_layer]
    assert got.accesses == base.union and got.logical == base.logical
    assert got.miss_fraction == pytest.approx(base.miss_fraction)


@given(data=st.data())
@settings(max_examples=80, deadline=None)
def test_prefetching_nothing_equals_the_base_policy(data):
    stream, caps = data.draw(streams())
    policy = data.draw(st.sampled_from(["lru", "lfu", "lfru", "lrfu", "advice"]))
    prio, _ = score_arrays(data.draw, stream.n_events, stream.n_experts)
    empty = np.full((stream.n_events, stream.n_experts), data.draw(st.sampled_from([NAN, -np.inf])),
                    dtype=np.float32)
    budget = data.draw(st.integers(1, stream.n_experts))
    a = replay_proactive(stream, ProactiveConfig(policy, capacity=caps, tie_break="random", seed=3),
                         Advice(priority=prio))
    b = replay_proactive(stream, ProactiveConfig(policy, capacity=caps, prefetch_budget=budget,
                                                 tie_break="random", seed=3),
                         Advice(priority=prio, prefetch_score=empty))
    assert b.proactive_loads == 0
    assert b.to_dict()["per_layer"] == a.to_dict()["per_layer"]
    assert (a.hits, a.demand_misses) == (b.hits, b.demand_misses)


@given(data=st.data())
@settings(max_examples=80, deadline=None)
def test_prefetching_the_true_next_experts_gives_full_hits(data):
    stream, _ = data.draw(streams())
    size = int(stream.event_size.max())
    caps = tuple(data.draw(st.integers(size, stream.n_experts)) for _ in range(stream.n_layers))
    pf = np.full((stream.n_events, stream.n_experts), NAN, dtype=np.float32)
    for i in range(stream.n_events):
        pf[i, stream.members(i)] = 1.0
    policy = data.draw(st.sampled_from(["lru", "lfu", "lrfu"]))
    r = replay_proactive(stream, ProactiveConfig(policy, capacity=caps, prefetch_budget=size, seed=1),
                         Advice(prefetch_score=pf))
    A, P = r.accesses, r.proactive_loads
    assert r.demand_misses == 0 and r.hit == 1.0
    assert r.adj_hit == pytest.approx(A / (A + P))
    assert r.useful_prefetches == P          # every proactive load was used
    assert r.transferred == P and r.load_per_token == pytest.approx(P / r.tokens)


def test_proactive_loads_appear_in_transfers_and_load_per_token():
    # one layer, N = 4, capacity 1; the prefetcher always proposes expert 3, which is never used
    s = EventStream.from_lists(1, 4, 1, steps=[0, 1, 2], layers=[0, 0, 0], experts=[[0], [1], [0]],
                               active=[2, 3, 2])
    pf = np.full((3, 4), NAN, dtype=np.float32)
    pf[:, 3] = 1.0
    cfg = ProactiveConfig("lru", capacity=(1,), prefetch_budget=1, tie_break="id", expert_bytes=1000)
    r = replay_proactive(s, cfg, Advice(prefetch_score=pf))
    # event 0: empty slot -> 3 inserted (P=1); 0 misses; U: keep 0 (newer clock) over 3. Same at events 1, 2.
    assert (r.proactive_loads, r.demand_misses, r.hits, r.useful_prefetches) == (3, 3, 0, 0)
    assert r.transferred == 6 and r.wasted_prefetches == 3
    assert r.tokens == 2 + 3 + 2
    assert r.load_per_token == pytest.approx(6 * 1000 / 7) and r.load_unit == "bytes/token"
    assert r.miss_fraction == pytest.approx(6 / (7 * 1))
    assert r.to_dict()["transferred"] == 6


def test_prefill_then_decode_initialises_the_cache():
    pre = EventStream.from_lists(1, 4, 1, steps=[0, 1], layers=[0, 0], experts=[[0, 1], [2]], active=[3, 2])
    dec = EventStream.from_lists(1, 4, 1, steps=[0, 1], layers=[0, 0], experts=[[2], [1]], active=[1, 1])
    s, warm = prefill_then_decode(pre, dec)
    assert warm == 2 and s.step.tolist() == [0, 1, 2, 3]
    assert s.provenance["warmup_events"] == 2      # saved, `expertcache replay` / `prefetch replay` honour it
    with pytest.raises(ValidationError, match="different shapes"):
        prefill_then_decode(EventStream.from_lists(1, 5, 1, steps=[0], layers=[0], experts=[[0]], active=[1]), dec)
    r = replay_proactive(s, ProactiveConfig("lru", capacity=(3,), warmup_events=warm))
    assert (r.accesses, r.hits, r.demand_misses, r.tokens, r.logical) == (2, 2, 0, 2, 2)
    cold = replay_proactive(dec, ProactiveConfig("lru", capacity=(3,)))
    assert cold.demand_misses == 2


def test_advice_round_trip_and_validation(tmp_path):
    s = clr_stream()
    adv = clr_advice(True)
    save_advice(adv, tmp_path / "a.npz")
    back = load_advice(tmp_path / "a.npz")
    assert back.next_use is None and back.provenance == adv.provenance
    np.testing.assert_array_equal(back.priority, adv.priority)
    np.testing.assert_array_equal(back.prefetch_score, adv.prefetch_score)
    with np.load(tmp_path / "a.npz", allow_pickle=False) as z:
        assert set(z.files) == {"priority", "prefetch_score", "provenance"}
    with pytest.raises(ValidationError, match="at least one"):
        Advice()
    with pytest.raises(ValidationError, match="reads advice"):
        replay_proactive(s, ProactiveConfig("advice", capacity=(2,)))
    with pytest.raises(ValidationError, match="lacks"):
        replay_proactive(s, ProactiveConfig("advice", capacity=(2,)), Advice(prefetch_score=adv.prefetch_score))
    with pytest.raises(ValidationError, match="shape"):
        replay_proactive(s, ProactiveConfig("advice", capacity=(2,)), Advice(priority=adv.priority[:3]))
    with pytest.raises(ValidationError, match="float32"):
        replay_proactive(s, ProactiveConfig("advice", capacity=(2,)),
                         Advice(priority=adv.priority.astype(np.float64)))
    with pytest.raises(ValidationError, match="capacity"):
        replay_proactive(s, ProactiveConfig("lru", capacity=(2, 2)))
    with pytest.raises(ValidationError, match="priority"):
        ProactiveConfig("mru")
    with pytest.raises(ValidationError, match="warmup"):
        replay_proactive(s, ProactiveConfig("lru", warmup_events=9))
    (tmp_path / "bad.npz").write_bytes(b"no")
    with pytest.raises(ValidationError, match="cannot read advice"):
        load_advice(tmp_path / "bad.npz")
    whole = (tmp_path / "a.npz").read_bytes()      # a truncated or damaged archive: one-line error, no traceback
    for name, data in (("cut.npz", whole[: len(whole) // 2]), ("pk.npz", b"PK\x03\x04garbage")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValidationError, match="cannot read advice"):
            load_advice(tmp_path / name)
    assert math.isfinite(replay_proactive(s, ProactiveConfig("lru", rho=0.5)).hit)


@given(data=st.data())
@settings(max_examples=150, deadline=None)
def test_lrfu_matches_naive_twin_on_long_streams(data):
    """LRFU's ranking only shows on longer histories: one or two layers, many steps."""
    stream, caps = data.draw(streams(max_layers=2, max_experts=6, max_steps=40))
    lam = data.draw(st.sampled_from([0.1, 0.5, 0.7]))
    got = replay_proactive(stream, ProactiveConfig("lrfu", capacity=caps, tie_break="id", lrfu_lambda=lam))
    want = naive_proactive(stream, "lrfu", caps, tie_break="id", lam=lam)
    assert (got.hits, got.demand_misses) == (want["hits"], want["demand_misses"])


def test_lrfu_hand_example():
    """lambda = 0.5, capacity 2, clock = events of the layer. A at t=0,1; X at 2; B at 3; C at 4; A at 5.

    t=3: keys log2(CRF) + lam*t_last: A = log2(1 + 2^-0.5) + 0.5 = 1.271, X = 0 + 1.0, B = 0 + 1.5 -> X leaves.
    t=4: A = 1.271, B = 1.5, C = 2.0 -> A leaves; t=5: A misses. Hits: t=1 only.
    With lambda = 0.3: A = log2(1 + 2^-0.3) + 0.3 = 1.158 > B = 0.9 at t=4 -> B leaves, A hits at t=5.
    """
    s = EventStream.from_lists(1, 4, 1, steps=list(range(6)), layers=[0] * 6,
                               experts=[[0], [0], [1], [2], [3], [0]], active=[1] * 6)
    r = replay_proactive(s, ProactiveConfig("lrfu", capacity=(2,), tie_break="id"))
    assert (r.hits, r.demand_misses) == (1, 5)
    r3 = replay_proactive(s, ProactiveConfig("lrfu", capacity=(2,), tie_break="id", lrfu_lambda=0.3))
    assert (r3.hits, r3.demand_misses) == (2, 4)


def test_refinement_victims_among_equal_scores_follow_the_retention_key():
    """Residents 0 and 1 both have no prefetch score; candidate 2 must replace one of them.

    U_B: the layer's previous priority row (event 1: expert 0 = 0.9 > expert 1 = 0.1) decides -> 1 leaves,
    and event 2's access {0} hits (D = 0, P = 1). Event 2's own row (reversed) must not be read.
    LRU: expert 0 is older (event 0) -> 0 leaves and the access misses, though tie_break="id" alone
    would have kept the lower id 0.
    """
    s = EventStream.from_lists(1, 4, 1, steps=[0, 1, 2], layers=[0, 0, 0], experts=[[0], [1], [0]],
                               active=[1, 1, 1])
    pf = np.full((3, 4), NAN, dtype=np.float32)
    pf[2, 2] = 1.0
    prio = np.zeros((3, 4), dtype=np.float32)
    prio[1, :2] = [0.9, 0.1]
    prio[2, :2] = [0.1, 0.9]
    adv = Advice(priority=prio, prefetch_score=pf)
    base = dict(capacity=(2,), prefetch_budget=1, warmup_events=2, tie_break="id")
    r = replay_proactive(s, ProactiveConfig("advice", **base), adv)
    assert (r.accesses, r.demand_misses, r.proactive_loads) == (1, 0, 1)
    lru = replay_proactive(s, ProactiveConfig("lru", **base), adv)
    assert (lru.accesses, lru.demand_misses, lru.proactive_loads) == (1, 1, 1)


def test_useful_prefetches_count_only_counted_loads():
    """A block prefetched during warm-up and hit afterwards is neither a counted load nor a useful one."""
    s = EventStream.from_lists(1, 4, 1, steps=[0, 1], layers=[0, 0], experts=[[0], [1]], active=[1, 1])
    pf = np.full((2, 4), NAN, dtype=np.float32)
    pf[0, 1] = 1.0
    r = replay_proactive(s, ProactiveConfig("lru", capacity=(2,), prefetch_budget=1, warmup_events=1),
                         Advice(prefetch_score=pf))
    assert (r.hits, r.proactive_loads, r.useful_prefetches, r.wasted_prefetches) == (1, 0, 0, 0)


def test_top_scores_are_a_stable_sort_of_the_finite_scores():
    """The refinement's candidates (``_proactive.top_scores``) against numpy: the ``budget`` highest scores that are
    neither NaN nor -inf, by a stable sort of the negated scores over ascending experts; rows with many ties, signed
    zeros, subnormals, infinities and NaN, every budget."""
    from expertcache.replay import _proactive as KP

    rng = np.random.default_rng(3)
    pool = np.array([NAN, -np.inf, np.inf, 0.0, -0.0, 1e-45, -1e-45, 0.5, 0.5, 1.0, -2.0, 3.0], dtype=np.float32)
    for n in (1, 2, 3, 7, 8, 33, 128, 300):
        rows = [rng.choice(pool, n), rng.standard_normal(n).astype(np.float32),
                np.round(rng.standard_normal(n), 1).astype(np.float32), np.full(n, NAN, np.float32)]
        scores = np.stack(rows)
        ids, vals, fa, fb = np.empty(n, np.int64), np.empty(n), np.empty(n), np.empty(n)
        for i in range(scores.shape[0]):
            row = scores[i]
            valid = np.flatnonzero(~np.isnan(row) & (row != -np.inf))
            ranked = valid[np.argsort(-row[valid].astype(np.float64), kind="stable")]
            for budget in sorted({0, 1, 2, 3, n // 2, n - 1, n, n + 5}):
                order = np.full(n, -1, np.int64)
                k = KP.top_scores(scores, i, n, budget, order, ids, vals, fa, fb)
                assert k == min(max(budget, 0), valid.size)
                assert order[:k].tolist() == ranked[:k].tolist(), (n, i, budget)
