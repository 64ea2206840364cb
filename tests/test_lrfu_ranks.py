"""Sequential per-layer lrfu on ranks (replay/_kernels_lrfu_ranks.py): against the heap loop, by hand, with its margins
forced off and its window narrowed (which must show), and the rule that picks it."""

from __future__ import annotations

import numpy as np
import pytest
from naive import naive_replay
from test_fast_policies import _seq_generic, _shuffled

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, engine, replay
from expertcache.replay import _kernels_lrfu_ranks as KRK
from expertcache.replay import _kernels_seq as KQ
from expertcache.replay.keys import KEY_LRFU


def _stream(seed: int, L: int, N: int, steps: int, lo: int, hi: int, alpha: float = 1.0) -> EventStream:
    """``steps`` steps of one event a layer, each of ``lo`` to ``hi`` distinct members drawn from a Zipf(``alpha``)
    popularity, some (step, layer) events missing."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, N + 1) ** alpha
    rows = []
    for s in range(steps):
        for layer in range(L):
            if rng.random() < 0.1:
                continue
            size = min(int(rng.integers(lo, hi + 1)), N)
            rows.append((s, layer, sorted(rng.choice(N, size=size, replace=False, p=w / w.sum()).tolist())))
    return EventStream.from_lists(L, N, N, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                                  [1] * len(rows))


def _heap(stream, expert, caps, tie, lam, warm):
    """The heap loop's counts and flags (test_fast_policies' twin), sequential per layer, lrfu at ``lam``."""
    return _seq_generic(stream, expert, caps, tie, KEY_LRFU, lam, False, warm)


def _ranks(stream, expert, caps, tie_pos, lam, warm, on_ranks=True):
    L = stream.n_layers
    out = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    KQ.replay_lrfu_seq(stream.offsets, expert, stream.layer, stream.n_experts, L, caps, tie_pos, lam, warm, *out,
                       on_ranks=on_ranks)
    return out


def _equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _cases(N: int):
    """Streams of small and large events over ``N`` experts, quotas from 0 to 64 (and past ``N``), tie ranks."""
    for seed, (lo, hi) in enumerate(((1, 3), (2, 12), (N // 4, N // 2), (N // 2, N))):
        stream = _stream(seed + N, 3, N, 60, max(lo, 1), max(hi, 1))
        tie = engine._tie_ranks("random", seed, 3 * N)
        _, tie_pos = engine._tie_order(tie, 3, N)
        for caps in ((0, 1, 2), (min(N, 64), N // 3, 5), (3, min(64, N + 1), N // 2)):
            yield stream, tie, tie_pos, np.array(caps, np.int64)


@pytest.mark.parametrize("N", (8, 40, 64, 130))
def test_ranks_loop_equals_the_heap_loop(N):
    """Counts and hit flags, ascending and shuffled members, lambda 0.1 to 2 (windows of 41 to 2 units), with and
    without a warm-up."""
    for stream, tie, tie_pos, caps in _cases(N):
        caps = np.minimum(caps, KRK.RANKS_MAX)
        for expert in (stream.expert, _shuffled(stream, N)):
            for lam in (0.1, 0.25, 0.5, 1.0, 2.0):
                for warm in (0, 7):
                    got = _ranks(stream, expert, caps, tie_pos, lam, warm)
                    assert _equal(got, _heap(stream, expert, caps, tie, lam, warm)), (caps, lam, warm)


def test_ranks_loop_on_long_gaps_past_its_decay_table():
    """One layer of 60,000 accesses: blocks idle for thousands of units (past the 2,154 decays lambda 0.5 tabulates
    before a decay is 0) come back among busy ones."""
    rng = np.random.default_rng(7)
    n = 3_000
    exps = [sorted(rng.choice(30, 20, replace=False).tolist()) for _ in range(n)]
    exps[0] = sorted(set(exps[0]) | {30, 31})
    exps[n - 1] = sorted(set(exps[n - 1]) | {30, 31})
    stream = EventStream.from_lists(1, 32, 32, list(range(n)), [0] * n, exps, [1] * n)
    tie = engine._tie_ranks("random", 3, 32)
    _, tie_pos = engine._tie_order(tie, 1, 32)
    for c in (5, 19, 21, 32):
        caps = np.array([c], np.int64)
        for lam in (0.5, 0.1):
            assert _equal(_ranks(stream, stream.expert, caps, tie_pos, lam, 0),
                          _heap(stream, stream.expert, caps, tie, lam, 0)), (c, lam)


def test_ranks_loop_by_hand_a_recent_resident_hits_past_an_earlier_member():
    """One layer of 4 experts, a quota of 2, lambda 0.25 (tie positions = ids), events [3] [2] [2, 3] [1, 2].
    Keys ``log2(S) + u / 4``: 3 at unit 0 (S = 1: 0), 2 at 1 (0.25); both hit in the third event, 2 at unit 2
    (S = 1 + 2**-0.25 = 1.8409: 1.3804), 3 at 3 (S = 1 + 2**-0.75 = 1.5946: 1.4232). Block 1 at unit 4 (S = 1: key 1)
    misses and is the lowest of the three, so it leaves at once; 2 then hits. Its rank was 1 (3 ranks above it) and
    one member came before it: it hits only because that member's new key (1) ranks below its old one (1.3804).
    The heap loop agrees."""
    stream = EventStream.from_lists(1, 4, 2, [0, 1, 2, 3], [0] * 4, [[3], [2], [2, 3], [1, 2]], [1] * 4)
    ident = np.arange(4, dtype=np.int64)
    caps = np.array([2], np.int64)
    got = _ranks(stream, stream.expert, caps, ident, 0.25, 0)
    assert got[2].tolist() == [0, 0, 1, 1, 0, 1] and got[0].tolist() == [3] and got[1].tolist() == [3]
    assert _equal(got, _heap(stream, stream.expert, caps, ident, 0.25, 0))


def test_ranks_loop_with_every_close_comparison_left_to_the_exact_keys(monkeypatch):
    """With a margin of one half, every comparison of CRFs within a factor 1.5 goes to the exact keys and tie
    positions (the path near-equal keys take): the same counts and flags as the heap loop."""
    real = KRK.lrfu_ranks_state

    def wide(*args):
        st = list(real(*args))
        st[4] = 0.5                                    # eps
        return tuple(st)

    monkeypatch.setattr(KRK, "lrfu_ranks_state", wide)
    for stream, tie, tie_pos, caps in _cases(40):
        for lam in (0.25, 1.0):
            assert _equal(_ranks(stream, stream.expert, caps, tie_pos, lam, 0),
                          _heap(stream, stream.expert, caps, tie, lam, 0)), (caps, lam)


def test_a_window_narrower_than_lambdas_is_caught(monkeypatch):
    """The check above can fail: with a window of 2 units where lambda 0.25 needs 12, later blocks are taken to
    rank above earlier ones they do not, and some counts differ from the heap loop's."""
    real = KRK.lrfu_ranks_state

    def narrow(*args):
        st = list(real(*args))
        st[1] = 2                                      # the window
        return tuple(st)

    monkeypatch.setattr(KRK, "lrfu_ranks_state", narrow)
    differs = 0
    for stream, tie, tie_pos, caps in _cases(40):
        differs += not _equal(_ranks(stream, stream.expert, caps, tie_pos, 0.25, 0),
                              _heap(stream, stream.expert, caps, tie, 0.25, 0))
    assert differs > 0


