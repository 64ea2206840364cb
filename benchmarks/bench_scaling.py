"""Scaling table: replay time per union access vs stream length, universe, batch and rho.

    python benchmarks/bench_scaling.py [--max-m 16] [--policies lru,belady,lfu,lfru,lrfu] [--markdown]

Event-atomic, per-layer, tie_break random, seed 0; each time is the minimum of
``--repeats`` replays after a warm-up replay (JIT compile / cache load), so a
row is the kernel's cost on an idle-as-possible core, not an alternated ratio.

* length: prefixes of ``drifting_qwen_stream`` (``bench_vs_libcachesim.py``;
  48 x 128, top-8, B = 8) of 1, 2, 4, ... M union accesses up to ``--max-m``;
  rho 0.4. Building the stream takes about 0.4 s per M accesses here, and the
  replays of every prefix about as long as the longest, so 64 M needs minutes;
* universe: ``routed_stream`` (below: Zipf(0.9) popularity over a random
  ranking per layer, each of B = 8 requests draws top-8 distinct experts by
  Gumbel top-k; no drift) with L x N from 8 x 128 (1 k blocks) to
  96 x 1024 (98 k blocks), ~2 M accesses each, rho 0.4, and 192 x 128 and
  768 x 128: the block counts of 48 x 512 and 96 x 1024 with 128 experts a
  layer, so that the rows tell the number of blocks from a layer's width;
* batch: ``routed_stream`` 48 x 128 with B = 1 ... 64, ~2 M accesses each, rho 0.4;
* rho: the 4 M prefix at rho 0.1, 0.25, 0.4, 0.75, 0.9.

Cells are ns per union access (``--markdown``: a table for docs/performance.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vs_libcachesim import drifting_qwen_stream, stream_prefix  # noqa: E402

from expertcache.events import EventStream  # noqa: E402
from expertcache.replay import ReplayConfig, replay  # noqa: E402

ACCESSES_PER_STEP = 1930  # drifting_qwen_stream: ~10.0 M union accesses at 5,200 steps


def routed_stream(n_layers: int, n_experts: int, batch: int, accesses: int, top_k: int = 8, seed: int = 0,
                  alpha: float = 0.9) -> EventStream:
    """A decode stream of about ``accesses`` union accesses: per layer a Zipf(``alpha``) popularity over a
    random ranking of the experts; each of ``batch`` requests draws ``top_k`` distinct experts (Gumbel top-k)."""
    L, N, k, B = n_layers, n_experts, top_k, batch
    rng = np.random.default_rng(seed)
    perm = np.stack([rng.permutation(N) for _ in range(L)])
    logw = -alpha * np.log(np.arange(1, N + 1, dtype=np.float64))
    experts, mult, sizes = [], [], []
    total = 0
    steps = 0
    chunk = max(1, int(2_000_000 // (L * B * N)))
    while total < accesses:
        z = logw + rng.gumbel(size=(chunk, L, B, N))
        ranks = np.argpartition(-z, k - 1, axis=-1)[..., :k]
        picks = np.take_along_axis(np.broadcast_to(perm[None, :, None, :], (chunk, L, B, N)), ranks, axis=-1)
        event = np.arange(chunk * L).reshape(chunk, L, 1, 1)
        counts = np.bincount((event * N + picks).ravel(), minlength=chunk * L * N).reshape(chunk * L, N)
        rows, cols = np.nonzero(counts)
        experts.append(cols.astype(np.int16))
        mult.append(counts[rows, cols].astype(np.int32))
        sizes.append(np.count_nonzero(counts, axis=1))
        total += cols.shape[0]
        steps += chunk
    size = np.concatenate(sizes)
    offsets = np.zeros(size.shape[0] + 1, dtype=np.int64)
    np.cumsum(size, out=offsets[1:])
    active = np.full(size.shape[0], B, dtype=np.int32)
    return EventStream(
        L, N, k,
        np.repeat(np.arange(steps, dtype=np.int64), L), np.tile(np.arange(L, dtype=np.int32), steps),
        active, active.astype(np.int64) * k, offsets, np.concatenate(experts), np.concatenate(mult), None,
        {"generator": "benchmarks/bench_scaling.py:routed_stream", "seed": seed, "alpha": alpha},
    )


def ns_per_access(stream: EventStream, policy: str, rho: float, repeats: int) -> float:
    cfg = ReplayConfig(policy, rho=rho)
    replay(stream, cfg)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        replay(stream, cfg)
        best = min(best, time.perf_counter() - t0)
    return best / stream.union * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-m", type=int, default=16, help="longest prefix, in M union accesses")
    ap.add_argument("--policies", default="lru,belady,lfu,lfru,lrfu",
                    help="comma list (default lru,belady,lfu,lfru,lrfu)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--accesses", type=float, default=2.0, help="M accesses of the universe/batch streams")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    policies = args.policies.split(",")
    rows: list[tuple[str, str, int, list[float]]] = []

    def run(group: str, label: str, stream: EventStream, rho: float = 0.4) -> None:
        cells = [ns_per_access(stream, p, rho, args.repeats) for p in policies]
        rows.append((group, label, stream.union, cells))
        print(f"{group:9s} {label:24s} {stream.union:>11,d} " + " ".join(f"{c:8.1f}" for c in cells),
              file=sys.stderr, flush=True)

    print(f"{'axis':9s} {'value':24s} {'accesses':>11s} " + " ".join(f"{p:>8s}" for p in policies),
          file=sys.stderr)
    t0 = time.perf_counter()
    full = drifting_qwen_stream(int(args.max_m * 1e6 / ACCESSES_PER_STEP) + 1, sample_seed=1)
    print(f"(built {full.union:,d} accesses in {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    m = 1
    while m <= args.max_m:
        run("length", f"{m} M (48 x 128, B = 8)", stream_prefix(full, int(m * 1e6 / ACCESSES_PER_STEP)))
        m *= 2
    four = stream_prefix(full, int(min(4, args.max_m) * 1e6 / ACCESSES_PER_STEP))
    del full
    n_acc = int(args.accesses * 1e6)
    for L, N in ((8, 128), (48, 128), (192, 128), (768, 128), (48, 512), (96, 512), (96, 1024)):
        run("universe", f"{L * N:,d} blocks ({L} x {N})", routed_stream(L, N, 8, n_acc))
    for B in (1, 4, 16, 64):
        s = routed_stream(48, 128, B, n_acc)
        run("batch", f"B = {B} (mean event {s.union / s.n_events:.1f})", s)
    for rho in (0.1, 0.25, 0.4, 0.75, 0.9):
        run("rho", f"rho = {rho} (4 M prefix)", four, rho)
    if args.markdown:
        print("| axis | value | union accesses | " + " | ".join(f"{p} ns/access" for p in policies) + " |")
        print("|---|---|---:|" + "---:|" * len(policies))
        for group, label, n, cells in rows:
            print(f"| {group} | {label} | {n:,d} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
