"""Per-layer sequential lru on ranks against the same on lists, by batch size and rho: where each loop is faster.

    python benchmarks/lru_ranks_shapes.py [--batches 1,4,16,64] [--rhos 0.1,0.2,0.3,0.4,0.5] [--accesses 3000000]
                                          [--pairs 5] [--json]

``replay/_kernels_seq.py`` replays per-layer sequential ``lru`` on ranks (an event rebuilt whole, no branch on an
access's outcome) where ``lru_on_ranks`` says so: every quota at most 64 and at most 4 times the stream's mean
event. Rebuilding an event's list costs about the quota, so with small events (batch 1: 8 members) and large
quotas the list loop (int32 links, a move per access) costs less. Per batch size, on
``bench_scaling.routed_stream(48, 128, B, accesses)`` (Zipf routing, top-8), and per rho, this times both loops
alternated pair by pair (``lru_seq_ranges(..., on_ranks=True / False)``), members ascending and in
sequential-random's order (shuffled beforehand, not timed), and prints each side's nanoseconds per access
(medians), ranks / lists, and which loop the rule picks. Both loops' hit counts are checked equal (exit 1
otherwise). Quotas past 64 run on lists only (ranks take one word of bits), so rho stops at 0.5 for N = 128.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import int_list, machine, report, rho_list, stream_options, yes_no  # noqa: E402


def row(s, rho: float, pairs: int) -> dict:
    """One stream and rho: both loops' nanoseconds per access in each member order, and the rule's choice."""
    from expertcache.replay import _kernels_seq as KQ
    from expertcache.replay import engine

    L, N = s.n_layers, s.n_experts
    caps = engine.capacities_for_rho(rho, L, N)
    shuffled = engine._member_order(s, "sequential-random", 0)
    flags = np.zeros(0, np.uint8)
    n_events = s.offsets.shape[0] - 1

    def timed(on_ranks: bool, expert) -> tuple[float, np.ndarray]:
        hits = np.zeros(L, np.int64)
        run = KQ.lru_seq_ranges(s.offsets, s.layer, N, L, caps, 0, hits, np.zeros(L, np.int64), flags,
                                on_ranks=on_ranks)
        t0 = time.perf_counter()
        run(expert, 0, n_events)
        return time.perf_counter() - t0, hits

    out = {"rho": rho, "quota": int(caps.max()), "rule_picks": "ranks" if KQ.lru_on_ranks(s.offsets, N, caps)
           else "lists"}
    same = True
    for name, expert in (("ascending", s.expert), ("shuffled", shuffled)):
        same &= bool(np.array_equal(timed(True, expert)[1], timed(False, expert)[1]))     # (also a warm-up)
        ranks, lists = [], []
        for k in range(pairs):
            for on_ranks in ((True, False) if k % 2 == 0 else (False, True)):
                (ranks if on_ranks else lists).append(timed(on_ranks, expert)[0])
        ns_r, ns_l = (statistics.median(x) / s.union * 1e9 for x in (ranks, lists))
        out[name] = {"ranks_ns": ns_r, "lists_ns": ns_l, "ratio": statistics.median(
            [a / b for a, b in zip(ranks, lists, strict=True)])}
    out["hits_equal"] = same
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int_list, default=[1, 4, 16, 64], help="comma list (default 1,4,16,64)")
    ap.add_argument("--rhos", type=rho_list, default=[0.1, 0.2, 0.3, 0.4, 0.5],
                    help="comma list, quotas up to 64 (default 0.1,0.2,0.3,0.4,0.5)")
    stream_options(ap, 3_000_000, 5)
    args = ap.parse_args(argv)
    if max(args.rhos) * 128 > 64.5:
        ap.error("--rhos: expected rho values up to 0.5 (quotas up to 64 of 128 experts; larger ones run on lists "
                 "only)")

    from bench_scaling import routed_stream

    rows = []
    for b in args.batches:
        s = routed_stream(48, 128, b, args.accesses)
        for rho in args.rhos:
            rows.append({"batch": b, "mean_event": s.union / s.n_events, **row(s, rho, args.pairs)})
    def line(r: dict) -> str:
        a, z = r["ascending"], r["shuffled"]
        return (f"{r['batch']:>3} {r['mean_event']:>6.1f} {r['rho']:>5} {r['quota']:>3}  {a['ranks_ns']:>9.2f} "
                f"{a['lists_ns']:>6.2f} {a['ratio']:>6.2f}  {z['ranks_ns']:>10.2f} {z['lists_ns']:>6.2f} "
                f"{z['ratio']:>6.2f}  {r['rule_picks']:<6} {yes_no(r['hits_equal'])}")

    return report(rows, args.json, {"machine": machine(), "accesses": args.accesses, "pairs": args.pairs},
                  [f"machine: {machine()}",
                   f"ns per access (medians of {args.pairs} alternated pairs); ranks / lists: median of per-pair "
                   "ratios",
                   f"{'B':>3} {'|E|':>6} {'rho':>5} {'c':>3}  {'asc ranks':>9} {'lists':>6} {'ratio':>6}  "
                   f"{'shuf ranks':>10} {'lists':>6} {'ratio':>6}  rule   hits equal"], line)


if __name__ == "__main__":
    raise SystemExit(main())
