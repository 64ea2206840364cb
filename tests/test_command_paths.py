"""The fast paths of the commands against what they replace (issue 19: commands at Qwen3 size).

* ``replay_curve``'s one pass for ``lfu`` (a rank pass, ``lfu_stack_depths``) against the naive twin and separate
  replays;
* the advice kernels of ``expertcache.prefetch`` (scatter, expert-map scores, prefix activations, the lookahead's
  pair counts) against the numpy expressions they replaced, bit for bit;
* ``read_events`` decoding member lists in batches, on the stored types.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from naive import naive_replay

from expertcache.events import EventStream, read_events
from expertcache.replay import ReplayConfig, one_pass_supported, replay, replay_curve


def _random_stream(rng, L, N, n_steps, k=2):
    steps = np.repeat(np.arange(n_steps), L)
    layers = np.tile(np.arange(L), n_steps)
    experts = [list(rng.choice(N, size=int(rng.integers(1, N + 1)), replace=False)) for _ in range(n_steps * L)]
    return EventStream.from_lists(L, N, k, steps, layers, experts, [max(1, (len(e) + 1) // 2) for e in experts])


@pytest.mark.parametrize("seed", range(12))
def test_lfu_one_pass_curve_equals_naive_and_separate_replays(seed):
    rng = np.random.default_rng(seed)
    s = _random_stream(rng, int(rng.integers(1, 4)), int(rng.integers(2, 10)), int(rng.integers(1, 40)))
    rhos = [0.0, 0.1, 0.35, 0.6, 1.0]            # capacity 0 up to the whole universe
    for sem, tb, tseed in itertools.product(("event-atomic", "sequential-ascending", "sequential-random"),
                                            ("random", "id"), (0, 5)):
        cfg = ReplayConfig("lfu", semantics=sem, tie_break=tb, seed=tseed)
        got = replay_curve(s, cfg, rhos, one_pass=True)
        assert got == tuple(replay(s, ReplayConfig("lfu", rho=r, semantics=sem, tie_break=tb, seed=tseed))
                            for r in rhos)
        for r, res in zip(rhos, got, strict=True):
            want = naive_replay(s, "lfu", rho=r, semantics=sem, tie_break=tb, seed=tseed)
            assert (res.hits, res.demand_misses) == (want["hits"], want["demand_misses"])


def test_lfu_one_pass_is_refused_where_the_rank_pass_does_not_hold():
    """In-cache counters (resets depend on the capacity), global scope and warm-up take separate replays."""
    for cfg in (ReplayConfig("lfu", lfu_in_cache_counters=True), ReplayConfig("lfu", scope="global"),
                ReplayConfig("lfu", warmup_events=1)):
        assert not one_pass_supported(cfg)
        s = _random_stream(np.random.default_rng(0), 2, 6, 12)
        assert replay_curve(s, cfg, [0.2, 0.5], one_pass=True) == tuple(
            replay(s, ReplayConfig(**{**cfg.__dict__, "rho": r})) for r in (0.2, 0.5))


# ----------------------------------------------------------------------------- prefetch kernels vs numpy
def _numpy_scatter(out, ev, scores):
    """``AdviceContext.scatter`` as it was (numpy reduceat over the stably sorted rows)."""
    order = np.argsort(ev, kind="stable")
    ev = ev[order]
    valid = ~np.isnan(scores[order])
    filled = np.where(valid, scores[order], 0.0).astype(np.float64)
    starts = np.flatnonzero(np.r_[True, ev[1:] != ev[:-1]])
    touched = ev[starts]
    acc = np.add.reduceat(filled, starts, axis=0)
    cnt = np.add.reduceat(valid.astype(np.int64), starts, axis=0)
    cur = out[touched].astype(np.float64)
    out[touched] = np.where(cnt > 0, np.where(np.isnan(cur), 0.0, cur) + acc, cur).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_kernel_is_bit_identical(dtype):
    from expertcache.prefetch._kernels import scatter_sorted

    rng = np.random.default_rng(1)
    n_events, N = 40, 7
    for _ in range(20):
        n = int(rng.integers(1, 200))
        ev = rng.integers(0, n_events, n)
        scores = rng.standard_normal((n, N)).astype(dtype)
        scores[rng.random((n, N)) < 0.3] = np.nan
        start = np.full((n_events, N), np.nan, dtype=np.float32)
        start[rng.random((n_events, N)) < 0.5] = 1.5
        a, b = start.copy(), start.copy()
        _numpy_scatter(a, ev, scores)
        order = np.argsort(ev, kind="stable")
        scatter_sorted(b, ev[order].astype(np.int64), order.astype(np.int64), scores, np.zeros(0, np.int64))
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
        # the looked-up form: rows of a table, a negative row meaning no score
        table = rng.random((5, N)).astype(dtype)
        row = rng.integers(-1, 5, n)
        looked = np.where((row >= 0)[:, None], table[np.maximum(row, 0)], np.nan)
        a, b = start.copy(), start.copy()
        _numpy_scatter(a, ev, looked)
        scatter_sorted(b, ev[order].astype(np.int64), order.astype(np.int64), table, row.astype(np.int64))
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("case, k, m", [("sem+traj", 3, 3), ("traj", 3, 3), ("sem-only", 3, 3), ("ties", 3, 3),
                                         ("small-store", 3, 3), ("sem+traj", 8, 3), ("traj", 6, 1), ("traj", 9, 4),
                                         ("sem+traj", 5, 5), ("ties", 8, 6), ("wide", 8, 3), ("negative", 8, 3),
                                         ("negative", 4, 6)])
def test_expert_map_kernel_is_bit_identical(case, k, m):
    """The expert-map kernel against the numpy expression it replaced (sums of k rows from 0 in expert order, then
    added; the stable argsort's m best; their mean row), every array over the stored maps by place: rows in
    passes of four with the last four padded (k = 3, 5, 6, 8, 9), the m-th best near value in registers (m <= 4)
    and by insertion (m = 5, 6), a tail block past the store (S = 9, 2; below every similarity where all are
    negative) and none (S = 24)."""
    from expertcache.prefetch._kernels import expert_map_scores, store_places
    from expertcache.prefetch.expert_map import top_m_rows

    rng = np.random.default_rng(2)
    n, N, alpha = 50, 10, 0.5
    S = {"small-store": 2, "wide": 24}.get(case, 9)
    m_take = min(m, S)
    dot = rng.random((n, S))
    ex = np.sort(np.stack([rng.choice(N, k, replace=False) for _ in range(n)]), axis=1)
    w = rng.random((n, k)).astype(np.float32)
    maps_prev = rng.random((N, S)).astype(np.float32)
    maps_prev[rng.random((N, S)) < 0.5] = 0.0       # sparse, as stored maps are (k of N experts per layer)
    x_sq = rng.random(n) + 0.1
    x_sq[0] = 0.0                                   # a zero norm: trajectory 0
    w[0] = 0.0
    m_sq = rng.random(S) + 0.1
    sem_tab = rng.random((7, S))                    # per-request cosines, a row per token
    sem_row = rng.integers(0, 7, n).astype(np.int64)
    maps = rng.random((S, N)).astype(np.float32)
    maps[rng.random((S, N)) < 0.4] = 0.0
    if case == "negative":                          # every similarity below 0 (cosines of hidden states can be)
        sem_tab -= 2.0
    if case == "ties":
        for a, b in ((1, 4), (2, 7), (3, 8)):
            dot[:, a] = dot[:, b]
            m_sq[a] = m_sq[b]
            sem_tab[:, a] = sem_tab[:, b]
            maps_prev[:, a] = maps_prev[:, b]
    use_sem = case in ("sem+traj", "sem-only", "ties", "small-store", "negative")
    use_traj = case != "sem-only"
    sem = sem_tab[sem_row]
    ref_dot = dot.copy()
    ref_x_sq = x_sq.copy()
    if use_traj:
        add = np.zeros((n, S))
        g_sq = np.zeros(n)
        for q in range(k):                          # each product exact in float64, summed in expert order
            g = w[:, q].astype(np.float64)
            add += g[:, None] * maps_prev[ex[:, q]].astype(np.float64)
            g_sq += g * g
        ref_dot += add
        ref_x_sq += g_sq
        norm = np.sqrt(np.multiply.outer(ref_x_sq, m_sq))
        traj = np.divide(ref_dot, norm, out=np.zeros_like(ref_dot), where=norm > 0)
        sim = alpha * sem + (1.0 - alpha) * traj if use_sem else traj
    else:
        sim = sem
    ref = maps[top_m_rows(sim, m_take)].mean(axis=1)
    ref[ref <= 0] = np.nan
    # the kernel's arrays by place, their tail zero; a zero row below the maps
    place = store_places(S)
    n_pos = -(-S // 8) * 8
    assert sorted(place.tolist()) == sorted(set(place.tolist())) and place.max() < n_pos

    def by_place(a):
        out = np.zeros((*a.shape[:-1], n_pos), dtype=a.dtype)
        out[..., place] = a
        return out

    dot_p, m_sq_p, sem_p = by_place(dot), by_place(m_sq), by_place(sem_tab)
    prev_p = np.vstack([by_place(maps_prev), np.zeros((1, n_pos), np.float32)])
    got = np.empty((n, N), dtype=np.float32)
    none = np.zeros((0, 0), np.float32)
    expert_map_scores(dot_p, ex if use_traj else np.zeros((0, 0), np.int64), w if use_traj else none,
                      prev_p if use_traj else none, x_sq, m_sq_p, sem_p if use_sem else np.zeros((0, 0)),
                      sem_row if use_sem else np.zeros(0, np.int64), alpha, use_traj, m_take, maps, got)
    assert np.array_equal(ref.view(np.uint32), got.view(np.uint32))
    if use_traj:
        assert np.array_equal(dot_p[:, place], ref_dot) and np.array_equal(x_sq, ref_x_sq)
        assert not np.delete(dot_p, place, axis=1).any()


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7])
def test_near_threshold_is_the_mth_largest(m):
    """The expert-map kernel's filter value: the m-th largest of the values by place (blocks of 8 a row apart),
    in registers for m <= 4 and by insertion above, with ties and -inf places."""
    from expertcache.prefetch._kernels import _near_threshold

    rng = np.random.default_rng(m)
    for trial in range(200):
        n_blocks = int(rng.integers(1, 20))
        v = rng.integers(-5, 5, 8 * n_blocks).astype(np.float64)     # whole numbers: many ties
        v[rng.random(v.size) < 0.1] = -np.inf
        if m > v.size:
            continue
        blocks = v.reshape(8, n_blocks)                              # block b's values: column b
        bmax = np.array([max(max(max(c[0], c[1]), max(c[2], c[3])), max(max(c[4], c[5]), max(c[6], c[7])))
                         for c in blocks.T])
        want = np.sort(v)[-m]
        assert _near_threshold(v, bmax, m, np.empty(m)) == want, (trial, m)


def test_prefix_activations_equal_cumsum():
    from expertcache.prefetch._kernels import prefix_activations
    from expertcache.prefetch.produced import multi_hot

    rng = np.random.default_rng(3)
    L, N, k, n = 3, 10, 2, 30
    experts = np.stack([np.stack([rng.choice(N, k, replace=False) for _ in range(L)]) for _ in range(n)])
    rows = rng.permutation(n)[:17].astype(np.int64)
    base = rng.integers(0, 5, L * N).astype(np.float32)
    hot = multi_hot(experts[rows].reshape(-1, k), N).reshape(rows.size, L * N)
    ref = base[None, :] + np.cumsum(hot, axis=0) - hot
    got = np.empty_like(ref)
    prefix_activations(experts.astype(np.int16), rows, base, got)
    assert np.array_equal(ref, got)


# ----------------------------------------------------------------------------- stream reading
@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64])
def test_pair_counts_equal_the_bincount_of_outer_sums(dtype):
    """The routing normal equations' co-occurrence counts (ProMoE-style lookahead) against the numpy expression
    they replaced, on distinct experts per row and on a 1-expert universe."""
    from expertcache.prefetch._kernels import pair_counts

    rng = np.random.default_rng(5)
    for N, k, n in ((128, 8, 300), (7, 3, 50), (1, 1, 4)):
        a = np.stack([rng.choice(N, k, replace=False) for _ in range(n)]).astype(dtype)
        b = np.stack([rng.choice(N, k, replace=False) for _ in range(n)]).astype(dtype)
        aa = np.zeros(N * N, dtype=np.int64)
        ab = np.zeros(N * N, dtype=np.int64)
        pair_counts(a, b, N, aa, ab)
        a64, b64 = a.astype(np.int64), b.astype(np.int64)
        assert (aa == np.bincount((a64[:, :, None] * N + a64[:, None, :]).ravel(), minlength=N * N)).all()
        assert (ab == np.bincount((a64[:, :, None] * N + b64[:, None, :]).ravel(), minlength=N * N)).all()


def test_read_events_in_batches_keeps_stored_types(tmp_path, monkeypatch):
    import expertcache.events.stream as S

    rng = np.random.default_rng(4)
    s = _random_stream(rng, 3, 12, 50)
    s.save(tmp_path / "s")
    monkeypatch.setattr(S, "_READ_ROWS", 7)              # many batches, events split across none of them
    monkeypatch.setattr(S, "_CHECK_CHUNK", 5)            # per-member checks in many chunks
    got = read_events(tmp_path / "s")
    assert got.expert.dtype == np.int16 and got.multiplicity.dtype == np.int32
    for name in ("step", "layer", "active", "logical_per_event", "offsets", "expert", "multiplicity"):
        assert np.array_equal(getattr(got, name), getattr(s, name)), name


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 16])
def test_chunked_multiplicity_bounds_take_each_members_own_event(chunk, monkeypatch):
    """The multiplicity bound [1, active of the member's event], checked a chunk of members at a time (events
    straddle chunks): every multiplicity at its event's bound passes, and one below 1 or above its event's active
    names the first such event, as a member-by-member loop finds it."""
    import expertcache.events.stream as S
    from expertcache.errors import ValidationError

    monkeypatch.setattr(S, "_CHECK_CHUNK", chunk)
    rng = np.random.default_rng([chunk, 6])
    for _ in range(20):
        s = _random_stream(rng, 2, 9, 12)
        active = rng.integers(1, 6, s.n_events).astype(np.int32)
        at_bound = np.repeat(active, np.diff(s.offsets)).astype(np.int32)      # each member at its event's bound

        def check(mult, s=s, active=active):
            S._check_events(s.step, s.layer, active, s.offsets, s.expert, mult, None, active.astype(np.int64) * 9,
                            s.n_layers, s.n_experts, s.top_k, "t")

        check(at_bound)
        mult = at_bound.copy()
        for _ in range(int(rng.integers(1, 4))):
            j = int(rng.integers(0, mult.shape[0]))
            mult[j] = 0 if rng.random() < 0.3 else at_bound[j] + 1         # out of bounds whatever came before
        first = next(j for j in range(mult.shape[0])
                     if not 1 <= mult[j] <= active[int(np.searchsorted(s.offsets, j, side="right")) - 1])
        event = int(np.searchsorted(s.offsets, first, side="right")) - 1
        with pytest.raises(ValidationError, match=f"record {event + 1}\\b.*multiplicity must be in"):
            check(mult)


def test_chunked_member_checks_name_the_first_bad_event(monkeypatch):
    import expertcache.events.stream as S
    from expertcache.errors import ValidationError

    monkeypatch.setattr(S, "_CHECK_CHUNK", 3)
    s = _random_stream(np.random.default_rng(5), 2, 8, 10)
    expert = s.expert.copy()
    j = int(s.offsets[7]) + (1 if s.offsets[8] - s.offsets[7] > 1 else 0)
    if s.offsets[8] - s.offsets[7] > 1:
        expert[j] = expert[j - 1]                         # a repeat inside event 7 (record 8)
        with pytest.raises(ValidationError, match="record 8"):
            EventStream(s.n_layers, s.n_experts, s.top_k, s.step, s.layer, s.active, s.logical_per_event,
                        s.offsets, expert, s.multiplicity)
    expert = s.expert.copy()
    expert[int(s.offsets[5])] = 99                        # out of range in event 5 (record 6)
    with pytest.raises(ValidationError, match="record 6"):
        EventStream(s.n_layers, s.n_experts, s.top_k, s.step, s.layer, s.active, s.logical_per_event,
                    s.offsets, expert, s.multiplicity)
