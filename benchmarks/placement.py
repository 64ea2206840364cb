"""How much a replay kernel's time depends on where its state arrays lie within their 4 KiB pages.

    python benchmarks/placement.py --kernel slots [--rho 0.2] [--steps 2600] [--pairs 5] [--random 20] [--json]

The kernels ``lrfu`` and ``lfru`` (per layer, event-atomic, ``_kernels_bits``), ``slots`` (global event-atomic
lfru on dense slots, ``_kernels_lfru_slots``) and ``groups`` (global lfru on frequency groups, event-atomic,
``_kernels_lfru_groups``) take the allocator of their state arrays as ``pages``; the shipped one,
``replay/_pages.Packed``, places them side by side, each on whole cache lines and none with its first 1 KiB
across a page boundary. This times the kernel on ``bench_vs_libcachesim.drifting_qwen_stream(steps)`` (48 x 128,
B = 8) with other placements, each against the shipped one, the two alternated pair by pair (median of
``--pairs`` per-pair ratios, other / shipped):

* ``array K at page end``: the shipped placement, but the K-th array allocated starts 64 bytes before a page's
  end (so its first 64-byte lanes straddle two pages); one row per array, with its dtype and length;
* ``random``: every array at a random multiple of 64 bytes into its page (``--random`` placements, seeded):
  min, median and max of their ratios;
* ``numpy``: every array from numpy's own allocator (as before ``_pages``): 16-byte aligned wherever the heap
  has room, which differs from process to process (this row is one draw of it).

The hit counts must be equal under every placement (exit 1 otherwise). The figures are in docs/performance.md,
*Lists that straddle a page*.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import alternated_ratio, machine  # noqa: E402

KERNELS = ("lrfu", "lfru", "slots", "groups")


class Placed:
    """An allocator with the interface of ``_pages.Packed``: the K-th array ``offsets[K]`` bytes into a page of its
    own where ``offsets[K]`` is not ``None``, the others packed as shipped; records each array's dtype and length."""

    def __init__(self, offsets: list[int | None]):
        from expertcache.replay._pages import Packed, page_aligned

        self._packed = Packed()
        self._page_aligned = page_aligned
        self._offsets = offsets
        self.arrays: list[str] = []

    def __call__(self, shape, dtype, fill=None):
        k = len(self.arrays)
        off = self._offsets[k] if k < len(self._offsets) else None
        out = self._packed(shape, dtype, fill) if off is None else self._page_aligned(shape, dtype, fill, off)
        self.arrays.append(f"{out.dtype}[{out.size}]")
        return out

    def copy(self, a):
        out = self(a.shape, a.dtype)
        out[...] = a
        return out


class Numpy:
    """An allocator with the interface of ``_pages.Packed`` that takes every array from numpy's allocator."""

    def __call__(self, shape, dtype, fill=None):
        return np.empty(shape, dtype) if fill is None else np.full(shape, fill, dtype)

    def copy(self, a):
        return np.array(a, order="C")


