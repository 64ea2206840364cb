"""Event-atomic per-layer lru / lfu: the lanes of keys against the engine's other loop, by shape, batch and rho.

    python benchmarks/layer_lanes.py [--policy lru|lfu] [--shapes 48x128x8,16x64x8,32x8x2] [--batches 1,4,8]
                                     [--rhos 0.1,0.25,0.4,0.75] [--accesses 2000000] [--pairs 3] [--json]

``replay/_kernels_belady_lanes.replay_lru_lanes`` (``replay_lfu_lanes``) gives each member's lane its unit's key (its
count, negated) and decides an overflow by vector reductions over the layer's lanes, as the per-layer Belady loop
does with next uses. The other side is the loop the engine takes elsewhere: for ``lru`` the recency buckets of
``replay/_kernels_bits.replay_lru_bits`` (with each block's bucket kept where ``lru_direct`` says so), for ``lfu`` the
bit-sliced counts of ``replay_lfu_bits`` (counts that persist). Per shape ``LxNxk`` (layers, experts a layer up to
128, top-k) and batch, on ``bench_scaling.routed_stream(L, N, B, accesses, k)`` (Zipf routing), per rho, this times
both alternated pair by pair (the first side alternating too) and prints each side's nanoseconds per access (medians;
without hit flags, as ``replay`` runs, whose flags are compared once), lanes / other as the minimum and the median of
the per-pair ratios, the quota in mean events (``c / |E|``), the loop the engine takes there (``lru_lanes_pay``,
``lfu_lanes_pay``), and whether both sides' hit counts and hit flags are equal (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

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


def row(s, rho: float, pairs: int, policy: str = "lru") -> dict:
    """One stream and rho: both loops' nanoseconds per access, their ratios, the engine's choice, and whether the
    two agree."""
    from expertcache.replay import _kernels_belady_lanes as KBL
    from expertcache.replay import _kernels_bits as KB
    from expertcache.replay import engine

    if policy == "lru":
        loops, pay = (KBL.replay_lru_lanes, KB.replay_lru_bits), KBL.lru_lanes_pay
    else:
        def bits(*a):                  # replay_lfu_bits with counts that persist (its reset argument False)
            KB.replay_lfu_bits(*a[:7], False, *a[7:])
        loops, pay = (KBL.replay_lfu_lanes, bits), KBL.lfu_lanes_pay
    out = layer_loops_row(s, rho, pairs, ("lanes", "other"), loops)
    caps = engine.capacities_for_rho(rho, s.n_layers, s.n_experts)      # (their mean decides)
    return {**out, "engine_lanes": pay(s.n_experts, caps, s.union / s.n_events)}


def _policy(text: str) -> str:
    """An argument type: ``lru`` or ``lfu``."""
    if text not in ("lru", "lfu"):
        raise argparse.ArgumentTypeError(f"expected lru or lfu, got {text!r}")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", type=_policy, default="lru",
                    help="lru (other side: the recency buckets) or lfu (the bit-sliced counts); default lru")
    shape_options(ap, "1,4,8", "48x128x8,16x64x8,32x8x2")
    stream_options(ap, 2_000_000, 3)
    args = ap.parse_args(argv)
    if any(n > 128 for _, n, _ in args.shapes):
        ap.error("--shapes: the lanes take layers of at most 128 experts (LxNxk with N <= 128)")
    rows = routed_rows(args, partial(row, policy=args.policy))
    other = "buckets" if args.policy == "lru" else "sliced"

    def line(r: dict) -> str:
        return (f"{row_lead(r)} "
                f"{r['quota_events']:>6.1f}  {r['lanes_ns']:>7.2f} {r['other_ns']:>7.2f} {r['ratio_min']:>6.2f} "
                f"{r['ratio']:>6.2f}  {'lanes' if r['engine_lanes'] else other:>7}  {yes_no(r['hits_equal'])}")

    return report(rows, args.json, {"machine": machine(), "policy": args.policy, "accesses": args.accesses,
                                    "pairs": args.pairs},
                  [f"machine: {machine()}",
                   f"{args.policy}: ns per access (medians of {args.pairs} alternated pairs); lanes / {other}: min and "
                   "median of per-pair ratios; c / |E|: the quota in mean events; engine: the loop replay takes",
                   ROW_HEAD + f" {'c/|E|':>6}  {'lanes':>7} {other:>7} "
                   f"{'min':>6} {'median':>6}  {'engine':>7}  hits equal"], line)


if __name__ == "__main__":
    raise SystemExit(main())
