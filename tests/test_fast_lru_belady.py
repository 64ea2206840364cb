"""The bitset kernels (``replay/_kernels_bits.py``) make exactly the decision of the list/heap kernels.

Event-atomic, per-layer ``lru`` (and ``belady`` / ``belady-forced``) dispatch to
the bitset loops when N <= 1024 (Belady to the lanes of next uses,
``replay/_kernels_belady_lanes.py``, or the walk; ``lru`` to the lanes of unit
keys, up to 128 experts a layer, or the recency buckets; each is run here, by
forcing the engine's choice). Here they are compared, counts and per-access
hit flags, against the kernels they replace (called directly) on many random
streams, with N below, at and above multiples of 64, capacities 0 to beyond the
universe, events larger than the cache, and warm-up events; and against the
naive twin (tests/naive.py) on small streams.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import naive
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, replay, replay_hits
from expertcache.replay import _kernels as K
from expertcache.replay import engine as E

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def random_stream(rng: np.random.Generator, L: int, N: int, n_steps: int, max_size: int,
                  alpha: float = 1.0, min_size: int = 1) -> EventStream:
    """Per step one event per layer (at least ``min_size`` members), drawn from a skewed popularity."""
    w = 1.0 / np.arange(1, N + 1) ** alpha
    rows = []
    for s in range(n_steps):
        for layer in range(L):
            k = int(rng.integers(min_size, max_size + 1))
            members = sorted(rng.choice(N, size=min(k, N), replace=False, p=w / w.sum()).tolist())
            rows.append((s, layer, members))
    return EventStream.from_lists(L, N, N, steps=[r[0] for r in rows], layers=[r[1] for r in rows],
                                  experts=[r[2] for r in rows], active=[1] * len(rows))


def old_kernel(stream: EventStream, policy: str, caps: np.ndarray, tie_break: str, seed: int, warmup: int):
    """Counts and hit flags from the kernel the bitset loop replaces (replay_lru / replay_belady)."""
    L, N = stream.n_layers, stream.n_experts
    tie = E._tie_ranks(tie_break, seed, L * N)
    hits = np.zeros(L, dtype=np.int64)
    misses = np.zeros(L, dtype=np.int64)
    flags = np.zeros(stream.union, dtype=np.uint8)
    if policy == "lru":
        order, tie_pos = E._tie_order(tie, L, N)
        K.replay_lru(stream.offsets, stream.expert, stream.layer, N, L, False, True, caps, order, tie_pos, warmup,
                     hits, misses, flags)
    else:
        nxt = K.next_use(stream.offsets, stream.expert, stream.layer, N, L, True)
        K.replay_belady(stream.offsets, stream.expert, stream.layer, N, L, False, True, nxt, caps, tie,
                        policy == "belady-forced", warmup, hits, misses, flags)
    return hits, misses, flags.astype(bool)


@contextmanager
def belady_on(loop: str | None, rule: str = "lanes_pay") -> Iterator[None]:
    """The engine's per-layer Belady on the lanes of next uses (``loop="lanes"``) or the walk (``"walk"``), its
    choice (``lanes_pay``) forced; ``None``: as the engine chooses. ``rule="lru_lanes_pay"``: per-layer lru on the
    lanes of unit keys (``"lanes"``) or in the recency buckets (``"buckets"``)."""
    from expertcache.replay import _kernels_belady_lanes as KBL

    if loop is None:
        yield
        return
    with mock.patch.object(KBL, rule, lambda *a: loop == "lanes"):
        yield


def check_against_old(stream: EventStream, policy: str, caps, tie_break: str = "random", seed: int = 0,
                      warmup: int = 0) -> None:
    """The engine's counts and hit flags (``policy`` as ``"belady/walk"`` or ``"belady/lanes"``, ``"lru/lanes"`` or
    ``"lru/buckets"`` forces the loop; ``lru``'s lanes past 128 experts: the buckets) equal the old kernel's."""
    policy, _, loop = policy.partition("/")
    with belady_on(loop or None, RULES[policy]):
        _check_against_old(stream, policy, caps, tie_break, seed, warmup)


def _check_against_old(stream: EventStream, policy: str, caps, tie_break: str, seed: int, warmup: int) -> None:
    caps = np.asarray(caps, dtype=np.int64)
    cfg = ReplayConfig(policy, capacity=tuple(int(c) for c in caps), tie_break=tie_break, seed=seed,
                       warmup_events=warmup)
    result, flags = replay_hits(stream, cfg)
    hits, misses, want_flags = old_kernel(stream, policy, caps, tie_break, seed, warmup)
    assert [lc.hits for lc in result.per_layer] == hits.tolist()
    assert [lc.demand_misses for lc in result.per_layer] == misses.tolist()
    assert np.array_equal(flags, want_flags)
    assert replay(stream, cfg) == result


POLICIES = ["lru/lanes", "lru/buckets", "belady/lanes", "belady/walk", "belady-forced/lanes", "belady-forced/walk"]
#: The engine's choice of loop each policy's ``/LOOP`` forces (:func:`belady_on`).
RULES = {"lru": "lru_lanes_pay", "belady": "lanes_pay", "belady-forced": "lanes_pay"}


@pytest.mark.parametrize("policy", POLICIES)
@given(seed=st.integers(0, 2**32 - 1), N=st.sampled_from([1, 5, 63, 64, 65, 100, 128, 130, 200, 1024]),
       L=st.integers(1, 3), data=st.data())
@SETTINGS
def test_bitset_kernels_equal_the_old_kernels_on_random_streams(policy, seed, N, L, data):
    rng = np.random.default_rng(seed)
    max_size = data.draw(st.integers(1, min(N, 80)))
    stream = random_stream(rng, L, N, n_steps=data.draw(st.integers(1, 40)), max_size=max_size,
                           alpha=data.draw(st.sampled_from([0.0, 0.8, 1.5])))
    caps = [data.draw(st.sampled_from([0, 1, 2, max(1, max_size // 2), max_size, max_size + 1, N - 1, N, N + 5,
                                       10**9])) for _ in range(L)]
    caps = [max(c, 0) for c in caps]
    warmup = data.draw(st.integers(0, stream.n_events))
    check_against_old(stream, policy, caps, data.draw(st.sampled_from(["random", "id"])),
                      data.draw(st.integers(0, 50)), warmup)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("N", [8, 64, 70, 129])
@pytest.mark.parametrize("rho", [0.0, 0.05, 0.1, 0.4, 0.75, 1.0])
def test_bitset_kernels_equal_the_old_kernels_at_every_rho(policy, N, rho):
    rng = np.random.default_rng(N)
    stream = random_stream(rng, 3, N, n_steps=120, max_size=min(N, 40), alpha=0.9)
    check_against_old(stream, policy, E.capacities_for_rho(rho, 3, N), seed=3, warmup=17)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(12))
def test_bitset_kernels_equal_the_naive_twin(policy, seed):
    name, _, loop = policy.partition("/")
    rng = np.random.default_rng([seed, 9])
    N = [6, 13, 66, 70][seed % 4]
    L = 1 + seed % 3
    stream = random_stream(rng, L, N, n_steps=25, max_size=min(N, 12), alpha=1.0, min_size=1)
    for caps in ([0] * L, [1] * L, [3] * L, [7] * L, [N] * L, [N + 3] * L, list(range(2, 2 + L))):
        for warmup in (0, 5):
            cfg = ReplayConfig(name, capacity=tuple(caps), tie_break="random", seed=seed, warmup_events=warmup)
            want_sets: list[set[int]] = []
            want = naive.naive_replay(stream, name, capacity=caps, seed=seed, warmup_events=warmup,
                                      hit_sets=want_sets)
            with belady_on(loop or None, RULES[name]):
                result, flags = replay_hits(stream, cfg)
            assert result.hits == want["hits"] and result.demand_misses == want["demand_misses"]
            blocks = stream.block
            got_sets = [set(blocks[lo:hi][flags[lo:hi]].tolist())
                        for lo, hi in zip(stream.offsets[:-1], stream.offsets[1:], strict=True)]
            assert got_sets == want_sets


def test_an_event_larger_than_the_cache_keeps_its_highest_tie_ranks():
    # one layer, N = 70 (two words); the first event (all 70 experts) overflows a cache of 5
    stream = EventStream.from_lists(1, 70, 70, steps=[0, 1], layers=[0, 0], experts=[list(range(70)), list(range(70))],
                                    active=[1, 1])
    result, flags = replay_hits(stream, ReplayConfig("lru", capacity=(5,), tie_break="id"))
    # tie_break="id": lower ids rank higher, so experts 0-4 stay and hit on the second event
    assert result.hits == 5 and flags[70:75].all() and not flags[75:].any()


@pytest.mark.parametrize("policy", POLICIES)
def test_phases_that_leave_residents_unused_for_long(policy):
    # experts 0-9 for 30 steps, then 10-19 for 60 steps, then 0-9 again: Belady's walk over future events
    # runs far ahead while the first phase's blocks are resident, and some are never used again
    rng = np.random.default_rng(4)
    rows = []
    for s in range(120):
        lo = 0 if s < 30 or s >= 90 else 10
        rows.append(sorted(rng.choice(np.arange(lo, lo + 10), size=int(rng.integers(1, 6)), replace=False).tolist()))
    rows.append([25, 26, 27])                                   # blocks seen once, at the very end
    stream = EventStream.from_lists(1, 70, 70, steps=list(range(len(rows))), layers=[0] * len(rows), experts=rows,
                                    active=[1] * len(rows))
    name, _, loop = policy.partition("/")
    for cap in (1, 4, 9, 12, 30):
        check_against_old(stream, policy, [cap], seed=cap)
        want = naive.naive_replay(stream, name, capacity=[cap], seed=cap)
        with belady_on(loop or None, RULES[name]):
            assert replay(stream, ReplayConfig(name, capacity=(cap,), seed=cap)).hits == want["hits"]


def _cyclic_scan(N: int, rounds: int) -> EventStream:
    """One layer, singleton events cycling through all N experts: every kept expert recurs N events ahead."""
    experts = [[j] for _ in range(rounds) for j in range(N)]
    return EventStream.from_lists(1, N, 1, steps=list(range(len(experts))), layers=[0] * len(experts),
                                  experts=experts, active=[1] * len(experts))


def test_the_belady_walk_stops_at_its_budget_on_a_cyclic_scan():
    """A scan makes every walk ~N rows long (over 32 per event): the walk gives up, the heap loop answers."""
    from expertcache.replay import _kernels_bits as KB

    s = _cyclic_scan(256, 20)
    tie = E._tie_ranks("random", 0, 256)
    _, tie_pos = E._tie_order(tie, 1, 256)
    caps = np.array([128], dtype=np.int64)
    z = np.zeros(1, dtype=np.int64)
    assert not KB.replay_belady_walk(s.offsets, s.expert, s.layer, 256, 1, caps, tie_pos, False, 0, z, z.copy(),
                                     np.empty(0, dtype=np.uint8))
    assert KB.replay_belady_walk(s.offsets, s.expert, s.layer, 256, 1, caps, tie_pos, False, 0, z, z.copy(),
                                 np.empty(0, dtype=np.uint8), 10**9)
    for policy in ("belady/walk", "belady-forced/walk", "belady/lanes", "belady-forced/lanes"):
        check_against_old(s, policy, [128])
        name, _, loop = policy.partition("/")
        want = naive.naive_replay(s, name, capacity=[128])
        with belady_on(loop):
            assert replay(s, ReplayConfig(name, capacity=(128,))).demand_misses == want["demand_misses"]


@pytest.mark.parametrize("policy", ["belady", "belady-forced"])
@pytest.mark.parametrize("seed", range(6))
def test_the_heap_fallback_after_an_exhausted_walk_budget_starts_from_scratch(policy, seed, monkeypatch):
    """With a zero budget every walk gives up at its first eviction: counts and flags are still the old kernel's."""
    from expertcache.replay import _kernels_bits as KB

    walk = KB.replay_belady_walk
    monkeypatch.setattr(KB, "replay_belady_walk", lambda *a, **kw: walk(*a, 0, **kw))
    rng = np.random.default_rng(seed)
    s = random_stream(rng, 2, 40, 30, 12)
    for c in (0, 3, 10, 39, 40):
        check_against_old(s, f"{policy}/walk", [c, max(c - 1, 0)], warmup=int(rng.integers(0, 10)))


