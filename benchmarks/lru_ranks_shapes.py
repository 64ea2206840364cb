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

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import ranks_orders, ranks_shapes  # noqa: E402


def row(s, rho: float, pairs: int) -> dict:
    """One stream and rho: both loops' nanoseconds per access in each member order, and the rule's choice."""
    from expertcache.replay import _kernels_seq as KQ
    from expertcache.replay import engine

    L, N = s.n_layers, s.n_experts
    caps = engine.capacities_for_rho(rho, L, N)
    flags = np.zeros(0, np.uint8)
    n_events = s.offsets.shape[0] - 1

    def timed(on_ranks: bool, expert) -> tuple[float, np.ndarray]:
        hits = np.zeros(L, np.int64)
        run = KQ.lru_seq_ranges(s.offsets, s.layer, N, L, caps, 0, hits, np.zeros(L, np.int64), flags,
                                on_ranks=on_ranks)
        t0 = time.perf_counter()
        run(expert, 0, n_events)
        return time.perf_counter() - t0, hits

    return {"rho": rho, "quota": int(caps.max()),
            "rule_picks": "ranks" if KQ.lru_on_ranks(s.offsets, N, caps) else "lists",
            **ranks_orders(s, pairs, "lists", timed)}


def main(argv: list[str] | None = None) -> int:
    return ranks_shapes(argv, __doc__.split("\n\n")[0], "lists", "", [1, 4, 16, 64], 3_000_000, 5, row)


if __name__ == "__main__":
    raise SystemExit(main())
