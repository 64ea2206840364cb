"""Replay throughput on a Qwen3-30B-A3B-shaped stream (union accesses per second).

    python benchmarks/replay_throughput.py [--steps 600] [--policies lru,lfu,lfru,belady]

Builds a stream of 48 layers x 128 experts, top-8, B = 8 (skewed per-layer
popularity, one random ranking per layer), then times each policy x semantics
x scope once, after a warm-up replay that pays the JIT compile (cached on disk
afterwards). This script measures expertcache alone; the comparison with
libCacheSim measured in the same run is the subject of the performance issue.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, replay


def qwen_shaped_stream(steps: int, seed: int = 0) -> EventStream:
    L, N, k, B = 48, 128, 8, 8
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, N + 1) ** 0.9
    w /= w.sum()
    perm = np.stack([rng.permutation(N) for _ in range(L)])
    exps, st, ly = [], [], []
    for s in range(steps):
        for l in range(L):
            z = np.log(w)[None, :] + rng.gumbel(size=(B, N))          # Gumbel top-k: k distinct per request
            picks = perm[l][np.argpartition(-z, k - 1, axis=1)[:, :k]]
            exps.append(np.unique(picks))
            st.append(s)
            ly.append(l)
    return EventStream.from_lists(L, N, k, st, ly, exps, [B] * len(st))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--policies", default="lru,lfu,lfru,least-stale,belady,belady-forced")
    args = ap.parse_args()
    t0 = time.perf_counter()
    stream = qwen_shaped_stream(args.steps)
    print(f"stream: {stream.n_events} events, {stream.union} union accesses "
          f"(mean |E| {stream.union / stream.n_events:.1f}), built in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    replay(stream, ReplayConfig("lru"))
    print(f"first replay incl. JIT load/compile: {time.perf_counter() - t0:.2f} s")
    print(f"{'policy':14s} {'semantics':22s} {'scope':9s} {'M acc/s':>8s} {'miss fraction':>13s}")
    for policy in args.policies.split(","):
        for sem in ("event-atomic", "sequential-ascending"):
            for scope in ("per-layer", "global"):
                cfg = ReplayConfig(policy, rho=0.4, scope=scope, semantics=sem)
                replay(stream, cfg)  # warm (compile this specialisation)
                t0 = time.perf_counter()
                r = replay(stream, cfg)
                dt = time.perf_counter() - t0
                print(f"{policy:14s} {sem:22s} {scope:9s} {stream.union / dt / 1e6:8.2f} {r.miss_fraction:13.4f}")


if __name__ == "__main__":
    main()
