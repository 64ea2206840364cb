"""Event-atomic per-layer lru: the lanes of unit keys against the recency buckets, by shape, batch and rho.

    python benchmarks/lru_lanes.py [--shapes 48x128x8,16x64x8,32x8x2] [--batches 1,4,8]
                                   [--rhos 0.1,0.25,0.4,0.75] [--accesses 2000000] [--pairs 3] [--json]

``replay/_kernels_belady_lanes.replay_lru_lanes`` gives each member's lane its unit's key and decides an overflow
by vector reductions over the layer's lanes, as the per-layer Belady loop does with next uses;
``replay/_kernels_bits.replay_lru_bits`` files a layer's residents in recency buckets (with each block's bucket kept
where ``lru_direct`` says so). Per shape ``LxNxk`` (layers, experts a layer up to 128, top-k) and batch, on
``bench_scaling.routed_stream(L, N, B, accesses, k)`` (Zipf routing), per rho, this times both alternated pair by
pair (the first side alternating too) and prints each side's nanoseconds per access (medians; without hit flags, as
``replay`` runs, whose flags are compared once), lanes / buckets as the minimum and the median of the per-pair
ratios, the quota in mean events (``c / |E|``), the loop the engine takes there (``lru_lanes_pay``), and whether
both sides' hit counts and hit flags are equal (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import (  # noqa: E402
    layer_loops_row,
    machine,
    report,
    routed_rows,
    shape_options,
    stream_options,
    yes_no,
)


def row(s, rho: float, pairs: int) -> dict:
    """One stream and rho: both loops' nanoseconds per access, their ratios, the engine's choice, and whether the
    two agree."""
    from expertcache.replay import _kernels_belady_lanes as KBL
    from expertcache.replay import _kernels_bits as KB

    out = layer_loops_row(s, rho, pairs, ("lanes", "buckets"), (KBL.replay_lru_lanes, KB.replay_lru_bits))
    return {**out, "engine_lanes": KBL.lru_lanes_pay(s.n_experts, [out["capacity"]], s.union / s.n_events)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shape_options(ap, "1,4,8", "48x128x8,16x64x8,32x8x2")
    stream_options(ap, 2_000_000, 3)
    args = ap.parse_args(argv)
    if any(n > 128 for _, n, _ in args.shapes):
        ap.error("--shapes: the lru lanes take layers of at most 128 experts (LxNxk with N <= 128)")
    rows = routed_rows(args, row)

    def line(r: dict) -> str:
        return (f"{r['shape']:>10} {r['batch']:>3} {r['mean_event']:>6.1f} {r['rho']:>5} {r['capacity']:>5} "
                f"{r['quota_events']:>6.1f}  {r['lanes_ns']:>7.2f} {r['buckets_ns']:>7.2f} {r['ratio_min']:>6.2f} "
                f"{r['ratio']:>6.2f}  {'lanes' if r['engine_lanes'] else 'buckets':>7}  {yes_no(r['hits_equal'])}")

    return report(rows, args.json, {"machine": machine(), "accesses": args.accesses, "pairs": args.pairs},
                  [f"machine: {machine()}",
                   f"ns per access (medians of {args.pairs} alternated pairs); lanes / buckets: min and median of "
                   "per-pair ratios; c / |E|: the quota in mean events; engine: the loop replay takes",
                   f"{'LxNxk':>10} {'B':>3} {'|E|':>6} {'rho':>5} {'c':>5} {'c/|E|':>6}  {'lanes':>7} {'buckets':>7} "
                   f"{'min':>6} {'median':>6}  {'engine':>7}  hits equal"], line)


if __name__ == "__main__":
    raise SystemExit(main())
