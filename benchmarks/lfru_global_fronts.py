"""Sequential global ``lfru``: how many count groups its pool forms, and where the leaving block's count sits.

    python benchmarks/lfru_global_fronts.py [--steps 600] [--rhos 0.1,0.2,0.3] [--json]

Under global scope and sequential semantics (``scope="global"``, one unit per access) a miss past the pool's
quota evicts the lowest ``count / (t - last + 1)`` of the residents and the accessed block (``t`` the access's
index in the stream; lower tie rank first among equal keys). Residents that share a count keep their order until
one is accessed (the older one is lower at every later unit), so only each count's oldest resident, the front of
its *group*, can leave: a loop that ranks fronts only ranks as many candidates as the pool has distinct counts.
These rows count them at the evictions (every ``--every``-th), with the rank of the leaving block's count among
them (0: the lowest count), so that a candidate structure for the global loop can be judged before it is built
(docs/performance.md, *Session 39*).

Counted by a plain loop here (a linear scan of the pool at every miss past the quota), not by the shipped kernel,
on ``replay_throughput.qwen_shaped_stream(steps)`` (48 x 128, top-8, B = 8; the stream of the global rows of
``replay_throughput.py``), members ascending, random tie ranks (seed 0), the pool ``rho * N`` a layer's worth
times ``L``. The shipped group loop's hits (``_kernels_lfru_groups.replay_lfru_groups``) are checked beside
(``hits equal``), so a row stands for what it decides.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import positive_int, report, rho_list, yes_no  # noqa: E402


@numba.njit(cache=False)
def fronts(offsets, expert, ev_layer, n_experts, n_layers, cap, tie, every):
    """``(evictions, evictions sampled, their summed distinct counts among the residents, the summed rank of the
    leaving block's count among those)`` of a sequential global ``lfru`` replay, and its hits per layer."""
    nb = n_layers * n_experts
    freq = np.zeros(nb, np.int64)
    last = np.zeros(nb, np.int64)
    res = np.zeros(nb, np.bool_)
    pool = np.empty(max(cap, 1), np.int64)
    counts = np.empty(max(cap, 1), np.int64)
    size = 0
    hits = np.zeros(n_layers, np.int64)
    out = np.zeros(4, np.int64)
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        for a in range(offsets[i], offsets[i + 1]):
            b = layer * n_experts + expert[a]
            freq[b] += 1
            last[b] = a
            if res[b]:
                hits[layer] += 1
                continue
            if size < cap:
                pool[size] = b
                size += 1
                res[b] = True
                continue
            if cap <= 0:
                continue
            best = -1
            bk = np.inf
            bt = 0
            for j in range(size):                    # the residents' keys at unit a
                q = pool[j]
                k = freq[q] / float(a - last[q] + 1)
                if k < bk or (k == bk and tie[q] < bt):
                    bk = k
                    bt = tie[q]
                    best = j
            nk = float(freq[b])                      # the accessed block's key: its count over an age of 1
            if nk < bk or (nk == bk and tie[b] < bt):
                continue                             # it leaves at once
            v = pool[best]
            if out[0] % every == 0:
                for j in range(size):
                    counts[j] = freq[pool[j]]
                distinct = np.unique(counts[:size])
                out[1] += 1
                out[2] += distinct.shape[0]
                out[3] += np.searchsorted(distinct, freq[v])
            out[0] += 1
            res[v] = False
            res[b] = True
            pool[best] = b
    return out, hits


def _shipped_hits(s, cap, tie):
    from expertcache.replay import _kernels_lfru_groups as KG

    h = np.zeros(s.n_layers, np.int64)
    m = np.zeros(s.n_layers, np.int64)
    KG.replay_lfru_groups(s.offsets, s.expert, s.layer, s.n_experts, s.n_layers, False, np.array([cap], np.int64),
                          tie, 0, h, m, np.zeros(0, np.uint8))
    return h


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=positive_int, default=600, help="decode steps of the stream (600: 1.16 M accesses)")
    ap.add_argument("--rhos", type=rho_list, default="0.1,0.2,0.3", help="cache fractions, comma-separated")
    ap.add_argument("--every", type=positive_int, default=97, help="count the groups at every n-th eviction")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args(argv)
    from replay_throughput import qwen_shaped_stream

    from expertcache.replay import engine

    s = qwen_shaped_stream(a.steps)
    L, N = s.n_layers, s.n_experts
    tie = engine._tie_ranks("random", 0, L * N)
    n = int(s.expert.shape[0])
    rows = []
    for rho in a.rhos:
        cap = int(engine.capacities_for_rho(rho, L, N).sum())
        out, hits = fronts(s.offsets, s.expert, s.layer, N, L, cap, tie, a.every)
        k = max(int(out[1]), 1)
        rows.append({"rho": rho, "pool": cap, "evictions_per_access": int(out[0]) / n,
                     "groups": int(out[2]) / k, "leaving_rank": int(out[3]) / k,
                     "hits_equal": bool((hits == _shipped_hits(s, cap, tie)).all())})
    return report(rows, a.json, {"accesses": n},
                  [f"stream: {s.offsets.shape[0] - 1} events, {n} accesses; means over every {a.every}th eviction",
                   f"{'rho':>5} {'pool':>6} {'evict/acc':>9} {'groups':>7} {'leaving rank':>12}  hits equal"],
                  lambda r: f"{r['rho']:5.2f} {r['pool']:6d} {r['evictions_per_access']:9.3f} {r['groups']:7.1f} "
                            f"{r['leaving_rank']:12.1f}  {yes_no(r['hits_equal'])}")


if __name__ == "__main__":
    sys.exit(main())
