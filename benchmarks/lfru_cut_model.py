"""Per-layer lfru's cuts, modelled: how many moved cuts and how wide a band each rule of the cuts gives.

    python benchmarks/lfru_cut_model.py [--steps 650] [--rhos 0.1,0.2,0.3,0.4,0.75] [--cuts 0.85,1.2]
                                        [--first-steps 4,1.5]

The per-layer lfru loop (``_kernels_bits._replay_lfru_bits``) ranks a layer's ``C ∪ U`` against two cuts set
from the layer's last ``need``-th key (times ``--cuts``). A cut on the wrong side becomes the other cut and a cut
further out is ranked alone, by a first factor (``--first-steps``: the rules compared), squared at each further
step; the ``need`` lowest keys between the two cuts (the *band*) are then ranked exactly: up to 16 in registers,
17-64 by a sorting network, which costs several times more. This replays per-layer event-atomic lfru in numpy
(``drifting_qwen_stream`` of ``bench_vs_libcachesim.py``, 48 x 128, B = 8; ties by expert id, no 8-bit rounding
of the cuts) and applies each rule to every overflow after the first 3,000 events: moved cuts per overflow and
the share of overflows with no band to rank, a band of up to 8, 9-16, 17-64, more. The model chose the loop's
first step (1.5, was 4; docs/performance.md, *Cuts that step by little*). Counts taken in the kernel itself on
the same stream agree within 3 points, except at rho 0.3 with a first step of 4 (bands of 17-64 after 42% of
the overflows here, 16% there: the two break ties differently, and at rho 0.3 the layers' paths part). Each rule
runs twice: with one pair of cuts per layer (the loop before session 33), and with a pair for each regime (units
with more members than the quota, and the others: the loop since).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import machine  # noqa: E402
from bench_vs_libcachesim import drifting_qwen_stream  # noqa: E402

from expertcache.replay import engine  # noqa: E402


def overflows(stream, rho: float, skip: int = 3000) -> list[tuple[int, np.ndarray, int, float, int]]:
    """Per overflow after event ``skip``: the layer, the sorted keys of ``C ∪ U``, ``m``, the layer's last
    ``need``-th key before it (``nan`` at a layer's first overflow) and the regime (1 where the event has more
    members than the quota, else 0)."""
    L, N = stream.n_layers, stream.n_experts
    caps = engine.capacities_for_rho(rho, L, N)
    F = np.zeros((L, N))
    last = np.zeros((L, N))
    res = np.zeros((L, N), dtype=bool)
    prev = np.full(L, np.nan)
    out = []
    off, ex, ly = stream.offsets, stream.expert, stream.layer
    for i in range(off.shape[0] - 1):
        layer = ly[i]
        e = ex[off[i]:off[i + 1]]
        F[layer, e] += 1.0
        last[layer, e] = i
        res[layer, e] = True
        idx = np.flatnonzero(res[layer])
        m = idx.shape[0] - int(caps[layer])
        if m <= 0:
            continue
        key = F[layer, idx] / (i - last[layer, idx] + 1.0)
        order = np.argsort(key, kind="stable")
        res[layer, idx[order[:m]]] = False
        if i >= skip and prev[layer] == prev[layer]:
            out.append((layer, np.sort(key), m, prev[layer], int(e.shape[0] > caps[layer])))
        prev[layer] = key[order[m - 1]]
    return out


def rule(records, lo: float, hi: float, first: float, per_regime: bool = False) -> tuple[float, np.ndarray]:
    """Moved cuts per overflow and the shares of bands none / <=8 / 9-16 / 17-64 / >64 under one rule. As in the
    loop, the next cuts follow the ``need``-th key, or the low cut where no key of the band leaves; with
    ``per_regime`` a layer keeps one such key for each regime (a record's fifth field, 0 where it has four), as
    the loop does since session 33."""
    moved = 0
    classes = np.zeros(5)
    at = {}
    for rec in records:
        layer, keys, m, v0 = rec[:4]
        where = (layer, rec[4] if per_regime and len(rec) > 4 else 0)
        v = at.get(where, v0)
        t0, t1 = lo * v, hi * v
        c0 = int(np.searchsorted(keys, t0, side="right"))
        c1 = int(np.searchsorted(keys, t1, side="right"))
        g = first
        while c0 > m or c1 < m:
            moved += 1
            if c0 > m:
                t1, c1 = t0, c0
                t0 /= g
                c0 = int(np.searchsorted(keys, t0, side="right"))
            else:
                t0, c0 = t1, c1
                t1 *= g
                c1 = int(np.searchsorted(keys, t1, side="right"))
            g *= g
        need, nb = m - c0, c1 - c0
        at[where] = t0 if need == 0 else keys[m - 1]
        k = 0 if need == 0 or need == nb else 1 if nb <= 8 else 2 if nb <= 16 else 3 if nb <= 64 else 4
        classes[k] += 1
    return moved / len(records), classes / len(records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=650, help="stream steps (650: 1.25 M accesses)")
    ap.add_argument("--rhos", default="0.1,0.2,0.3,0.4,0.75")
    ap.add_argument("--cuts", default="0.85,1.2", help="the low and high cut as factors of the last need-th key")
    ap.add_argument("--first-steps", default="4,1.5", help="first factors a moved cut steps out by, compared")
    args = ap.parse_args()
    lo, hi = (float(x) for x in args.cuts.split(","))
    print(f"machine: {machine()}")
    stream = drifting_qwen_stream(args.steps, sample_seed=1)
    print(f"{args.steps} steps, cuts {lo:g} / {hi:g}: moved cuts per overflow; bands none / <=8 / 9-16 / 17-64 / >64")
    for rho in (float(x) for x in args.rhos.split(",")):
        records = overflows(stream, rho)
        ratio = np.array([keys[m - 1] / v for _, keys, m, v, _ in records if v > 0])
        q = np.percentile(ratio, [5, 50, 95])
        print(f"  rho {rho:<5g} next need-th key / last: {q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f} (5 / 50 / 95%)")
        for first in (float(x) for x in args.first_steps.split(",")):
            for per_regime in (False, True):
                per, sh = rule(records, lo, hi, first, per_regime)
                name = "cuts per regime" if per_regime else "one pair"
                print(f"  rho {rho:<5g} first step {first:<4g} {name:<15} {per:5.2f}   "
                      + " / ".join(f"{x:4.0%}" for x in sh))


if __name__ == "__main__":
    main()