def _runner(kernel: str, steps: int, rho: float):
    """``run(offsets) -> (seconds, hits per layer, arrays)``: one replay with the arrays placed as ``offsets`` says
    (``None``: the shipped placement)."""
    from bench_vs_libcachesim import drifting_qwen_stream

    from expertcache.replay import _kernels_bits as KB
    from expertcache.replay import _kernels_lfru_groups as KG
    from expertcache.replay import _kernels_lfru_slots as KS
    from expertcache.replay import engine

    s = drifting_qwen_stream(steps, sample_seed=1)
    L, N = s.n_layers, s.n_experts
    tie = engine._tie_ranks("random", 0, L * N)
    _, tie_pos = engine._tie_order(tie, L, N)
    flags = np.zeros(0, np.uint8)
    head = (s.offsets, s.expert, s.layer, N, L)

    def run(offsets):
        pages = None if offsets is None else Numpy() if offsets == "numpy" else Placed(offsets)
        hits, misses = np.zeros(L, np.int64), np.zeros(L, np.int64)
        t0 = time.perf_counter()
        if kernel == "slots":
            KS.replay_lfru_slots(*head, np.array([int(round(rho * L * N))]), tie, 0, hits, misses, flags,
                                 pages=pages)
        elif kernel == "groups":
            KG.replay_lfru_groups(*head, True, np.array([int(round(rho * L * N))]), tie, 0, hits, misses, flags,
                                  pages=pages)
        elif kernel == "lrfu":
            KB.replay_lrfu_bits(*head, engine.capacities_for_rho(rho, L, N), tie_pos, 0.5, 0, hits, misses, flags,
                                pages=pages)
        else:
            KB.replay_lfru_bits(*head, engine.capacities_for_rho(rho, L, N), tie_pos, 0, hits, misses, flags,
                                pages=pages)
        dt = time.perf_counter() - t0
        return dt, hits, (pages.arrays if isinstance(pages, Placed) else None)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", choices=KERNELS, default="slots")
    ap.add_argument("--rho", type=float, default=0.2, help="cache size as a share of the blocks (default 0.2)")
    ap.add_argument("--steps", type=int, default=2600, help="steps of the drifting stream (default 2600: 5 M)")
    ap.add_argument("--pairs", type=int, default=5, help="alternated pairs per placement (default 5)")
    ap.add_argument("--random", type=int, default=20, help="random placements (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random placements")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args()
    if a.steps < 1 or a.pairs < 1 or a.random < 0 or not 0.0 < a.rho <= 1.0:
        ap.error("--steps and --pairs must be at least 1, --random at least 0, --rho in (0, 1]")
    from expertcache.replay._pages import PAGE

    run = _runner(a.kernel, a.steps, a.rho)
    _, ref, _ = run(None)
    arrays = run([])[2]                # the shipped placement through Placed: how many arrays, of which shapes
    total = len(arrays) + a.random + 1
    done = [0]

    def ratio(offsets) -> float:
        def side(k: int) -> float:
            dt, hits, _ = run(offsets if k == 0 else None)
            if not np.array_equal(hits, ref):
                print(f"placement {offsets}: the hits differ from the shipped placement's", file=sys.stderr)
                sys.exit(1)
            return dt

        r = alternated_ratio(side, a.pairs, 0)
        done[0] += 1
        print(f"  placement {done[0]}/{total}", file=sys.stderr, end="\r" if done[0] < total else "\n", flush=True)
        return r

    rows = []
    for k, desc in enumerate(arrays):
        offs = [None] * len(arrays)
        offs[k] = PAGE - 64
        rows.append({"array": k, "what": desc, "ratio": ratio(offs)})
    rng = np.random.default_rng(a.seed)
    rand = [ratio([int(x) * 64 for x in rng.integers(0, PAGE // 64, len(arrays))]) for _ in range(a.random)]
    numpy_ratio = ratio("numpy")
    t_shipped = statistics.median(run(None)[0] for _ in range(5))
    out = {"machine": machine(), "kernel": a.kernel, "rho": a.rho, "steps": a.steps, "pairs": a.pairs,
           "shipped_ms": t_shipped * 1e3, "at_page_end": rows, "numpy": numpy_ratio,
           "random": ({"n": len(rand), "min": min(rand), "median": statistics.median(rand), "max": max(rand)}
                      if rand else None)}
    if a.json:
        print(json.dumps(out))
        return
    print(f"machine: {out['machine']}")
    print(f"{a.kernel}, rho {a.rho:g}, {a.steps} steps: time / shipped placement (median of {a.pairs} alternated "
          f"pairs); shipped {t_shipped * 1e3:.2f} ms")
    for r in rows:
        print(f"  array {r['array']:2d} ({r['what']:>16s}) 64 bytes before a page end  {r['ratio']:.3f}")
    if rand:
        q = out["random"]
        print(f"  {q['n']} random placements: min {q['min']:.3f}  median {q['median']:.3f}  max {q['max']:.3f}")
    print(f"  numpy's allocator (this process): {numpy_ratio:.3f}")


if __name__ == "__main__":
    main()
