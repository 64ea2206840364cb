"""Event-atomic global ``lrfu`` on dense slots (``replay/_kernels_lrfu_slots.py``): the heap loop's decision, counts and
hit flags, by hand and on random streams, and the pool loop's on larger ones; the engine runs it for small caches."""

from __future__ import annotations

import numpy as np
import pytest
from naive import naive_replay
from test_fast_policies import _any_sizes_stream, counts, naive_counts
from test_lrfu_global import _heap, _pool

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, engine, replay
from expertcache.replay import _kernels_lrfu_global as KLR
from expertcache.replay import _kernels_lrfu_slots as KLQ


def _slots(stream, cap, tie_pos, lam, warm=0, **kw):
    L, N = stream.n_layers, stream.n_experts
    out = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    KLQ.replay_lrfu_slots(stream.offsets, stream.expert, stream.layer, N, L, np.array([cap]), tie_pos, lam, warm,
                          *out, **kw)
    return out


def _same(a, b):
    return all((x == y).all() for x, y in zip(a, b, strict=True))


def test_by_hand_two_layers_one_pool():
    """The pool loop's hand-worked example (``test_lrfu_global.test_by_hand_two_layers_one_pool``: blocks 0 1 | 2 3, a
    pool of 2, lam 1, tie positions = ids): hits one per layer, the third event's and the last; a warm-up of three
    events counts the last one only. With a base that moves at every unit (``span`` 1), the same."""
    s = EventStream.from_lists(2, 2, 2, [0, 0, 1, 1, 2, 2, 3, 3], [0, 1, 0, 1, 0, 1, 0, 1],
                               [[0, 1], [0], [1], [1], [0], [0, 1], [0], [1]], [1] * 8)
    ident = np.arange(4, dtype=np.int64)
    for kw in ({}, {"span": 1}):
        h, m, f = _slots(s, 2, ident, 1.0, **kw)
        assert h.tolist() == [1, 1] and m.tolist() == [4, 4]
        assert f.tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 1]
        assert _slots(s, 2, ident, 1.0, warm=3, **kw)[0].tolist() == [0, 1]


