"""One-pass miss-ratio curves and parallel sweeps, timed against their naive equivalents.

    python benchmarks/curves_and_sweeps.py [--steps 5200 | --quick] [--cost-table]

On the stream of ``bench_vs_libcachesim.py`` (Qwen3-30B-A3B-shaped, ~10 M
union accesses at the default size), for lru and belady under event-atomic,
per-layer replay at rho = 0.05:0.95:0.05 (19 points), it reports:

* one replay at rho = 0.4 (the reference time),
* ``replay_curve`` (one pass) — its time relative to the single replay,
* 19 separate replays (the loop it replaces), checked equal to the curve,

a sweep of 8 independent configurations with ``jobs=1`` and ``jobs=2``
(processes), checked identical, and the choice of ``replay_curve`` between
one pass and separate replays (``engine.curve_pays``) on a 3-point grid and on
5-, 6- and 8-point grids from rho 0.1 (``lru``, ``lfu``), timed against forced
separate replays, alternated pair by pair (min and median of the ratios), with
the forced pass beside it. Everything is warmed up first (JIT).

``--cost-table`` instead prints ``engine.CURVE_COST``: for every stack policy
and event-atomic / sequential units, the time of a forced one-pass curve with
a largest rho of 0.1, 0.4 and 0.95 over the time of one replay at rho 0.4
(minimum of 5 rounds, the four timed in turn), in the form the engine holds
(``--policy lfru``: that row only).
The ratios depend on the workload (``lfu``'s rank pass moves a block past
every block that shares its count), so they are measured on two streams and
the table holds their geometric mean: the drifting stream above and a
working-set stream (``working_set_stream``: the synthetic generator's
per-request working sets, as ``bench_commands.py``'s trace, under FCFS batching
at B = 8); each stream's own row is printed as a comment first. With
``--quick`` the geometric-mean rows are ``engine.CURVE_COST`` (small
streams); at the default size the ``drifting`` comment rows (10 M accesses)
are ``engine.CURVE_COST_LARGE``, and the engine interpolates between the two
by the stream's length (``engine.curve_cost``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import machine  # noqa: E402
from bench_vs_libcachesim import STEPS_FULL, STEPS_QUICK, drifting_qwen_stream  # noqa: E402

from expertcache.replay import ReplayConfig, curve_pays, replay, replay_curve, sweep  # noqa: E402

GRID = [round(0.05 * i, 2) for i in range(1, 20)]
GRID3 = [0.2, 0.3, 0.4]
#: The curves replay_curve's choice is timed on: 3 points, and 5, 6 and 8 from rho 0.1 (where the pass starts to pay).
#: The stack policies ``engine.CURVE_COST`` holds (least-stale runs on lru's kernels).
COST_POLICIES = ("lru", "lfu", "lfru", "lrfu", "belady")
CHOICE_GRIDS = (GRID3, [0.1, 0.2, 0.3, 0.4, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [round(0.1 * i, 1) for i in range(1, 9)])


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=STEPS_FULL)
    ap.add_argument("--quick", action="store_true", help=f"{STEPS_QUICK} steps (~1 M accesses)")
    ap.add_argument("--cost-table", action="store_true", help="print engine.CURVE_COST as measured here")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--policy", action="append", choices=COST_POLICIES, default=None,
                    help="with --cost-table: only this policy's row (repeatable; default all)")
    args = ap.parse_args()
    stream = drifting_qwen_stream(STEPS_QUICK if args.quick else args.steps, sample_seed=1)
    print(f"machine: {machine()}")
    print(f"stream: {stream.n_events} events, {stream.union} union accesses")
    if args.cost_table:
        cost_table({"drifting": stream, "working sets": working_set_stream(args.quick)},
                   tuple(args.policy or COST_POLICIES))
        return
    print(f"{'policy':8s} {'one replay':>11s} {'curve (1 pass)':>15s} {'ratio':>6s} {'19 replays':>11s} {'speed-up':>9s}")
    for policy in ("lru", "belady"):
        cfg = ReplayConfig(policy, semantics="event-atomic", scope="per-layer")
        replay(stream, cfg)
        replay_curve(stream, cfg, GRID[:2])                                   # warm both kernels
        t_one, _ = min((timed(lambda cfg=cfg: replay(stream, cfg)) for _ in range(3)), key=lambda x: x[0])
        t_curve, curve = min((timed(lambda cfg=cfg: replay_curve(stream, cfg, GRID)) for _ in range(3)),
                             key=lambda x: x[0])
        t_loop, loop = timed(lambda policy=policy: [replay(stream, ReplayConfig(policy, rho=r)) for r in GRID])
        assert list(curve) == loop, "one-pass curve differs from separate replays"
        print(f"{policy:8s} {t_one:10.3f}s {t_curve:14.3f}s {t_curve / t_one:5.2f}x {t_loop:10.3f}s "
              f"{t_loop / t_curve:8.1f}x")
    cfgs = [ReplayConfig(p, rho=0.4, semantics=s) for p in ("lfu", "lfru", "least-stale", "belady-forced")
            for s in ("event-atomic", "sequential-ascending")]
    sweep(stream, cfgs[:1], jobs=1)
    t1, serial = timed(lambda: sweep(stream, cfgs, jobs=1))
    t2, parallel = timed(lambda: sweep(stream, cfgs, jobs=2))
    assert serial == parallel, "parallel sweep differs from serial"
    print(f"sweep of {len(cfgs)} configurations: jobs=1 {t1:.2f}s, jobs=2 {t2:.2f}s "
          f"({t1 / t2:.2f}x; identical results)")
    print("replay_curve's choice (engine.curve_pays) against forced separate replays, alternated pairs; the")
    print("forced pass / separate replays beside it (min, median); 'pass' where the engine takes the pass:")
    for policy in ("lru", "lfu", "belady"):
        for sem in ("event-atomic", "sequential-ascending"):
            cfg = ReplayConfig(policy, semantics=sem)
            for grid in CHOICE_GRIDS:
                if policy == "belady" and grid is not GRID3:
                    continue
                assert replay_curve(stream, cfg, grid) == replay_curve(stream, cfg, grid, one_pass=False)
                sides = [lambda cfg=cfg, grid=grid: replay_curve(stream, cfg, grid),
                         lambda cfg=cfg, grid=grid: replay_curve(stream, cfg, grid, one_pass=False),
                         lambda cfg=cfg, grid=grid: replay_curve(stream, cfg, grid, one_pass=True)]
                ratios = ([], [])
                for k in range(args.pairs):
                    t = [0.0, 0.0, 0.0]
                    for j in ((2, 1, 0) if k % 2 else (0, 1, 2)):
                        t[j] = timed(sides[j])[0]
                    ratios[0].append(t[0] / t[1])
                    ratios[1].append(t[2] / t[1])
                took = "pass" if curve_pays(cfg, grid, stream.union) else "separate"
                print(f"  {policy:6s} {sem:21s} rho {grid[0]}-{grid[-1]} ({len(grid)}) {took:8s} "
                      f"auto/separate {min(ratios[0]):5.2f} {statistics.median(ratios[0]):5.2f}   "
                      f"pass/separate {min(ratios[1]):5.2f} {statistics.median(ratios[1]):5.2f}", flush=True)


def working_set_stream(quick: bool):
    """The synthetic generator's trace (48 x 128, top-8, 4 request categories, per-request working sets; 48 x 96
    decode tokens, ``quick``: 24 x 96) under FCFS continuous batching at B = 8."""
    from expertcache.events import build_events
    from expertcache.trace.synth import SynthConfig, synthesize_trace

    requests = 24 if quick else 48
    trace = synthesize_trace(SynthConfig(n_layers=48, n_experts=128, top_k=8, n_requests=requests,
                                         decode_tokens=96, seed=0, n_categories=4))
    return build_events(trace, 8)


def cost_table(streams: dict, policies: tuple[str, ...] = COST_POLICIES) -> None:
    """Print ``CURVE_COST`` entries: forced one-pass curve time / one replay time, by largest rho, the geometric
    mean over ``streams`` (each stream's row printed as a comment first).

    The replay and the three curves are timed in turn, 5 rounds, and the minimum of each is kept, so a
    change of load between them moves no ratio.
    """
    for name, stream in streams.items():
        print(f"# {name}: {stream.n_events} events, {stream.union} union accesses")
    for policy in policies:
        row = []
        for sem in ("event-atomic", "sequential-ascending"):
            cfg = ReplayConfig(policy, semantics=sem)
            per = []
            for name, stream in streams.items():
                sides = [lambda cfg=cfg, stream=stream: replay(stream, cfg)] + [
                    lambda cfg=cfg, top=top, stream=stream: replay_curve(stream, cfg, [0.05, top], one_pass=True)
                    for top in (0.1, 0.4, 0.95)]
                for fn in sides:
                    fn()
                best = [float("inf")] * len(sides)
                for _ in range(5):
                    for j, fn in enumerate(sides):
                        best[j] = min(best[j], timed(fn)[0])
                per.append([b / best[0] for b in best[1:]])
                print(f'    # {name}: ("{policy}", {sem == "event-atomic"}): '
                      f'({per[-1][0]:.1f}, {per[-1][1]:.1f}, {per[-1][2]:.1f})', flush=True)
            r = [statistics.geometric_mean(col) for col in zip(*per, strict=True)]
            row.append(f'("{policy}", {sem == "event-atomic"}): ({r[0]:.1f}, {r[1]:.1f}, {r[2]:.1f}),')
        print("    " + " ".join(row), flush=True)


if __name__ == "__main__":
    main()
