"""Event-atomic per-layer Belady: the lanes of next uses against the bitset walk, by shape, batch and rho.

    python benchmarks/belady_lanes.py [--shapes 48x128x8,16x64x8,32x8x2,58x256x8,48x512x8] [--batches 1,4,8,64]
                                      [--rhos 0.1,0.25,0.4,0.75] [--accesses 2000000] [--pairs 3] [--sides] [--json]

``replay/_kernels_belady_lanes.replay_belady_lanes`` keeps each block's next use in a dense lane beside its layer's
bitset and decides an overflow by vector reductions over the lanes (rounds of the farthest or the nearest group);
``replay/_kernels_bits.replay_belady_walk`` keeps no next uses and walks the layer's future event bitsets instead.
Per shape ``LxNxk`` (layers, experts a layer, top-k) and batch, on ``bench_scaling.routed_stream(L, N, B, accesses,
k)`` (Zipf routing), per rho, this times both alternated pair by pair (the first side alternating too), each with
what it builds first (the next-use array, ``_kernels.next_use``; the event bitsets, ``event_bitsets``), and prints
each side's nanoseconds per access (medians; without hit flags, as ``replay`` runs, whose flags are compared once),
lanes / walk as the minimum and the median of the per-pair ratios, the loop the engine takes there
(``_kernels_belady_lanes.lanes_pay``), and whether both sides' hit counts and hit flags are equal (exit 1
otherwise). Where the walk gives up (past its budget of walked rows) the heap loop replays from scratch, with a
next-use array, as the engine ran it; the walk's time includes both.

``--sides`` times, instead, the lanes loop with its rules for the end a unit's rounds start from (``KEEP_GROUP``,
``KEEP_BOUND``) and for the bracket (``BRACKET_ROUNDS``) against the same without the bracket (``plain``), the far end
always and the near end always (four sides in turn, the first rotating): ``rule / plain``, ``rule / far`` and
``rule / near`` as medians of per-round ratios, and whether the four agree (counts and hit flags).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import (  # noqa: E402
    ROW_HEAD,
    checked_pairs,
    layer_inputs,
    machine,
    pair_fields,
    report,
    routed_rows,
    row_lead,
    shape_options,
    stream_options,
    yes_no,
)

#: ``--sides``: the loop's rules (``None``: its defaults), the same without the bracket, the far end always and the
#: near end always (``(keep_group, keep_bound, bracket_rounds)``).
SIDES = {"rule": None, "plain": (3.0, 8, 1 << 30), "far": (0.0, 0, 1 << 30), "near": (0.0, 1 << 30, 1 << 30)}


def _lanes(s, caps, tie_pos, flags, sides=None) -> np.ndarray:
    """The lanes loop with its next-use array built first; the hit counts."""
    from expertcache.replay import _kernels as K
    from expertcache.replay import _kernels_belady_lanes as BL

    L, N = s.n_layers, s.n_experts
    hits = np.zeros(L, np.int64)
    nxt = K.next_use(s.offsets, s.expert, s.layer, N, L, True)
    BL.replay_belady_lanes(s.offsets, s.expert, s.layer, N, L, caps, tie_pos, nxt, False, 0, hits,
                           np.zeros(L, np.int64), flags, *(sides or ()))
    return hits


def _walk(s, caps, tie_pos, flags) -> np.ndarray:
    """The walk with its event bitsets built first, and the heap loop from scratch where it gives up (past its
    budget of walked rows), as the engine ran it; the hit counts."""
    from expertcache.replay import _kernels as K
    from expertcache.replay import _kernels_bits as KB
    from expertcache.replay import engine

    L, N = s.n_layers, s.n_experts
    hits = np.zeros(L, np.int64)
    if not KB.replay_belady_walk(s.offsets, s.expert, s.layer, N, L, caps, tie_pos, False, 0, hits,
                                 np.zeros(L, np.int64), flags):
        hits[:] = 0
        flags[:] = 0
        nxt = K.next_use(s.offsets, s.expert, s.layer, N, L, True)
        tie = engine._tie_ranks("random", 0, L * N)
        K.replay_belady(s.offsets, s.expert, s.layer, N, L, False, True, nxt, caps, tie, False, 0, hits,
                        np.zeros(L, np.int64), flags)
    return hits


def row(s, rho: float, pairs: int) -> dict:
    """One stream and rho: the lanes loop against the walk."""
    from expertcache.replay import _kernels_belady_lanes as KBL

    caps, tie_pos = layer_inputs(s, rho)

    def timed(lanes: bool, record: bool) -> tuple[float, np.ndarray, np.ndarray]:
        flags = np.zeros(s.union if record else 0, np.uint8)
        t0 = time.perf_counter()
        if lanes:
            hits = _lanes(s, caps, tie_pos, flags)
        else:
            hits = _walk(s, caps, tie_pos, flags)
        return time.perf_counter() - t0, hits, flags

    lanes, walk, equal = checked_pairs(timed, pairs)
    return {"rho": rho, "capacity": int(caps[0]), **pair_fields(("lanes", "walk"), lanes, walk, s.union),
            "engine": "lanes" if KBL.lanes_pay(s.n_experts, caps, s.union / s.n_events) else "walk",
            "hits_equal": equal}


def sides_row(s, rho: float, pairs: int) -> dict:
    """One stream and rho: the lanes loop's rule against each end always."""
    caps, tie_pos = layer_inputs(s, rho)
    flags = {name: np.zeros(s.union, np.uint8) for name in SIDES}
    out = {name: _lanes(s, caps, tie_pos, flags[name], sides) for name, sides in SIDES.items()}
    equal = all(np.array_equal(out["rule"], out[n]) and np.array_equal(flags["rule"], flags[n]) for n in SIDES)
    t: dict[str, list[float]] = {name: [] for name in SIDES}
    names = list(SIDES)
    for k in range(pairs):
        for name in names[k % len(names):] + names[:k % len(names)]:
            t0 = time.perf_counter()
            _lanes(s, caps, tie_pos, np.zeros(0, np.uint8), SIDES[name])
            t[name].append(time.perf_counter() - t0)
    ns = {f"{name}_ns": statistics.median(v) / s.union * 1e9 for name, v in t.items()}
    return {"rho": rho, "capacity": int(caps[0]), **ns,
            **{f"rule_{name}": statistics.median(a / b for a, b in zip(t["rule"], t[name], strict=True))
               for name in names[1:]},
            "hits_equal": equal}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shape_options(ap, "1,4,8,64")
    ap.add_argument("--sides", action="store_true",
                    help="time the lanes loop's choice of end against each end always, instead of against the walk")
    stream_options(ap, 2_000_000, 3)
    args = ap.parse_args(argv)
    rows = routed_rows(args, sides_row if args.sides else row)

    head = ROW_HEAD + "  "
    meta = {"machine": machine(), "accesses": args.accesses, "pairs": args.pairs, "sides": args.sides}
    if args.sides:
        def line(r: dict) -> str:
            return (f"{row_lead(r)}  "
                    f"{r['rule_ns']:>6.2f} {r['plain_ns']:>6.2f} {r['far_ns']:>6.2f} {r['near_ns']:>6.2f}  "
                    f"{r['rule_plain']:>10.2f} {r['rule_far']:>8.2f} {r['rule_near']:>9.2f}  {yes_no(r['hits_equal'])}")

        return report(rows, args.json, meta,
                      [f"machine: {machine()}",
                       f"ns per access (medians of {args.pairs} rounds of four); rule / plain (no bracket), rule / "
                       "far, rule / near: medians of per-round ratios",
                       head + f"{'rule':>6} {'plain':>6} {'far':>6} {'near':>6}  {'rule/plain':>10} {'rule/far':>8} "
                       f"{'rule/near':>9}  hits equal"],
                      line)

    def line(r: dict) -> str:
        return (f"{row_lead(r)}  "
                f"{r['lanes_ns']:>7.2f} {r['walk_ns']:>7.2f} {r['ratio_min']:>6.2f} {r['ratio']:>6.2f}  "
                f"{r['engine']:>6}  {yes_no(r['hits_equal'])}")

    return report(rows, args.json, meta,
                  [f"machine: {machine()}",
                   f"ns per access, each with what it builds first (medians of {args.pairs} alternated pairs); "
                   "lanes / walk: min and median of per-pair ratios; engine: the loop replay takes",
                   head + f"{'lanes':>7} {'walk':>7} {'min':>6} {'median':>6}  {'engine':>6}  hits equal"], line)


if __name__ == "__main__":
    raise SystemExit(main())