@pytest.mark.parametrize("loop", ["walk", "lanes"])
def test_reused_belady_inputs_never_serve_another_stream_or_tie_order(loop):
    """Inside engine.reuse_belady_inputs, Belady replays of interleaved streams and tie seeds equal the replays
    outside it (entries match by array identity, and the walk's by tie order), and the scope leaves nothing
    behind: the walk keeps event bitsets, the lanes loop next-use arrays."""
    from expertcache.replay import engine

    a = random_stream(np.random.default_rng(31), 3, 20, 30, 9)
    b = random_stream(np.random.default_rng(32), 3, 20, 30, 9)
    cfgs = [ReplayConfig(p, rho=0.3, seed=s) for p in ("belady", "belady-forced") for s in (0, 1)]
    with belady_on(loop):
        want = {(id(st), c): replay(st, c) for st in (a, b) for c in cfgs}
        with engine.reuse_belady_inputs():
            for st, c in [(a, cfgs[0]), (b, cfgs[0]), (a, cfgs[1]), (a, cfgs[2]), (b, cfgs[3]), (a, cfgs[0])] * 2:
                assert replay(st, c) == want[(id(st), c)]
            kept = engine._REUSED["bitsets" if loop == "walk" else "next"]
            assert len(kept) == 2 and {id(k[0][0]) for k in kept} == {id(a.offsets), id(b.offsets)}
            assert engine._REUSED["next" if loop == "walk" else "bitsets"] == []
    assert engine._REUSED == {"bitsets": [], "next": [], "order": []}


