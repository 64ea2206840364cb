"""Global-scope lrfu: the pool loop against the heap loop, by batch size, rho and semantics.

    python benchmarks/lrfu_global.py [--batches 1,8,64] [--rhos 0.05,0.1,0.2,0.4,0.75] [--accesses 2000000]
                                     [--pairs 5] [--json]

``replay/_kernels_lrfu_global.py`` replays ``lrfu`` with one global pool by keeping only the low keys ordered (a
sorted run and a side list); the heap loop it replaced (``_kernels_ranked.replay_ranked``) sifts at every access.
Per batch size, on ``bench_scaling.routed_stream(48, 128, B, accesses)`` (Zipf routing, top-8), per rho and per
semantics (event-atomic, sequential-ascending), this times both loops alternated pair by pair and prints each
side's nanoseconds per access (medians), pool / heap (the median of per-pair ratios), and whether both loops' hit
counts and hit flags are equal (exit 1 otherwise). The engine takes the pool loop for every global lrfu replay.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import checked_pairs, int_list, machine, report, rho_list, stream_options, yes_no  # noqa: E402


def row(s, rho: float, atomic: bool, pairs: int, lam: float = 0.5) -> dict:
    """One stream, rho and semantics: both loops' nanoseconds per access, their ratio, and whether they agree."""
    from expertcache.replay import _kernels_lrfu_global as KLG
    from expertcache.replay import _kernels_ranked as KR
    from expertcache.replay import engine
    from expertcache.replay.keys import KEY_LRFU

    L, N = s.n_layers, s.n_experts
    caps = np.array([int(engine.capacities_for_rho(rho, L, N).sum())], dtype=np.int64)
    tie = engine._tie_ranks("random", 0, L * N)
    _, tie_pos = engine._tie_order(tie, 1, L * N)

    def timed(pool: bool, check: bool) -> tuple[float, np.ndarray, np.ndarray]:    # (flags also when timed)
        hits = np.zeros(L, np.int64)
        flags = np.zeros(s.union, np.uint8)
        t0 = time.perf_counter()
        if pool:
            KLG.replay_lrfu_global(s.offsets, s.expert, s.layer, N, L, atomic, caps, tie_pos, lam, 0, hits,
                                   np.zeros(L, np.int64), flags)
        else:
            KR.replay_ranked(s.offsets, s.expert, s.layer, s.step, N, L, True, atomic, caps, tie, KEY_LRFU,
                             int(L * N).bit_length(), 0, False, lam, 0, hits, np.zeros(L, np.int64), flags)
        return time.perf_counter() - t0, hits, flags

    pool, heap, equal = checked_pairs(timed, pairs)
    return {"rho": rho, "capacity": int(caps[0]), "semantics": "event-atomic" if atomic else "sequential-ascending",
            "pool_ns": statistics.median(pool) / s.union * 1e9, "heap_ns": statistics.median(heap) / s.union * 1e9,
            "ratio": statistics.median([a / b for a, b in zip(pool, heap, strict=True)]),
            "hits_equal": equal}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int_list, default=[1, 8, 64], help="comma list (default 1,8,64)")
    ap.add_argument("--rhos", type=rho_list, default=[0.05, 0.1, 0.2, 0.4, 0.75],
                    help="comma list (default 0.05,0.1,0.2,0.4,0.75)")
    stream_options(ap, 2_000_000, 5)
    args = ap.parse_args(argv)

    from bench_scaling import routed_stream

    rows = []
    for b in args.batches:
        s = routed_stream(48, 128, b, args.accesses)
        for atomic in (True, False):
            for rho in args.rhos:
                rows.append({"batch": b, "mean_event": s.union / s.n_events, **row(s, rho, atomic, args.pairs)})

    def line(r: dict) -> str:
        return (f"{r['batch']:>3} {r['mean_event']:>6.1f} {r['semantics']:<20} {r['rho']:>5} {r['capacity']:>5}  "
                f"{r['pool_ns']:>7.1f} {r['heap_ns']:>7.1f} {r['ratio']:>6.2f}  {yes_no(r['hits_equal'])}")

    return report(rows, args.json, {"machine": machine(), "accesses": args.accesses, "pairs": args.pairs},
                  [f"machine: {machine()}",
                   f"ns per access (medians of {args.pairs} alternated pairs); pool / heap: median of per-pair ratios",
                   f"{'B':>3} {'|E|':>6} {'semantics':<20} {'rho':>5} {'c':>5}  {'pool':>7} {'heap':>7} {'ratio':>6}  "
                   "hits equal"], line)


if __name__ == "__main__":
    raise SystemExit(main())