def test_ranks_by_ranges_equal_one_call():
    """The loop given by ranges of events (as sequential-random's chunks run it) carries its state: the same counts
    and flags as one call, cut at events 1, 17 and 100."""
    stream = _stream(5, 2, 64, 80, 8, 40)
    tie = engine._tie_ranks("random", 1, 128)
    _, tie_pos = engine._tie_order(tie, 2, 64)
    caps = np.array([20, 33], np.int64)
    want = _ranks(stream, stream.expert, caps, tie_pos, 0.5, 3)
    L = 2
    got = [np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(stream.union, np.uint8)]
    run = KQ.lrfu_seq_ranges(stream.offsets, stream.layer, 64, L, caps, tie_pos, 0.5, 3, *got, on_ranks=True)
    n_events = stream.offsets.shape[0] - 1
    for a, b in ((0, 1), (1, 17), (17, 100), (100, n_events)):
        run(stream.expert, a, b)
    assert _equal(got, want)


def test_the_rule_and_the_engine_take_ranks_for_large_events(monkeypatch):
    """Ranks where every quota (at most N) is at most 64, lambda's window at most 64 units and the mean event at least 16
    members, or at least 12 with every quota at most 4 times it; the engine then runs the loop (counts equal to the
    naive twin's); forcing it past its quota is an error."""
    big = _stream(2, 3, 64, 30, 20, 40)
    small = _stream(2, 3, 64, 30, 1, 8)
    caps = np.array([10, 30, 64], np.int64)
    assert KQ.lrfu_on_ranks(big.offsets, 64, caps, 0.5)
    assert not KQ.lrfu_on_ranks(small.offsets, 64, caps, 0.5)
    twelve = EventStream.from_lists(1, 64, 64, [0, 1], [0, 0], [list(range(12)), list(range(10, 22))], [1, 1])
    eleven = EventStream.from_lists(1, 64, 64, [0, 1], [0, 0], [list(range(12)), list(range(10, 20))], [1, 1])
    assert KQ.lrfu_on_ranks(twelve.offsets, 64, np.array([48], np.int64), 0.5)        # 12 members, 48 = 4 x 12
    assert not KQ.lrfu_on_ranks(twelve.offsets, 64, np.array([49], np.int64), 0.5)
    assert not KQ.lrfu_on_ranks(eleven.offsets, 64, np.array([8], np.int64), 0.5)      # 11 members
    assert KQ.lrfu_on_ranks(big.offsets, 64, np.array([65, 1, 1], np.int64), 0.5)      # a quota counts up to N
    assert not KQ.lrfu_on_ranks(big.offsets, 128, np.array([65, 1, 1], np.int64), 0.5)
    assert not KQ.lrfu_on_ranks(big.offsets, 64, caps, 0.01)              # a window of 719 units
    assert not KQ.lrfu_on_ranks(big.offsets, 40_000, caps, 0.5)           # ids past the lists' int16
    with pytest.raises(ValueError, match="quotas up to 64"):
        KQ.lrfu_seq_ranges(big.offsets, big.layer, 128, 3, np.array([65, 1, 1], np.int64),
                           np.zeros(384, np.int64), 0.5, 0, np.zeros(3, np.int64), np.zeros(3, np.int64),
                           np.zeros(0, np.uint8), on_ranks=True)
    calls = []
    real = KRK.replay_lrfu_ranks
    monkeypatch.setattr(KRK, "replay_lrfu_ranks", lambda *a: calls.append(1) or real(*a))
    for semantics in ("sequential-ascending", "sequential-random"):
        for rho in (0.1, 0.4):
            kw = dict(rho=rho, semantics=semantics, seed=4, lrfu_lambda=0.5, warmup_events=2)
            got = replay(big, ReplayConfig("lrfu", **kw))
            want = naive_replay(big, "lrfu", **kw)
            assert (got.hits, got.demand_misses) == (want["hits"], want["demand_misses"]), kw
    assert calls


