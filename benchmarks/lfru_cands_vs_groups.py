"""Global sequential lfru: the candidates loop's time over the frequency groups', by cache fraction and stream.

    python benchmarks/lfru_cands_vs_groups.py --stream drifting:2600 --rhos 0.05,0.1,0.2,0.3,0.5,0.75,0.9
    python benchmarks/lfru_cands_vs_groups.py --stream routed:48x512x8:2e6 --rhos 0.1,0.3 --processes 4
    python benchmarks/lfru_cands_vs_groups.py --stream drifting:650 --rhos 0.2 --random

The engine replays global ``lfru`` with one unit per access (sequential semantics) on dense slots whose lowest key
is found among candidates made every few units (``_kernels_lfru_cands``); before, on the frequency groups
(``_kernels_lfru_groups``), which still take event-atomic global caches past the slots loop's bound. This prints,
for each cache fraction ``rho`` (of the ``L * N`` blocks), the candidates' kernel time over the groups' (both
called directly, the same hits asserted), the median of ``--pairs`` alternated pairs in each of ``--processes``
fresh processes, as the median over the processes and their range, and the candidates loop's nanoseconds per
access in the first process. ``--random``: the members shuffled per event (sequential-random, seed 0). Streams:
``drifting:STEPS`` (``bench_vs_libcachesim.drifting_qwen_stream``, 48 x 128, B = 8; 2,600 steps is about 5 M
accesses) and ``routed:LxNxB:ACCESSES`` (``bench_scaling.routed_stream``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import alternated_pairs, machine, median_and_range, pooled_rows, positive_int, rho_list  # noqa: E402
from lfru_slots_vs_groups import parse_with_stream  # noqa: E402


def child(s, rhos: list[float], pairs: int, first: int, shuffled: bool) -> None:
    """One process's rows on the stream ``s``: per rho, the median ratio of alternated pairs and the candidates
    loop's best nanoseconds per access."""
    from expertcache.replay import _kernels_lfru_cands as KC
    from expertcache.replay import _kernels_lfru_groups as KG
    from expertcache.replay import engine

    L, N = s.n_layers, s.n_experts
    tie = engine._tie_ranks("random", 0, L * N)
    expert = engine._member_order(s, "sequential-random", 0) if shuffled else s.expert
    out = []
    for rho in rhos:
        cap = np.array([engine.total_capacity(rho, L, N)], np.int64)

        def run(k, cap=cap):
            h = np.zeros(L, np.int64)
            m = np.zeros(L, np.int64)
            f = np.zeros(0, np.uint8)
            t0 = time.perf_counter()
            if k == 0:
                KC.replay_lfru_cands(s.offsets, expert, s.layer, N, L, cap, tie, 0, h, m, f)
            else:
                KG.replay_lfru_groups(s.offsets, expert, s.layer, N, L, False, cap, tie, 0, h, m, f)
            return time.perf_counter() - t0, h

        assert (run(0)[1] == run(1)[1]).all(), "the two sides disagree"
        a, b = alternated_pairs(lambda k, run=run: run(k)[0], pairs, first)
        ratios = sorted(x / y for x, y in zip(a, b, strict=True))
        out += [ratios[len(ratios) // 2], min(a) / max(int(s.offsets[-1]), 1) * 1e9]
    print(" ".join(f"{x:.4f}" for x in out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream", default="drifting:650", help="drifting:STEPS or routed:LxNxB:ACCESSES")
    ap.add_argument("--rhos", type=rho_list, default=[0.1, 0.2, 0.3],
                    help="cache fractions of the L * N blocks, comma-separated (default 0.1,0.2,0.3)")
    ap.add_argument("--pairs", type=positive_int, default=7)
    ap.add_argument("--processes", type=positive_int, default=2)
    ap.add_argument("--random", action="store_true", help="the members shuffled per event (sequential-random)")
    args, s = parse_with_stream(ap, argv)
    if args.child is not None:
        child(s, args.rhos, args.pairs, args.child, args.random)
        return 0
    print(f"machine: {machine()}")
    order = "sequential-random" if args.random else "sequential-ascending"
    print(f"{args.stream}: {s.n_events} events, {s.union} union accesses, {order}; candidates / groups kernel time, "
          f"{args.pairs} alternated pairs in each of {args.processes} processes")
    cols = pooled_rows([sys.executable, __file__, "--stream", args.stream, "--rhos",
                        ",".join(repr(x) for x in args.rhos), "--pairs", str(args.pairs),
                        *(["--random"] if args.random else [])], args.processes)
    for k, rho in enumerate(args.rhos):
        med, lo, hi = median_and_range(cols[2 * k])
        print(f"  rho {rho:<5g}: {med:.2f} ({lo:.2f}-{hi:.2f}); candidates {cols[2 * k + 1][0]:.1f} ns an access")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
