"""``benchmarks/replay_throughput.py``: its rows in one process and pooled over several (``--processes``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "replay_throughput.py")
ROW = "lrfu / lru (event-atomic, per-layer, rho 0.2)"


def _run(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, "--steps", "4", "--pairs", "2", "--policies", "lrfu",
                           "--random-policies", "", "--no-global", "--policy-rhos", "0.2", *extra],
                          capture_output=True, text=True, timeout=600)


def _row(out: str) -> list[str]:
    lines = [ln for ln in out.splitlines() if ln.startswith(ROW)]
    assert len(lines) == 1, out
    return lines[0][len(ROW):].split()


def test_one_process_prints_min_median_and_both_sides_times():
    r = _run()
    assert r.returncode == 0, r.stderr
    lo, med, ns, peer = (float(x) for x in _row(r.stdout))
    assert 0 < lo <= med and ns > 0 and peer > 0
    assert "proc lo-hi" not in r.stdout
    assert r.stdout.splitlines()[0].startswith("machine: ")           # figures name their machine


def test_several_processes_pool_their_pairs_and_show_the_spread_of_process_medians():
    r = _run("--processes", "2")
    assert r.returncode == 0, r.stderr
    assert "in each of 2 processes" in r.stdout and "proc lo-hi" in r.stdout
    assert r.stderr.count("process ") == 2                   # one progress line per worker
    lo, med, ns, peer, spread = _row(r.stdout)
    p_lo, p_hi = (float(x) for x in spread.split("-"))
    assert 0 < float(lo) <= p_lo <= float(med) <= p_hi                    # pooled median within the process medians
    assert float(ns) > 0 and float(peer) > 0


def test_bad_process_count_is_a_usage_error():
    r = _run("--processes", "0")
    assert r.returncode == 2 and "--processes" in r.stderr and "Traceback" not in r.stderr


def test_policy_rows_under_another_semantics_name_it():
    r = _run("--policy-semantics", "sequential-ascending")
    assert r.returncode == 0, r.stderr
    row = "lrfu / lru (sequential-ascending, per-layer, rho 0.2)"
    assert sum(ln.startswith(row) for ln in r.stdout.splitlines()) == 1, r.stdout
    assert ROW not in r.stdout


def test_unknown_policy_semantics_is_a_usage_error():
    r = _run("--policy-semantics", "atomic")
    assert r.returncode == 2 and "--policy-semantics" in r.stderr and "Traceback" not in r.stderr


def test_random_rows_at_other_rhos_name_them():
    r = subprocess.run([sys.executable, SCRIPT, "--steps", "4", "--pairs", "2", "--policies", "", "--random-policies",
                        "lru", "--random-rhos", "0.1,0.4", "--no-global"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert sum(ln.startswith("lru: sequential-random / sequential-ascending (rho 0.1)") for ln in lines) == 1
    assert sum(ln.startswith("lru: sequential-random / sequential-ascending ") and "rho" not in ln
               for ln in lines) == 1, r.stdout
