"""Whole commands on a Qwen3-sized trace: today's code against this checkout, each run in a fresh process.

    python benchmarks/bench_commands.py --baseline SRC [--pairs 3] [--quick] [--dir DIR] [--only a,b] [--json]

``--baseline SRC`` is the ``src`` directory of the code to compare against (e.g. a checkout of the
previous commit); this checkout's ``src`` is the other side.

Inputs (built once, deterministically, into ``--dir`` or a temporary directory; a directory already
holding them is reused):

* ``trace/``: a Qwen3-30B-A3B-shaped routing trace made by the synthetic generator
  (``expertcache.trace.synth``, as ``benchmarks/bench_import.py``): 48 layers x 128 experts, top-8,
  144 requests x 384 decode tokens (``--quick``: 24 x 96), seed 0, Zipf(0.9) popularity per layer with
  per-request working sets of 12 experts redrawn by a quarter every 16 tokens (skewed, drifting).
* ``stream/``: that trace under FCFS continuous batching, B = 8 (``expertcache events build --batch 8``,
  run with the baseline code), about 11 M union accesses at full size.
* ``spec.toml``: 180 conditions = policy {lru, lfu, lfru, least-stale, belady} x rho {0.1, 0.2, 0.3, 0.4}
  x tie seed {0, 1, 2} x batch {4, 8, 16}, per-layer scope, event-atomic, on the trace.
* ``nextuse-model.json``: a linear next-use model (``expertcache nextuse fit``, the baseline code) of the stream,
  which ``nextuse-eval`` evaluates on it.
* ``tiny/``: a 2-request stream: ``replay`` on it gives the process floor (interpreter, numpy, pyarrow,
  numba and the kernels loaded) that is subtracted from ``replay``'s peak RSS.

Commands (each in a fresh child; its wall time and peak RSS, ``ru_maxrss`` from ``wait4``, are its own;
BLAS single-threaded on both sides unless ``--blas-threads`` says otherwise):

``report``            ``expertcache report TRACE -o OUT --no-figures --json``
``prefetch compare``  ``expertcache prefetch compare TRACE --batch 8 --json``
``spec run``          ``expertcache spec run SPEC --store STORE --json``
``audit``             ``expertcache audit TRACE --json``
``replay``            ``expertcache replay STREAM --policy lru --json`` (``--replay-args`` gives other options)
``affinity``          ``expertcache affinity TRACE --json`` (deadline rotation, three schedulers, §8.3-§8.4)
``events-build``      ``expertcache events build TRACE -B 8 -o events --overwrite --json`` (its manifest's sha256
                      in the JSON: the stream files must agree)
``transition``        ``expertcache experiment transition TRACE --json`` (§8.1 warm-cache transitions)
``nextuse-fit``       ``expertcache nextuse fit STREAM -o model.json --overwrite --json`` (the fitted model file
                      must agree too)
``nextuse-eval``      ``expertcache nextuse eval MODEL STREAM --json`` (``MODEL``: ``nextuse-model.json``, a linear
                      model the baseline fits on the stream once, beside the inputs)

Every command is run once per side untimed first (numba caches warm, files in the page cache; ``--no-warmup``
skips it when the caches are known warm, and compares the first pair's outputs instead); then the sides alternate pair by pair (baseline, ours; baseline, ours; ...), so load drift on a shared machine
hits both. Printed per command: min and median seconds of each side, min and median of the per-pair
ratios baseline / ours (wall time, and CPU time: user + system of the child, less sensitive to other jobs), and the peak RSS of each side; for ``replay`` also bytes per union access,
``(peak RSS - peak RSS of replay on tiny/) / union``. Outputs of the two sides must agree: the JSON on
stdout (``report``: also ``report.json`` and the tables it writes; ``spec run``: the consolidated
results table) with run-specific fields (paths, wall times) removed; the run fails otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OURS = HERE.parent / "src"
sys.path.insert(0, str(HERE))

from _ab import machine  # noqa: E402

COMMANDS = ("report", "prefetch-compare", "spec-run", "audit", "replay", "affinity", "events-build", "transition",
            "nextuse-fit", "nextuse-eval")
#: What a run without ``--only`` times: the issue's commands (the others, added in session 42, by name).
DEFAULT = COMMANDS[:5]

SPEC = """\
[experiment]
name = "bench-commands"