def test_reused_next_uses_follow_the_kept_shuffled_member_order():
    """A sequential-random replay's next uses follow the shuffled member order, which
    engine.reuse_belady_inputs keeps: inside it the order and those next uses are kept (one entry each, the next
    uses keyed by the kept order), sequential-ascending's next uses beside them, and the counts are the replays'
    outside it."""
    from expertcache.replay import engine

    s = random_stream(np.random.default_rng(33), 2, 20, 30, 9)
    cfgs = [ReplayConfig("belady", rho=0.3, semantics=m) for m in ("sequential-random", "sequential-ascending")]
    want = [replay(s, c) for c in cfgs]
    with engine.reuse_belady_inputs():
        assert replay(s, cfgs[0]) == want[0] and len(engine._REUSED["next"]) == 1
        order = engine._REUSED["order"][0][2]
        assert engine._REUSED["next"][0][0][1] is order and order is not s.expert
        assert replay(s, cfgs[0]) == want[0] and len(engine._REUSED["next"]) == 1
        assert replay(s, cfgs[1]) == want[1] and len(engine._REUSED["next"]) == 2
        assert replay(s, cfgs[1]) == want[1] and len(engine._REUSED["next"]) == 2
        assert len(engine._REUSED["order"]) == 1


@pytest.mark.parametrize("direct", [True, False, None])
@pytest.mark.parametrize("seed", range(6))
def test_lru_bitset_loop_with_and_without_each_blocks_bucket(direct, seed):
    """replay_lru_bits keeping each block's bucket (a hit clears its bit in its own bucket) in every layer, in
    none, and in the layers lru_direct names (quotas above 3.5 mean events: here the second and third): events of
    1-8 members, quotas from 0 to beyond N per layer, warm-up; counts and hit flags of replay_lru."""
    from expertcache.replay import _kernels_bits as KB

    rng = np.random.default_rng([seed, 47])
    N = [20, 64, 70, 130][seed % 4]
    stream = random_stream(rng, 3, N, n_steps=150, max_size=8, alpha=0.9)
    for caps in ([2, 40, N + 3], [0, N - 1, N], [5, 17, 1]):
        caps = np.array(caps, dtype=np.int64)
        tie = E._tie_ranks("random", seed, 3 * N)
        _, tie_pos = E._tie_order(tie, 3, N)
        got = [np.zeros(3, np.int64), np.zeros(3, np.int64), np.zeros(stream.union, np.uint8)]
        KB.replay_lru_bits(stream.offsets, stream.expert, stream.layer, N, 3, caps, tie_pos, 11, *got, direct=direct)
        hits, misses, flags = old_kernel(stream, "lru", caps, "random", seed, 11)
        assert got[0].tolist() == hits.tolist() and got[1].tolist() == misses.tolist(), caps
        assert np.array_equal(got[2].astype(bool), flags), caps
    assert KB.lru_direct(stream.offsets, np.array([2, 40, N + 3])).tolist() == [False, True, True]


