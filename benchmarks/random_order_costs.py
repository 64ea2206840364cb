"""Where sequential-random's time goes: the shuffle, the shuffled order's own replay, and the two beside each other.

    python benchmarks/random_order_costs.py [--steps 2600] [--rhos 0.1,0.2,0.4] [--policies lru] [--pairs 7] [--json]
    python benchmarks/random_order_costs.py --curves --policies lru,lfu,lrfu,lfru,belady --rhos 0.1,0.2,0.3,0.4
    python benchmarks/random_order_costs.py --chunks 65536,262144 --policies lru,lfu --rhos 0.1,0.2

``sequential-random`` replays each event's members in a seeded shuffled order; its loop shuffles the stream on a
second thread, chunk by chunk, ahead of the replay (``replay/_kernels_order.shuffled_replay``). Per policy and rho,
on ``bench_vs_libcachesim.drifting_qwen_stream(steps)`` (48 x 128, B = 8), this prints the nanoseconds per access
of:

* ``ascending``: the sequential loop on the members as stored (``sequential-ascending``);
* ``pre-shuffled``: the same loop on the members already in sequential-random's order (shuffled beforehand, not
  timed): what replaying that order costs by itself;
* ``random``: ``shuffled_replay`` over the same loop, the shuffle beside the replay (what ``replay`` runs for
  ``sequential-random``);
* ``shuffle``: ``shuffle_events`` alone, on one thread;

the four timed in turn within each pair, their order rotated pair by pair (median over pairs), and the ratios
``pre-shuffled`` / ``ascending`` and ``random`` / ``ascending``. Where ``random`` exceeds ``pre-shuffled``, the
difference is what running the shuffle beside the replay costs (a wait for it, or the two cores slowing each
other). Each row checks that the ``pre-shuffled`` and ``random`` replays' per-layer hits equal those of
``expertcache.replay(..., semantics="sequential-random")`` (exit 1 otherwise).

``--chunks A,B,...`` instead times the ``random`` side alone at each chunk size (accesses a chunk of
``_kernels_order.CHUNK_ACCESSES``, the share of the stream the second thread shuffles ahead at a time), in turn
within each round, their order rotated round by round: nanoseconds per access and the median per-round ratio to
the first size, hits checked as above.

``--curves`` instead times, per policy (``belady`` allowed too), a sequential-random curve at ``--rhos`` as
separate replays (``replay_curve(..., one_pass=False)``: within one ``engine.reuse_belady_inputs`` scope, so the
order is shuffled once and the later replays run on it) against the same replays one by one outside any scope
(each shuffling again), alternated pair by pair: milliseconds of each (medians) and the per-pair ratios one by
one / curve (min and median); each row checks that the two give equal results (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import alternated_pairs, int_list, machine, positive_int, report, rho_list, yes_no  # noqa: E402

#: The policies this script times: those whose sequential per-layer loop ``shuffled_replay`` runs.
POLICIES = ("lru", "lfu", "lfru", "lrfu")
SIDES = ("ascending", "pre-shuffled", "random", "shuffle")


def _ranges(policy: str, s, caps, tie_pos, hits, misses):
    """The policy's sequential per-layer loop by ranges (``_kernels_seq.*_seq_ranges``), as the engine calls it
    with default settings (tie break random, seed 0, lambda 0.5, counts kept on eviction, no warm-up)."""
    from expertcache.replay import _kernels_seq as KQ

    flags = np.zeros(0, np.uint8)
    L, N = s.n_layers, s.n_experts
    if policy == "lru":
        return KQ.lru_seq_ranges(s.offsets, s.layer, N, L, caps, 0, hits, misses, flags)
    if policy == "lfu":
        return KQ.lfu_seq_ranges(s.offsets, s.layer, N, L, caps, tie_pos, False, 0, hits, misses, flags)
    if policy == "lfru":
        return KQ.lfru_seq_ranges(s.offsets, s.layer, N, L, caps, tie_pos, 0, hits, misses, flags)
    return KQ.lrfu_seq_ranges(s.offsets, s.layer, N, L, caps, tie_pos, 0.5, 0, hits, misses, flags)


def _inputs(s, rho: float) -> tuple:
    """The per-layer quotas at ``rho``, the tie positions (tie break random, seed 0) and sequential-random's
    generator words (seed 0) that the engine's default replay uses."""
    from expertcache.replay import engine

    L, N = s.n_layers, s.n_experts
    _, tie_pos = engine._tie_order(engine._tie_ranks("random", 0, L * N), L, N)
    return engine.capacities_for_rho(rho, L, N), tie_pos, engine._order_words(0)


