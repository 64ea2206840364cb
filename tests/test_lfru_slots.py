"""``_kernels_lfru_slots.replay_lfru_slots`` (event-atomic lfru, small global caches) against ``replay_select``.

The kernel keeps the residents in dense slots and decides each overflowing event with two exact (dyadic) cuts
from one vector pass, a band sorted by a network (a quickselect past 64) and tie ranks among equal keys; the
decision, the per-layer hits and misses and the hit flags must be those of the re-ranking reference exactly.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from test_fast_policies import _skewed_stream
from test_lfru_groups import tie_heavy_streams
from test_twin_large import random_stream

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, engine, replay, replay_hits
from expertcache.replay import _kernels_lfru as KL
from expertcache.replay import _kernels_lfru_slots as KS


def _run(kernel, stream: EventStream, cap: int, tie: np.ndarray, warm: int):
    L = stream.n_layers
    hits = np.zeros(L, dtype=np.int64)
    misses = np.zeros(L, dtype=np.int64)
    flags = np.zeros(stream.union, dtype=np.uint8)
    caps = np.array([cap], dtype=np.int64)
    if kernel is KL.replay_select:
        kernel(stream.offsets, stream.expert, stream.layer, stream.n_experts, L, True, True, caps, tie, warm, hits,
               misses, flags)
    else:
        kernel(stream.offsets, stream.expert, stream.layer, stream.n_experts, L, caps, tie, warm, hits, misses, flags)
    return hits, misses, flags


def _check(stream: EventStream, cap: int, tie: np.ndarray, warm: int, old_age: float | None = None,
           want=None) -> None:
    """The slots loop against ``replay_select`` (or ``want``, its counts and flags computed elsewhere), four ways: as
    in use; the high cut alone in the vector pass at any size (``one_cut_words=0``) over every slot; the same over
    candidates at any size (``cand_words=0``); and over candidates made afresh every 3 events with the units' base
    moved every 7 (every 2**15 in use)."""
    if want is None:
        want = _run(KL.replay_select, stream, cap, tie, warm)
    ages = {} if old_age is None else {"old_age": old_age}
    for one_cut, cand_words, cand_k, rebase in ((None, None, None, None), (0, -1, None, None), (0, 0, None, None),
                                                (0, 0, 3, 7)):
        got = _run(partial(KS.replay_lfru_slots, one_cut_words=one_cut, cand_words=cand_words, cand_k=cand_k,
                           rebase=rebase, **ages), stream, cap, tie, warm)
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), \
            (cap, warm, old_age, one_cut, cand_words, cand_k, rebase)


@pytest.mark.parametrize("seed", range(4))
def test_random_streams_every_capacity(seed):
    """Universes of 1 to 260 blocks, capacities from 0 past the universe (first overflows wider than 64 slots:
    the quickselect), warm-up, random and id tie ranks (equal keys f / age, tie ranks deciding)."""
    rng = np.random.default_rng([seed, 29])
    for L, N, steps in ((1, 1, 30), (3, 7, 60), (2, 64, 200), (4, 33, 300), (2, 130, 120), (3, 40, 300)):
        stream = random_stream(seed * 100 + L * N, L=L, N=N, k=min(N, 5), steps=steps)
        tie = engine._tie_ranks("random" if rng.random() < 0.6 else "id", seed, L * N)
        n = L * N
        for cap in sorted({0, 1, 2, 3, 5, n // 4, n // 2, n - 1, n, 3 * n}):
            for warm in (0, 7):
                _check(stream, cap, tie, warm)


def test_caches_of_many_words_list_only_the_words_holding_slots():
    """From SPARSE_WORDS words of slots on, the band and the leaving slots are listed from a summary bit per word;
    caches of 2,050-2,900 slots (33-46 words) with events of up to 480 members, so that both lists span many
    words, have replay_select's counts and flags, also with the float64 test on most lanes."""
    stream = random_stream(41, L=2, N=1500, k=60, steps=120)
    tie = engine._tie_ranks("random", 2, stream.n_blocks)
    assert stream.union / stream.n_events > 100
    for cap in (KS.SPARSE_WORDS * 64 + 2, 2400, 2900):
        _check(stream, cap, tie, 3)
    _check(stream, 2400, tie, 0, 3.0)


