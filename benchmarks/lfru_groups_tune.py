"""Global lfru's frequency-group loop under its two pool tunings, by batch size, rho and semantics.

    python benchmarks/lfru_groups_tune.py [--batches 1,8,64] [--rhos 0.1,0.2,0.4] [--accesses 1000000]
                                          [--pairs 3] [--semantics sequential] [--other A,B,LOW,UP,CUT] [--json]

``replay/_kernels_lfru_groups.py`` keeps a pool of the residents whose key fell below a threshold; its tuning ``(a,
b, low, up, cut)`` sets when the threshold falls (a pool past ``a m + b`` entries) and how far it rises (``up``
times the last leaving key), and any values give the same decision. The loop takes ``TUNE`` for event-atomic units
and ``TUNE_SEQ`` for sequential ones (one block to leave each). Per batch size, on
``bench_scaling.routed_stream(48, 128, B, accesses)``, per rho and semantics (``--semantics``: ``sequential``,
``event-atomic`` or ``both``), this times the loop under ``TUNE`` and ``TUNE_SEQ`` (or the tuning ``--other``)
alternated pair by pair, and prints each one's nanoseconds per access (medians), the second / ``TUNE`` (the median
of per-pair ratios), and whether both gave the same hit counts (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import int_list, machine, positive_int, report, rho_list, yes_no  # noqa: E402


def row(s, rho: float, atomic: bool, pairs: int, other: tuple | None = None) -> dict:
    """One stream, rho and semantics: the loop's nanoseconds per access under each tuning, their ratio."""
    from expertcache.replay import _kernels_lfru_groups as KG
    from expertcache.replay import engine

    L, N = s.n_layers, s.n_experts
    cap = np.array([int(engine.capacities_for_rho(rho, L, N).sum())], dtype=np.int64)
    tie = engine._tie_ranks("random", 0, L * N)

    def timed(tune: tuple) -> tuple[float, np.ndarray]:
        hits = np.zeros(L, np.int64)
        t0 = time.perf_counter()
        KG.replay_lfru_groups(s.offsets, s.expert, s.layer, N, L, atomic, cap, tie, 0, hits, np.zeros(L, np.int64),
                              np.zeros(0, np.uint8), tune=tune)
        return time.perf_counter() - t0, hits

    sides = (KG.TUNE, KG.TUNE_SEQ if other is None else other)
    h = [timed(t)[1] for t in sides]        # (also the warm-up)
    times: list[list[float]] = [[], []]
    for k in range(pairs):
        for i in ((0, 1) if k % 2 == 0 else (1, 0)):
            times[i].append(timed(sides[i])[0])
    return {"rho": rho, "capacity": int(cap[0]), "semantics": "event-atomic" if atomic else "sequential-ascending",
            "tune_ns": statistics.median(times[0]) / s.union * 1e9,
            "tune_seq_ns": statistics.median(times[1]) / s.union * 1e9,
            "ratio": statistics.median([b / a for a, b in zip(times[0], times[1], strict=True)]),
            "hits_equal": bool(np.array_equal(h[0], h[1]))}


def _tuning(text: str) -> tuple:
    """``A,B,LOW,UP,CUT``: two non-negative integers, three positive numbers."""
    try:
        a, b, low, up, cut = text.split(",")
        t = (int(a), int(b), float(low), float(up), float(cut))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A,B,LOW,UP,CUT (e.g. 8,32,1.03,1.12,1.005); got {text!r}") from None
    if t[0] < 0 or t[1] < 0 or not min(t[2:]) > 0:
        raise argparse.ArgumentTypeError(f"A and B must be at least 0, LOW, UP and CUT above 0; got {text!r}")
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int_list, default=[1, 8, 64], help="comma list (default 1,8,64)")
    ap.add_argument("--rhos", type=rho_list, default=[0.1, 0.2, 0.4], help="comma list (default 0.1,0.2,0.4)")
    ap.add_argument("--accesses", type=positive_int, default=1_000_000, help="union accesses a stream (default 1 M)")
    ap.add_argument("--pairs", type=positive_int, default=3, help="alternated pairs a row (default 3)")
    ap.add_argument("--semantics", choices=("sequential", "event-atomic", "both"), default="sequential",
                    help="the units replayed (default sequential)")
    ap.add_argument("--other", type=_tuning, default=None, help="a tuning A,B,LOW,UP,CUT in place of TUNE_SEQ")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)

    from bench_scaling import routed_stream

    kinds = {"sequential": (False,), "event-atomic": (True,), "both": (True, False)}[args.semantics]
    rows = []
    for b in args.batches:
        s = routed_stream(48, 128, b, args.accesses)
        for atomic in kinds:
            for rho in args.rhos:
                rows.append({"batch": b, "mean_event": s.union / s.n_events,
                             **row(s, rho, atomic, args.pairs, args.other)})

    def line(r: dict) -> str:
        return (f"{r['batch']:>3} {r['mean_event']:>6.1f} {r['semantics']:<20} {r['rho']:>5} {r['capacity']:>5}  "
                f"{r['tune_ns']:>7.1f} {r['tune_seq_ns']:>8.1f} {r['ratio']:>6.2f}  {yes_no(r['hits_equal'])}")

    return report(rows, args.json, {"machine": machine(), "accesses": args.accesses, "pairs": args.pairs},
                  [f"machine: {machine()}",
                   f"ns per access (medians of {args.pairs} alternated pairs); "
                   f"{'TUNE_SEQ' if args.other is None else args.other} / TUNE: median of per-pair ratios",
                   f"{'B':>3} {'|E|':>6} {'semantics':<20} {'rho':>5} {'c':>5}  {'TUNE':>7} "
                   f"{'TUNE_SEQ' if args.other is None else 'other':>8} "
                   f"{'ratio':>6}  hits equal"], line)


if __name__ == "__main__":
    raise SystemExit(main())