def _engine_hits(s, policy: str, rho: float) -> np.ndarray:
    """Per-layer hits of ``expertcache.replay(..., semantics="sequential-random")``: what every timed side must give."""
    from expertcache.replay import ReplayConfig, replay

    return np.array([x.hits for x in replay(s, ReplayConfig(policy=policy, rho=rho,
                                                             semantics="sequential-random")).per_layer])


def _rotated(timed, sides: list, pairs: int) -> dict:
    """Seconds of each side (``timed(side)[0]``) over ``pairs`` rounds, the sides timed in turn within a round and
    their order rotated round by round."""
    secs: dict = {side: [] for side in sides}
    for k in range(pairs):
        for j in range(len(sides)):
            side = sides[(j + k) % len(sides)]
            secs[side].append(timed(side)[0])
    return secs


def row(s, policy: str, rho: float, pairs: int) -> dict:
    """One policy and rho: the four sides' nanoseconds per access (medians), the two ratios, and the check."""
    from expertcache.replay import _kernels_order as KO
    from expertcache.replay import engine

    L = s.n_layers
    caps, tie_pos, words = _inputs(s, rho)
    order = engine._member_order(s, "sequential-random", 0)
    n_events = s.offsets.shape[0] - 1

    def timed(side: str) -> tuple[float, np.ndarray]:
        hits = np.zeros(L, np.int64)
        misses = np.zeros(L, np.int64)
        if side == "shuffle":
            work = s.expert.copy()
            t0 = time.perf_counter()
            KO.shuffle_events(s.offsets, work, words)
            return time.perf_counter() - t0, hits
        run = _ranges(policy, s, caps, tie_pos, hits, misses)
        t0 = time.perf_counter()
        if side == "random":
            KO.shuffled_replay(s.offsets, s.expert, words, run)
        else:
            run(s.expert if side == "ascending" else order, 0, n_events)
        return time.perf_counter() - t0, hits

    want = _engine_hits(s, policy, rho)
    same = all(np.array_equal(timed(side)[1], want) for side in ("pre-shuffled", "random"))   # (also a warm-up)
    timed("ascending")
    timed("shuffle")
    secs = _rotated(timed, list(SIDES), pairs)
    ns = {side: statistics.median(v) / s.union * 1e9 for side, v in secs.items()}
    return {"policy": policy, "rho": rho, "ns_per_access": ns,
            "pre_shuffled_over_ascending": ns["pre-shuffled"] / ns["ascending"],
            "random_over_ascending": ns["random"] / ns["ascending"], "hits_equal": same}


def chunk_row(s, policy: str, rho: float, chunks: list[int], pairs: int) -> dict:
    """One policy and rho: the ``random`` side (``shuffled_replay`` on two threads) at each chunk size in ``chunks``
    (``_kernels_order.CHUNK_ACCESSES``), timed in turn within each pair, their order rotated pair by pair: nanoseconds
    per access (medians) and each one's per-pair ratio to the first size's (median); hits checked against
    ``expertcache.replay`` at every size."""
    from expertcache.replay import _kernels_order as KO

    L = s.n_layers
    caps, tie_pos, words = _inputs(s, rho)
    keep = KO.CHUNK_ACCESSES

    def timed(chunk: int) -> tuple[float, np.ndarray]:
        hits = np.zeros(L, np.int64)
        run = _ranges(policy, s, caps, tie_pos, hits, np.zeros(L, np.int64))
        KO.CHUNK_ACCESSES = chunk
        try:
            t0 = time.perf_counter()
            KO.shuffled_replay(s.offsets, s.expert, words, run, threads=True)
            return time.perf_counter() - t0, hits
        finally:
            KO.CHUNK_ACCESSES = keep

    want = _engine_hits(s, policy, rho)
    same = all(np.array_equal(timed(c)[1], want) for c in chunks)     # (also a warm-up)
    secs = _rotated(timed, chunks, pairs)
    return {"policy": policy, "rho": rho, "chunks": chunks,
            "ns_per_access": {str(c): statistics.median(v) / s.union * 1e9 for c, v in secs.items()},
            "ratio_to_first": {str(c): statistics.median([a / b for a, b in zip(v, secs[chunks[0]], strict=True)])
                               for c, v in secs.items()}, "hits_equal": same}


