"""Event-atomic per-layer lru: each block's bucket kept (direct) against the sweep, by shape, batch and rho.

    python benchmarks/lru_direct.py [--shapes 48x128x8,16x64x8,32x8x2,58x256x8,48x512x8] [--batches 1,4,8]
                                    [--rhos 0.1,0.25,0.4,0.75] [--accesses 2000000] [--pairs 3] [--json]

``replay/_kernels_bits.replay_lru_bits`` files a layer's residents in recency buckets. A unit's hits leave their older
buckets either by a sweep from the newest bucket (every bucket back to the oldest hit's, one pointer at a time) or, with
``direct``, from an array of each block's bucket (one store a member, one look-up a hit). Per shape ``LxNxk`` (layers,
experts a layer, top-k) and batch, on ``bench_scaling.routed_stream(L, N, B, accesses, k)`` (Zipf routing), per rho,
this times both forms alternated pair by pair (the first side alternating too) and prints each side's nanoseconds per
access (medians; without hit flags, as ``replay`` runs, whose flags are compared once), direct / sweep as the minimum
and the median of the per-pair ratios, the quota in mean events (``c / |E|``), the form the engine takes there
(``_kernels_bits.lru_direct``: direct above ``LRU_DIRECT_QUOTA + LRU_DIRECT_SLOPE * W`` mean events, ``W`` the words of
a layer's bitset), and whether both forms' hit counts and hit flags are equal (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import (  # noqa: E402
    ROW_HEAD,
    layer_loops_row,
    machine,
    report,
    routed_rows,
    row_lead,
    shape_options,
    stream_options,
    yes_no,
)


def row(s, rho: float, pairs: int) -> dict:
    """One stream and rho: both forms' nanoseconds per access, their ratios, the engine's choice, and whether the
    two agree."""
    from functools import partial

    from expertcache.replay import _kernels_bits as KB

    out = layer_loops_row(s, rho, pairs, ("direct", "sweep"),
                          (partial(KB.replay_lru_bits, direct=True), partial(KB.replay_lru_bits, direct=False)))
    return {**out, "engine_direct": bool(KB.lru_direct(s.offsets, np.array([out["capacity"]]), s.n_experts)[0])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shape_options(ap, "1,4,8")
    stream_options(ap, 2_000_000, 3)
    args = ap.parse_args(argv)
    rows = routed_rows(args, row)

    def line(r: dict) -> str:
        return (f"{row_lead(r)} "
                f"{r['quota_events']:>6.1f}  {r['direct_ns']:>7.2f} {r['sweep_ns']:>7.2f} {r['ratio_min']:>6.2f} "
                f"{r['ratio']:>6.2f}  {'direct' if r['engine_direct'] else 'sweep':>6}  {yes_no(r['hits_equal'])}")

    return report(rows, args.json, {"machine": machine(), "accesses": args.accesses, "pairs": args.pairs},
                  [f"machine: {machine()}",
                   f"ns per access (medians of {args.pairs} alternated pairs); direct / sweep: min and median of "
                   "per-pair ratios; c / |E|: the quota in mean events; engine: the form replay takes",
                   ROW_HEAD + f" {'c/|E|':>6}  {'direct':>7} {'sweep':>7} "
                   f"{'min':>6} {'median':>6}  {'engine':>6}  hits equal"], line)


if __name__ == "__main__":
    raise SystemExit(main())
