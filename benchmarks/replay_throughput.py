"""Every policy against lru, alternated pair by pair on one Qwen3-30B-A3B-shaped stream.

    python benchmarks/replay_throughput.py [--steps 1300] [--pairs 7] [--policies lfu,lfru,lrfu,least-stale,belady]

Builds ``drifting_qwen_stream`` of ``bench_vs_libcachesim.py`` (48 layers x 128
experts, top-8, B = 8; ~10 M union accesses at 5,200 steps, ~2.5 M at the
default 1,300), rho = 0.4, tie_break random, seed 0. After a warm-up replay of
every configuration (JIT compile / cache load), each comparison is timed as
``--pairs`` pairs, the two sides alternated within each pair (the order
flipping every pair), and reported as the min and median of the per-pair time
ratios (the machine is noisy; a ratio against a peer timed in the same pair is
what counts):

* per policy: policy / lru, event-atomic (or each of ``--policy-semantics``), per-layer scope (at rho 0.4, or at
  each of ``--policy-rhos``);
* sequential-random / sequential-ascending (same policy, per-layer; at rho 0.4, or at each of ``--random-rhos``);
* lfru global / lfru per-layer (event-atomic and sequential-ascending; at rho 0.4, or at each of
  ``--global-rhos``).

``ns/acc`` is the median time of the first side per union access, ``peer`` the second side's (a ratio that
moved because its peer slowed shows there).

``--processes K`` (K > 1) runs every row in K fresh processes, one after another, and pools their pairs:
min and median over all of them, and the lowest and highest per-process median (``proc lo-hi``). Where a
kernel's machine code lands moves its time by up to ~15% from process to process, and the lottery is drawn
once per process (docs/performance.md, *Placement noise*), so one process is one draw; the pooled median
over several is the figure to record.

``--kernel-choice`` instead times, for lfu and least-stale, the two event-atomic
per-layer kernels of ``replay/_kernels_ranked.py`` (sorted residents vs heaps)
on ``bench_scaling.routed_stream`` streams of several batch sizes, universes
and rho, against the quota / mean event size ratio: the crossover sets
``engine._SORTED_UP_TO``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _ab import machine  # noqa: E402
from bench_vs_libcachesim import drifting_qwen_stream  # noqa: E402

from expertcache.events import EventStream  # noqa: E402
from expertcache.replay import ReplayConfig, replay  # noqa: E402
from expertcache.replay.engine import SEMANTICS  # noqa: E402


def qwen_shaped_stream(steps: int, seed: int = 0) -> EventStream:
    """48 x 128, top-8, B = 8 without drift: skewed per-layer popularity, one random ranking per layer.

    The distribution ``bench_vs_libcachesim.drifting_qwen_stream`` (the stream timed here) adds drift to.
    """
    L, N, k, B = 48, 128, 8, 8
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, N + 1) ** 0.9
    w /= w.sum()
    perm = np.stack([rng.permutation(N) for _ in range(L)])
    exps, st, ly = [], [], []
    for s in range(steps):
        for layer in range(L):
            z = np.log(w)[None, :] + rng.gumbel(size=(B, N))          # Gumbel top-k: k distinct per request
            picks = perm[layer][np.argpartition(-z, k - 1, axis=1)[:, :k]]
            exps.append(np.unique(picks))
            st.append(s)
            ly.append(layer)
    return EventStream.from_lists(L, N, k, st, ly, exps, [B] * len(st))


def _time(stream, cfg: ReplayConfig) -> float:
    t0 = time.perf_counter()
    replay(stream, cfg)
    return time.perf_counter() - t0


def alternate(stream, a: ReplayConfig, b: ReplayConfig, pairs: int) -> tuple[list[float], list[float], list[float]]:
    """Per-pair ``time(a) / time(b)`` and the seconds of ``a`` and of ``b``, the two sides alternated pair by
    pair."""
    replay(stream, a)
    replay(stream, b)  # warm: compile or load both specialisations, fault in their temporaries
    ratios, ta, tb = [], [], []
    for k in range(pairs):
        if k % 2:
            tb_, ta_ = _time(stream, b), _time(stream, a)
        else:
            ta_, tb_ = _time(stream, a), _time(stream, b)
        ratios.append(ta_ / tb_)
        ta.append(ta_)
        tb.append(tb_)
    return ratios, ta, tb


def rows(args: argparse.Namespace) -> list[tuple[str, ReplayConfig, ReplayConfig]]:
    """The comparisons the options ask for: ``(label, a, b)``, timed as ``a / b``."""
    out = []
    for sem in args.policy_semantics.split(","):
        for rho in [float(x) for x in args.policy_rhos.split(",") if x]:
            at = "" if rho == 0.4 else f", rho {rho:g}"
            lru = ReplayConfig("lru", rho=rho, semantics=sem)
            for policy in filter(None, args.policies.split(",")):
                out.append((f"{policy} / lru ({sem}, per-layer{at})", ReplayConfig(policy, rho=rho, semantics=sem),
                            lru))
    for rho in [float(x) for x in args.random_rhos.split(",") if x]:
        at = "" if rho == 0.4 else f" (rho {rho:g})"
        for policy in filter(None, args.random_policies.split(",")):
            out.append((f"{policy}: sequential-random / sequential-ascending{at}",
                        ReplayConfig(policy, rho=rho, semantics="sequential-random"),
                        ReplayConfig(policy, rho=rho, semantics="sequential-ascending")))
    for rho in () if args.no_global else [float(x) for x in args.global_rhos.split(",") if x]:
        for sem in ("event-atomic", "sequential-ascending"):
            at = "" if rho == 0.4 else f", rho {rho:g}"
            out.append((f"lfru: global / per-layer ({sem}{at})",
                        ReplayConfig("lfru", rho=rho, scope="global", semantics=sem),
                        ReplayConfig("lfru", rho=rho, semantics=sem)))
    return out


def pooled(argv: list[str], processes: int, n_rows: int) -> tuple[dict, list[tuple[list, list, list]]]:
    """The stream's shape (from the first process) and every row's ratios and both sides' seconds from
    ``processes`` fresh runs of this script (``--worker``), one after another; ``[row][process]`` lists."""
    shape: dict = {}
    got: list[tuple[list, list, list]] = [([], [], []) for _ in range(n_rows)]
    for k in range(processes):
        out = subprocess.run([sys.executable, __file__, *argv, "--worker"], capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"worker process {k + 1} failed:\n{out.stderr[-2000:]}")
        head, *recs = (json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{"))
        shape = shape or head
        for r, rec in enumerate(recs):
            got[r][0].append(rec["ratios"])
            got[r][1].append(rec["seconds"])
            got[r][2].append(rec["peer_seconds"])
        print(f"  process {k + 1}/{processes} done", file=sys.stderr, flush=True)
    return shape, got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1300)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--policies", default="lfu,lfru,lrfu,least-stale,belady")
    ap.add_argument("--random-policies", default="lru,lfu",
                    help="policies timed sequential-random vs ascending ('' for none)")
    ap.add_argument("--random-rhos", default="0.4",
                    help="rho values of the sequential-random / ascending rows, comma-separated (default 0.4)")
    ap.add_argument("--no-global", action="store_true", help="skip the lfru global / per-layer rows")
    ap.add_argument("--global-rhos", default="0.4",
                    help="rho values of the lfru global / per-layer rows, comma-separated (default 0.4)")
    ap.add_argument("--policy-rhos", default="0.4",
                    help="rho values of the policy / lru rows, comma-separated (default 0.4)")
    ap.add_argument("--policy-semantics", default="event-atomic",
                    help="semantics of the policy / lru rows, comma-separated (event-atomic, sequential-ascending, "
                         "sequential-random; default event-atomic)")
    ap.add_argument("--kernel-choice", action="store_true", help="time sorted vs heap kernels (see above)")
    ap.add_argument("--processes", type=int, default=1,
                    help="run every row in this many fresh processes and pool their pairs (see above)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.kernel_choice:
        kernel_choice()
        return
    if args.processes < 1 or args.pairs < 1:
        ap.error("--processes and --pairs must be at least 1")
    bad = [x for x in args.policy_semantics.split(",") if x not in SEMANTICS]
    if bad:
        ap.error(f"--policy-semantics: {', '.join(map(repr, bad))} is not one of {', '.join(SEMANTICS)}")
    table = rows(args)
    many = args.processes > 1 and not args.worker     # a worker times its rows itself, never fans out
    if many:                           # the stream is built and timed in the worker processes only
        shape, results = pooled([x for x in sys.argv[1:] if x != "--worker"], args.processes, len(table))
    else:
        t0 = time.perf_counter()
        stream = drifting_qwen_stream(args.steps, sample_seed=1)
        shape = {"events": stream.n_events, "union": stream.union, "built_s": time.perf_counter() - t0}
        if args.worker:                # one process of --processes K: the shape, then every row's pairs
            print(json.dumps(shape), flush=True)
            for _, a, b in table:
                ratios, ta, tb = alternate(stream, a, b, args.pairs)
                print(json.dumps({"ratios": ratios, "seconds": ta, "peer_seconds": tb}), flush=True)
            return
    n = shape["union"]
    print(f"machine: {machine()}")
    print(f"stream: {shape['events']} events, {n} union accesses (mean |E| {n / shape['events']:.1f}), "
          f"built in {shape['built_s']:.1f} s; {args.pairs} alternated pairs per row"
          + (f" in each of {args.processes} processes" if many else ""))
    print(f"{'comparison':58s} {'min':>6s} {'median':>7s} {'ns/acc':>7s} {'peer':>7s}" + (f" {'proc lo-hi':>11s}" if many else ""))
    if many:
        for (label, _, _), (ratios, ta, tb) in zip(table, results, strict=True):
            meds = [statistics.median(p) for p in ratios]
            print(_row(label, [x for p in ratios for x in p], [x for p in ta for x in p], [x for p in tb for x in p],
                       n) + f" {min(meds):5.2f}-{max(meds):<5.2f}", flush=True)
        return
    for label, a, b in table:
        print(_row(label, *alternate(stream, a, b, args.pairs), n), flush=True)


def _row(label: str, ratios: list[float], ta: list[float], tb: list[float], n: int) -> str:
    """One row: the label, min and median ratio, and each side's median time per access (``n`` accesses) in ns."""
    return (f"{label:58s} {min(ratios):6.2f} {statistics.median(ratios):7.2f} "
            f"{statistics.median(ta) / n * 1e9:7.1f} {statistics.median(tb) / n * 1e9:7.1f}")