@pytest.mark.parametrize("old_age", [1.0, 3.0, 40.0])
def test_lanes_past_the_age_bound_decided_exactly(old_age):
    """The float32 cut pass leaves lanes whose age reaches a bound (2**16 in use, where an 8-bit cut's product
    can round) to an exact float64 test; with the bound lowered to 1, 3 or 40 most or many lanes take that test
    at every cut, and the counts and flags are still ``replay_select``'s."""
    rng = np.random.default_rng([int(old_age), 5])
    for L, N, steps in ((2, 64, 200), (4, 33, 300), (3, 40, 300)):
        stream = random_stream(int(old_age) * 7 + L * N, L=L, N=N, k=min(N, 5), steps=steps)
        tie = engine._tie_ranks("random" if rng.random() < 0.6 else "id", 3, L * N)
        n = L * N
        for cap in (1, 5, n // 4, n // 2, n - 1):
            _check(stream, cap, tie, 0, old_age)
    stream = _skewed_stream(4, 128, 400, 8, 128)
    _check(stream, 100, engine._tie_ranks("random", 1, 512), 0, old_age)


def test_small_streams_with_many_ties():
    """Few blocks, short streams: keys equal across counts and ages (1/2 = 2/4 ...) at nearly every overflow."""
    rng = np.random.default_rng(13)
    for stream, tie in tie_heavy_streams(rng, 60):
        for cap in range(0, stream.n_blocks + 2):
            _check(stream, cap, tie, int(rng.integers(0, 3)) % max(stream.n_events, 1))


def test_wide_bands_with_equal_keys():
    """Events of 60-80 blocks into caches of 70-130: whole first overflows and later wide bands go past the
    64-lane network to the quickselect, with dozens of equal keys (one count, one age) at the cut, so the tie
    ranks decide which of them leave there too."""
    rng = np.random.default_rng(41)
    N = 200
    for trial in range(6):
        experts, steps = [], []
        for s in range(12):
            experts.append(np.sort(rng.choice(N, int(rng.integers(60, 81)), replace=False)))
            steps.append(s)
        stream = EventStream.from_lists(1, N, 8, steps, [0] * len(steps), experts, [10] * len(steps))
        tie = engine._tie_ranks("random" if trial % 2 else "id", trial, N)
        for cap in (70, 100, 130):
            _check(stream, cap, tie, 0)


@pytest.mark.parametrize("N", (16, 128, 200))
def test_long_skewed_streams(N):
    """Popularity that drifts over 800 steps: the cuts follow the m-th key as it moves, bands narrow and widen,
    capacities from 2% to 60% of the universe."""
    stream = _skewed_stream(4, N, 800, 8, N)
    tie = engine._tie_ranks("random", 1, 4 * N)
    for rho in (0.02, 0.1, 0.3, 0.6):
        _check(stream, max(1, int(rho * 4 * N)), tie, 0)


def _spy_slots(monkeypatch) -> list[int]:
    """Record the capacity of every call the engine makes to the slots loop (the loop still runs)."""
    calls = []
    real = KS.replay_lfru_slots

    def spy(*args):
        calls.append(int(args[5][0]))
        return real(*args)

    monkeypatch.setattr(KS, "replay_lfru_slots", spy)
    return calls


def test_slots_per_member_grows_with_the_stream():
    """The engine's bound is SLOTS_PER_MEMBER up to SLOTS_BASE_EVENTS events per layer, then linear up to
    SLOTS_PER_MEMBER_LONG at SLOTS_LONG_EVENTS, flat beyond (worked by hand: 150 + 175 * 650 / 4550 = 175 at
    1,300 events, 150 + 175 * 1950 / 4550 = 225 at 2,600)."""
    assert KS.slots_per_member(1) == KS.slots_per_member(650) == KS.SLOTS_PER_MEMBER == 150
    assert abs(KS.slots_per_member(1300) - 175.0) < 1e-9 and abs(KS.slots_per_member(2600) - 225.0) < 1e-9
    assert KS.slots_per_member(5200) == KS.slots_per_member(52000) == KS.SLOTS_PER_MEMBER_LONG == 325


def test_the_engine_takes_slots_for_larger_caches_on_longer_streams(monkeypatch):
    """A cache of 200 blocks per mean member (above SLOTS_PER_MEMBER, below the bound of about 223 at the stream's
    2,558 events per layer) replays on the slots, with replay_select's counts."""
    calls = _spy_slots(monkeypatch)
    stream = random_stream(9, L=1, N=1024, k=1, steps=3000)
    mean = stream.union / stream.n_events
    per_layer = stream.n_events / stream.n_layers
    assert per_layer > 2500 and KS.slots_per_member(per_layer) > 201
    cap = int(200 * mean)
    assert KS.SLOTS_PER_MEMBER * mean < cap <= KS.slots_per_member(per_layer) * mean
    cfg = ReplayConfig("lfru", capacity=cap, scope="global", seed=3)
    res = replay(stream, cfg)
    assert calls == [cap]
    hits, misses, _ = _run(KL.replay_select, stream, cap, engine._tie_ranks("random", 3, stream.n_blocks), 0)
    assert res.hits == hits.sum() and res.demand_misses == misses.sum()


def test_the_engine_takes_slots_for_small_event_atomic_caches(monkeypatch):
    """Global event-atomic lfru with a cache of at most ``slots_per_member`` blocks per mean event member
    replays here (same counts and flags as ``replay_select``); larger caches and sequential units do not (the
    bound lowered to 20 blocks per member, so that the largest cache here is past it)."""
    calls = _spy_slots(monkeypatch)
    monkeypatch.setattr(KS, "SLOTS_PER_MEMBER", 20)
    stream = random_stream(8, L=4, N=32, k=3, steps=60)
    mean = stream.union / stream.n_events
    for rho in (0.05, 0.3, 0.95):
        cfg = ReplayConfig("lfru", rho=rho, scope="global", seed=4, warmup_events=2)
        cap = engine.total_capacity(rho, stream.n_layers, stream.n_experts)
        before = len(calls)
        res = replay(stream, cfg)
        bound = KS.slots_per_member(stream.n_events / stream.n_layers) * mean
        assert (len(calls) > before) == (cap <= bound), (rho, cap, mean)
        hits, misses, flags = _run(KL.replay_select, stream, cap, engine._tie_ranks("random", 4, stream.n_blocks), 2)
        assert res.hits == hits.sum() and res.demand_misses == misses.sum()
        _, hit = replay_hits(stream, cfg)
        assert (hit == flags.astype(bool)).all()
    before = len(calls)
    replay(stream, ReplayConfig("lfru", rho=0.05, scope="global", semantics="sequential-ascending"))
    assert len(calls) == before


#: Haswell's features as numba takes them (with a CPU name set, numba and ``_simd._has_feature`` read these).
_HASWELL = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,+popcnt,+sse,+sse2,+sse3,"
            "+sse4.1,+sse4.2,+ssse3,+xsave")