def test_a_comparison_by_units_by_crfs_and_by_tie_positions():
    """``_above_su``: blocks ``w`` units apart rank by unit whatever their CRFs; closer ones by ``S 2**(lam u)``; equal
    keys by tie position (the higher ranks above, as the heap loop's ``_below``)."""
    lam, w = 0.5, 5
    pw = 2.0 ** (lam * np.arange(-w, w + 1, dtype=np.float64))
    eps = 1e-12
    above = KRK._above_su
    assert above(1.0, 105, 0, 3.4, 100, 9, lam, w, pw, eps)          # 5 units later: above a CRF of 3.4
    assert not above(3.4, 100, 9, 1.0, 105, 0, lam, w, pw, eps)
    assert above(3.0, 100, 0, 1.0, 103, 9, lam, w, pw, eps)          # log2(3) > 1.5
    assert not above(2.5, 100, 0, 1.0, 103, 9, lam, w, pw, eps)      # log2(2.5) < 1.5
    assert above(2.0, 100, 3, 1.0, 102, 2, lam, w, pw, eps)          # equal keys (101): tie position 3 above 2
    assert not above(2.0, 100, 2, 1.0, 102, 3, lam, w, pw, eps)
    assert not above(1.0, 102, 2, 2.0, 100, 3, lam, w, pw, eps)


def test_ranks_loop_on_fast_lists_next_to_busy_blocks():
    """A layer's list kept as a fast event's last members (its ranks by units), then events of ``c`` to ``c + w``
    members, some of which leave it as it is where no resident left ranks above the ``c``-th newest member: runs of
    one-member events raise a few blocks' CRFs near their bound first (accesses a unit apart), and the next events
    start or end with them, in the order given, so that residents within the window rank above or below new
    members. Counts and flags equal the heap loop's."""
    from expertcache.replay._kernels_lrfu_window import window

    N = 24
    tie = engine._tie_ranks("random", 5, N)
    _, tie_pos = engine._tie_order(tie, 1, N)
    for seed in range(12):
        rng = np.random.default_rng(seed)
        c = int(rng.choice((2, 3, 5, 8)))
        for lam in (0.1, 0.25, 0.5, 1.0):
            w = window(lam)
            hot = rng.choice(N, 3, replace=False)
            order = []
            for _ in range(120):
                if rng.random() < 0.35:
                    order += [[int(rng.choice(hot))]] * int(rng.integers(1, 8))
                else:
                    size = min(int(rng.integers(c, c + w + 2)), N)
                    ev = rng.choice(N, size, replace=False).tolist()
                    h = [x for x in ev if x in hot]
                    rest = [x for x in ev if x not in hot]
                    order.append(h + rest if rng.random() < 0.5 else rest + h)
            stream = EventStream.from_lists(1, N, N, list(range(len(order))), [0] * len(order),
                                            [sorted(x) for x in order], [1] * len(order))
            expert = np.concatenate([np.array(x, np.int16) for x in order])
            caps = np.array([c], np.int64)
            got = _ranks(stream, expert, caps, tie_pos, lam, 0)
            assert _equal(got, _heap(stream, expert, caps, tie, lam, 0)), (seed, c, lam)
