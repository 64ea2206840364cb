"""``_kernels_lfru_groups.replay_lfru_groups`` (lfru, global scope) called directly against ``replay_select``.

The kernel keeps residents in frequency groups, a pool of the low keys and a timing wheel; every path of its
threshold (the cut holding too few, a full ranking raising ``theta``, a large pool lowering it, tie ranks
deciding at the ``m``-th key, groups filed far ahead and re-filed) must give the decision of the re-ranking
reference exactly: the same hits and misses per layer and the same hit flags, both semantics, warm-up.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_twin_large import random_stream

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, engine, replay, replay_hits
from expertcache.replay import _kernels_lfru as KL
from expertcache.replay import _kernels_lfru_groups as KG

#: The default tunings (event-atomic, sequential), a threshold moved at nearly every unit, one kept far above the
#: keys, and one kept below them (every overflowing unit ranked in full).
TUNES = (KG.TUNE, KG.TUNE_SEQ, (0, 0, 1.0001, 1.0001, 1.0001), (8, 8, 3.0, 3.0, 1.5), (0, 0, 0.5, 0.9, 0.5))


def _run(kernel, stream: EventStream, atomic: bool, cap: int, tie: np.ndarray, warm: int, expert=None, **kw):
    L = stream.n_layers
    expert = stream.expert if expert is None else expert
    hits = np.zeros(L, dtype=np.int64)
    misses = np.zeros(L, dtype=np.int64)
    flags = np.zeros(stream.union, dtype=np.uint8)
    caps = np.array([cap], dtype=np.int64)
    if kernel is KL.replay_select:
        kernel(stream.offsets, expert, stream.layer, stream.n_experts, L, True, atomic, caps, tie, warm,
               hits, misses, flags)
    else:
        kernel(stream.offsets, expert, stream.layer, stream.n_experts, L, atomic, caps, tie, warm,
               hits, misses, flags, **kw)
    return hits, misses, flags


def _check(stream: EventStream, atomic: bool, cap: int, tie: np.ndarray, warm: int, tunes=TUNES) -> np.ndarray:
    """Every tuning against ``replay_select``; returns the summed trace."""
    want = _run(KL.replay_select, stream, atomic, cap, tie, warm)
    total = np.zeros(6, dtype=np.int64)
    for tune in tunes:
        trace = np.zeros(6, dtype=np.int64)
        got = _run(KG.replay_lfru_groups, stream, atomic, cap, tie, warm, tune=tune, trace=trace)
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), (atomic, cap, warm, tune)
        total += trace
    return total


def capacity_grid(seed: int, salt: int):
    """Random streams over universes of 1 to 260 blocks (not a whole number of 64-bit words), each with its tie
    ranks (random or id), capacities from 0 past the universe and warm-ups of 0 and 7 events:
    ``(stream, tie, cap, warm)``."""
    rng = np.random.default_rng([seed, salt])
    for L, N, steps in ((1, 1, 30), (3, 7, 60), (2, 64, 120), (4, 33, 150), (2, 130, 80)):
        stream = random_stream(seed * 100 + L * N, L=L, N=N, k=min(N, 5), steps=steps)
        tie = engine._tie_ranks("random" if rng.random() < 0.7 else "id", seed, L * N)
        n = L * N
        for cap in sorted({0, 1, 2, 3, n // 4, n // 2, n - 1, n, 3 * n}):
            for warm in (0, 7):
                yield stream, tie, cap, warm


@pytest.mark.parametrize("seed", range(4))
def test_random_streams_every_capacity(seed):
    """Universes of 1 to 260 blocks (not a whole number of 64-bit words), capacities from 0 past the universe,
    warm-up, both semantics, random and id tie ranks."""
    trace = np.zeros(6, dtype=np.int64)
    for stream, tie, cap, warm in capacity_grid(seed, 23):
        for atomic in (True, False):
            trace += _check(stream, atomic, cap, tie, warm)
    assert (trace[:5] > 0).all(), trace     # every path of the threshold was taken


def tie_heavy_streams(rng: np.random.Generator, n: int):
    """``n`` streams of few blocks and steps, each with its tie ranks (id or random): many equal lfru keys
    (1/2 = 2/4 ...), so tie ranks decide at the m-th key."""
    for trial in range(n):
        L = int(rng.integers(1, 4))
        N = int(rng.integers(1, 10))
        k = int(rng.integers(1, N + 1))
        rows = [(s, l) for s in range(int(rng.integers(1, 40))) for l in range(L) if rng.random() < 0.8] or [(0, 0)]
        experts = [sorted(rng.choice(N, int(rng.integers(1, k + 1)), replace=False).tolist()) for _ in rows]
        stream = EventStream.from_lists(L, N, k, [r[0] for r in rows], [r[1] for r in rows], experts,
                                        [1] * len(rows))
        yield stream, engine._tie_ranks(str(rng.choice(["id", "random"])), trial, L * N)


def test_small_random_streams_with_ties():
    """Few blocks and short streams: many equal keys (1/2 = 2/4 ...), so tie ranks decide at the m-th key."""
    rng = np.random.default_rng(7)
    trace = np.zeros(6, dtype=np.int64)
    for stream, tie in tie_heavy_streams(rng, 60):
        L, N = stream.n_layers, stream.n_experts
        for cap in range(0, L * N + 2):
            for atomic in (True, False):
                trace += _check(stream, atomic, cap, tie, int(rng.integers(0, 3)) % max(stream.n_events, 1))
    assert trace[4] > 0, trace


def hot_stream(rng: np.random.Generator) -> EventStream:
    """72,000 events over 2 x 6 blocks, two members each drawn from skewed weights: a few blocks reach counts in
    the tens of thousands."""
    L, N = 2, 6
    w = np.array([0.5, 0.25, 0.12, 0.07, 0.04, 0.02])
    rows = [(s, layer) for s in range(36_000) for layer in range(L)]
    experts = [np.unique(rng.choice(N, size=2, p=w)).tolist() for _ in rows]
    return EventStream.from_lists(L, N, 2, [r[0] for r in rows], [r[1] for r in rows], experts, [1] * len(rows))


def once_hot_stream(rng: np.random.Generator) -> EventStream:
    """150,000 one-member events of one layer of 3,000 blocks: block 0 the first 5,000 times, then random cold
    ones."""
    N, n_ev = 3000, 150_000
    experts = [[0]] * 5000 + [[int(x)] for x in rng.integers(1, N, n_ev - 5000)]
    return EventStream.from_lists(1, N, 1, list(range(n_ev)), [0] * n_ev, experts, [1] * n_ev)


def test_long_streams_large_counts_and_far_groups():
    """More than 65,536 units: a few hot blocks reaching counts in the tens of thousands; and a block accessed
    5,000 times then never again among 3,000 cold ones, whose group waits in the wheel's far list (due hundreds
    of thousands of units ahead) and is re-filed each time that list is swept."""
    rng = np.random.default_rng(11)
    stream = hot_stream(rng)
    assert stream.n_events > 65_536
    tie = engine._tie_ranks("random", 3, stream.n_blocks)
    for cap in (1, 3, 7):
        for atomic in (True, False):
            _check(stream, atomic, cap, tie, 100, tunes=(KG.TUNE, (0, 0, 0.5, 0.9, 0.5)))
    stream = once_hot_stream(rng)
    tie = engine._tie_ranks("random", 0, stream.n_blocks)
    for atomic in (True, False):
        trace = _check(stream, atomic, 1500, tie, 0, tunes=(KG.TUNE,))
        assert trace[5] > 0, trace


@pytest.mark.parametrize("seed", range(2))
def test_larger_cache_on_a_skewed_stream(seed):
    """A pool a few hundred blocks deep: the threshold settles, the cut and the pool do the work."""
    stream = random_stream(seed, L=8, N=64, k=6, steps=150)
    tie = engine._tie_ranks("random", seed, 8 * 64)
    for cap in (60, 200, 400):
        for atomic in (True, False):
            trace = _check(stream, atomic, cap, tie, 0, tunes=(KG.TUNE,))
            assert trace[0] > 0


def test_int64_node_records():
    """``wide=True`` keeps the node records in int64, as streams past ``_NARROW_UNITS`` units do: the same
    decisions, every tuning, both semantics."""
    for seed in range(2):
        stream = random_stream(seed + 40, L=3, N=20, k=4, steps=80)
        tie = engine._tie_ranks("random", seed, stream.n_blocks)
        for cap in (1, 5, 20, 45):
            for atomic in (True, False):
                want = _run(KL.replay_select, stream, atomic, cap, tie, 3)
                for tune in TUNES:
                    got = _run(KG.replay_lfru_groups, stream, atomic, cap, tie, 3, tune=tune, wide=True)
                    assert all((a == b).all() for a, b in zip(got, want, strict=True)), (atomic, cap, tune)


@pytest.mark.parametrize("semantics", ("event-atomic", "sequential-ascending", "sequential-random"))
def test_the_engine_dispatches_global_lfru_here(semantics):
    """``replay`` / ``replay_hits`` under global scope give ``replay_select``'s counts and flags (any rho,
    warm-up): this kernel's, for small event-atomic caches ``_kernels_lfru_slots``'s, and for sequential units
    ``_kernels_lfru_cands``'s."""
    stream = random_stream(5, L=3, N=20, k=4, steps=40)
    for rho in (0.0, 0.1, 0.4, 1.0):
        cfg = ReplayConfig("lfru", rho=rho, scope="global", semantics=semantics, seed=2, warmup_events=3)
        res = replay(stream, cfg)
        tie = engine._tie_ranks("random", 2, stream.n_blocks)
        expert = engine._member_order(stream, semantics, 2)       # shuffled per event for sequential-random
        cap = engine.total_capacity(rho, stream.n_layers, stream.n_experts)
        hits, misses, flags = _run(KL.replay_select, stream, semantics == "event-atomic", cap, tie, 3, expert)
        assert res.hits == hits.sum() and res.demand_misses == misses.sum()
        assert [x.hits for x in res.per_layer] == hits.tolist()
        if semantics != "sequential-random":
            _, hit = replay_hits(stream, cfg)
            assert (hit == flags.astype(bool)).all()


def test_the_tuning_benchmark_times_both_tunings_and_checks_them():
    """``benchmarks/lfru_groups_tune.py`` runs both pool tunings on the same streams, checks that their hits agree,
    and prints one row per batch, semantics and rho."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lfru_groups_tune.py"), "--batches", "1,8",
                        "--rhos", "0.2", "--accesses", "20000", "--pairs", "1", "--semantics", "both", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["batch"], x["semantics"][:5]) for x in rows] == [(1, "event"), (1, "seque"), (8, "event"), (8, "seque")]
    assert all(x["hits_equal"] and x["tune_ns"] > 0 and x["tune_seq_ns"] > 0 for x in rows)
