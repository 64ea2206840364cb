"""Global-scope ``lrfu`` on a pool of low keys (``replay/_kernels_lrfu_global.py``): the heap loop's decision, counts
and hit flags, by hand and on random streams; the engine runs it for every global lrfu replay."""

from __future__ import annotations

import numpy as np
import pytest
from naive import naive_replay
from test_fast_policies import _any_sizes_stream, counts, naive_counts

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, engine, replay
from expertcache.replay import _kernels_lrfu_global as KLR
from expertcache.replay import _kernels_ranked as KR
from expertcache.replay.keys import KEY_LRFU


def _pool(stream, atomic, cap, tie_pos, lam, warm=0, **sizes):
    L, N = stream.n_layers, stream.n_experts
    out = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    KLR.replay_lrfu_global(stream.offsets, stream.expert, stream.layer, N, L, atomic, np.array([cap]), tie_pos, lam,
                           warm, *out, **sizes)
    return out


def _heap(stream, atomic, cap, tie, lam, warm=0):
    L, N = stream.n_layers, stream.n_experts
    out = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    KR.replay_ranked(stream.offsets, stream.expert, stream.layer, stream.step, N, L, True, atomic,
                     np.array([cap], np.int64), tie, KEY_LRFU, int(L * N).bit_length(), 0, False, lam, warm, *out)
    return out


def test_by_hand_two_layers_one_pool():
    """Two layers of two experts (blocks 0 1 | 2 3), a pool of 2, lam 1, tie positions = ids (the lower leaves first
    among equal keys). Keys ``log2(S) + u`` with ``u`` the unit of the block's layer:

    * ``[0 1]`` (layer 0, u 0): both join, keys 0 and 0.
    * ``[2]`` (layer 1, u 0): key 0; the three tie at 0 and block 0, the lowest position, leaves.
    * ``[1]`` (layer 0, u 1): a hit; S = 1 + 2**-1, key log2(1.5) + 1 = 1.585.
    * ``[3]`` (layer 1, u 1): key 1; block 2 (key 0) leaves.
    * ``[0]`` (layer 0, u 2): S = 1 + 2**-2, key 2.32; block 3 (key 1) leaves.
    * ``[2 3]`` (layer 1, u 2): block 2's S = 1 + 2**-2 (key 2.32, as block 0's), block 3's 1 + 2**-1 (key 2.585);
      block 1 (1.585) leaves, then of blocks 0 and 2, equal at 2.32, block 0 (the lower position).
    * ``[0]`` (layer 0, u 3): a miss; S = 1 + 1.25 * 2**-1, key 3.70; block 2 (2.32) leaves.
    * ``[3]`` (layer 1, u 3): a hit.

    Hits: layer 0 one (the third event), layer 1 one (the last); a warm-up of three events counts the last one only.
    """
    s = EventStream.from_lists(2, 2, 2, [0, 0, 1, 1, 2, 2, 3, 3], [0, 1, 0, 1, 0, 1, 0, 1],
                               [[0, 1], [0], [1], [1], [0], [0, 1], [0], [1]], [1] * 8)
    ident = np.arange(4, dtype=np.int64)
    h, m, f = _pool(s, True, 2, ident, 1.0)
    assert h.tolist() == [1, 1] and m.tolist() == [4, 4]
    assert f.tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 1]
    assert _pool(s, True, 2, ident, 1.0, warm=3)[0].tolist() == [0, 1]
    assert all((a == b).all() for a, b in zip(_heap(s, True, 2, ident, 1.0), (h, m, f), strict=True))   # ranks = ids


