"""The engine's per-layer totals (union and logical accesses), one integer pass against two weighted bincounts.

    python benchmarks/engine_totals.py [--steps 5200] [--pairs 15]

Every replay ends by counting each layer's union and logical accesses over the events after the warm-up
(``replay.engine._layer_totals``, the ``union`` and ``logical`` of each layer's record). Since session 29 that is
one numba pass in integers (``replay._kernels.layer_totals``); before, it was two ``np.bincount`` with float
weights, one of them over ``np.diff`` of the offsets. This times the two, alternated pair by pair (the order
flipping every pair), on ``bench_vs_libcachesim.drifting_qwen_stream(steps)`` (48 x 128, B = 8; 5,200 steps is the
10 M-access benchmark stream), after checking that they give the same totals (exit 1 otherwise), and prints each
side's min and median time and the min and median of the per-pair ratios (pass / bincounts).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import alternated_ratio, machine  # noqa: E402


def bincounts(stream, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The totals as the engine took them before: two weighted ``np.bincount``, widened back to int64."""
    L = stream.n_layers
    layer = stream.layer[start:]
    return (np.bincount(layer, weights=stream.event_size[start:], minlength=L).astype(np.int64),
            np.bincount(layer, weights=stream.logical_per_event[start:], minlength=L).astype(np.int64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5200, help="steps of the drifting stream (default 5200: 10 M)")
    ap.add_argument("--pairs", type=int, default=15, help="alternated pairs (default 15)")
    a = ap.parse_args()
    if a.steps < 1 or a.pairs < 1:
        ap.error("--steps and --pairs must be at least 1")
    from bench_vs_libcachesim import drifting_qwen_stream

    from expertcache.replay import engine

    s = drifting_qwen_stream(a.steps, sample_seed=1)
    sides = (engine._layer_totals, bincounts)
    for start in (0, s.n_events // 3):
        got, want = sides[0](s, start), sides[1](s, start)
        if not all(np.array_equal(x, y) for x, y in zip(got, want, strict=True)):
            print(f"the totals differ from the bincounts' (warm-up {start})", file=sys.stderr)
            sys.exit(1)
    times: tuple[list[float], list[float]] = ([], [])

    def run(side: int) -> float:
        t0 = time.perf_counter()
        sides[side](s)
        times[side].append(time.perf_counter() - t0)
        return times[side][-1]

    median_ratio = alternated_ratio(run, a.pairs, 0)
    ratios = [x / y for x, y in zip(*times, strict=True)]        # pair by pair, as alternated_ratio took them
    print(f"machine: {machine()}")
    print(f"stream: {s.n_events} events, {int(s.offsets[-1])} union accesses; {a.pairs} alternated pairs")
    for name, ts in (("one pass", times[0]), ("bincounts", times[1])):
        print(f"  {name:<10} min {min(ts) * 1e3:.3f} ms  median {statistics.median(ts) * 1e3:.3f} ms")
    print(f"  pass / bincounts: min {min(ratios):.3f}  median {median_ratio:.3f}")


if __name__ == "__main__":
    main()