#: Skylake-X's: AVX-512 without VBMI2, on a core taken to have fast gathers (``_simd.FAST_GATHERS``).
_SKYLAKE_X = _HASWELL + ",+avx512f,+avx512bw,+avx512cd,+avx512dq,+avx512vl"


def skip_unless_host_runs(features: str) -> None:
    """Skip a check that compiles for a named CPU (its ``features``, as :data:`_HASWELL`) where this machine cannot
    run that code (a machine without AVX-512 stops the process at the first AVX-512 instruction)."""
    import llvmlite.binding as llvm

    have = llvm.get_host_cpu_features()
    missing = [f[1:] for f in features.split(",") if not have.get(f[1:], False)]
    if missing:
        pytest.skip(f"this machine cannot run code compiled with {', '.join(missing)}")


def named_cpu_env(tmp_path, cpu: str) -> dict[str, str]:
    """The environment of a subprocess whose kernels compile afresh (a numba cache under ``tmp_path``) for ``cpu``:
    ``generic`` (x86-64), ``haswell`` (:data:`_HASWELL`) or ``skylake-avx512`` (:data:`_SKYLAKE_X`), with this
    directory on the path. Skipped on a machine other than x86-64, or one that cannot run that code."""
    import os
    import platform
    from pathlib import Path

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the targets named here are x86-64's")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    env.update(NUMBA_CPU_NAME=cpu, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")])))
    if cpu != "generic":
        env["NUMBA_CPU_FEATURES"] = _HASWELL if cpu == "haswell" else _SKYLAKE_X
        skip_unless_host_runs(env["NUMBA_CPU_FEATURES"])
    return env


def skip_where_host_runs_the_haswell_forms(need_fma: bool) -> None:
    """Skip a check compiled for Haswell where this machine's own kernels are those forms (no AVX-512; with FMA
    where ``need_fma``, the forms of checks whose passes fuse with it): the tests in its own process run them."""
    from expertcache.replay import _simd as S

    if not S.WIDE_VECTORS and (S.HAS_FMA or not need_fma):
        pytest.skip("this machine's own kernels are the Haswell forms: the tests in this process run them")