@pytest.mark.parametrize("seed", range(3))
def test_random_streams_equal_the_heap_loop(seed):
    """Counts and hit flags of replay_ranked (KEY_LRFU, one global partition, event-atomic) on streams of 1-3 layers
    whose clocks drift apart (a layer skips steps), events of one member to every expert, lam 0 / 0.1 / 0.5 / 1,
    pools 0 / 1 / 2 / a third / all but one / all / past all, warm-up, random and id tie ranks; as shipped, with no
    outer cut move allowed (every overflow that needs one ranks all slots by exact keys), and with a base that moves
    every one or two units (layers behind the base, values below the float32 floor); and with every overflow decided
    over candidates first, among them with room for two (listings that do not fit, joins past the room)."""
    rng = np.random.default_rng([seed, 84])
    for trial in range(12):
        s = _any_sizes_stream(rng, 40, 30)
        L, N = s.n_layers, s.n_experts
        nb = L * N
        tie = engine._tie_ranks("random" if trial % 3 else "id", trial, nb)
        tie_pos = np.argsort(np.argsort(tie)).astype(np.int64)
        for lam in (0.0, 0.1, 0.5, 1.0):
            for c in (0, 1, 2, nb // 3, nb - 1, nb, nb + 5):
                warm = int(rng.integers(0, 3))
                want = _heap(s, True, c, tie, lam, warm)
                for kw in ({}, {"max_moves": 0}, {"span": 2}, {"span": 1, "max_moves": 1}, {"cand": 0},
                           {"cand": 0, "cand_max": 2, "span": 3}):
                    assert _same(_slots(s, c, tie_pos, lam, warm, **kw), want), (trial, lam, c, kw)


def _routed(seed, L, N, B, steps, k=8, alpha=0.9):
    """Decode steps of ``B`` tokens each picking ``k`` distinct experts by Zipf(``alpha``) popularity per layer:
    batch-sized events with many repeated values (blocks accessed once in one unit share theirs)."""
    rng = np.random.default_rng(seed)
    w = np.arange(1, N + 1, dtype=np.float64) ** -alpha
    perm = np.stack([rng.permutation(N) for _ in range(L)])
    steps_, layers, experts = [], [], []
    for t in range(steps):
        for layer in range(L):
            g = np.log(w)[None, :] + rng.gumbel(size=(B, N))
            picked = np.unique(np.argsort(-g, axis=1)[:, :k])
            steps_.append(t)
            layers.append(layer)
            experts.append(sorted(perm[layer][picked].tolist()))
    return EventStream.from_lists(L, N, N, steps_, layers, experts, [1] * len(steps_))


@pytest.mark.parametrize("B", [1, 8, 32])
def test_batch_streams_equal_the_pool_loop(B):
    """24 layers of 64 experts, Zipf routing at batch 1 / 8 / 32 (clusters of equal values, bands past 64, outer
    cuts, halvings), pools from a twentieth to three quarters of the blocks, lam 0 / 0.5 / 1, as shipped and with
    every overflow decided over candidates first (among them with room for 64): the pool loop's counts and hit flags
    (the pool loop is held to the heap loop by tests/test_lrfu_global.py)."""
    s = _routed(B, 24, 64, B, 40)
    nb = s.n_layers * s.n_experts
    tie = engine._tie_ranks("random", B, nb)
    tie_pos = np.argsort(np.argsort(tie)).astype(np.int64)
    for lam in (0.0, 0.5, 1.0):
        for c in (nb // 20, nb // 8, nb // 3, 3 * nb // 4):
            want = _pool(s, True, c, tie_pos, lam, 3)
            for kw in ({}, {"cand": 0}, {"cand": 0, "cand_max": 64}):
                assert _same(_slots(s, c, tie_pos, lam, 3, **kw), want), (lam, c, kw)


def test_drifting_layer_clocks_equal_the_heap_loop():
    """One layer in every step and another in every tenth: with lam 1 and a base that moves every few units, the
    slow layer's members scale below the float32 floor (values of 0), ranked by exact keys; the heap loop's
    counts and flags."""
    rows = [(t, 0) for t in range(120)] + [(t, 1) for t in range(0, 120, 10)]
    rows.sort()
    rng = np.random.default_rng(5)
    experts = [sorted(rng.choice(12, int(rng.integers(1, 7)), replace=False).tolist()) for _ in rows]
    s = EventStream.from_lists(2, 12, 12, [r[0] for r in rows], [r[1] for r in rows], experts, [1] * len(rows))
    tie = engine._tie_ranks("random", 1, 24)
    tie_pos = np.argsort(np.argsort(tie)).astype(np.int64)
    for span in (None, 3, 40):
        for c in (3, 8, 15):
            for cand in (None, 0):
                kw = ({} if span is None else {"span": span}) | ({} if cand is None else {"cand": cand})
                assert _same(_slots(s, c, tie_pos, 1.0, **kw), _heap(s, True, c, tie, 1.0)), (span, c, cand)


def test_a_cut_near_the_last_value_moves_off_it():
    """``_set_cut`` leaves a cut further than ``16 delta`` from the last ``need``-th value where it is, and moves one
    within it to ``32 delta`` below (at or under the value) or above it; its float32 bounds follow."""
    delta = 2.0 ** -21
    th, thv = np.zeros(4), np.zeros(8, np.float32)
    for t, near, want in ((3.0, 2.0, 3.0), (2.0, 2.0, 2.0 * (1 - 32 * delta)), (2.0 * (1 + delta), 2.0,
                                                                                 2.0 * (1 + 32 * delta)),
                          (2.0 * (1 - 15 * delta), 2.0, 2.0 * (1 - 32 * delta)), (5.0, 0.0, 5.0)):
        KLQ._set_cut(th, thv, 2, t, delta, near)
        assert th[2] == want, (t, near)
        assert thv[4] == np.float32(want * (1 - delta)) and thv[5] == np.float32(want * (1 + delta))


def test_exact_ranking_breaks_ties_by_tie_position():
    """``_leave_exact`` marks the ``need`` lowest (key, tie position): below the ``need``-th key all, and of those
    equal to it the lowest tie positions, against a sort of the pairs."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(1, 90))
        key = rng.choice([0.5, 1.0, 1.5, 2.0], k)
        ctp = rng.permutation(1000)[:k].astype(np.float64)
        pos = rng.permutation(192)[:k].astype(np.int64)
        need = int(rng.integers(1, k + 1))
        lv = np.zeros(3, np.uint64)
        slots = np.arange(k, dtype=np.int64)       # lane r in slot r, holding block r, at tie position ctp[r]
        v = KLQ._leave_exact(key, ctp.astype(np.int64), slots.astype(np.int32), slots, pos, k, need, np.zeros(k),
                             np.zeros(k), lv)
        order = np.lexsort((ctp, key))[:need]
        got = {int(j) for j in range(192) if (int(lv[j >> 6]) >> (j & 63)) & 1}
        assert got == set(pos[order].tolist()) and v == key[order[-1]]


def test_the_engine_takes_the_slots_for_small_caches_and_equals_the_twin(monkeypatch):
    """Through the engine, event-atomic global lrfu runs the slots loop where the cache holds at most
    ``SLOTS_BASE + SLOTS_SLOPE * E`` blocks per member of a mean event of ``E`` members and the pool loop past it
    (the bound set to 1 here), each equal to the naive twin with a warm-up and two decays."""
    from conftest import spy_calls
    from test_twin_large import random_stream

    slots = spy_calls(monkeypatch, KLQ, "replay_lrfu_slots")
    pool = spy_calls(monkeypatch, KLR, "replay_lrfu_global")
    stream = random_stream(12, L=3, N=24, k=6, steps=20)
    for bound in (KLQ.SLOTS_BASE, 1.0):
        monkeypatch.setattr(KLQ, "SLOTS_BASE", bound)
        monkeypatch.setattr(KLQ, "SLOTS_SLOPE", KLQ.SLOTS_SLOPE if bound > 1 else 0.0)
        for lam in (0.5, 0.05):
            kw = dict(rho=0.3, scope="global", semantics="event-atomic", seed=4, warmup_events=5, lrfu_lambda=lam)
            got = replay(stream, ReplayConfig("lrfu", **kw))
            assert counts(got) == naive_counts(naive_replay(stream, "lrfu", **kw)), (bound, lam)
    assert (len(slots), len(pool)) == (2, 2)


def test_a_slot_key_is_crf_key_bit_for_bit():
    """``_slot_key`` (a CRF of 1 without a logarithm, kept until the slot's block is accessed) equals
    ``crf_key`` bit for bit over CRFs of 1 and more, units and lambdas, and returns its kept key after."""
    from expertcache.replay._kernels import crf_key

    rng = np.random.default_rng(8)
    for lam in (0.0, 0.1, 0.5, 1.0):
        S = np.concatenate([[1.0, 1.0, 1.0 + 2.0 ** -52], 1.0 + rng.random(20) * 3])
        PL = rng.integers(0, 10**6, S.size).astype(np.int32)
        PL[0] = 0
        sB = np.arange(S.size, dtype=np.int32)
        sK = np.full(S.size, np.nan)
        for j in range(S.size):
            want = crf_key(S[j], float(PL[j]), lam)
            assert KLQ._slot_key(S, PL, sB, sK, j, lam) == want and sK[j] == want, (lam, j)
        sK[1] = 7.0
        assert KLQ._slot_key(S, PL, sB, sK, 1, lam) == 7.0


def test_a_value_within_a_cuts_margin_is_placed_by_its_exact_key():
    """``_cut_pass`` on values whose float32 rounding cannot tell them from a cut: a CRF of ``1 + 2**-30`` (value 1.0
    in float32) lies above a cut at 1.0 (key 0) and below one at ``1 + 2**-28``, as its exact key says; a value well
    below the cuts is below both, a free slot (not in ``occ``) below none."""
    lam, delta = 0.5, 2.0 ** -21
    S = np.array([1.0 + 2.0 ** -30, 1.0])
    PL = np.array([0, -200], np.int32)
    sB = np.array([0, 1] + [0] * 62, np.int32)
    V = np.zeros(64, np.float32)
    V[0] = np.float32(S[0])
    V[1] = np.float32(2.0 ** -100)
    V[2] = np.float32(0.5)                          # a free slot's stale value
    occ = np.array([3], np.uint64)
    ident = np.arange(64, dtype=np.int32)          # lane j stands for slot j
    th, thv = np.zeros(4), np.zeros(8, np.float32)
    KLQ._set_cut(th, thv, 1, 1.0, delta, 0.0)
    KLQ._set_cut(th, thv, 2, 1.0 + 2.0 ** -28, delta, 0.0)
    msk, cnt = np.zeros((4, 1), np.uint64), np.zeros(4, np.int64)
    KLQ._cut_pass(V, S, PL, sB, np.full(64, np.nan), ident, lam, 0.0, occ, 1, th, thv, np.zeros(4, np.uint64), msk,
                  1, 2, cnt)
    assert (int(msk[1, 0]), int(msk[2, 0])) == (0b10, 0b11) and cnt.tolist()[1:3] == [1, 2]
    KLQ._set_cut(th, thv, 1, 1.0 + 2.0 ** -28, delta, 0.0)         # the same cuts the other way round
    KLQ._set_cut(th, thv, 2, 1.0, delta, 0.0)
    KLQ._cut_pass(V, S, PL, sB, np.full(64, np.nan), ident, lam, 0.0, occ, 1, th, thv, np.zeros(4, np.uint64), msk,
                  1, 2, cnt)
    assert (int(msk[1, 0]), int(msk[2, 0])) == (0b11, 0b10) and cnt.tolist()[1:3] == [2, 1]


def test_the_benchmark_script_times_both_loops_and_checks_them():
    """``benchmarks/lrfu_slots.py`` runs, checks the counts it times, prints min and median ratios, and refuses bad
    arguments in one line."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    script = ROOT / "benchmarks" / "lrfu_slots.py"

    def run(*args):
        return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)

    r = run("--batches", "1,8", "--rhos", "0.1,0.6", "--lams", "0,0.5", "--accesses", "20000", "--pairs", "2",
            "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["batch"], x["lam"], x["rho"]) for x in rows] == [
        (b, lam, rho) for b in (1, 8) for lam in (0.0, 0.5) for rho in (0.1, 0.6)]
    assert all(x["hits_equal"] and x["slots_ns"] > 0 and x["pool_ns"] > 0 and 0 < x["ratio_min"] <= x["ratio"]
               for x in rows)
    for args in (["--rhos", "2"], ["--lams", "1.5"], ["--batches", "0"], ["--pairs", "x"]):
        r = run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, args
        assert "expected" in r.stderr.strip().splitlines()[-1], (args, r.stderr)