@pytest.mark.parametrize("seed", range(3))
def test_random_streams_equal_the_heap_loop(seed):
    """Counts and hit flags of replay_ranked (KEY_LRFU, one global partition) on streams of 1-3 layers whose clocks
    drift apart (a layer skips steps), events of one member to every expert, both semantics, lam 0 / 0.1 / 0.5 / 1,
    pools 0 / 1 / 2 / a third / all but one / all / past all, warm-up, random and id tie ranks; the pool at its
    shipped size and at the smallest (one entry a fill, a side list of one), so that every fill, merge and spill
    runs."""
    rng = np.random.default_rng([seed, 83])
    for trial in range(12):
        s = _any_sizes_stream(rng, 40, 30)
        L, N = s.n_layers, s.n_experts
        nb = L * N
        tie = engine._tie_ranks("random" if trial % 3 else "id", trial, nb)
        tie_pos = np.argsort(np.argsort(tie)).astype(np.int64)
        for atomic in (True, False):
            for lam in (0.0, 0.1, 0.5, 1.0):
                for c in (0, 1, 2, nb // 3, nb - 1, nb, nb + 5):
                    warm = int(rng.integers(0, 3))
                    want = _heap(s, atomic, c, tie, lam, warm)
                    for sizes in ({}, {"run": 1, "side": 1}, {"run": 3, "side": 2}):
                        got = _pool(s, atomic, c, tie_pos, lam, warm, **sizes)
                        assert all((a == b).all() for a, b in zip(got, want, strict=True)), (trial, atomic, lam, c)


def test_a_larger_stream_equals_the_heap_loop():
    """48 layers of 32 experts, batch-sized events (the side list spills into the run, fills guess their
    threshold), event-atomic and sequential, at three pool sizes."""
    from test_twin_large import random_stream

    s = random_stream(5, L=48, N=32, k=4, steps=40)
    nb = s.n_layers * s.n_experts
    tie = engine._tie_ranks("random", 3, nb)
    tie_pos = np.argsort(np.argsort(tie)).astype(np.int64)
    for atomic in (True, False):
        for c in (nb // 20, nb // 5, nb // 2):
            want = _heap(s, atomic, c, tie, 0.5)
            for sizes in ({}, {"run": 16, "side": 4}):
                got = _pool(s, atomic, c, tie_pos, 0.5, **sizes)
                assert all((a == b).all() for a, b in zip(got, want, strict=True)), (atomic, c, sizes)


def test_the_engine_takes_the_pool_and_it_equals_the_twin(monkeypatch):
    """Through the engine, global lrfu runs the pool loop (sequential units where lambda leaves a window past
    ``_kernels_lrfu_window.MAX_WINDOW``, here 0.05; the window loop takes lambda 0.5; event-atomic units on caches
    past the slots loop's bound, ``_kernels_lrfu_slots.SLOTS_BASE`` and ``SLOTS_SLOPE``, set to 0 here so that the
    slots loop takes none) and equals the naive twin in every semantics, with a warm-up and two decays."""
    from conftest import spy_calls
    from test_twin_large import random_stream

    from expertcache.replay import _kernels_lrfu_slots as KLQ
    from expertcache.replay import _kernels_lrfu_window as KLW

    monkeypatch.setattr(KLQ, "SLOTS_BASE", 0.0)
    monkeypatch.setattr(KLQ, "SLOTS_SLOPE", 0.0)
    called = spy_calls(monkeypatch, KLR, "replay_lrfu_global")
    windowed = spy_calls(monkeypatch, KLW, "replay_lrfu_window")
    stream = random_stream(12, L=3, N=24, k=6, steps=20)
    for semantics in ("event-atomic", "sequential-ascending", "sequential-random"):
        for lam in (0.5, 0.05):
            kw = dict(rho=0.3, scope="global", semantics=semantics, seed=4, warmup_events=5, lrfu_lambda=lam)
            got = replay(stream, ReplayConfig("lrfu", **kw))
            want = naive_replay(stream, "lrfu", **kw)
            assert counts(got) == naive_counts(want), (semantics, lam)
    assert (len(called), len(windowed)) == (4, 2)


def test_the_benchmark_script_times_both_loops_and_checks_them():
    """``benchmarks/lrfu_global.py`` runs, checks the counts it times, and refuses bad arguments in one line."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    script = ROOT / "benchmarks" / "lrfu_global.py"

    def run(*args):
        return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)

    r = run("--batches", "1,8", "--rhos", "0.1,0.75", "--accesses", "20000", "--pairs", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["batch"], x["semantics"][:5], x["rho"]) for x in rows] == [
        (b, sem, rho) for b in (1, 8) for sem in ("event", "seque") for rho in (0.1, 0.75)]
    assert all(x["hits_equal"] and x["pool_ns"] > 0 and x["heap_ns"] > 0 for x in rows)
    for args in (["--rhos", "2"], ["--batches", "0"], ["--pairs", "x"]):
        r = run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, args
        assert "expected" in r.stderr.strip().splitlines()[-1], (args, r.stderr)


@pytest.mark.parametrize("seed", range(3))
def test_the_run_sort_orders_by_key_then_tie(seed):
    """``_sort`` (networks on keys with the tie position in their low bits, an exact insertion pass, merges) against
    ``np.lexsort`` on runs of 1 to 300 entries: keys drawn from a few values (long ties), keys one to a few units in
    the last place apart (the packed bits cannot tell them apart, the insertion pass must), and, with more than
    ``2**20`` blocks, the runs of 8 by insertion."""
    rng = np.random.default_rng([seed, 91])
    for n_blocks in (64, 6144, 2**20 + 5):
        for n in (x for x in (1, 2, 7, 63, 64, 65, 130, 300) if x <= n_blocks):
            t = rng.choice(n_blocks, n, replace=False).astype(np.int64)
            kind = rng.integers(3)
            if kind == 0:
                k = rng.choice([0.0, 0.5, 3.25], n)
            elif kind == 1:
                k = np.nextafter(np.full(n, 37.5), np.inf) + rng.integers(0, 4, n) * np.spacing(37.5)
            else:
                k = rng.random(n) * 50
            K = np.full(n_blocks, -1.0)
            K[t] = k
            want = np.lexsort((t, k))
            kk, tt = k.copy(), t.copy()
            KLR._sort(kk, tt, n, np.zeros(n + 64), np.zeros(n + 64, np.int64), K)
            assert tt.tolist() == t[want].tolist() and kk.tolist() == k[want].tolist(), (n_blocks, n, kind)
