"""How non-uniform and how temporally local a trace's decode routing is.

Two readings of the decode tokens of a :class:`~expertcache.trace.RoutingTrace`:

* **Top-fraction share** (skew): per layer, the share of decode assignments
  (``k`` per token) that go to the most-used ``q*N`` experts, averaged over
  layers. ``q*N`` need not be an integer: the last expert counts fractionally,
  so uniform use gives exactly ``q`` (0.10 for the default top 10%).
* **Adjacent-step Jaccard** (temporal locality): for each request and layer,
  ``|S_t ∩ S_t+1| / |S_t ∪ S_t+1|`` of the top-k sets of consecutive decode
  tokens, averaged over all (request, layer, adjacent pair). The **time-shuffled
  control** recomputes it after permuting each request's decode tokens at
  random (seeded), which keeps every request's expert frequencies and destroys
  their order: the difference is locality in time, not popularity. For scale,
  ``uniform_jaccard`` is the expectation for two independent uniform k-subsets
  of ``N``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ValidationError
from ..trace import DECODE, RoutingTrace

__all__ = ["LocalityStats", "routing_locality", "top_share", "uniform_jaccard"]


@dataclass(frozen=True)
class LocalityStats:
    """Skew and temporal locality of decode routing (means over layers / pairs; per-layer tuples).

    Attributes
    ----------
    top_fraction
        ``q``: the fraction of experts whose share is measured.
    top_share, top_share_per_layer
        Share of decode assignments going to the most-used ``q*N`` experts (uniform: ``q``).
    adjacent_jaccard, adjacent_jaccard_per_layer
        Mean Jaccard similarity of consecutive decode tokens' expert sets (NaN without pairs).
    shuffled_jaccard, shuffled_jaccard_per_layer
        The same after permuting decode tokens within each request, averaged over ``n_shuffles``.
    uniform_jaccard
        Expected Jaccard of two independent uniform k-subsets of ``N`` experts.
    n_decode_tokens, n_pairs
        Decode tokens read; adjacent (request, token pair) count (each contributes ``L`` layer values).
    n_shuffles, seed
        Control repetitions and the seed of their permutations.
    """

    top_fraction: float
    top_share: float
    top_share_per_layer: tuple[float, ...]
    adjacent_jaccard: float
    adjacent_jaccard_per_layer: tuple[float, ...]
    shuffled_jaccard: float
    shuffled_jaccard_per_layer: tuple[float, ...]
    uniform_jaccard: float
    n_decode_tokens: int
    n_pairs: int
    n_shuffles: int
    seed: int

    def to_dict(self) -> dict:
        """The record as a JSON-ready dict."""
        return asdict(self)


def top_share(counts: np.ndarray, top_fraction: float) -> np.ndarray:
    """``float64[L]``: share of each layer's count held by its top ``top_fraction * N`` experts.

    ``counts`` is ``[L, N]``; the ``ceil(qN)``-th expert is counted with weight ``qN - floor(qN)``
    when ``qN`` is fractional. Layers with no counts give NaN.
    """
    counts = np.asarray(counts, dtype=np.float64)
    L, N = counts.shape
    m = top_fraction * N
    whole = int(math.floor(m + 1e-12))
    frac = m - whole
    srt = -np.sort(-counts, axis=1)
    top = srt[:, :whole].sum(axis=1)
    if whole < N and frac > 1e-12:
        top = top + frac * srt[:, whole]
    tot = counts.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tot > 0, top / tot, np.nan)


def uniform_jaccard(n_experts: int, top_k: int) -> float:
    """Expected Jaccard of two independent uniformly random ``k``-subsets of ``N`` (hypergeometric overlap)."""
    N, k = n_experts, top_k
    total = math.comb(N, k)
    return sum(math.comb(k, i) * math.comb(N - k, k - i) / total * i / (2 * k - i)
               for i in range(max(0, 2 * k - N), k + 1))


def _pair_jaccard(experts: np.ndarray, order: np.ndarray, request: np.ndarray) -> tuple[np.ndarray, int]:
    """Per-layer mean Jaccard over consecutive rows of ``order`` that belong to the same request."""
    a, b = order[:-1], order[1:]
    same = request[a] == request[b]
    a, b = a[same], b[same]
    L, k = experts.shape[1], experts.shape[2]
    if a.size == 0:
        return np.full(L, np.nan), 0
    sums = np.zeros(L, dtype=np.float64)
    chunk = max(1, 2_000_000 // (L * k * k))
    for s in range(0, a.size, chunk):
        ea, eb = experts[a[s:s + chunk]], experts[b[s:s + chunk]]          # (P, L, k)
        inter = (ea[:, :, :, None] == eb[:, :, None, :]).sum(axis=(2, 3))   # ids are distinct per (token, layer)
        sums += (inter / (2 * k - inter)).sum(axis=0)
    return sums / a.size, int(a.size)


def routing_locality(trace: RoutingTrace, *, top_fraction: float = 0.1, n_shuffles: int = 8,
                     seed: int = 0) -> LocalityStats:
    """Skew and temporal locality of the decode routing of ``trace`` (see the module docstring).

    Parameters
    ----------
    trace
        A routing trace; only decode tokens are read, in position order per request.
    top_fraction
        ``q`` in (0, 1]: measure the share of the top ``q*N`` experts.
    n_shuffles
        Repetitions of the time-shuffled control (>= 1).
    seed
        Seed of the control's permutations.
    """
    if not (0 < top_fraction <= 1):
        raise ValidationError(f"top_fraction must be in (0, 1]; got {top_fraction}", field="top_fraction")
    if isinstance(n_shuffles, bool) or not isinstance(n_shuffles, int) or n_shuffles < 1:
        raise ValidationError(f"n_shuffles must be a positive integer; got {n_shuffles!r}", field="n_shuffles")
    rows = np.flatnonzero(trace.phase == DECODE)
    if rows.size == 0:
        raise ValidationError("the trace holds no decode tokens; locality is measured on decode routing")
    L, N, k = trace.n_layers, trace.n_experts, trace.top_k
    experts = trace.experts[rows].astype(np.int64)
    request = trace.request[rows]
    # Trace rows are grouped by request and sorted by position inside it (validated on construction).
    counts = np.bincount((np.arange(L)[None, :, None] * N + experts).ravel(), minlength=L * N).reshape(L, N)
    shares = top_share(counts, top_fraction)

    ident = np.arange(rows.size)
    adj, n_pairs = _pair_jaccard(experts, ident, request)
    rng = np.random.default_rng(seed)
    shuf = np.zeros(L, dtype=np.float64)
    for _ in range(n_shuffles):
        order = np.lexsort((rng.random(rows.size), request))  # a uniform permutation inside each request
        shuf += _pair_jaccard(experts, order, request)[0]
    shuf /= n_shuffles
    return LocalityStats(
        top_fraction=float(top_fraction), top_share=float(np.nanmean(shares)),
        top_share_per_layer=tuple(float(x) for x in shares),
        adjacent_jaccard=float(adj.mean()), adjacent_jaccard_per_layer=tuple(float(x) for x in adj),
        shuffled_jaccard=float(shuf.mean()), shuffled_jaccard_per_layer=tuple(float(x) for x in shuf),
        uniform_jaccard=float(uniform_jaccard(N, k)), n_decode_tokens=int(rows.size), n_pairs=n_pairs,
        n_shuffles=n_shuffles, seed=seed)
