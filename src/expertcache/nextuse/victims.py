"""Victim-ranking instrumentation at eviction decisions (§7.3, Table 16 shape).

The predicted-next-use policy is replayed (event-atomic, Belady's machinery on
advice). At every ``every``-th eviction decision — one victim leaving the
candidate set (the residents plus the unit's not-yet-decided misses) — the
candidate set is recorded with each candidate's true next use, predicted next
use, last use and frequency. Then, at the identical cache state:

* the **optimal-victim set** is tie-aware: every candidate attaining the
  maximal true next use (never-again counts as the maximum);
* each chooser — a uniformly random candidate (its expectation, exactly),
  predicted next use (the policy's own choice), LRU, LFRU — is scored on
  whether it picks inside that set, and by its **distance regret**
  ``(D_opt - D_chosen) / n_units`` with ``D`` the true next-use distance
  (never-again = the distance to the end of the stream);
* **Spearman** correlation of predicted vs true next use over the candidates
  (average ranks), per decision, averaged; also excluding never-again candidates.

95% intervals come from a cluster bootstrap over scheduler steps (decisions of
one step move together), seeded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .._jit import jit
from ..events import EventStream
from ..replay import ReplayConfig, capacities_for_rho, total_capacity
from ..replay import _kernels as K
from ..replay.engine import _advice_next_use, _tie_ranks
from .advice import Advice

__all__ = ["VictimDecisions", "CANDIDATE_SETS", "record_decisions", "VictimReport", "score_decisions", "cluster_bootstrap"]


@jit
def _record(offsets, expert, ev_layer, ev_step, n_experts, n_layers, global_scope, pred_next, true_next, capacity,
            tie, every, max_rows, residents_only, dec_unit, dec_step, dec_start, dec_len, dec_choice,
            c_block, c_true, c_pred, c_last, c_freq):
    """Replay predicted-next-use with a max-heap on predicted keys; record every ``every``-th decision.

    ``residents_only``: the candidates are the blocks resident before the event (this event's misses are
    left out, and a decision whose victim is one of them, a bypass, is not sampled).
    """
    n_blocks = n_layers * n_experts
    n_events = offsets.shape[0] - 1
    heap, hk, size, pos, low = K.next_use_heaps(capacity, n_blocks, K._max_unit(offsets, True), tie)
    last = np.full(n_blocks, -1, dtype=np.int64)
    freq = np.zeros(n_blocks, dtype=np.int64)
    cur_true = np.zeros(n_blocks, dtype=np.int64)
    cur_pred = np.zeros(n_blocks, dtype=np.int64)
    missed_at = np.full(n_blocks, -1, dtype=np.int64)
    n_dec = 0
    n_rows = 0
    pops = 0
    for i in range(n_events):
        layer = ev_layer[i]
        p = 0 if global_scope else layer
        cap = capacity[p]
        base = layer * n_experts
        n_miss = 0
        for a in range(offsets[i], offsets[i + 1]):
            b = base + expert[a]
            last[b] = i
            freq[b] += 1
            cur_true[b] = true_next[a]
            cur_pred[b] = pred_next[a]
            key = (np.int64(pred_next[a]) << 23) | low[b]
            if pos[b] >= 0:
                K._up(heap, hk, p, pos[b], b, key, pos)
            else:
                n = size[p]
                size[p] = n + 1
                K._up(heap, hk, p, n, b, key, pos)
                n_miss += 1
                missed_at[b] = i
        while size[p] > cap:
            pops += 1
            bypass = residents_only and missed_at[heap[p, 0]] == i
            if pops % every == 0 and not bypass and n_dec < dec_unit.shape[0] and n_rows + size[p] <= max_rows:
                dec_unit[n_dec] = i
                dec_step[n_dec] = ev_step[i]
                dec_start[n_dec] = n_rows
                dec_choice[n_dec] = heap[p, 0]
                n0 = n_rows
                for j in range(size[p]):
                    q = heap[p, j]
                    if residents_only and missed_at[q] == i:
                        continue
                    c_block[n_rows] = q
                    c_true[n_rows] = cur_true[q]
                    c_pred[n_rows] = cur_pred[q]
                    c_last[n_rows] = last[q]
                    c_freq[n_rows] = freq[q]
                    n_rows += 1
                dec_len[n_dec] = n_rows - n0
                n_dec += 1
            b = heap[p, 0]
            pos[b] = -1
            n = size[p] - 1
            size[p] = n
            if n > 0:
                K._down(heap, hk, p, 0, n, heap[p, n], hk[p, n], pos)
    return n_dec, n_rows


@dataclass(frozen=True)
class VictimDecisions:
    """Sampled decisions: per decision its unit, step and candidate rows (``start:start+len``)."""

    n_units: int
    unit: np.ndarray
    step: np.ndarray
    start: np.ndarray
    length: np.ndarray
    choice: np.ndarray
    block: np.ndarray
    true_next: np.ndarray
    pred_next: np.ndarray
    last: np.ndarray
    freq: np.ndarray
    tie: np.ndarray
    candidates: str = "residents"


#: Candidate sets :func:`record_decisions` can record.
CANDIDATE_SETS = ("residents", "residents+misses")


def record_decisions(stream: EventStream, advice: Advice, rho: float = 0.4, scope: str = "per-layer",
                     seed: int = 0, every: int = 37, max_decisions: int = 50_000,
                     max_rows: int = 5_000_000, candidates: str = "residents") -> VictimDecisions:
    """Replay predicted-next-use under ``advice`` and record every ``every``-th eviction decision.

    ``candidates="residents"`` (default, the §7.3 reading): the blocks resident when the event begins, so
    a decision ranks at most the capacity; decisions whose victim is one of the event's own misses
    (bypasses) are not sampled. ``"residents+misses"``: the residents plus the event's not-yet-decided
    misses, everything the policy's heap holds at the pop.
    """
    from ..errors import ValidationError

    if candidates not in CANDIDATE_SETS:
        raise ValidationError(f"candidates must be one of {', '.join(CANDIDATE_SETS)}; got {candidates!r}",
                              field="candidates")
    cfg = ReplayConfig("predicted-next-use", rho=rho, scope=scope, seed=seed)
    pred = _advice_next_use(stream, cfg, advice)
    L, N = stream.n_layers, stream.n_experts
    caps = (np.array([total_capacity(rho, L, N)], dtype=np.int64) if scope == "global"
            else capacities_for_rho(rho, L, N))
    tie = _tie_ranks("random", seed, L * N)
    true_next = K.next_use(stream.offsets, stream.expert, stream.layer, N, L, True)
    d = [np.empty(max_decisions, dtype=np.int64) for _ in range(5)]
    c = [np.empty(max_rows, dtype=np.int64) for _ in range(5)]
    n_dec, n_rows = _record(stream.offsets, stream.expert, stream.layer, stream.step, N, L, scope == "global", pred,
                            true_next, caps, tie, max(1, int(every)), max_rows, candidates == "residents", *d, *c)
    d = [x[:n_dec] for x in d]
    c = [x[:n_rows] for x in c]
    return VictimDecisions(stream.n_events, *d, *c, tie, candidates)


def _avg_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    xs = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2:
        return np.nan
    ra, rb = _avg_ranks(a), _avg_ranks(b)
    sa, sb = ra.std(), rb.std()
    return float(((ra - ra.mean()) * (rb - rb.mean())).mean() / (sa * sb)) if sa > 0 and sb > 0 else np.nan


@dataclass(frozen=True)
class VictimReport:
    """Table 16 shape: per chooser, in-optimal-set rate and distance regret, with 95% cluster-bootstrap CIs."""

    n_decisions: int
    candidates: str
    mean_candidates: float
    mean_optimal_set: float
    in_optimal_set: dict[str, tuple[float, float, float]]
    distance_regret: dict[str, tuple[float, float, float]]
    spearman_all: tuple[float, float, float]
    spearman_excluding_never: tuple[float, float, float]

    def to_dict(self) -> dict:
        return asdict(self)


def cluster_bootstrap(values: np.ndarray, clusters: np.ndarray, n_boot: int = 1000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): resample whole clusters with replacement; NaN values are ignored."""
    ok = ~np.isnan(values)
    values, clusters = values[ok], clusters[ok]
    if values.size == 0:
        return (np.nan, np.nan, np.nan)
    ids, inv = np.unique(clusters, return_inverse=True)
    sums = np.bincount(inv, weights=values, minlength=ids.size)
    counts = np.bincount(inv, minlength=ids.size).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, ids.size, size=(n_boot, ids.size))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    a = (1 - level) / 2
    return (float(values.mean()), float(np.quantile(means, a)), float(np.quantile(means, 1 - a)))


