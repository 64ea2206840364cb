"""``benchmarks/lrfu_seq_selection.py``: sequential per-layer lrfu on the event-atomic selection, a prototype that
must decide as the heap loop and the slot loop do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "lrfu_seq_selection.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)


def test_check_finds_every_count_equal_to_the_heap_and_slot_loops():
    r = _run("--check")
    assert r.returncode == 0, r.stdout + r.stderr
    done, _, total = r.stdout.splitlines()[-1].split()[:3]
    assert done == total and int(total) > 300         # every comparison equal, the heap loop's among them


def test_a_window_too_narrow_is_caught():
    # the units that decide a hit surely are W apart (5 at lambda 0.5, 41 at 0.1): at 2, some outcome differs where
    # counts reorder recent blocks (short gaps: 2 layers of 8 experts, top-2, batch 1)
    r = _run("--check", "--window", "2")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "differs from the slot loop: 2 x 8, top-2, B = 1" in r.stdout
    assert "differs from the heap loop" in r.stdout
    done, _, total = r.stdout.splitlines()[-1].split()[:3]
    assert int(done) < int(total)


def test_timing_rows_name_the_machine_and_each_rho():
    r = _run("--steps", "20", "--pairs", "1", "--rhos", "0.2,0.4")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("machine: ")
    rows = [ln.split() for ln in lines[3:]]
    assert [row[0] for row in rows] == ["0.2", "0.4"] and all(row[-1] == "yes" for row in rows)


def test_bad_arguments_are_one_line_and_exit_2():
    cases = ((("--rhos", "2"), "cache fractions in [0, 1]"), (("--window", "2"), "--window goes with --check"))
    for args, said in cases:
        r = _run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr and said in r.stderr
