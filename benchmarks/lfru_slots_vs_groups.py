"""Global event-atomic lfru: the slots loop's time over the frequency groups', by cache size and stream.

    python benchmarks/lfru_slots_vs_groups.py --stream drifting:5200 --bpm 61,76,85,100 [--processes 2]
    python benchmarks/lfru_slots_vs_groups.py --stream routed:48x512x8:4.8e6 --bpm 50,60,70

The engine replays global event-atomic ``lfru`` on dense slots (``_kernels_lfru_slots``) for caches of up to
``slots_per_member(events per layer)`` blocks per member of a mean event, on frequency groups
(``_kernels_lfru_groups``) beyond. This prints, for each cache of ``bpm`` blocks per mean member, the slots'
kernel time over the groups' (both called directly, same counts asserted), the median of ``--pairs``
alternated pairs in each of ``--processes`` fresh processes (a kernel's time moves by up to ~15% with where its
code lands in a process: docs/performance.md, *Placement noise*), as the median over the processes and their
range. Streams: ``drifting:STEPS`` (``bench_vs_libcachesim.drifting_qwen_stream``, 48 x 128, B = 8; 5,200
steps is the 10 M-access benchmark stream) and ``routed:LxNxB:ACCESSES`` (``bench_scaling.routed_stream``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import alternated_ratio, machine, median_and_range, pooled_rows  # noqa: E402


def build(spec: str):
    kind, _, rest = spec.partition(":")
    if kind == "drifting":
        from bench_vs_libcachesim import drifting_qwen_stream

        return drifting_qwen_stream(int(rest), sample_seed=1)
    if kind == "routed":
        from bench_scaling import routed_stream

        shape, _, acc = rest.partition(":")
        L, N, B = (int(x) for x in shape.split("x"))
        return routed_stream(L, N, B, int(float(acc)))
    raise SystemExit(f"unknown stream {spec!r}: expected drifting:STEPS or routed:LxNxB:ACCESSES")


def child(spec: str, bpms: list[float], pairs: int, first: int) -> None:
    from expertcache.replay import _kernels_lfru_groups as KG
    from expertcache.replay import _kernels_lfru_slots as KS
    from expertcache.replay import engine

    s = build(spec)
    L, N = s.n_layers, s.n_experts
    tie = engine._tie_ranks("random", 0, L * N)
    mean = s.union / s.n_events
    out = []
    for bpm in bpms:
        cap = np.array([int(bpm * mean)])

        def run(k, cap=cap):
            h = np.zeros(L, np.int64)
            m = np.zeros(L, np.int64)
            f = np.zeros(0, np.uint8)
            t0 = time.perf_counter()
            if k == 0:
                KS.replay_lfru_slots(s.offsets, s.expert, s.layer, N, L, cap, tie, 0, h, m, f)
            else:
                KG.replay_lfru_groups(s.offsets, s.expert, s.layer, N, L, True, cap, tie, 0, h, m, f)
            return time.perf_counter() - t0, h

        assert (run(0)[1] == run(1)[1]).all(), "slots and groups disagree"
        out.append(alternated_ratio(lambda k, run=run: run(k)[0], pairs, first))
    print(" ".join(f"{x:.4f}" for x in out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream", default="drifting:650", help="drifting:STEPS or routed:LxNxB:ACCESSES")
    ap.add_argument("--bpm", default="40,50,60,70", help="blocks per member of a mean event, comma-separated")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    bpms = [float(x) for x in args.bpm.split(",")]
    if args.child is not None:
        child(args.stream, bpms, args.pairs, args.child)
        return
    s = build(args.stream)
    print(f"machine: {machine()}")
    print(f"{args.stream}: {s.n_events} events ({s.n_events / s.n_layers:.0f} per layer), {s.union} union "
          f"accesses, mean event {s.union / s.n_events:.1f}; slots / groups kernel time, {args.pairs} alternated "
          f"pairs in each of {args.processes} processes")
    cols = pooled_rows([sys.executable, __file__, "--stream", args.stream, "--bpm", args.bpm, "--pairs",
                        str(args.pairs)], args.processes)
    for bpm, col in zip(bpms, cols, strict=True):
        med, lo, hi = median_and_range(col)
        print(f"  {bpm:6.1f} blocks per member: {med:.2f} ({lo:.2f}-{hi:.2f})")


if __name__ == "__main__":
    main()
