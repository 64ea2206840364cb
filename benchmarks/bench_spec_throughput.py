"""Throughput of `expertcache spec run` on the paper's warm-transition grid (§8.1): units per minute.

    python benchmarks/bench_spec_throughput.py [--jobs 1,2] [--ray] [--quick] [--json]

The grid is the warm-transition experiment of §8.1: 2 models x 3 residency
fractions x 3 request-order seeds x 20 directed transitions between 5 workload
proxies x 4 post-transition windows = 1,440 units. A unit is one gap
measurement on one post-transition window: 5 replays (lru, lfu, lfru,
least-stale, belady), so 7,200 conditions. On small synthetic traces:

* models: a 40-expert (L=8, k=4) and a 64-expert (L=8, k=8) synthetic trace,
  each holding 5 workload proxies (pools of 100 requests, 16 decode tokens
  each, every pool from its own generator seed and popularity skew);
* a transition A->B is a warm-transition condition (``warm = "poolA"``,
  ``selection = "poolB"``): 100 requests of A warm the cache, then the
  window, the first N = 10, 25, 50, 100 requests of B (the paper's windows),
  both in the order drawn by the order seed; one FCFS stream, B = 8;
* the cache is counted from the first step that serves a request of B
  (``ReplayConfig.warmup_events``): every metric is the window's, as in
  :func:`expertcache.experiment.scoped.warm_transition`;
* per-layer scope, event-atomic replay, tie seed 0.

The figure is a throughput of the spec runner (expansion, stream builds,
replays, chunked Parquet writes, consolidation), not a result about caching:
the traces are synthetic. Each run starts from an empty store; a second run on
the full store checks that nothing is recomputed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from expertcache.experiment import expand, gap_rows, run_spec, spec_from_dict
from expertcache.trace import RoutingTrace
from expertcache.trace.synth import SynthConfig, synthesize_trace

POOLS, POOL_SIZE, DECODE_TOKENS, WINDOWS, WARM, BATCH = 5, 100, 16, (10, 25, 50, 100), 100, 8
POLICIES = ["lru", "lfu", "lfru", "least-stale", "belady"]


def model_trace(n_experts: int, top_k: int, seed: int) -> RoutingTrace:
    """Five workload proxies (different generator seeds and skews) concatenated into one trace."""
    parts = [synthesize_trace(SynthConfig(n_layers=8, n_experts=n_experts, top_k=top_k, n_requests=POOL_SIZE,
                                          decode_tokens=DECODE_TOKENS, zipf_s=0.6 + 0.15 * w,
                                          working_set=min(12, n_experts), seed=seed * 100 + w))
             for w in range(POOLS)]
    n_tok = parts[0].n_tokens
    return RoutingTrace(8, n_experts, top_k,
                        tuple(f"w{w}-{r}" for w, p in enumerate(parts) for r in p.request_ids),
                        np.concatenate([p.request + w * POOL_SIZE for w, p in enumerate(parts)]).astype(np.int32),
                        np.concatenate([p.phase for p in parts]), np.concatenate([p.position for p in parts]),
                        np.concatenate([p.experts for p in parts]), np.concatenate([p.gates for p in parts]),
                        np.full(n_tok * POOLS, -1, dtype=np.int64),
                        provenance={"generator": "bench_spec_throughput", "n_experts": n_experts})


def paper_sized_spec(root: Path, seeds=(0, 1, 2)) -> dict:
    """The 1,440-unit grid (with ``seeds`` request-order seeds) as a spec dict, traces written under ``root``."""
    model_trace(40, 4, 1).save(root / "model40", overwrite=True)
    model_trace(64, 8, 2).save(root / "model64", overwrite=True)
    pools = [f"pool{w}" for w in range(POOLS)]
    return {"experiment": {"name": "warm-transition"},
            "inputs": {"model40": {"trace": "model40"}, "model64": {"trace": "model64"}},
            "selections": {f"pool{w}": {"range": [w * POOL_SIZE, (w + 1) * POOL_SIZE]} for w in range(POOLS)},
            # warm x selection over 5 pools is 20 directed transitions (a pool with itself is left out)
            "grid": {"input": ["model40", "model64"], "warm": pools, "selection": pools, "warm_requests": WARM,
                     "window_requests": list(WINDOWS), "order_seed": list(seeds), "batch": BATCH,
                     "rho": [0.2, 0.3, 0.4], "policy": POLICIES, "tie_seed": 0}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="1,2", help="Comma list of local worker counts to time.")
    ap.add_argument("--ray", action="store_true", help="Also time the Ray executor (local instance, --jobs max).")
    ap.add_argument("--quick", action="store_true", help="One order seed (480 units) instead of three.")
    ap.add_argument("--json", action="store_true", help="Print the measurements as one JSON object.")
    args = ap.parse_args()
    jobs_list = [int(j) for j in args.jobs.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bench_spec_"))
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    try:
        spec = spec_from_dict(paper_sized_spec(root, (0,) if args.quick else (0, 1, 2)), root)
        t0 = time.perf_counter()
        planned = expand(spec)
        t_expand = time.perf_counter() - t0
        n_units = len(planned) // len(POLICIES)
        log(f"{len(planned)} conditions = {n_units} units x {len(POLICIES)} policies; expand {t_expand:.2f} s")
        runs = []
        reference = None
        executors = [("local", j) for j in jobs_list] + ([("ray", max(jobs_list))] if args.ray else [])
        for executor, jobs in executors:
            store = root / f"store-{executor}-{jobs}"
            rep = run_spec(spec, store, executor=executor, jobs=jobs)
            table = (store / "results.parquet").read_bytes()
            t = pq.read_table(store / "results.parquet")
            warm = [v for m, v in zip(t["metric"].to_pylist(), t["value"].to_pylist(), strict=True)
                    if m == "warmup_events"]
            assert len(warm) == len(planned) and min(warm) > 0, "a unit was not measured on its window alone"
            same = None if reference is None else t.equals(reference)
            reference = t if reference is None else reference
            t1 = time.perf_counter()
            again = run_spec(spec, store, executor="local", jobs=1)
            t_noop = time.perf_counter() - t1
            assert again.ran == (), "a re-run recomputed stored conditions"
            row = {"executor": executor, "jobs": jobs, "seconds": rep.seconds, "conditions": len(rep.ran),
                   "conditions_per_minute": rep.conditions_per_minute,
                   "units_per_minute": rep.conditions_per_minute / len(POLICIES),
                   "identical_to_first": same, "rerun_noop_seconds": t_noop, "table_bytes": len(table)}
            runs.append(row)
            log(f"{executor:5s} jobs={jobs}: {rep.seconds:7.1f} s  {row['conditions_per_minute']:9,.0f} conditions/min"
                f"  {row['units_per_minute']:8,.0f} units/min  identical={same}  re-run (no-op) {t_noop:.1f} s")
        gaps = [g for _, g in gap_rows(reference)]
        n_meeting = sum(g is not None and g >= 0.10 for g in gaps)
        log(f"{len(gaps)} unit gaps (synthetic traces; a check of the pipeline, not a caching result): "
            f"{n_meeting} >= 10%, range {min(g for g in gaps if g is not None):.2%} to "
            f"{max(g for g in gaps if g is not None):.2%}")
        out = {"n_conditions": len(planned), "n_units": n_units, "expand_seconds": t_expand, "runs": runs,
               "n_unit_gaps": len(gaps), "units_gap_at_least_10pct": n_meeting}
        if args.json:
            print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
