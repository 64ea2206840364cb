"""Timing model throughput: ``simulate`` (replay with per-access hits + the timeline loop) against ``replay``.

    python benchmarks/bench_timing.py [--steps 5200] [--pairs 7] [--policies lru,lfu,belady] [--prefetch R]

The stream is the Qwen3-30B-A3B-shaped drifting stream of ``bench_vs_libcachesim.py`` (48 x 128, top-8, B = 8;
5,200 steps ~ 10 M union accesses). For each policy the two sides, the plain replay (the peer: what a block count
costs) and the timed replay, alternate pair by pair after one untimed warm-up each; the script prints min and
median seconds, union accesses per second of the timed side, and the per-pair ratio timed / replay. The counts
of the two sides are checked equal in every pair.

``--prefetch R`` times prefetching instead: the proactive replay (``replay_proactive``, the peer) against
``simulate_prefetch`` (the same replay recording its hits and insertions, then the timeline with prefetches
issued at the previous layer), with the next-true oracle's advice (every event's experts are candidates), budget
R, LRU retention; ``--policies`` is then ignored.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_libcachesim import drifting_qwen_stream  # noqa: E402

from expertcache.replay import ReplayConfig, replay  # noqa: E402
from expertcache.timing import load_profile, simulate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5200)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--policies", default="lru,lfu,belady")
    ap.add_argument("--rho", type=float, default=0.4)
    ap.add_argument("--prefetch", type=int, default=None, help="Time prefetching with budget R (next-true advice).")
    args = ap.parse_args()
    stream = drifting_qwen_stream(args.steps, sample_seed=1)
    n = int(stream.expert.shape[0])
    profile = load_profile("pcie-gen4-x16")
    nbytes = 3 * 2048 * 768 * 2  # Qwen3-30B-A3B: gate, up, down of 2048 x 768 in bf16
    print(f"stream: {stream.n_events:,} events, {n:,} union accesses; rho {args.rho}; profile {profile.name}")
    if args.prefetch is not None:
        _prefetch(stream, n, profile, nbytes, args)
        return
    print(f"{'policy':8s} {'replay min/med s':>18s} {'timed min/med s':>18s} {'timed M acc/s (min)':>20s} "
          f"{'ratio min/med':>14s}")
    for policy in args.policies.split(","):
        cfg = ReplayConfig(policy, rho=args.rho)
        replay(stream, cfg)
        simulate(stream, cfg, profile, expert_bytes=nbytes)
        plain, timed, ratio = [], [], []
        for _ in range(args.pairs):
            t0 = time.perf_counter()
            want = replay(stream, cfg)
            t1 = time.perf_counter()
            got = simulate(stream, cfg, profile, expert_bytes=nbytes)
            t2 = time.perf_counter()
            assert (got.transferred, got.hits) == (want.transferred, want.hits)
            plain.append(t1 - t0)
            timed.append(t2 - t1)
            ratio.append((t2 - t1) / (t1 - t0))
        print(f"{policy:8s} {min(plain):8.3f} /{statistics.median(plain):8.3f} {min(timed):8.3f} /"
              f"{statistics.median(timed):8.3f} {n / min(timed) / 1e6:20.1f} {min(ratio):6.2f} /"
              f"{statistics.median(ratio):6.2f}")


def _prefetch(stream, n, profile, nbytes, args) -> None:
    from expertcache.prefetch import next_true
    from expertcache.replay.proactive import ProactiveConfig, replay_proactive
    from expertcache.timing.prefetch import simulate_prefetch

    advice = next_true(stream).advice
    cfg = ProactiveConfig("lru", rho=args.rho, prefetch_budget=args.prefetch)
    replay_proactive(stream, cfg, advice)
    simulate_prefetch(stream, cfg, profile, advice, expert_bytes=nbytes)
    plain, timed, ratio = [], [], []
    for _ in range(args.pairs):
        t0 = time.perf_counter()
        want = replay_proactive(stream, cfg, advice)
        t1 = time.perf_counter()
        got = simulate_prefetch(stream, cfg, profile, advice, expert_bytes=nbytes)
        t2 = time.perf_counter()
        assert (got.transferred, got.prefetch_loads) == (want.transferred, want.proactive_loads)
        plain.append(t1 - t0)
        timed.append(t2 - t1)
        ratio.append((t2 - t1) / (t1 - t0))
    print(f"prefetch R={args.prefetch} (next-true advice, LRU retention): P = {want.proactive_loads:,}, "
          f"D = {want.demand_misses:,}")
    print(f"{'side':10s} {'proactive min/med s':>18s} {'timed min/med s':>18s} {'timed M acc/s (min)':>20s} "
          f"{'ratio min/med':>14s}")
    print(f"{'proactive':10s} {min(plain):8.3f} /{statistics.median(plain):8.3f} {min(timed):8.3f} /"
          f"{statistics.median(timed):8.3f} {n / min(timed) / 1e6:20.1f} {min(ratio):6.2f} /"
          f"{statistics.median(ratio):6.2f}")


if __name__ == "__main__":
    main()