def kernel_choice() -> None:
    """Sorted-residents vs heap kernel time, event-atomic per layer, by quota / mean event size."""
    from bench_scaling import routed_stream

    from expertcache.replay import _kernels_ranked as KR
    from expertcache.replay import engine
    from expertcache.replay.keys import KEY_LEAST_STALE, KEY_LFU

    for L, N, B in ((48, 128, 1), (48, 128, 4), (48, 128, 8), (48, 512, 8), (48, 128, 16)):
        s = routed_stream(L, N, B, 300_000)
        tie = engine._tie_ranks("random", 0, L * N)
        order, tie_pos = engine._tie_order(tie, L, N)
        for rho in (0.1, 0.4, 0.75):
            caps = engine.capacities_for_rho(rho, L, N)
            out = []
            for name, code in (("lfu", KEY_LFU), ("least-stale", KEY_LEAST_STALE)):
                bits = engine._ranked_bits(code, s.offsets, s.step, L * N, True)

                def run(sorted_, code=code, bits=bits, caps=caps, s=s, tie=tie, order=order, tie_pos=tie_pos):
                    hm = np.zeros(s.n_layers, np.int64), np.zeros(s.n_layers, np.int64)
                    head = (s.offsets, s.expert, s.layer, s.step, s.n_experts, s.n_layers, False, True, caps, tie)
                    tail = (code, *bits, False, -1.0, 0, *hm, np.zeros(0, np.uint8))
                    t0 = time.perf_counter()
                    if sorted_:
                        KR.replay_sorted(*head, order, tie_pos, *tail)
                    else:
                        KR.replay_ranked(*head, *tail)
                    return time.perf_counter() - t0

                run(False)
                run(True)
                ratios = sorted(run(True) / run(False) for _ in range(3))
                out.append(f"{name} sorted/heap {ratios[1]:.2f}")
            mean = s.union / s.n_events
            print(f"{L} x {N}, B = {B}, mean |E| {mean:.1f}, quota {caps.max()} = {caps.max() / mean:.2f} |E|: "
                  + ", ".join(out), flush=True)


if __name__ == "__main__":
    main()
