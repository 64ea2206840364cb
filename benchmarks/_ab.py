"""Alternated A/B timing shared by the kernel benchmarks (``kernel_ab.py``, ``lfru_slots_vs_groups.py``).

A kernel's time moves by up to ~15% with where its code lands in a process (docs/performance.md, *Placement
noise*), so each benchmark times both sides in one process, alternated pair by pair, in several fresh
processes, and reports the median over the processes of each one's median ratio, with their range.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Callable


def alternated_ratio(run: Callable[[int], float], pairs: int, first: int) -> float:
    """The median over ``pairs`` pairs of ``run(0) / run(1)`` (seconds), the side timed first alternating from
    pair to pair (side 0 first in pair ``k`` when ``k + first`` is even)."""
    ratios = []
    for k in range(pairs):
        t = {}
        for side in ((1, 0) if (k + first) % 2 else (0, 1)):
            t[side] = run(side)
        ratios.append(t[0] / t[1])
    return statistics.median(ratios)


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
