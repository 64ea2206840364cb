"""Global event-atomic lfru: the slots loop's time over the frequency groups', by cache size and stream.

    python benchmarks/lfru_slots_vs_groups.py --stream drifting:5200 --bpm 61,76,85,100 [--processes 2]
    python benchmarks/lfru_slots_vs_groups.py --stream routed:48x512x8:4.8e6 --bpm 50,60,70
    python benchmarks/lfru_slots_vs_groups.py --stream drifting:5200 --bpm 21,23,25,28,30,38,45 --cands

The engine replays global event-atomic ``lfru`` on dense slots (``_kernels_lfru_slots``) for caches of up to
``slots_per_member(events per layer)`` blocks per member of a mean event, on frequency groups
(``_kernels_lfru_groups``) beyond. This prints, for each cache of ``bpm`` blocks per mean member, the slots'
kernel time over the groups' (both called directly, same counts asserted), the median of ``--pairs``
alternated pairs in each of ``--processes`` fresh processes (a kernel's time moves by up to ~15% with where its
code lands in a process: docs/performance.md, *Placement noise*), as the median over the processes and their
range. Streams: ``drifting:STEPS`` (``bench_vs_libcachesim.drifting_qwen_stream``, 48 x 128, B = 8; 5,200
steps is the 10 M-access benchmark stream) and ``routed:LxNxB:ACCESSES`` (``bench_scaling.routed_stream``).

``--cands``: instead, the slots loop with its one-cut pass over candidates at any size (``cand_words=0``) over the
same loop without candidates (``cand_words=-1``), with each cache's words of slots and whether the engine takes the
candidates there (``_kernels_lfru_slots.CAND_WORDS``, which depends on the machine's vector width).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import alternated_ratio, machine, median_and_range, pooled_rows, positive_int  # noqa: E402


def build(spec: str):
    """The stream named by ``spec`` (``drifting:STEPS`` or ``routed:LxNxB:ACCESSES``); ValueError otherwise."""
    kind, _, rest = spec.partition(":")
    try:
        if kind == "drifting" and int(rest) > 0:
            from bench_vs_libcachesim import drifting_qwen_stream

            return drifting_qwen_stream(int(rest), sample_seed=1)
        if kind == "routed":
            from bench_scaling import routed_stream

            shape, _, acc = rest.partition(":")
            L, N, B = (int(x) for x in shape.split("x"))
            if min(L, N, B) > 0 and float(acc) >= 1:
                return routed_stream(L, N, B, int(float(acc)))
    except ValueError:
        pass
    raise ValueError(f"expected drifting:STEPS or routed:LxNxB:ACCESSES (positive numbers), got {spec!r}")


def parse_with_stream(ap: argparse.ArgumentParser, argv: list[str] | None):
    """``ap``'s arguments (with the hidden ``--child`` of :func:`_ab.pooled_rows`'s processes) and the stream its
    ``--stream`` names; a bad one is refused (exit 2, one line)."""
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        return args, build(args.stream)
    except ValueError as e:
        ap.error(f"--stream: {e}")


def bpm_list(text: str) -> list[float]:
    """An argument type: blocks per member of a mean event, positive numbers, comma-separated."""
    try:
        out = [float(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or not all(x > 0 for x in out):
        raise argparse.ArgumentTypeError(f"expected positive numbers, comma-separated (e.g. 40,60), got {text!r}")
    return out


def child(s, bpms: list[float], pairs: int, first: int, cands: bool) -> None:
    """One process's rows on the stream ``s``: a line of alternated-pair ratios, one per cache."""
    from expertcache.replay import _kernels_lfru_groups as KG
    from expertcache.replay import _kernels_lfru_slots as KS
    from expertcache.replay import engine

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
            if cands:                  # candidates at any size / never
                KS.replay_lfru_slots(s.offsets, s.expert, s.layer, N, L, cap, tie, 0, h, m, f,
                                     cand_words=0 if k == 0 else -1)
            elif k == 0:
                KS.replay_lfru_slots(s.offsets, s.expert, s.layer, N, L, cap, tie, 0, h, m, f)
            else:
                KG.replay_lfru_groups(s.offsets, s.expert, s.layer, N, L, True, cap, tie, 0, h, m, f)
            return time.perf_counter() - t0, h

        assert (run(0)[1] == run(1)[1]).all(), "the two sides disagree"
        out.append(alternated_ratio(lambda k, run=run: run(k)[0], pairs, first))
    print(" ".join(f"{x:.4f}" for x in out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream", default="drifting:650", help="drifting:STEPS or routed:LxNxB:ACCESSES")
    ap.add_argument("--bpm", type=bpm_list, default=[40.0, 50.0, 60.0, 70.0],
                    help="blocks per member of a mean event, comma-separated (default 40,50,60,70)")
    ap.add_argument("--pairs", type=positive_int, default=7)
    ap.add_argument("--processes", type=positive_int, default=2)
    ap.add_argument("--cands", action="store_true",
                    help="the slots loop with candidates at any size over the same loop without them")
    args, s = parse_with_stream(ap, argv)
    bpm_text = ",".join(repr(x) for x in args.bpm)
    if args.child is not None:
        child(s, args.bpm, args.pairs, args.child, args.cands)
        return 0
    from expertcache.replay import _kernels_lfru_slots as KS

    mean = s.union / s.n_events
    widest = int(np.diff(s.offsets).max()) if s.n_events else 0
    print(f"machine: {machine()}")
    what = "slots with candidates / without" if args.cands else "slots / groups"
    print(f"{args.stream}: {s.n_events} events ({s.n_events / s.n_layers:.0f} per layer), {s.union} union "
          f"accesses, mean event {mean:.1f}, widest {widest}; {what} kernel time, {args.pairs} alternated pairs in "
          f"each of {args.processes} processes")
    cols = pooled_rows([sys.executable, __file__, "--stream", args.stream, "--bpm", bpm_text, "--pairs",
                        str(args.pairs), *(["--cands"] if args.cands else [])], args.processes)
    for bpm, col in zip(args.bpm, cols, strict=True):
        med, lo, hi = median_and_range(col)
        extra = ""
        if args.cands:                 # the loop's words of slots for child()'s cache
            words = KS.slot_words(int(bpm * mean), widest)
            extra = f" ({words} words of slots; the engine: {'candidates' if words >= KS.CAND_WORDS else 'every slot'})"
        print(f"  {bpm:6.1f} blocks per member{extra}: {med:.2f} ({lo:.2f}-{hi:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