def score_decisions(dec: VictimDecisions, n_boot: int = 1000, seed: int = 0) -> VictimReport:
    """Score each chooser at every recorded decision (tie-aware), with cluster-bootstrap CIs over steps."""
    n = dec.unit.shape[0]
    names = ("random candidate", "predicted next use", "LRU", "LFRU")
    inset = {k: np.empty(n) for k in names}
    regret = {k: np.empty(n) for k in names}
    sp_all, sp_ex = np.empty(n), np.empty(n)
    opt_sizes = np.empty(n)
    horizon = dec.n_units
    for j in range(n):
        s = slice(dec.start[j], dec.start[j] + dec.length[j])
        t = dec.unit[j]
        blk, tn, pn = dec.block[s], dec.true_next[s], dec.pred_next[s]
        never = tn >= int(K.NEVER)
        dist = np.where(never, horizon - t, tn - t).astype(np.float64)
        opt = dist == dist.max()                       # tie-aware: every candidate at the maximal true next use
        opt_sizes[j] = opt.sum()
        tie = dec.tie[blk]
        lfru = dec.freq[s] / (t - dec.last[s] + 1.0)
        picks = {
            "predicted next use": int(np.flatnonzero(blk == dec.choice[j])[0]),
            "LRU": int(np.lexsort((tie, dec.last[s]))[0]),
            "LFRU": int(np.lexsort((tie, lfru))[0]),
        }
        inset["random candidate"][j] = opt.mean()
        regret["random candidate"][j] = (dist.max() - dist.mean()) / horizon
        for k, i in picks.items():
            inset[k][j] = float(opt[i])
            regret[k][j] = (dist.max() - dist[i]) / horizon
        sp_all[j] = _spearman(pn.astype(np.float64), dist + t)
        sp_ex[j] = _spearman(pn[~never].astype(np.float64), (dist + t)[~never])
    boot = {k: cluster_bootstrap(inset[k], dec.step, n_boot, seed) for k in names}
    rboot = {k: cluster_bootstrap(regret[k], dec.step, n_boot, seed) for k in names}
    return VictimReport(n, dec.candidates, float(dec.length.mean()) if n else 0.0, float(opt_sizes.mean()) if n else 0.0, boot,
                        rboot, cluster_bootstrap(sp_all, dec.step, n_boot, seed),
                        cluster_bootstrap(sp_ex, dec.step, n_boot, seed))
