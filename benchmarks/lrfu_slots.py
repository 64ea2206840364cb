"""Event-atomic global lrfu: the slots loop against the pool loop, by batch size, rho and lambda.

    python benchmarks/lrfu_slots.py [--batches 1,8,64] [--rhos 0.05,0.1,0.2,0.4,0.6] [--lams 0.5]
                                    [--accesses 2000000] [--pairs 5] [--json]

``replay/_kernels_lrfu_slots.py`` replays event-atomic ``lrfu`` with one global pool on dense slots with float32
values and vector cuts; the pool loop (``_kernels_lrfu_global.replay_lrfu_global``) keeps the low keys in a sorted
run. Per batch size, on ``bench_scaling.routed_stream(48, 128, B, accesses)`` (Zipf routing, top-8), per rho and
lambda, this times both loops alternated pair by pair (the first side alternating too) and prints each side's
nanoseconds per access (medians), slots / pool as the minimum and the median of the per-pair ratios, the cache's
blocks per member of a mean event (the engine takes the slots loop up to ``SLOTS_BASE + SLOTS_SLOPE * E`` of
them, ``E`` the mean event: ``_kernels_lrfu_slots.fits``),
and whether both loops' hit counts and hit flags are equal (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import (  # noqa: E402
    checked_pairs,
    int_list,
    machine,
    pair_fields,
    report,
    rho_list,
    stream_options,
    unit_list,
    yes_no,
)

#: An argument type: lambdas in [0, 1], comma-separated.
lam_list = unit_list("lambdas", "0.1,0.5")


def row(s, rho: float, lam: float, pairs: int) -> dict:
    """One stream, rho and lambda: both loops' nanoseconds per access, their ratios, and whether they agree."""
    from expertcache.replay import _kernels_lrfu_global as KLG
    from expertcache.replay import _kernels_lrfu_slots as KLQ
    from expertcache.replay import engine

    L, N = s.n_layers, s.n_experts
    caps = np.array([int(engine.capacities_for_rho(rho, L, N).sum())], dtype=np.int64)
    tie = engine._tie_ranks("random", 0, L * N)
    _, tie_pos = engine._tie_order(tie, 1, L * N)

    def timed(slots: bool, check: bool) -> tuple[float, np.ndarray, np.ndarray]:   # (flags also when timed)
        hits = np.zeros(L, np.int64)
        flags = np.zeros(s.union, np.uint8)
        t0 = time.perf_counter()
        if slots:
            KLQ.replay_lrfu_slots(s.offsets, s.expert, s.layer, N, L, caps, tie_pos, lam, 0, hits,
                                  np.zeros(L, np.int64), flags)
        else:
            KLG.replay_lrfu_global(s.offsets, s.expert, s.layer, N, L, True, caps, tie_pos, lam, 0, hits,
                                   np.zeros(L, np.int64), flags)
        return time.perf_counter() - t0, hits, flags

    slots, pool, equal = checked_pairs(timed, pairs)
    return {"rho": rho, "lam": lam, "capacity": int(caps[0]), "per_member": int(caps[0]) * s.n_events / s.union,
            **pair_fields(("slots", "pool"), slots, pool, s.union), "hits_equal": equal}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int_list, default=[1, 8, 64], help="comma list (default 1,8,64)")
    ap.add_argument("--rhos", type=rho_list, default=[0.05, 0.1, 0.2, 0.4, 0.6],
                    help="comma list (default 0.05,0.1,0.2,0.4,0.6)")
    ap.add_argument("--lams", type=lam_list, default=[0.5], help="comma list of lambdas (default 0.5)")
    stream_options(ap, 2_000_000, 5)
    args = ap.parse_args(argv)

    from bench_scaling import routed_stream

    rows = []
    for b in args.batches:
        s = routed_stream(48, 128, b, args.accesses)
        for lam in args.lams:
            for rho in args.rhos:
                rows.append({"batch": b, "mean_event": s.union / s.n_events, **row(s, rho, lam, args.pairs)})

    def line(r: dict) -> str:
        return (f"{r['batch']:>3} {r['mean_event']:>6.1f} {r['lam']:>4} {r['rho']:>5} {r['capacity']:>5} "
                f"{r['per_member']:>7.1f}  {r['slots_ns']:>7.1f} {r['pool_ns']:>7.1f} {r['ratio_min']:>6.2f} "
                f"{r['ratio']:>6.2f}  {yes_no(r['hits_equal'])}")

    return report(rows, args.json, {"machine": machine(), "accesses": args.accesses, "pairs": args.pairs},
                  [f"machine: {machine()}",
                   f"ns per access (medians of {args.pairs} alternated pairs); slots / pool: min and median of "
                   "per-pair ratios; c / |E|: blocks per member of a mean event",
                   f"{'B':>3} {'|E|':>6} {'lam':>4} {'rho':>5} {'c':>5} {'c/|E|':>7}  {'slots':>7} {'pool':>7} "
                   f"{'min':>6} {'median':>6}  hits equal"], line)


if __name__ == "__main__":
    raise SystemExit(main())
