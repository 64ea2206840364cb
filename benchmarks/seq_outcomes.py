"""What a sequential per-layer access does, by policy: how often it hits, its block leaves at once, or a resident leaves.

    python benchmarks/seq_outcomes.py [--steps 2600] [--rhos 0.1,0.2,0.4,0.75] [--json]

A sequential replay decides once per access (``semantics="sequential-ascending"``), so what a loop costs turns
on the share of each outcome: a hit; a miss whose block leaves at once (its key is below every resident's, so
nothing changes but its own count); a miss that admits its block (where the layer is full, a resident leaves:
an eviction); and
how often the outcome changes from one access to the next (a branch on the outcome is guessed wrong about that
often). ``replay/_kernels_seq.py`` takes the branch on the outcome out of sequential ``lfu``'s loop because
nearly all of its misses leave at once (docs/performance.md, *Session 37*); these rows show why the same does
not carry over to ``lrfu`` and ``lfru``, whose misses nearly all evict.

Counted by a plain loop here (a linear scan of the layer's residents for the lowest key at every miss), not by
the shipped kernels, on ``bench_vs_libcachesim.drifting_qwen_stream(steps)`` (48 x 128, B = 8), members
ascending, random tie order (seed 0): ``lfu`` (counts kept when a block leaves), ``lrfu`` (lambda 0.5, a layer's
units its accesses; the key ``log2(CRF) + lambda u``), ``lfru`` (the key ``count / (t - last + 1)``, ``t`` the
access's index in the stream). Lower ``(key, tie position)`` leaves, the accessed block included. A check on
the shipped kernels' hit counts is printed beside (``hits equal``), so a row stands for what they decide.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import positive_int, report, rho_list, yes_no  # noqa: E402

#: The policies of the rows and their codes in :func:`outcomes`.
_CODES = {"lfu": 0, "lrfu": 1, "lfru": 2}


@numba.njit(cache=False)
def outcomes(offsets, expert, ev_layer, n_experts, n_layers, caps, tie_pos, code, lam):
    """``(hits, leave at once, admissions, outcome changes)`` of a sequential per-layer replay, and its hits per
    layer."""
    nb = n_layers * n_experts
    cnt = np.zeros(nb)                 # lfu / lfru counts, lrfu CRF
    last = np.full(nb, -1.0)           # lrfu / lfru last unit
    res = np.zeros(nb, np.bool_)
    size = np.zeros(n_layers, np.int64)
    units = np.zeros(n_layers, np.int64)
    hits = np.zeros(n_layers, np.int64)
    out = np.zeros(4, np.int64)
    prev = -1
    for i in range(offsets.shape[0] - 1):
        layer = ev_layer[i]
        cap = caps[layer]
        for a in range(offsets[i], offsets[i + 1]):
            b = layer * n_experts + expert[a]
            u = units[layer]
            units[layer] = u + 1
            t = float(u) if code == 1 else float(a)
            if code == 1:
                cnt[b] = 1.0 + cnt[b] * 2.0 ** (-lam * (t - last[b])) if last[b] >= 0 else 1.0
            else:
                cnt[b] += 1.0
            last[b] = t
            kind = 0
            if res[b]:
                hits[layer] += 1
            elif size[layer] < cap:
                res[b] = True
                size[layer] += 1
                kind = 2
            else:
                best = -1
                bk = np.inf
                bt = 1 << 30
                for e in range(n_experts + 1):          # the residents, then the accessed block
                    q = layer * n_experts + e if e < n_experts else b
                    if e < n_experts and (not res[q] or q == b):
                        continue
                    if code == 0:
                        k = cnt[q]
                    elif code == 1:
                        k = np.log2(cnt[q]) + lam * last[q]
                    else:
                        k = cnt[q] / (t - last[q] + 1.0)
                    tp = tie_pos[q]
                    if k < bk or (k == bk and tp < bt):
                        bk = k
                        bt = tp
                        best = q
                if best == b or cap <= 0:
                    kind = 1
                else:
                    res[best] = False
                    res[b] = True
                    kind = 2
            out[kind] += 1
            if prev >= 0 and kind != prev:
                out[3] += 1
            prev = kind
    return out, hits


def _shipped_hits(s, caps, tie_pos, policy):
    from expertcache.replay import _kernels_seq as KQ

    L, N = s.n_layers, s.n_experts
    h = np.zeros(L, np.int64)
    m = np.zeros(L, np.int64)
    head = (s.offsets, s.expert, s.layer, N, L, caps, tie_pos)
    if policy == "lfu":
        KQ.replay_lfu_seq(*head, False, 0, h, m, np.zeros(0, np.uint8))
    elif policy == "lrfu":
        KQ.replay_lrfu_seq(*head, 0.5, 0, h, m, np.zeros(0, np.uint8))
    else:
        KQ.replay_lfru_seq(*head, 0, h, m, np.zeros(0, np.uint8))
    return h


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=positive_int, default=2600, help="decode steps of the stream (2,600: 5 M accesses)")
    ap.add_argument("--rhos", type=rho_list, default="0.1,0.2,0.4,0.75", help="cache fractions, comma-separated")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args(argv)
    from bench_vs_libcachesim import drifting_qwen_stream

    from expertcache.replay import engine

    s = drifting_qwen_stream(a.steps, sample_seed=1)
    L, N = s.n_layers, s.n_experts
    _, tie_pos = engine._tie_order(engine._tie_ranks("random", 0, L * N), L, N)
    n = s.expert.shape[0]
    rows = []
    for policy in _CODES:
        for rho in a.rhos:
            caps = engine.capacities_for_rho(rho, L, N)
            out, hits = outcomes(s.offsets, s.expert, s.layer, N, L, caps, tie_pos, _CODES[policy], 0.5)
            rows.append({"policy": policy, "rho": rho, "hit": out[0] / n, "leave_at_once": out[1] / n,
                         "admit": out[2] / n, "outcome_changes": out[3] / n,
                         "hits_equal": bool((hits == _shipped_hits(s, caps, tie_pos, policy)).all())})
    return report(rows, a.json, {"accesses": int(n)},
                  [f"stream: {s.offsets.shape[0] - 1} events, {n} accesses; shares of accesses",
                   f"{'policy':6} {'rho':>5} {'hit':>7} {'leave':>7} {'admit':>7} {'change':>7}  hits equal"],
                  lambda r: f"{r['policy']:6} {r['rho']:5.2f} {r['hit']:7.3f} {r['leave_at_once']:7.3f} "
                            f"{r['admit']:7.3f} {r['outcome_changes']:7.3f}  {yes_no(r['hits_equal'])}")


if __name__ == "__main__":
    sys.exit(main())