def seeded_cases(seeds: int, base: int, caps: tuple[int, ...], **shape):
    """(key, stream, capacity, tie ranks) of a check compiled for other targets: ``seeds`` random streams
    (``random_stream(base + seed, **shape)``, random tie ranks of that seed), each at every capacity of ``caps``."""
    for seed in range(seeds):
        stream = random_stream(base + seed, **shape)
        tie = engine._tie_ranks("random", seed, stream.n_blocks)
        for cap in caps:
            yield f"{seed}-{cap}", stream, cap, tie


def _generic_cases():
    """The cases of :data:`_GENERIC_CHECK`."""
    return seeded_cases(3, 300, (1, 9, 40, 150), L=3, N=70, k=6, steps=150)


def save_wants(path, wants: dict) -> str:
    """Write the reference's counts and flags (``key -> arrays``), computed in this process, whose kernels are
    compiled for this machine and cached, for a subprocess whose kernels compile afresh for another target: it
    compiles only the kernels under test. Returns the file's path as a string."""
    np.savez(path, **{f"{key}/{i}": a for key, arrays in wants.items() for i, a in enumerate(arrays)})
    return str(path)


def load_wants(path: str) -> dict:
    """``key -> [arrays]`` as :func:`save_wants` wrote them."""
    parts: dict = {}
    with np.load(path) as z:
        for name in z.files:
            key, i = name.rsplit("/", 1)
            parts.setdefault(key, {})[int(i)] = z[name]
    return {key: [d[i] for i in range(len(d))] for key, d in parts.items()}


_GENERIC_CHECK = """
import numpy as np
import test_lfru_slots as T
from expertcache.replay import _simd as S
import sys
avx512 = sys.argv[1] == "skylake-avx512"
assert S.bit_positions is (S._bit_positions_avx512 if avx512 else S._bit_positions_few)
assert S.bit_positions_dense is (S._bit_positions_avx512 if avx512 else S._bit_positions_bytes)
assert S.HAS_FMA == (sys.argv[1] != "generic")
assert S.FAST_GATHERS == avx512 and S.cut_list1_32_fma is S._cut_list1_32_fma_any
assert S.cut_list1_32_fma_dense is S._cut_list1_32_fma_any_dense
wants = T.load_wants(sys.argv[2])
for key, stream, cap, tie in T._generic_cases():
    T._check(stream, cap, tie, 3, want=wants.pop(key))
assert not wants
print("ok")
"""


