"""routing_locality: hand-derived values on tiny hand-built traces, and a naive set-based twin."""

from __future__ import annotations

import math

import numpy as np
import pytest

from expertcache.analysis.locality import routing_locality, top_share, uniform_jaccard
from expertcache.errors import ValidationError
from expertcache.trace import RoutingTrace


def _trace(rows, n_experts=4, top_k=2):
    """rows: (request index, phase, position, [[layer0 ids], [layer1 ids], ...])."""
    n_req = max(r[0] for r in rows) + 1
    experts = np.array([r[3] for r in rows], dtype=np.int16)
    n = len(rows)
    return RoutingTrace(experts.shape[1], n_experts, top_k, tuple(f"r{i}" for i in range(n_req)),
                        np.array([r[0] for r in rows], np.int32), np.array([r[1] for r in rows], np.int8),
                        np.array([r[2] for r in rows], np.int32), experts, None, np.full(n, -1, np.int64))


# One request; a prefill token (ignored) and three decode tokens; L=2, N=4, k=2.
HAND = _trace([
    (0, 0, 0, [[2, 3], [2, 3]]),
    (0, 1, 1, [[0, 1], [0, 1]]),
    (0, 1, 2, [[0, 2], [2, 3]]),
    (0, 1, 3, [[1, 0], [3, 2]]),
])


def test_top_share_hand_derived():
    s = routing_locality(HAND, n_shuffles=1)
    # Layer 0 decode counts: e0=3, e1=2, e2=1, e3=0 (6 assignments); top 10% of 4 experts = 0.4 expert:
    # 0.4*3/6 = 0.2. Layer 1: e0=1, e1=1, e2=2, e3=2: 0.4*2/6 = 2/15.
    assert s.top_share_per_layer == pytest.approx((0.2, 2 / 15))
    assert s.top_share == pytest.approx((0.2 + 2 / 15) / 2)
    half = routing_locality(HAND, top_fraction=0.5, n_shuffles=1)
    assert half.top_share_per_layer == pytest.approx((5 / 6, 4 / 6))
    assert s.n_decode_tokens == 3 and s.n_pairs == 2


def test_adjacent_jaccard_hand_derived():
    s = routing_locality(HAND, n_shuffles=1)
    # Layer 0: J({0,1},{0,2}) = 1/3, J({0,2},{0,1}) = 1/3. Layer 1: J({0,1},{2,3}) = 0, J({2,3},{2,3}) = 1.
    assert s.adjacent_jaccard_per_layer == pytest.approx((1 / 3, 1 / 2))
    assert s.adjacent_jaccard == pytest.approx(5 / 12)
    # Two independent uniform 2-subsets of 4: overlap 0/1/2 with p 1/6, 4/6, 1/6 -> 4/6 * 1/3 + 1/6 = 7/18.
    assert s.uniform_jaccard == pytest.approx(7 / 18)


def test_shuffled_control_converges_to_the_permutation_expectation():
    s = routing_locality(HAND, n_shuffles=3000, seed=1)
    # Layer 0 sets X, Y, X: the order XYX (prob 1/3) gives 1/3, else (1 + 1/3)/2 = 2/3 -> 5/9.
    # Layer 1 sets A, B, B: BAB (prob 1/3) gives 0, else 1/2 -> 1/3.
    assert s.shuffled_jaccard_per_layer == pytest.approx((5 / 9, 1 / 3), abs=0.02)
    assert routing_locality(HAND, n_shuffles=5, seed=3) == routing_locality(HAND, n_shuffles=5, seed=3)


def test_pairs_never_cross_requests_and_two_token_requests_shuffle_to_themselves():
    tr = _trace([
        (0, 1, 0, [[0, 1]]), (0, 1, 1, [[0, 1]]),
        (1, 1, 0, [[2, 3]]), (1, 1, 1, [[1, 2]]),
    ])
    s = routing_locality(tr, n_shuffles=7, seed=5)
    # Pairs: r0 (1.0) and r1 (J({2,3},{1,2}) = 1/3); the r0/r1 boundary is not a pair.
    assert s.n_pairs == 2
    assert s.adjacent_jaccard == pytest.approx((1 + 1 / 3) / 2)
    assert s.shuffled_jaccard == pytest.approx(s.adjacent_jaccard)  # a pair is the same pair in any order


def test_no_pairs_gives_nan_and_no_decode_is_an_error():
    single = _trace([(0, 0, 0, [[0, 1]]), (0, 1, 1, [[2, 3]])])
    s = routing_locality(single)
    assert s.n_pairs == 0 and math.isnan(s.adjacent_jaccard) and math.isnan(s.shuffled_jaccard)
    assert s.top_share == pytest.approx(0.4 * 1 / 2)
    with pytest.raises(ValidationError, match="no decode tokens"):
        routing_locality(_trace([(0, 0, 0, [[0, 1]])]))
    with pytest.raises(ValidationError, match="top_fraction"):
        routing_locality(HAND, top_fraction=0)
    with pytest.raises(ValidationError, match="n_shuffles"):
        routing_locality(HAND, n_shuffles=0)


def test_uniform_jaccard_matches_enumeration():
    from itertools import combinations

    for N, k in ((5, 2), (6, 3), (4, 4)):
        subsets = [set(c) for c in combinations(range(N), k)]
        exact = np.mean([len(a & b) / len(a | b) for a in subsets for b in subsets])
        assert uniform_jaccard(N, k) == pytest.approx(exact)


def _naive(trace, q):
    """Set-and-loop twin of routing_locality's top share and adjacent Jaccard."""
    L, N = trace.n_layers, trace.n_experts
    shares, jac = [], []
    for layer in range(L):
        counts = [0] * N
        vals = []
        for r in range(trace.n_requests):
            prev = None
            for i in range(trace.n_tokens):
                if trace.request[i] != r or trace.phase[i] != 1:
                    continue
                cur = set(int(e) for e in trace.experts[i, layer])
                for e in cur:
                    counts[e] += 1
                if prev is not None:
                    vals.append(len(prev & cur) / len(prev | cur))
                prev = cur
        counts.sort(reverse=True)
        m = q * N
        top = sum(counts[: int(m)]) + (m - int(m)) * (counts[int(m)] if int(m) < N else 0)
        shares.append(top / sum(counts))
        jac.append(sum(vals) / len(vals))
    return shares, jac


@pytest.mark.parametrize("seed", range(5))
def test_agrees_with_naive_twin_on_random_traces(seed):
    rng = np.random.default_rng(seed)
    L, N, k = 3, 10, 3
    rows = []
    for r in range(4):
        n_pre, n_dec = int(rng.integers(0, 3)), int(rng.integers(2, 9))
        for p in range(n_pre + n_dec):
            rows.append((r, int(p >= n_pre), p, [list(rng.choice(N, k, replace=False)) for _ in range(L)]))
    tr = _trace(rows, N, k)
    s = routing_locality(tr, top_fraction=0.25, n_shuffles=1)
    shares, jac = _naive(tr, 0.25)
    assert s.top_share_per_layer == pytest.approx(tuple(shares))
    assert s.adjacent_jaccard_per_layer == pytest.approx(tuple(jac))


def test_top_share_function_edges():
    assert top_share(np.array([[5, 0, 0, 0]]), 1.0).tolist() == [1.0]
    assert top_share(np.array([[1, 1, 1, 1]]), 0.1) == pytest.approx([0.1])  # uniform use gives q
    assert np.isnan(top_share(np.zeros((1, 4)), 0.1)[0])