[inputs.qwen]
trace = "trace"

[grid]
input = "qwen"
batch = [4, 8, 16]
rho = [0.1, 0.2, 0.3, 0.4]
policy = ["lru", "lfu", "lfru", "least-stale", "belady"]
tie_seed = [0, 1, 2]
"""

#: BLAS threads of both sides (``--blas-threads``): on a small shared machine OpenBLAS's spinning worker
#: threads turn a 129 x 129 solve into a second of waiting, a cost of neither side's code.
BLAS_ENV: dict[str, str] = {}

#: CPU seconds of the last child (:func:`run_child`).
LAST_CPU = [0.0]

#: Keys whose values depend on the run (paths, wall times), dropped before outputs are compared.
VOLATILE = {"seconds", "conditions_per_minute", "store", "out", "files", "source", "path", "command", "wall_s",
            "elapsed_s", "created", "created_at"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_child(src: Path, args: list[str], cwd: Path) -> tuple[float, int, str]:
    """Run ``python -m expertcache ARGS`` with ``src`` on the path; (seconds, peak RSS bytes, stdout).

    The child's CPU seconds (user + system, from ``wait4``) are left in :data:`LAST_CPU`."""
    env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "200", **BLAS_ENV}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "expertcache", *args], cwd=cwd, env=env, stdout=out,
                                stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        dt = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, etext = out.read().decode(), err.read().decode()
    LAST_CPU[0] = usage.ru_utime + usage.ru_stime
    if proc.returncode != 0:
        raise SystemExit(f"{src}: expertcache {' '.join(args)} failed ({proc.returncode}):\n{etext[-3000:]}")
    return dt, int(usage.ru_maxrss) * 1024, text


def build_inputs(d: Path, quick: bool, baseline: Path) -> None:
    """The trace, stream, spec and tiny stream in ``d`` (skipped when already there)."""
    d.mkdir(parents=True, exist_ok=True)
    requests, tokens = (24, 96) if quick else (144, 384)
    if not (d / "trace" / "manifest.json").is_file():
        code = ("import sys; from expertcache.trace.synth import SynthConfig, synthesize_trace; "
                "synthesize_trace(SynthConfig(n_layers=48, n_experts=128, top_k=8, "
                f"n_requests={requests}, decode_tokens={tokens}, seed=0, n_categories=4)).save(sys.argv[1])")
        log(f"synthesising {requests} x {tokens} tokens x 48 layers ...")
        subprocess.run([sys.executable, "-c", code, str(d / "trace")], check=True,
                       env={**os.environ, "PYTHONPATH": str(baseline)})
    if not (d / "stream" / "manifest.json").is_file():
        run_child(baseline, ["events", "build", "trace", "--batch", "8", "-o", "stream"], d)
    if not (d / "nextuse-model.json").is_file():
        run_child(baseline, ["nextuse", "fit", "stream", "-o", "nextuse-model.json", "--json"], d)
    if not (d / "tiny" / "manifest.json").is_file():
        code = ("import sys; from expertcache.trace import read_trace, select_requests; "
                "select_requests(read_trace(sys.argv[1]), [0, 1]).save(sys.argv[2])")
        subprocess.run([sys.executable, "-c", code, str(d / "trace"), str(d / "tiny_trace")], check=True,
                       env={**os.environ, "PYTHONPATH": str(baseline)})
        run_child(baseline, ["events", "build", "tiny_trace", "--batch", "8", "-o", "tiny"], d)
    (d / "spec.toml").write_text(SPEC)


#: The options of the ``replay`` command (``--replay-args``).
REPLAY = {"args": ["--policy", "lru"]}


