"""``_kernels_lfru_cands.replay_lfru_cands`` (sequential lfru, global scope) called directly against ``replay_select``.

The kernel keeps residents in dense slots and finds the lowest key among candidates made afresh every few units,
by float32 keys and exact float64 ones near the lowest; every setting of its candidates (a window of one unit,
bounds so tight that the candidates run out at nearly every window, pools past 64 lanes, slots rebased and aged
past the float32 bound) must give the decision of the re-ranking reference exactly: the same hits and misses per
layer and the same hit flags, warm-up, random and id tie ranks.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_lfru_groups import _run, capacity_grid, hot_stream, once_hot_stream, tie_heavy_streams
from test_twin_large import random_stream

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, engine, replay, replay_hits
from expertcache.replay import _kernels_lfru as KL
from expertcache.replay import _kernels_lfru_cands as KC

#: The default settings; a window of one unit; bounds barely above the last leaving key (candidates run out, made
#: again); loose bounds and a long window (more than 64 candidates); slots rebased every 5 units and a candidate
#: at every pass once 7 units old; int64 block records.
SETTINGS = ({}, {"window": 1}, {"up": 1.000001, "many": 1e9}, {"up": 8.0, "many": 1e9, "window": 200},
            {"rebase": 5, "old": 7}, {"wide": True})


def _cands(stream: EventStream, cap: int, tie: np.ndarray, warm: int, expert=None, **kw):
    L = stream.n_layers
    expert = stream.expert if expert is None else expert
    hits = np.zeros(L, dtype=np.int64)
    misses = np.zeros(L, dtype=np.int64)
    flags = np.zeros(stream.union, dtype=np.uint8)
    KC.replay_lfru_cands(stream.offsets, expert, stream.layer, stream.n_experts, L, np.array([cap], dtype=np.int64),
                         tie, warm, hits, misses, flags, **kw)
    return hits, misses, flags


def _check(stream: EventStream, cap: int, tie: np.ndarray, warm: int, settings=SETTINGS, want=None) -> np.ndarray:
    """Every setting against ``replay_select`` (sequential units; or ``want``, its counts and flags computed
    elsewhere); returns the summed trace."""
    if want is None:
        want = _run(KL.replay_select, stream, False, cap, tie, warm)
    total = np.zeros(5, dtype=np.int64)
    for kw in settings:
        trace = np.zeros(5, dtype=np.int64)
        got = _cands(stream, cap, tie, warm, trace=trace, **kw)
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), (cap, warm, kw)
        total += trace
    return total


@pytest.mark.parametrize("seed", range(3))
def test_random_streams_every_capacity(seed):
    """Universes of 1 to 260 blocks, capacities from 0 past the universe, warm-up, random and id tie ranks."""
    trace = np.zeros(5, dtype=np.int64)
    for stream, tie, cap, warm in capacity_grid(seed, 29):
        trace += _check(stream, cap, tie, warm)
    assert (trace > 0).all(), trace     # overflows, sets made, made again, candidates, more than 64 of them


def test_small_random_streams_with_ties():
    """Few blocks and short streams: many equal keys (1/2 = 2/4 ...), so tie ranks decide between candidates
    and between the lowest candidate and the miss."""
    rng = np.random.default_rng(13)
    for stream, tie in tie_heavy_streams(rng, 60):
        L, N = stream.n_layers, stream.n_experts
        for cap in range(0, L * N + 2):
            _check(stream, cap, tie, int(rng.integers(0, 3)) % max(stream.n_events, 1))


def test_long_streams_large_counts_and_old_slots():
    """More than 65,536 units with a few hot blocks reaching counts in the tens of thousands; and one block
    accessed 5,000 times then never again among 3,000 cold ones, which stays resident for over a hundred thousand
    units (past the float32 bound of ``old`` in the last setting)."""
    rng = np.random.default_rng(17)
    stream = hot_stream(rng)
    assert stream.union > 65_536
    tie = engine._tie_ranks("random", 3, stream.n_blocks)
    for cap in (1, 3, 7):
        _check(stream, cap, tie, 100, settings=({}, {"up": 1.000001, "many": 1e9}))
    stream = once_hot_stream(rng)
    tie = engine._tie_ranks("random", 0, stream.n_blocks)
    trace = _check(stream, 1500, tie, 0, settings=({}, {"rebase": 1000, "old": 20_000}))
    assert trace[1] > 0


@pytest.mark.parametrize("seed", range(2))
def test_larger_cache_on_a_skewed_stream(seed):
    """Caches a few hundred blocks deep: the bound settles and the candidates do the work."""
    stream = random_stream(seed, L=8, N=64, k=6, steps=150)
    tie = engine._tie_ranks("random", seed, 8 * 64)
    for cap in (60, 200, 400):
        trace = _check(stream, cap, tie, 0, settings=({},))
        assert trace[0] > 0 and trace[1] > 0


@pytest.mark.parametrize("semantics", ("sequential-ascending", "sequential-random"))
def test_the_engine_takes_this_loop_for_sequential_global_lfru(monkeypatch, semantics):
    """``replay`` / ``replay_hits`` under global scope and one unit per access run this kernel, with
    ``replay_select``'s counts and flags (the members shuffled per event for sequential-random)."""
    calls = []
    real = KC.replay_lfru_cands

    def spy(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(KC, "replay_lfru_cands", spy)
    stream = random_stream(6, L=3, N=20, k=4, steps=40)
    for rho in (0.0, 0.1, 0.4, 1.0):
        cfg = ReplayConfig("lfru", rho=rho, scope="global", semantics=semantics, seed=2, warmup_events=3)
        n = len(calls)
        res = replay(stream, cfg)
        assert len(calls) == n + 1
        tie = engine._tie_ranks("random", 2, stream.n_blocks)
        expert = engine._member_order(stream, semantics, 2)
        cap = engine.total_capacity(rho, stream.n_layers, stream.n_experts)
        hits, misses, flags = _run(KL.replay_select, stream, False, cap, tie, 3, expert)
        assert [x.hits for x in res.per_layer] == hits.tolist()
        assert res.demand_misses == misses.sum()
        if semantics == "sequential-ascending":
            _, hit = replay_hits(stream, cfg)
            assert (hit == flags.astype(bool)).all()
    calls.clear()
    replay(stream, ReplayConfig("lfru", rho=0.2, scope="global", semantics="event-atomic", seed=2))
    assert not calls


def test_strided_experts():
    """A strided member array (a view) gives the same decision as a contiguous copy."""
    stream = random_stream(9, L=2, N=16, k=3, steps=50)
    tie = engine._tie_ranks("random", 1, stream.n_blocks)
    wide = np.zeros((stream.union, 2), dtype=stream.expert.dtype)
    wide[:, 0] = stream.expert
    for cap in (3, 9):
        got = _cands(stream, cap, tie, 0, expert=wide[:, 0])
        want = _run(KL.replay_select, stream, False, cap, tie, 0)
        assert all((a == b).all() for a, b in zip(got, want, strict=True))


def _pool(rng: np.random.Generator, n: int, tb: float, width: int = 192):
    """Candidate arrays of ``n`` entries (float32 copies as ``_make`` writes them: minus the count's reciprocal,
    the last unit), past them ranks of 0: counts and ages near ``2**25``, beyond float32's integers, so that their
    float32 ranks err and cluster."""
    PF = np.zeros(width)
    PL = np.zeros(width)
    QR = np.zeros(width, dtype=np.float32)
    QL = np.zeros(width, dtype=np.float32)
    PB = np.zeros(width, dtype=np.int32)
    c = float(rng.integers(2**25, 2**26))
    for q in range(n):
        age = float(rng.integers(2**25, 2**26))
        f = np.floor(c * (age + 1) / (2**25)) + float(rng.integers(-2, 3))   # keys near c / 2**25
        PF[q], PL[q] = f, tb - age
        QR[q], QL[q] = np.float32(-1.0 / f), np.float32(PL[q] - tb)
        PB[q] = q
    return PF, PL, QR, QL, PB


@pytest.mark.parametrize("n", (1, 5, 8, 13, 33, 64, 65, 150))
def test_the_lowest_candidate_against_every_exact_key(n):
    """``_lowest_entry`` (float32 ranks, then float64 keys near the lowest) returns the entry of lowest ``(float64 key,
    tie rank)`` on pools whose float32 ranks err by a few ulps and tie often, every width of its lanes."""
    rng = np.random.default_rng(n)
    for trial in range(300):
        tb = float(rng.integers(2**27, 2**28))
        PF, PL, QR, QL, PB = _pool(rng, n, tb)
        rec = np.zeros(4 * 192, dtype=np.int32)
        rec[3::4] = rng.permutation(192)
        tf = tb + float(rng.integers(1, 40))
        dead = rng.random(n) < (0.0 if trial % 3 == 0 else 0.5)
        dead[rng.integers(0, n)] = False
        DW = np.zeros(4, dtype=np.uint64)
        for q in np.flatnonzero(dead):
            DW[q >> 6] |= np.uint64(1) << np.uint64(q & 63)
        best, bf, ba = KC._lowest_entry(QR, QL, PF, PL, PB, DW, n, int(n - dead.sum()), tf, tb, rec)
        keys = PF[:n] / (tf - PL[:n])
        want = min(np.flatnonzero(~dead), key=lambda q: (keys[q], rec[4 * q + 3]))
        assert (best, bf / ba) == (want, keys[want]), (trial, n)


def test_entries_that_leave_are_marked_and_their_lanes_taken_again_lowest_first():
    """``_drop`` marks an entry's lane in the dead words (any of 130 lanes) and returns one fewer; ``_free_lane``
    gives the lowest dead lane (its bit cleared), and lane ``n_lanes`` (one more in use) when none is dead."""
    DW = np.zeros(3, dtype=np.uint64)
    n = 130
    for q in (129, 3, 64, 70, 0):
        n = KC._drop(q, n, DW)
    assert n == 125 and [int(w) for w in DW] == [2**0 + 2**3, 2**0 + 2**6, 2**1]
    got = [KC._free_lane(DW, 130) for _ in range(6)]
    assert got == [(0, 130), (3, 130), (64, 130), (70, 130), (129, 130), (130, 131)]
    assert not DW.any() and KC._free_lane(DW, 0) == (0, 1)


def test_the_key_tests_by_products_equal_the_divisions():
    """``_at_most`` and ``_against`` (a product where it decides, else the division) against the float64 key
    ``g / age`` they stand for: bounds at the key, a float64 step either side and drawn; counts equal to the
    product, one either side and drawn; counts and ages from 1 to past ``2**26`` (products past ``2**52``)."""
    rng = np.random.default_rng(5)
    for trial in range(4000):
        hi = (2**8, 2**20, 2**27, 2**40)[trial % 4]
        g, age, f = (float(x) for x in rng.integers(1, hi, 3))
        k = g / age
        for c in (k, np.nextafter(k, 0.0), np.nextafter(k, np.inf), k * rng.uniform(0.5, 2.0), np.inf):
            assert KC._at_most(g, age, c) == (k <= c), (g, age, c)
        for x in (g, f * age, f * age - 1.0, f * age + 1.0):
            want = (f < x / age, f == x / age)
            assert KC._against(f, x, age) == want, (f, x, age)


def test_a_pass_lists_every_slot_at_or_below_the_bound():
    """``_make`` lists every slot whose float64 key at the window's last unit is at most ``c_max``, with ``c_max``
    each slot's own key in turn (the bound's edge), counts past float32's integers included; its words listed both
    ways (``n_last``, the last pass's count: ``bit_positions`` or ``bit_positions_some``)."""
    rng = np.random.default_rng(3)
    n, width, window, t, sbase = 150, 256, 9, 5_000_000, 4_000_000
    f = rng.integers(1, 2**26, n).astype(np.float64)
    last = t - rng.integers(0, 3_000_000, n).astype(np.float64)
    SF = np.zeros(width, dtype=np.float32)
    SL = np.zeros(width, dtype=np.float32)
    SF[:n], SL[:n] = f, last - sbase
    SX = np.zeros(width)
    SX[:n] = last
    SB = np.arange(width, dtype=np.int32)
    rec = np.full(4 * width, -1, dtype=np.int32)
    rec[0::4][:n] = f
    keys = f / (float(t + window) - last)      # at unit t + window - 1
    for c_max, n_last in zip(keys[:40], [0, 1_000] * 20, strict=True):   # (n_last: how its words are listed)
        QR = np.full(width, np.inf, dtype=np.float32)         # stale lanes (150 old entries): reset past the list
        QL = np.full(width, 7.0, dtype=np.float32)
        PF, PL, PB = np.zeros(width), np.zeros(width), np.zeros(width, dtype=np.int32)
        rec[2::4] = -1
        DW = np.full(4, 2**64 - 1, dtype=np.uint64)                # (every old entry had left)
        k = KC._make(t, window, c_max, n, sbase, SF, SL, SX, SB, QR, QL, PF, PL, PB, rec, 150,
                     np.zeros(width, dtype=np.int32), n_last, DW)
        listed = set(PB[:k].tolist())
        assert {int(s) for s in np.flatnonzero(keys <= c_max)} <= listed
        assert all(rec[4 * b + 2] == q for q, b in enumerate(PB[:k]))
        assert (PF[:k] == f[PB[:k]]).all() and (PL[:k] == last[PB[:k]]).all()
        assert (QR[:k] == np.float32(-1.0 / f[PB[:k]])).all() and (QR[k:150] == 0).all() and (QL[k:150] == 0).all()


def test_the_benchmark_prints_a_row_per_rho_and_refuses_bad_arguments():
    """``benchmarks/lfru_cands_vs_groups.py`` times this loop against the frequency groups (their hits asserted
    equal in the script) and prints one row per rho with the loop's nanoseconds per access; bad arguments are
    refused (exit 2, one line saying what was expected)."""
    import re

    from conftest import assert_refused, run_benchmark

    for extra in ([], ["--random"]):
        r = run_benchmark("lfru_cands_vs_groups.py", "--stream", "drifting:30", "--rhos", "0.1,0.6", "--pairs", "1",
                          "--processes", "1", *extra)
        assert r.returncode == 0, r.stderr[-2000:]
        assert ("sequential-random" in r.stdout) == bool(extra), r.stdout
        rows = re.findall(r"rho ([\d.]+)\s*: (\d+\.\d\d) \([\d.]+-[\d.]+\); candidates ([\d.]+) ns an access",
                          r.stdout)
        assert [float(x[0]) for x in rows] == [0.1, 0.6] and all(float(x[1]) > 0 < float(x[2]) for x in rows), r.stdout
    assert_refused("lfru_cands_vs_groups.py", (["--rhos", "2"], ["--stream", "drifting:x"], ["--pairs", "0"]))


#: The settings of the check compiled for other targets: as in use, and loose bounds over a long window.
_WORDS_SETTINGS = ({}, {"up": 8.0, "many": 1e9, "window": 200})


def _words_cases():
    """The cases of :data:`_WORDS_CHECK` (:func:`test_lfru_slots.seeded_cases`)."""
    from test_lfru_slots import seeded_cases

    return seeded_cases(2, 500, (1, 7, 30, 100), L=3, N=40, k=5, steps=120)


_WORDS_CHECK = """
import numpy as np
import sys
import test_lfru_cands as T
from test_lfru_slots import load_wants
from expertcache.replay import _simd as S
assert S._CMP_MOVMSK == (sys.argv[1] == "haswell")
wants = load_wants(sys.argv[2])
for key, stream, cap, tie in T._words_cases():
    T._check(stream, cap, tie, 2, settings=T._WORDS_SETTINGS, want=wants.pop(key))
assert not wants
print("ok")
"""


@pytest.mark.parametrize("cpu", ["generic", "haswell", "skylake-avx512"])
def test_the_words_of_each_vector_width(tmp_path, cpu):
    """The float32 compares' words by a bitcast of the compare (a generic x86-64, or AVX-512) and by one sign-bit
    mask per eight lanes (Haswell's AVX2, :data:`._simd._CMP_MOVMSK`), the kernels compiled afresh for each: the
    counts and flags of ``replay_select``, pools of up to 64 lanes and past them. A form this machine cannot run,
    or whose kernels are its own (the tests in this process run them), is skipped."""
    import subprocess
    import sys

    from test_lfru_slots import named_cpu_env, save_wants

    from expertcache.replay import _simd as S

    env = named_cpu_env(tmp_path, cpu)
    if cpu == "haswell" and S._CMP_MOVMSK:
        pytest.skip("this machine's own kernels build their words by sign-bit masks: this process tests them")
    wants = save_wants(tmp_path / "wants.npz", {key: _run(KL.replay_select, stream, False, cap, tie, 2)
                                                for key, stream, cap, tie in _words_cases()})
    proc = subprocess.run([sys.executable, "-c", _WORDS_CHECK, cpu, wants], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
