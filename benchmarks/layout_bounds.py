"""What two layouts of the per-layer state could save at most: bounds for the event-atomic per-layer kernels.

    python benchmarks/layout_bounds.py [--steps 2600] [--pairs 7] [--processes 2] [--rhos 0.1,0.2,0.3]

Two changes are often proposed for the per-layer kernels of ``replay/_kernels_bits.py`` (``lru``, ``lfru``,
``lrfu``), whose member loops store into each layer's dense lanes at the members' tie positions, scattered:

* store in order: keep the state in expert order, so that an event's members (ascending expert ids) store up
  each array. The bound: the same kernels with ``tie_break="id"``, whose tie positions are the expert ids
  reversed, so the stores already run in order (down each array), with the stream and the decisions' work
  otherwise alike;
* keep a layer in the first-level cache (prefetch a layer's lanes, or take a layer's events together). The
  bound: the same stream with each layer's events made contiguous (a stable sort by layer), which ``lru`` and
  ``lrfu`` decide exactly as the original (their layers share no state and count units per layer; the counts are
  asserted equal). Not for ``lfru``, whose ages count events of every layer.

Each row times the variant against the shipped run on ``bench_vs_libcachesim.drifting_qwen_stream(steps)``
(48 x 128, B = 8), the two alternated pair by pair, in ``--processes`` fresh processes: the median of the
per-process medians of variant / shipped, and the process range. Below 1.0 is what the change could save at
most; it is not a change shipped.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import alternated_ratio, machine, median_and_range, pooled_rows  # noqa: E402

KERNELS = ("lru", "lfru", "lrfu")
VARIANTS = ("in-order", "by-layer")
#: The rows of each rho: (kernel, variant), less lfru's by-layer (its ages count events of every layer).
ROWS = tuple((k, v) for k in KERNELS for v in VARIANTS if (k, v) != ("lfru", "by-layer"))


def child(steps: int, rhos: list[float], pairs: int, first: int) -> None:
    from bench_vs_libcachesim import drifting_qwen_stream

    from expertcache.replay import _kernels_bits as KB
    from expertcache.replay import engine

    s = drifting_qwen_stream(steps, sample_seed=1)
    L, N = s.n_layers, s.n_experts
    order = np.argsort(s.layer, kind="stable")                  # each layer's events together, in order
    lens = np.diff(s.offsets)
    off2 = np.concatenate([[0], np.cumsum(lens[order])]).astype(s.offsets.dtype)
    starts = s.offsets[:-1][order]
    ex2 = np.concatenate([s.expert[a:a + n] for a, n in zip(starts, lens[order], strict=True)]).astype(s.expert.dtype)
    streams = {"shipped": (s.offsets, s.expert, s.layer), "by-layer": (off2, ex2, s.layer[order])}
    ties = {name: engine._tie_order(engine._tie_ranks(name, 0, L * N), L, N)[1] for name in ("random", "id")}
    flags = np.zeros(0, np.uint8)
    out = []
    for rho in rhos:
        caps = engine.capacities_for_rho(rho, L, N)
        for kernel in KERNELS:
            def run(variant, kernel=kernel, caps=caps):
                off, ex, lay = streams["by-layer" if variant == "by-layer" else "shipped"]
                tie_pos = ties["id" if variant == "in-order" else "random"]
                h = np.zeros(L, np.int64)
                m = np.zeros(L, np.int64)
                head = (off, ex, lay, N, L, caps, tie_pos)
                t0 = time.perf_counter()
                if kernel == "lru":
                    KB.replay_lru_bits(*head, 0, h, m, flags)
                elif kernel == "lfru":
                    KB.replay_lfru_bits(*head, 0, h, m, flags)
                else:
                    KB.replay_lrfu_bits(*head, 0.5, 0, h, m, flags)
                return time.perf_counter() - t0, h

            if kernel != "lfru" and not (run("by-layer")[1] == run("shipped")[1]).all():
                print(f"{kernel} at rho {rho}: the layer-sorted stream counts differently", file=sys.stderr)
                sys.exit(1)
            run("in-order")
            for variant in (v for k, v in ROWS if k == kernel):
                out.append(alternated_ratio(lambda side, v=variant, run=run: run(v if side == 0 else "shipped")[0],
                                            pairs, first))
    print(" ".join(f"{x:.4f}" for x in out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2600, help="steps of the drifting stream (default 2600: 5 M)")
    ap.add_argument("--pairs", type=int, default=7, help="alternated pairs per row in each process")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--rhos", default="0.1,0.2,0.3")
    ap.add_argument("--child", type=int, default=-1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        rhos = [float(x) for x in a.rhos.split(",")]
    except ValueError:
        ap.error(f"--rhos {a.rhos!r}: expected numbers separated by commas, e.g. 0.1,0.2")
    if a.steps < 1 or a.pairs < 1 or a.processes < 1 or not all(0.0 < r <= 1.0 for r in rhos):
        ap.error("--steps, --pairs and --processes must be at least 1, and each rho in (0, 1]")
    if a.child >= 0:
        child(a.steps, rhos, a.pairs, a.child)
        return
    cols = pooled_rows([sys.executable, __file__, "--steps", str(a.steps), "--pairs", str(a.pairs), "--rhos",
                        a.rhos], a.processes)
    print(f"machine: {machine()}")
    print(f"per-layer kernels, {a.steps} steps, {a.processes} processes x {a.pairs} pairs: variant / shipped "
          "(median, process range)")
    k = 0
    for rho in rhos:
        for kernel in KERNELS:
            cells = []
            for variant in (v for kk, v in ROWS if kk == kernel):
                med, lo, hi = median_and_range(cols[k])
                cells.append(f"{variant} {med:.3f} ({lo:.3f}-{hi:.3f})")
                k += 1
            print(f"  rho {rho:<5} {kernel:<5} " + "   ".join(cells))


if __name__ == "__main__":
    main()
