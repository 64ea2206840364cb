"""Import throughput: routing records/s into a trace, the columnar readers against the record-by-record one.

    python benchmarks/bench_import.py [--pairs 3] [--requests 144] [--tokens 384] [--layers 48] [--json]

The records are a Qwen3-30B-A3B-shaped collection made by the synthetic generator
(``expertcache.trace.synth``: 144 requests x 384 decode tokens x 48 layers = 2,654,208 records,
N = 128, k = 8, with gates), written to a temporary directory (never committed) in three forms:

* routes JSON Lines (this project's interchange format, docs/design.md §3);
* the same records as CSV (expert ids and gates as space-separated strings) and as Parquet
  (list columns), both read by ``import_columnar`` with the default column names.

Sides, each timed in a fresh child process (so its peak resident memory is its own):

``reference``
    The record-by-record JSON Lines importer as it was before the columnar readers (a copy is
    kept below, :func:`reference_import_routes_jsonl`): ``json.loads`` per line, numpy per token.
``jsonl``
    ``import_routes_jsonl`` (pyarrow's JSON reader, whole-column checks, one vectorised assembly).
``csv``, ``parquet``
    ``import_columnar`` on the CSV and the Parquet file.

The sides alternate pair by pair (reference, jsonl, csv, parquet; then again), so a load change
on the shared machine hits all of them; min and median over the pairs are printed, with the
ratio of each side's median time to the reference's. Every side's ``routes.parquet`` must be
byte-identical to the reference's (the check fails the run otherwise).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {bench_dir!r})
side, src, out, L, N, k = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7])
from bench_import import reference_import_routes_jsonl
from expertcache.trace.importers import import_columnar, import_routes_jsonl
t0 = time.perf_counter()
if side == "reference":
    tr = reference_import_routes_jsonl(src, L, N, k)
elif side == "jsonl":
    tr = import_routes_jsonl(src, L, N, k)
else:
    tr, _ = import_columnar(src, n_layers=L, n_experts=N, top_k=k)
dt = time.perf_counter() - t0
tr.save(out)
print(json.dumps({{"seconds": dt, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


# ----------------------------------------------------------------------------- the reference (today's path)
def reference_import_routes_jsonl(path, n_layers: int, n_experts: int, top_k: int, provenance=None):
    """The record-by-record routes JSON Lines importer as it was before the columnar readers (kept verbatim)."""
    from expertcache.errors import ValidationError
    from expertcache.jsonl import check_shape, float_list, int_field, int_list, iter_records
    from expertcache.trace.model import PHASES, RoutingTrace

    src = str(path)
    L, N, k = n_layers, n_experts, top_k
    check_shape(L, N, k)
    tokens: dict[tuple[str, int], int] = {}
    request_ids: dict[str, int] = {}
    last_phase: dict[str, int] = {}
    last_pos: dict[str, tuple[int, int]] = {}
    rows_req: list[int] = []
    rows_phase: list[int] = []
    rows_pos: list[int] = []
    rows_tok: list[int] = []
    experts: list[np.ndarray] = []
    gates: list[np.ndarray] = []
    seen: list[np.ndarray] = []
    has_gates = None
    for line_no, rec in iter_records(path):
        rid = rec.get("request_id")
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise ValidationError(f"expected a string or integer; got {rid!r}", source=src, record=line_no,
                                  field="request_id")
        rid = str(rid)
        phase = rec.get("phase")
        if phase not in PHASES:
            raise ValidationError(f"expected 'decode' or 'prefill'; got {phase!r}", source=src, record=line_no,
                                  field="phase")
        pos = int_field(rec, "position", src, line_no, lo=0)
        layer = int_field(rec, "layer", src, line_no, lo=0, hi=L)
        ex = int_list(rec, "experts", src, line_no, k, N)
        g = rec.get("gates")
        if has_gates is None:
            has_gates = g is not None
        elif has_gates != (g is not None):
            raise ValidationError("gates must be given on every record or on none", source=src, record=line_no,
                                  field="gates")
        tok = rec.get("token_id", -1)
        if tok is None:
            tok = -1
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < -1:
            raise ValidationError(f"expected a non-negative integer; got {tok!r}", source=src, record=line_no,
                                  field="token_id")
        prev = last_pos.get(rid)
        if prev is not None and pos < prev[0]:
            raise ValidationError(f"positions must not decrease within a request; got {pos} after {prev[0]}",
                                  source=src, record=line_no, field="position")
        last_pos[rid] = (pos, line_no)
        key = (rid, pos)
        row = tokens.get(key)
        pcode = PHASES.index(phase)
        if row is None:
            row = len(rows_req)
            tokens[key] = row
            if rid not in request_ids:
                request_ids[rid] = len(request_ids)
            elif last_phase[rid] > pcode:
                raise ValidationError("a prefill record cannot follow a decode record of the same request",
                                      source=src, record=line_no, field="phase")
            last_phase[rid] = pcode
            rows_req.append(request_ids[rid])
            rows_phase.append(pcode)
            rows_pos.append(pos)
            rows_tok.append(tok)
            experts.append(np.full((L, k), -1, dtype=np.int16))
            gates.append(np.zeros((L, k), dtype=np.float32))
            seen.append(np.zeros(L, dtype=bool))
        elif rows_phase[row] != pcode:
            raise ValidationError("phase differs from another layer of the same position", source=src,
                                  record=line_no, field="phase")
        if seen[row][layer]:
            raise ValidationError(f"duplicate record for request {rid!r}, position {pos}, layer {layer}",
                                  source=src, record=line_no, field="layer")
        seen[row][layer] = True
        experts[row][layer] = ex
        if g is not None:
            gates[row][layer] = float_list(g, src, line_no, k)
        if tok >= 0:
            rows_tok[row] = tok
    if not rows_req:
        raise ValidationError("no routing records found", source=src)
    for (rid, pos), row in tokens.items():
        if not seen[row].all():
            raise ValidationError(f"request {rid!r}, position {pos}: a layer has no record", source=src)
    order = np.lexsort((np.array(rows_pos), np.array(rows_req)))
    req = np.array(rows_req, dtype=np.int32)[order]
    return RoutingTrace(
        L, N, k, tuple(request_ids), req, np.array(rows_phase, dtype=np.int8)[order],
        np.array(rows_pos, dtype=np.int32)[order], np.stack(experts)[order],
        np.stack(gates)[order] if has_gates else None, np.array(rows_tok, dtype=np.int64)[order],
        provenance=dict(provenance or {"source": os.path.basename(src), "format": "routes-jsonl"}))


# ----------------------------------------------------------------------------- inputs
def write_inputs(d: Path, requests: int, tokens: int, layers: int) -> tuple[dict[str, Path], int, Any]:
    """The synthetic collection as routes JSON Lines, CSV and Parquet; returns the paths and the record count."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from expertcache.trace.synth import SynthConfig, synthesize_trace

    t0 = time.perf_counter()
    tr = synthesize_trace(SynthConfig(n_layers=layers, n_experts=128, top_k=8, n_requests=requests,
                                      decode_tokens=tokens, seed=1))
    print(f"synthesised {tr.n_tokens} tokens x {layers} layers in {time.perf_counter() - t0:.0f} s", flush=True)
    table = tr.to_table().drop_columns(["token_id"])
    n = table.num_rows
    flat = pa.table({"request_id": table["request_id"].cast(pa.string()), "phase": table["phase"].cast(pa.string()),
                     "position": table["position"], "layer": table["layer"],
                     "experts": pc.cast(table["experts"], pa.list_(pa.int16())),
                     "gates": pc.cast(table["gates"], pa.list_(pa.float32()))})
    paths = {"jsonl": d / "routes.jsonl", "csv": d / "routes.csv", "parquet": d / "routes.parquet"}
    pq.write_table(flat, paths["parquet"])
    req = flat["request_id"].to_pylist()
    ph = flat["phase"].to_pylist()
    pos = flat["position"].to_numpy()
    lay = flat["layer"].to_numpy()
    ex = tr.experts.reshape(n, -1)
    g = tr.gates.reshape(n, -1).astype(np.float64)
    with open(paths["jsonl"], "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"request_id": req[i], "phase": ph[i], "position": int(pos[i]), "layer": int(lay[i]),
                                 "experts": ex[i].tolist(), "gates": g[i].tolist()}) + "\n")
    as_text = pa.table({"request_id": flat["request_id"], "phase": flat["phase"], "position": flat["position"],
                        "layer": flat["layer"],
                        "experts": pc.binary_join(pc.cast(flat["experts"], pa.list_(pa.string())), " "),
                        "gates": pc.binary_join(pc.cast(pc.cast(flat["gates"], pa.list_(pa.float64())),
                                                        pa.list_(pa.string())), " ")})
    pcsv.write_csv(as_text, paths["csv"])
    print(f"wrote {n} records: " + ", ".join(f"{k} {p.stat().st_size / 2**20:.0f} MiB" for k, p in paths.items()),
          flush=True)
    return paths, n, tr


