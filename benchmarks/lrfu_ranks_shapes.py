"""Per-layer sequential lrfu on ranks against the slot loop, by batch size and rho: where each loop is faster.

    python benchmarks/lrfu_ranks_shapes.py [--batches 1,2,3,4,16,64] [--rhos 0.1,0.2,0.3,0.4,0.5]
                                           [--accesses 2000000] [--pairs 3] [--json]

``replay/_kernels_seq.py`` replays per-layer sequential ``lrfu`` on ranks (``_kernels_lrfu_ranks``: each layer's
residents in key order, an event replayed whole) where ``lrfu_on_ranks`` says so: every quota at most 64, lambda's
window of units at most 64 and the stream's mean event at least 16 members, or at least 12 where every quota is at
most 4 times it. An event's list is rebuilt whole, so with small events (batch 1: 8 members) the slot loop, which
decides each access in registers, costs less. Per batch size, on ``bench_scaling.routed_stream(48, 128, B, accesses)`` (Zipf routing, top-8), and per rho, this
times both loops alternated pair by pair (``lrfu_seq_ranges(..., on_ranks=True / False)``, lambda 0.5), members
ascending and in sequential-random's order (shuffled beforehand, not timed), and prints each side's nanoseconds per
access (medians), ranks / slots (the median of per-pair ratios), and which loop the rule picks. Both loops' hit
counts are checked equal (exit 1 otherwise). Quotas past 64 run on the slot loop only, so rho stops at 0.5.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import layer_inputs, ranks_orders, ranks_shapes  # noqa: E402

LAM = 0.5


def row(s, rho: float, pairs: int) -> dict:
    """One stream and rho: both loops' nanoseconds per access in each member order, and the rule's choice."""
    from expertcache.replay import _kernels_seq as KQ

    L, N = s.n_layers, s.n_experts
    caps, tie_pos = layer_inputs(s, rho)
    flags = np.zeros(0, np.uint8)
    n_events = s.offsets.shape[0] - 1

    def timed(on_ranks: bool, expert) -> tuple[float, np.ndarray]:
        hits = np.zeros(L, np.int64)
        run = KQ.lrfu_seq_ranges(s.offsets, s.layer, N, L, caps, tie_pos, LAM, 0, hits, np.zeros(L, np.int64),
                                 flags, on_ranks=on_ranks)
        t0 = time.perf_counter()
        run(expert, 0, n_events)
        return time.perf_counter() - t0, hits

    return {"rho": rho, "quota": int(caps.max()),
            "rule_picks": "ranks" if KQ.lrfu_on_ranks(s.offsets, N, caps, LAM) else "slots",
            **ranks_orders(s, pairs, "slots", timed)}


def main(argv: list[str] | None = None) -> int:
    return ranks_shapes(argv, __doc__.split("\n\n")[0], "slots", f"sequential per-layer lrfu (lambda {LAM}), ",
                        [1, 2, 3, 4, 16, 64], 2_000_000, 3, row)


if __name__ == "__main__":
    raise SystemExit(main())