@pytest.mark.parametrize("cpu", ["generic", "haswell", "skylake-avx512"])
def test_the_slots_without_avx512(tmp_path, cpu):
    """On a machine without AVX-512 (numba compiling for a generic x86-64, or for Haswell's AVX2 and FMA; the
    kernels afresh) the band's and the leaving slots' lists come from the byte table (a word of few slots by
    unrolled steps; the candidates' listing by the table alone), the passes are fused (and the candidates taken)
    only with FMA, and the counts and flags are still ``replay_select``'s. With
    AVX-512 but not VBMI2 (Skylake-X), the list split by gathers (``split_low16``, where an AMD core splits one slot
    at a time) and the one-cut pass's mask listed apart: the same counts and flags. Haswell's form is skipped on a
    machine without AVX-512 that has FMA: its own kernels are that form, and the tests in this process run them."""
    import subprocess
    import sys

    env = named_cpu_env(tmp_path, cpu)
    if cpu == "haswell":
        skip_where_host_runs_the_haswell_forms(need_fma=True)
    wants = save_wants(tmp_path / "wants.npz", {key: _run(KL.replay_select, stream, cap, tie, 3)
                                                for key, stream, cap, tie in _generic_cases()})
    proc = subprocess.run([sys.executable, "-c", _GENERIC_CHECK, cpu, wants], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_streams_past_the_float32_bound_go_to_the_groups(monkeypatch):
    """The loop keeps counts and units as float32 (exact below ``MAX_EVENTS``): a longer stream is refused by the
    kernel and replayed by the frequency groups, with the same counts."""
    stream = random_stream(4, L=3, N=16, k=3, steps=40)
    cfg = ReplayConfig("lfru", rho=0.1, scope="global")
    want = replay(stream, cfg)
    monkeypatch.setattr(KS, "MAX_EVENTS", stream.n_events)
    with pytest.raises(ValueError, match="float32"):
        _run(KS.replay_lfru_slots, stream, 4, engine._tie_ranks("id", 0, stream.n_blocks), 0)
    calls = []
    monkeypatch.setattr(KS, "replay_lfru_slots", lambda *a: calls.append(1))
    got = replay(stream, cfg)
    assert not calls and got.hits == want.hits and got.demand_misses == want.demand_misses


def test_caches_past_32000_slots_keep_int32_slots():
    """Up to 32,000 slots a block's slot is kept as int16, past it as int32: a cache of 31,500 blocks whose first
    overflowing events bring 2,000 new blocks each (slots past int16's 32,767 taken) decides as the reference
    does."""
    rng = np.random.default_rng(31)
    L, N = 2, 20_000                                # expert ids are int16: two layers for 40,000 blocks
    events = [list(range(2_000 * (i // L), 2_000 * (i // L + 1))) for i in range(L * 10)]    # every block new
    events += [sorted(rng.choice(N, size=2_000, replace=False).tolist()) for _ in range(L * 20)]
    n = len(events)
    stream = EventStream.from_lists(L, N, 8, [i // L for i in range(n)], [i % L for i in range(n)], events, [250] * n)
    tie = engine._tie_ranks("random", 3, L * N)
    want = _run(KL.replay_select, stream, 31_500, tie, 5)
    assert want[1].sum() > 0
    got = _run(KS.replay_lfru_slots, stream, 31_500, tie, 5)
    assert all((a == b).all() for a, b in zip(got, want, strict=True))


def test_strided_experts_and_flags():
    """The member loop reads the experts through their data pointer: a strided view of them (every other element
    of a longer array) decides as the contiguous array does; a strided hit-flag array, which it would write
    through a pointer, is refused with a clear error."""
    stream = _skewed_stream(3, 40, 120, 5, 40)
    L = stream.n_layers
    tie = engine._tie_ranks("random", 3, L * stream.n_experts)
    caps = np.array([30], dtype=np.int64)
    want = _run(KS.replay_lfru_slots, stream, 30, tie, 2)
    strided = np.repeat(stream.expert, 2)[::2]
    assert not strided.flags.c_contiguous and (strided == stream.expert).all()
    hits = np.zeros(L, dtype=np.int64)
    misses = np.zeros(L, dtype=np.int64)
    flags = np.zeros(stream.union, dtype=np.uint8)
    KS.replay_lfru_slots(stream.offsets, strided, stream.layer, stream.n_experts, L, caps, tie, 2, hits, misses,
                         flags)
    assert all((a == b).all() for a, b in zip((hits, misses, flags), want, strict=True))
    with pytest.raises(ValueError, match="hit_flag must be C-contiguous"):
        KS.replay_lfru_slots(stream.offsets, stream.expert, stream.layer, stream.n_experts, L, caps, tie, 2, hits,
                             misses, np.zeros(2 * stream.union, dtype=np.uint8)[::2])


def test_the_candidates_benchmark_prints_each_caches_words_and_the_engines_choice():
    """``benchmarks/lfru_slots_vs_groups.py --cands`` times the slots loop with candidates at any size against the
    loop without them (their counts asserted equal in the script), and names each cache's words of slots (the loop's
    ``ceil((c + widest event) / 64)``) and whether the engine takes the candidates there (``CAND_WORDS``, which
    depends on the vector width); bad arguments are refused (exit 2, one line saying what was expected)."""
    import re

    from conftest import assert_refused, run_benchmark

    r = run_benchmark("lfru_slots_vs_groups.py", "--stream", "drifting:30", "--bpm", "20,40", "--pairs", "1",
                      "--processes", "1", "--cands")
    assert r.returncode == 0, r.stderr[-2000:]
    n_events, union, widest = (int(x) for x in re.search(r"(\d+) events \(\d+ per layer\), (\d+) union accesses, "
                                                         r"mean event [\d.]+, widest (\d+);", r.stdout).groups())
    mean = union / n_events
    rows = re.findall(r"(\d+\.\d) blocks per member \((\d+) words of slots; the engine: (candidates|every slot)\): "
                      r"(\d+\.\d\d) \(", r.stdout)
    assert [float(b) for b, *_ in rows] == [20.0, 40.0], r.stdout
    for bpm, words, choice, ratio in rows:
        want = (int(float(bpm) * mean) + widest + 63) // 64
        assert int(words) == want and (choice == "candidates") == (want >= KS.CAND_WORDS) and float(ratio) > 0
    assert_refused("lfru_slots_vs_groups.py", (["--bpm", "0,2"], ["--stream", "drifting:x"], ["--stream", "routed:4x8"],
                                               ["--pairs", "0"]))