def run_side(side: str, src: Path, out: Path, shape: tuple[int, int, int]) -> dict[str, float]:
    env = dict(os.environ)
    src_dir = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src_dir + os.pathsep + env.get("PYTHONPATH", "")
    code = _CHILD.format(bench_dir=str(Path(__file__).resolve().parent))
    res = subprocess.run([sys.executable, "-c", code, side, str(src), str(out), *map(str, shape)], env=env,
                         capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"{side} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=144)
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sides = ["reference", "jsonl", "csv", "parquet"]
    with tempfile.TemporaryDirectory(prefix="bench_import_") as tmp:
        d = Path(tmp)
        paths, n, _ = write_inputs(d, args.requests, args.tokens, args.layers)
        src = {"reference": paths["jsonl"], "jsonl": paths["jsonl"], "csv": paths["csv"], "parquet": paths["parquet"]}
        shape = (args.layers, 128, 8)
        times: dict[str, list[float]] = {s: [] for s in sides}
        peaks: dict[str, list[float]] = {s: [] for s in sides}
        digests: dict[str, set[str]] = {s: set() for s in sides}
        for p in range(args.pairs):
            for s in sides:
                out = d / f"out_{s}_{p}"
                r = run_side(s, src[s], out, shape)
                times[s].append(r["seconds"])
                peaks[s].append(r["peak_rss_mib"])
                digests[s].add(hashlib.sha256((out / "routes.parquet").read_bytes()).hexdigest())
                print(f"pair {p + 1}/{args.pairs} {s:9s} {r['seconds']:8.2f} s  {n / r['seconds']:>11,.0f} records/s  "
                      f"peak RSS {r['peak_rss_mib']:,.0f} MiB", flush=True)
                import shutil

                shutil.rmtree(out)
        identical = len(set().union(*digests.values())) == 1
        ref_med = statistics.median(times["reference"])
        rows = []
        for s in sides:
            med, mn = statistics.median(times[s]), min(times[s])
            rows.append({"side": s, "min_s": mn, "median_s": med, "records_per_s_median": n / med,
                         "records_per_s_best": n / mn, "speedup_vs_reference_median": ref_med / med,
                         "peak_rss_mib_max": max(peaks[s])})
        result = {"records": n, "pairs": args.pairs, "identical_routes_parquet": identical, "sides": rows,
                  "cpus": os.cpu_count()}
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"\n{n:,} records, {args.pairs} alternated pairs, {os.cpu_count()} CPUs")
            print(f"{'side':10s} {'min s':>8s} {'median s':>9s} {'records/s (median)':>19s} {'x reference':>12s} "
                  f"{'peak RSS MiB':>13s}")
            for r in rows:
                print(f"{r['side']:10s} {r['min_s']:8.2f} {r['median_s']:9.2f} {r['records_per_s_median']:19,.0f} "
                      f"{r['speedup_vs_reference_median']:12.1f} {r['peak_rss_mib_max']:13,.0f}")
            print(f"routes.parquet identical across every side and pair: {identical}")
        if not identical:
            raise SystemExit("the sides produced different traces")


if __name__ == "__main__":
    main()