def test_the_direct_benchmark_times_both_forms_and_checks_them():
    """``benchmarks/lru_direct.py`` runs, checks the counts it times, names the engine's form per row (as
    ``lru_direct`` decides it), prints min and median ratios, and refuses bad arguments in one line."""
    import json

    from conftest import assert_refused, run_benchmark

    from expertcache.replay import _kernels_bits as KB

    r = run_benchmark("lru_direct.py", "--shapes", "4x16x2,2x130x4", "--batches", "1,3", "--rhos", "0.1,0.9",
                      "--accesses", "5000", "--pairs", "2", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["shape"], x["batch"], x["rho"]) for x in rows] == [
        (sh, b, rho) for sh in ("4x16x2", "2x130x4") for b in (1, 3) for rho in (0.1, 0.9)]
    assert all(x["hits_equal"] and x["direct_ns"] > 0 and x["sweep_ns"] > 0 and 0 < x["ratio_min"] <= x["ratio"]
               for x in rows)
    for x in rows:
        words = 1 if x["shape"] == "4x16x2" else 3
        assert x["engine_direct"] == (x["quota_events"] > KB.LRU_DIRECT_QUOTA + KB.LRU_DIRECT_SLOPE * words), x
    assert any(x["engine_direct"] for x in rows) and not all(x["engine_direct"] for x in rows)
    assert_refused("lru_direct.py")