def curve_row(s, policy: str, rhos: list[float], pairs: int) -> dict:
    """One policy's sequential-random curve in one scope against its replays one by one (module docstring)."""
    from expertcache.replay import ReplayConfig, replay, replay_curve

    cfg = ReplayConfig(policy, semantics="sequential-random")

    def timed(side: int) -> tuple[float, tuple]:
        t0 = time.perf_counter()
        if side == 0:
            out = replay_curve(s, cfg, rhos, one_pass=False)
        else:
            out = tuple(replay(s, ReplayConfig(policy, rho=r, semantics="sequential-random")) for r in rhos)
        return time.perf_counter() - t0, out

    same = timed(0)[1] == timed(1)[1]                # (also the warm-up)
    curve, apart = alternated_pairs(lambda side: timed(side)[0], pairs)
    ratios = [b / a for a, b in zip(curve, apart, strict=True)]
    return {"policy": policy, "rhos": rhos, "curve_ms": statistics.median(curve) * 1e3,
            "one_by_one_ms": statistics.median(apart) * 1e3, "ratio_min": min(ratios),
            "ratio": statistics.median(ratios), "hits_equal": same}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=positive_int, default=2600, help="scheduling steps (default 2600, ~5 M accesses)")
    ap.add_argument("--rhos", type=rho_list, default=[0.1, 0.2, 0.4], help="comma list (default 0.1,0.2,0.4)")
    ap.add_argument("--policies", default="lru", help=f"comma list of {', '.join(POLICIES)} (default lru)")
    ap.add_argument("--pairs", type=positive_int, default=7, help="rounds of the four sides (default 7)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--curves", action="store_true",
                    help="time each policy's sequential-random curve at --rhos in one scope against its replays one "
                         "by one (belady allowed)")
    ap.add_argument("--chunks", type=int_list, default=None,
                    help="time the random side at each of these chunk sizes (accesses, comma list)")
    args = ap.parse_args(argv)
    if args.curves and args.chunks:
        ap.error("--curves, --chunks: expected one of the two, not both")
    allowed = (*POLICIES, "belady") if args.curves else POLICIES
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in allowed]
    if bad or not policies:
        ap.error(f"--policies: expected a comma list of {', '.join(allowed)}; got {args.policies!r}")

    from bench_vs_libcachesim import drifting_qwen_stream

    s = drifting_qwen_stream(args.steps, sample_seed=1)
    if args.chunks:
        meta = {"machine": machine(), "steps": args.steps, "union": int(s.union), "pairs": args.pairs}
        return report([chunk_row(s, p, rho, args.chunks, args.pairs) for p in policies for rho in args.rhos],
                      args.json, meta,
                      [f"machine: {machine()}",
                       f"stream: {s.n_events} events, {s.union} union accesses; the random side, ns per access "
                       f"(median of {args.pairs} rounds) and its ratio to chunk {args.chunks[0]} (median of per-round "
                       "ratios)",
                       f"{'policy':<7}{'rho':>6}" + "".join(f"{'chunk ' + str(c):>22}" for c in args.chunks)
                       + "  hits equal"],
                      lambda r: f"{r['policy']:<7}{r['rho']:>6}" + "".join(
                          f"{r['ns_per_access'][str(c)]:>13.2f} ({r['ratio_to_first'][str(c)]:.3f})"
                          for c in r["chunks"]) + "  " + yes_no(r["hits_equal"]))
    if args.curves:
        return report([curve_row(s, p, args.rhos, args.pairs) for p in policies], args.json,
                      {"machine": machine(), "steps": args.steps, "union": int(s.union), "pairs": args.pairs},
                      [f"machine: {machine()}",
                       f"stream: {s.n_events} events, {s.union} union accesses; sequential-random at rho "
                       f"{', '.join(map(str, args.rhos))}; ms, median of {args.pairs} pairs",
                       f"{'policy':<14}{'curve':>10}{'one by one':>12}{'ratio min/med':>16}  results equal"],
                      lambda r: f"{r['policy']:<14}{r['curve_ms']:>10.1f}{r['one_by_one_ms']:>12.1f}"
                      f"{r['ratio_min']:>9.2f} /{r['ratio']:>5.2f}  {yes_no(r['hits_equal'])}")
    rows = [row(s, p, rho, args.pairs) for p in policies for rho in args.rhos]
    return report(rows, args.json,
                  {"machine": machine(), "steps": args.steps, "union": int(s.union), "pairs": args.pairs},
                  [f"machine: {machine()}",
                   f"stream: {s.n_events} events, {s.union} union accesses; ns per access, median of {args.pairs} "
                   "rounds",
                   f"{'policy':<7}{'rho':>6}" + "".join(f"{x:>14}" for x in SIDES)
                   + f"{'pre/asc':>9}{'rand/asc':>10}  hits equal"],
                  lambda r: f"{r['policy']:<7}{r['rho']:>6}" + "".join(f"{r['ns_per_access'][x]:>14.2f}" for x in SIDES)
                  + f"{r['pre_shuffled_over_ascending']:>9.2f}{r['random_over_ascending']:>10.2f}  "
                  + yes_no(r["hits_equal"]))


if __name__ == "__main__":
    raise SystemExit(main())