def command_args(name: str) -> list[str]:
    """The command line of ``name``, run in the side's own directory ``out-SIDE/`` (so both sides' command
    lines, which a report quotes, are the same)."""
    if name == "report":
        return ["report", "../trace", "-o", "report", "--no-figures", "--overwrite", "--json"]
    if name == "prefetch-compare":
        return ["prefetch", "compare", "../trace", "--batch", "8", "--json"]
    if name == "spec-run":
        return ["spec", "run", "../spec.toml", "--store", "store", "--json"]
    if name == "audit":
        return ["audit", "../trace", "--json"]
    if name == "affinity":
        return ["affinity", "../trace", "--json"]
    if name == "events-build":
        return ["events", "build", "../trace", "-B", "8", "-o", "events", "--overwrite", "--json"]
    if name == "transition":
        return ["experiment", "transition", "../trace", "--json"]
    if name == "nextuse-fit":
        return ["nextuse", "fit", "../stream", "-o", "model.json", "--overwrite", "--json"]
    if name == "nextuse-eval":
        return ["nextuse", "eval", "../nextuse-model.json", "../stream", "--json"]
    return ["replay", "../stream", *REPLAY["args"], "--json"]


def _scrub(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


def _json_lines(text: str) -> list[Any]:
    return [_scrub(json.loads(line)) for line in text.splitlines() if line.strip().startswith(("{", "["))]


def outputs(name: str, side: str, stdout: str, d: Path) -> Any:
    """What must agree between the sides: the scrubbed JSON, plus the files the command wrote."""
    got: dict[str, Any] = {"stdout": _json_lines(stdout)}
    if name == "report":
        rep = d / f"out-{side}" / "report"
        for p in sorted(rep.rglob("*")):
            if p.is_file() and p.suffix in (".json", ".csv", ".md", ".txt"):
                text = p.read_text()
                got[str(p.relative_to(rep))] = _scrub(json.loads(text)) if p.suffix == ".json" else text
    if name == "nextuse-fit":
        got["model"] = json.loads((d / f"out-{side}" / "model.json").read_text())
    if name == "spec-run":
        import pyarrow.parquet as pq

        store = d / f"out-{side}" / "store"
        tables = sorted(store.glob("*.parquet"))
        got["tables"] = {p.name: pq.read_table(p).to_pylist() for p in tables}
    return got


def clean(name: str, side: str, d: Path) -> None:
    if name == "spec-run":
        shutil.rmtree(d / f"out-{side}" / "store", ignore_errors=True)
    (d / f"out-{side}").mkdir(exist_ok=True)


def union_of(d: Path, stream: str) -> int:
    return int(json.loads((d / stream / "manifest.json").read_text())["union"])


def _same(name: str, seen: dict[str, Any]) -> None:
    if seen["baseline"] != seen["ours"]:
        a, b = seen["baseline"], seen["ours"]
        diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        raise SystemExit(f"{name}: the outputs of the two sides differ ({', '.join(diff)})")


def bench(name: str, d: Path, sides: dict[str, Path], pairs: int, warmup: bool = True) -> dict[str, Any]:
    times: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    rss: dict[str, list[int]] = {s: [] for s in sides}
    seen: dict[str, Any] = {}
    if warmup:
        for side, src in sides.items():            # warm-up: numba caches, page cache; outputs compared
            clean(name, side, d)
            _, _, text = run_child(src, command_args(name), d / f"out-{side}")
            seen[side] = outputs(name, side, text, d)
        _same(name, seen)
    for i in range(pairs):
        for side, src in sides.items():
            clean(name, side, d)
            dt, peak, text = run_child(src, command_args(name), d / f"out-{side}")
            times[side].append(dt)
            cpu[side].append(LAST_CPU[0])
            rss[side].append(peak)
            if not warmup and i == 0:
                seen[side] = outputs(name, side, text, d)
        if not warmup and i == 0:
            _same(name, seen)
        log(f"  {name} pair {i + 1}: baseline {times['baseline'][-1]:.1f} s ({cpu['baseline'][-1]:.1f} s CPU), "
            f"ours {times['ours'][-1]:.1f} s ({cpu['ours'][-1]:.1f} s CPU)")
    ratios = [b / o for b, o in zip(times["baseline"], times["ours"], strict=True)]
    cpu_ratios = [b / o for b, o in zip(cpu["baseline"], cpu["ours"], strict=True)]
    row: dict[str, Any] = {"command": name, "pairs": pairs, "ratio_min": min(ratios),
                           "ratio_median": statistics.median(ratios), "cpu_ratio_min": min(cpu_ratios),
                           "cpu_ratio_median": statistics.median(cpu_ratios)}
    for side in sides:
        row[f"{side}_min_s"] = min(times[side])
        row[f"{side}_median_s"] = statistics.median(times[side])
        row[f"{side}_cpu_min_s"] = min(cpu[side])
        row[f"{side}_cpu_median_s"] = statistics.median(cpu[side])
        row[f"{side}_peak_rss_mib"] = max(rss[side]) / 2 ** 20
    if name == "replay":
        union = union_of(d, "stream")
        row["union"] = union
        row["replay_args"] = " ".join(REPLAY["args"])
        for side, src in sides.items():
            floor = min(run_child(src, ["replay", "tiny", *REPLAY["args"], "--json"], d)[1] for _ in range(2))
            row[f"{side}_floor_mib"] = floor / 2 ** 20
            row[f"{side}_bytes_per_access"] = (min(rss[side]) - floor) / union
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'command':<18}{'baseline s (min/med)':>22}{'ours s (min/med)':>20}{'ratio min/med':>16}"
          f"{'CPU ratio min/med':>19}{'RSS MiB base/ours':>20}")
    for r in rows:
        print(f"{r['command']:<18}{r['baseline_min_s']:>10.1f} /{r['baseline_median_s']:>8.1f}  "
              f"{r['ours_min_s']:>9.1f} /{r['ours_median_s']:>7.1f}  {r['ratio_min']:>7.2f} /{r['ratio_median']:>5.2f}"
              f"{r['cpu_ratio_min']:>11.2f} /{r['cpu_ratio_median']:>5.2f}"
              f"{r['baseline_peak_rss_mib']:>11.0f} /{r['ours_peak_rss_mib']:>6.0f}")
        if r["command"] == "replay":
            print(f"{'':<18}replay {r['replay_args']}: bytes per union access (peak RSS - floor on tiny/) / "
                  f"{r['union']:,}: "
                  f"baseline {r['baseline_bytes_per_access']:.1f} (floor {r['baseline_floor_mib']:.0f} MiB), "
                  f"ours {r['ours_bytes_per_access']:.1f} (floor {r['ours_floor_mib']:.0f} MiB)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, type=Path, help="src directory of the code to compare against")
    ap.add_argument("--pairs", type=int, default=3, help="timed pairs per command (default 3)")
    ap.add_argument("--quick", action="store_true", help="24 requests x 96 tokens instead of 144 x 384")
    ap.add_argument("--dir", type=Path, default=None, help="where the inputs are built (kept); default: a temp dir")
    ap.add_argument("--only", default=",".join(DEFAULT),
                    help=f"comma list of {', '.join(COMMANDS)} (default {','.join(DEFAULT)})")
    ap.add_argument("--no-warmup", action="store_true",
                    help="no untimed first run (numba caches already warm); the first pair's outputs are compared")
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="OPENBLAS/OMP/MKL threads of both sides (default 1; 0 = leave the environment as is)")
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON object too")
    ap.add_argument("--replay-args", default="--policy lru",
                    help="the replay command's options, one string (default '--policy lru')")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in COMMANDS]
    if bad:
        raise SystemExit(f"unknown command {bad[0]!r}; choose from {', '.join(COMMANDS)}")
    sides = {"baseline": args.baseline.resolve(), "ours": OURS}
    REPLAY["args"] = shlex.split(args.replay_args)
    if args.blas_threads > 0:
        BLAS_ENV.update({v: str(args.blas_threads) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                              "MKL_NUM_THREADS")})
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-commands-")
        d = Path(tmp.name)
    else:
        d = args.dir.resolve()
    try:
        build_inputs(d, args.quick, sides["baseline"])
        log(f"machine: {machine()}")
        log(f"inputs in {d}: {union_of(d, 'stream'):,} union accesses (B = 8)")
        rows = []
        for name in names:
            rows.append(bench(name, d, sides, args.pairs, warmup=not args.no_warmup))
            log(json.dumps(rows[-1]))
        print_table(rows)
        if args.json:
            print(json.dumps({"quick": args.quick, "rows": rows}, indent=1))
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
