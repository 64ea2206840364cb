"""Alternated A/B timing shared by the kernel benchmarks (``kernel_ab.py``, ``lfru_slots_vs_groups.py``), and the
argument types and output of the scripts that check what they time or count (``seq_outcomes.py``,
``lfru_global_fronts.py``, ``random_order_costs.py``, ``lru_ranks_shapes.py``), and the checked, alternated rows of
those that time two loops on ``bench_scaling.routed_stream`` (``lrfu_global.py``, ``lrfu_slots.py``,
``lru_direct.py``, ``belady_lanes.py``; the last two by shape, batch and rho through ``routed_rows``), and the
tables of a sequential loop on ranks against its peer by batch and rho (``lru_ranks_shapes.py``,
``lrfu_ranks_shapes.py``: ``ranks_shapes``).

A kernel's time moves by up to ~15% with where its code lands in a process (docs/performance.md, *Placement
noise*), so each benchmark times both sides in one process, alternated pair by pair, in several fresh
processes, and reports the median over the processes of each one's median ratio, with their range.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

#: The vector features that decide which code the kernels take (docs/performance.md).
_FEATURES = ("avx2", "avx512f", "avx512vbmi2", "bmi2")


def cpu_model(cpuinfo: str) -> str:
    """The processor's name in the text of ``/proc/cpuinfo`` (its first ``model name`` line; on machines that
    have none, ``Hardware`` or ``cpu model``), or ``""``."""
    for key in ("model name", "Hardware", "cpu model"):
        for line in cpuinfo.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return value.strip()
    return ""


def machine() -> str:
    """What a benchmark's figures were measured on, for the first line of its output: the processor's name,
    the CPUs this process may run on, and the CPU and vector features LLVM compiles the kernels for. Ratios
    move with the processor (docs/performance.md, *Another machine*), so every figure names its machine."""
    try:
        model = cpu_model(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        model = ""
    model = model or platform.processor() or platform.machine() or "unknown processor"
    n_cpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import llvmlite.binding as llvm

        feats = llvm.get_host_cpu_features()
        have = [f for f in _FEATURES if feats.get(f, False)]
        llvm_part = f"; LLVM host {llvm.get_host_cpu_name()} ({', '.join(have) or 'none of ' + ', '.join(_FEATURES)})"
    except Exception:  # pragma: no cover - llvmlite comes with numba, a dependency
        llvm_part = ""
    return f"{model}; {n_cpu} CPUs{llvm_part}"


def alternated_pairs(run: Callable[[int], float], pairs: int, first: int = 0) -> tuple[list[float], list[float]]:
    """``run(0)`` and ``run(1)`` (seconds) over ``pairs`` pairs, the side timed first alternating from pair to pair
    (side 0 first in pair ``k`` when ``k + first`` is even): side 0's times and side 1's, pair by pair."""
    t: tuple[list[float], list[float]] = ([], [])
    for k in range(pairs):
        for side in ((1, 0) if (k + first) % 2 else (0, 1)):
            t[side].append(run(side))
    return t


def checked_pairs(timed: Callable[[bool, bool], tuple], pairs: int) -> tuple[list[float], list[float], bool]:
    """Two sides of a row, ``timed(first_side, check)`` returning ``(seconds, *outputs)``: each run once with
    ``check`` (also the warm-up), their outputs compared, then timed without it over ``pairs`` alternated pairs
    (:func:`alternated_pairs`). Returns the first side's times, the second's, and whether the outputs were equal."""
    a = timed(True, True)[1:]
    b = timed(False, True)[1:]
    first, second = alternated_pairs(lambda side: timed(side == 0, False)[0], pairs)
    return first, second, all(bool(np.array_equal(x, y)) for x, y in zip(a, b, strict=True))


def pair_fields(names: tuple[str, str], first: list[float], second: list[float], n: int) -> dict:
    """A row's timing fields: each side's median nanoseconds per access over ``n`` accesses (``NAME_ns``), and the
    minimum and median of the per-pair ratios first / second (``ratio_min``, ``ratio``)."""
    ratios = [a / b for a, b in zip(first, second, strict=True)]
    return {f"{names[0]}_ns": statistics.median(first) / n * 1e9, f"{names[1]}_ns": statistics.median(second) / n * 1e9,
            "ratio_min": min(ratios), "ratio": statistics.median(ratios)}


def layer_inputs(s, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """The per-layer quotas of stream ``s`` at ``rho`` and the tie positions of the random tie order of seed 0 (the
    engine's default)."""
    from expertcache.replay import engine

    L, N = s.n_layers, s.n_experts
    return engine.capacities_for_rho(rho, L, N), engine._tie_order(engine._tie_ranks("random", 0, L * N), L, N)[1]


#: The first cells of the header of a table that :func:`routed_rows` fills (:func:`row_lead` a row's).
ROW_HEAD = f"{'LxNxk':>10} {'B':>3} {'|E|':>6} {'rho':>5} {'c':>5}"


def row_lead(r: dict) -> str:
    """A :func:`routed_rows` row's first cells: its shape, batch, mean event, rho and first layer's quota."""
    return f"{r['shape']:>10} {r['batch']:>3} {r['mean_event']:>6.1f} {r['rho']:>5} {r['capacity']:>5}"


def layer_loops_row(s, rho: float, pairs: int, names: tuple[str, str], loops: tuple[Callable, Callable]) -> dict:
    """Two per-layer loops called as ``loop(offsets, expert, layer, N, L, caps, tie_pos, 0, hits, misses, flags)``
    (``replay_lru_bits``' parameters) on stream ``s`` at ``rho`` (:func:`layer_inputs`): :func:`checked_pairs` (hit
    counts and flags compared once, then timed without flags, as ``replay`` runs) and :func:`pair_fields` under
    ``names``, the quota (``capacity``, ``quota_events``: in mean events) and ``hits_equal``."""
    L, N = s.n_layers, s.n_experts
    caps, tie_pos = layer_inputs(s, rho)

    def timed(first: bool, record: bool) -> tuple[float, np.ndarray, np.ndarray]:
        hits = np.zeros(L, np.int64)
        flags = np.zeros(s.union if record else 0, np.uint8)
        t0 = time.perf_counter()
        loops[0 if first else 1](s.offsets, s.expert, s.layer, N, L, caps, tie_pos, 0, hits, np.zeros(L, np.int64),
                                 flags)
        return time.perf_counter() - t0, hits, flags

    first, second, equal = checked_pairs(timed, pairs)
    return {"rho": rho, "capacity": int(caps[0]), "quota_events": float(caps[0]) * s.n_events / s.union,
            **pair_fields(names, first, second, s.union), "hits_equal": equal}


def stream_options(ap: argparse.ArgumentParser, accesses: int, pairs: int) -> None:
    """The options of the scripts that time rows on ``bench_scaling.routed_stream``: ``--accesses`` (union accesses
    a stream), ``--pairs`` (alternated pairs a row) and ``--json``, with these defaults."""
    ap.add_argument("--accesses", type=positive_int, default=accesses,
                    help=f"union accesses a stream (default {accesses // 1_000_000} M)")
    ap.add_argument("--pairs", type=positive_int, default=pairs, help=f"alternated pairs a row (default {pairs})")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")


def alternated_ratio(run: Callable[[int], float], pairs: int, first: int) -> float:
    """The median over ``pairs`` pairs of ``run(0) / run(1)`` (:func:`alternated_pairs`)."""
    a, b = alternated_pairs(run, pairs, first)
    return statistics.median([x / y for x, y in zip(a, b, strict=True)])


def pooled_rows(argv: list[str], processes: int, env: dict[str, str] | None = None) -> list[list[float]]:
    """Run ``argv + ['--child', str(p % 2)]`` in ``processes`` fresh processes; each prints one line of floats
    (one per row of the benchmark). Returns the columns: per row, every process's value. A failed process ends
    the benchmark with its last line of stderr."""
    out = []
    for p in range(processes):
        proc = subprocess.run([*argv, "--child", str(p % 2)], capture_output=True, text=True, env=env)
        if proc.returncode:
            err = proc.stderr.strip().splitlines()
            sys.exit(err[-1] if err else f"process {p + 1} failed")
        out.append([float(x) for x in proc.stdout.split()])
        print(f"  process {p + 1}/{processes} done", file=sys.stderr, flush=True)
    return [list(col) for col in zip(*out, strict=True)]


def median_and_range(col: list[float]) -> tuple[float, float, float]:
    """The median of the processes' values, their least and their greatest."""
    return statistics.median(col), min(col), max(col)


def unit_list(what: str, example: str) -> Callable[[str], list[float]]:
    """An argument type: ``what`` (numbers in [0, 1]), comma-separated, as in ``example``."""
    def parse(text: str) -> list[float]:
        try:
            out = [float(x) for x in text.split(",")]
        except ValueError:
            out = []
        if not out or not all(0.0 <= r <= 1.0 for r in out):
            raise argparse.ArgumentTypeError(f"expected {what} in [0, 1], comma-separated (e.g. {example}), got "
                                             f"{text!r}")
        return out
    return parse


#: An argument type: cache fractions in [0, 1], comma-separated.
rho_list = unit_list("cache fractions", "0.1,0.2")


def int_list(text: str) -> list[int]:
    """An argument type: positive integers, comma-separated."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {text!r}")
    return out


def positive_int(text: str) -> int:
    """An argument type: a positive integer."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def shape_list(text: str) -> list[tuple[int, int, int]]:
    """An argument type: shapes ``LxNxk`` (layers, experts a layer, top-k; ``k <= N <= 1024``), comma-separated."""
    out = []
    for part in text.split(","):
        try:
            L, N, k = (int(x) for x in part.split("x"))
        except ValueError:
            L = N = k = 0
        if not (L >= 1 and 1 <= k <= N <= 1024):
            raise argparse.ArgumentTypeError(f"expected shapes LxNxk (layers, experts a layer up to 1024, top-k up "
                                             f"to N), comma-separated (e.g. 48x128x8), got {text!r}")
        out.append((L, N, k))
    return out


def shape_options(ap: argparse.ArgumentParser, batches: str,
                  shapes: str = "48x128x8,16x64x8,32x8x2,58x256x8,48x512x8") -> None:
    """The ``--shapes`` (default ``shapes``), ``--batches`` (default ``batches``) and ``--rhos`` options of the
    scripts that time rows on ``bench_scaling.routed_stream`` by shape (``lru_direct.py``, ``belady_lanes.py``,
    ``layer_lanes.py``)."""
    ap.add_argument("--shapes", type=shape_list, default=shape_list(shapes),
                    help=f"comma list of LxNxk (default {shapes})")
    ap.add_argument("--batches", type=int_list, default=int_list(batches), help=f"comma list (default {batches})")
    ap.add_argument("--rhos", type=rho_list, default=[0.1, 0.25, 0.4, 0.75],
                    help="comma list (default 0.1,0.25,0.4,0.75)")


def routed_rows(args: argparse.Namespace, row: Callable[..., dict]) -> list[dict]:
    """Per shape and batch of ``args`` (:func:`shape_options`), one ``bench_scaling.routed_stream`` of
    ``args.accesses`` union accesses, and per rho its row: ``shape``, ``batch``, ``mean_event`` and
    ``row(stream, rho, args.pairs)``; each shape and batch said done on stderr."""
    from bench_scaling import routed_stream

    rows = []
    for L, N, k in args.shapes:
        for b in args.batches:
            s = routed_stream(L, N, b, args.accesses, top_k=k)
            for rho in args.rhos:
                rows.append({"shape": f"{L}x{N}x{k}", "batch": b, "mean_event": s.union / s.n_events,
                             **row(s, rho, args.pairs)})
            print(f"  {L}x{N}x{k} batch {b} done", file=sys.stderr, flush=True)
    return rows


def report(rows: list[dict], as_json: bool, meta: dict, header: list[str], line: Callable[[dict], str]) -> int:
    """Print the rows as one JSON object (``meta``, then ``rows``) or as the ``header`` lines and one ``line(row)``
    each; return the exit status of a script whose rows each check the shipped kernel: 0 where every row's
    ``hits_equal`` holds, else 1."""
    if as_json:
        print(json.dumps({**meta, "rows": rows}))
    else:
        print("\n".join(header))
        for r in rows:
            print(line(r))
    return 0 if all(r["hits_equal"] for r in rows) else 1


def ranks_orders(s, pairs: int, peer: str, timed: Callable[[bool, np.ndarray], tuple[float, np.ndarray]]) -> dict:
    """A sequential loop on ranks against its ``peer`` on stream ``s``, ``timed(on_ranks, expert)`` returning
    ``(seconds, hits)``: in each member order (ascending, and sequential-random's shuffled beforehand, not timed) the
    two runs' hits compared (also the warm-up), then ``pairs`` alternated pairs; each side's median ns per access
    (``ranks_ns``, ``PEER_ns``) and the median per-pair ratio, and ``hits_equal``."""
    from expertcache.replay import engine

    out: dict = {}
    same = True
    for name, expert in (("ascending", s.expert), ("shuffled", engine._member_order(s, "sequential-random", 0))):
        same &= bool(np.array_equal(timed(True, expert)[1], timed(False, expert)[1]))
        ranks: list[float] = []
        other: list[float] = []
        for k in range(pairs):
            for on_ranks in ((True, False) if k % 2 == 0 else (False, True)):
                (ranks if on_ranks else other).append(timed(on_ranks, expert)[0])
        out[name] = {"ranks_ns": statistics.median(ranks) / s.union * 1e9,
                     f"{peer}_ns": statistics.median(other) / s.union * 1e9,
                     "ratio": statistics.median([a / b for a, b in zip(ranks, other, strict=True)])}
    out["hits_equal"] = same
    return out


def ranks_shapes(argv: list[str] | None, description: str, peer: str, title: str, batches: list[int],
                 accesses: int, pairs: int, row: Callable[..., dict]) -> int:
    """The command line of a ranks-against-``peer`` table: ``--batches``, ``--rhos`` (quotas up to 64 of 128),
    :func:`stream_options`; per batch ``bench_scaling.routed_stream(48, 128, B, accesses)`` and per rho
    ``row(s, rho, pairs)`` (its ``rho``, ``quota``, ``rule_picks`` and :func:`ranks_orders`' fields), under the
    machine, ``title`` and a header."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--batches", type=int_list, default=batches,
                    help=f"comma list (default {','.join(map(str, batches))})")
    ap.add_argument("--rhos", type=rho_list, default=[0.1, 0.2, 0.3, 0.4, 0.5],
                    help="comma list, quotas up to 64 (default 0.1,0.2,0.3,0.4,0.5)")
    stream_options(ap, accesses, pairs)
    args = ap.parse_args(argv)
    if max(args.rhos) * 128 > 64.5:
        ap.error(f"--rhos: expected rho values up to 0.5 (quotas up to 64 of 128 experts; larger ones run on the "
                 f"{peer} loop only)")

    from bench_scaling import routed_stream

    rows = []
    for b in args.batches:
        s = routed_stream(48, 128, b, args.accesses)
        for rho in args.rhos:
            rows.append({"batch": b, "mean_event": s.union / s.n_events, **row(s, rho, args.pairs)})

    def line(r: dict) -> str:
        a, z = r["ascending"], r["shuffled"]
        return (f"{r['batch']:>3} {r['mean_event']:>6.1f} {r['rho']:>5} {r['quota']:>3}  {a['ranks_ns']:>9.2f} "
                f"{a[peer + '_ns']:>6.2f} {a['ratio']:>6.2f}  {z['ranks_ns']:>10.2f} {z[peer + '_ns']:>6.2f} "
                f"{z['ratio']:>6.2f}  {r['rule_picks']:<6} {yes_no(r['hits_equal'])}")

    return report(rows, args.json, {"machine": machine(), "accesses": args.accesses, "pairs": args.pairs},
                  [f"machine: {machine()}",
                   f"{title}ns per access (medians of {args.pairs} alternated pairs); ranks / {peer}: median of "
                   "per-pair ratios",
                   f"{'B':>3} {'|E|':>6} {'rho':>5} {'c':>3}  {'asc ranks':>9} {peer:>6} {'ratio':>6}  "
                   f"{'shuf ranks':>10} {peer:>6} {'ratio':>6}  rule   hits equal"], line)


def yes_no(ok: bool) -> str:
    """A table's ``hits equal`` cell."""
    return "yes" if ok else "NO"
