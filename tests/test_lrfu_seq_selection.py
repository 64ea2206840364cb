"""``benchmarks/lrfu_seq_selection.py``: sequential per-layer lrfu on the event-atomic selection, a prototype that
must decide as the heap loop and the shipped slot loop do."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "lrfu_seq_selection.py"


def _module():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("lrfu_seq_selection", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_finds_every_count_equal_to_the_heap_and_shipped_loops():
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    done, _, total = r.stdout.split()[:3]
    assert done == total and int(total) > 200         # every comparison equal, the heap loop's among them


def test_a_window_too_narrow_is_caught(monkeypatch):
    # the units that decide a hit surely are W apart (5 at lambda 0.5): at 2, some outcome differs from the heap
    # loop's on a stream of short gaps (2 layers of 8 experts, top-2, batch 1), where counts reorder recent blocks
    mod = _module()
    from bench_scaling import routed_stream

    from expertcache.replay import engine

    s = routed_stream(2, 8, 1, 20_000, top_k=2)
    tie = engine._tie_ranks("random", 0, 16)
    tie_pos = engine._tie_order(tie, 2, 8)[1]
    caps = engine.capacities_for_rho(0.25, 2, 8)
    right = mod._heap_counts(s, caps, tie, 0.5)
    assert all(np.array_equal(a, b) for a, b in zip(mod._counts(mod.replay_lrfu_seq_bits, s, caps, tie_pos, 0.5),
                                                     right, strict=True))
    monkeypatch.setattr(mod, "window", lambda lam: 2)
    assert not np.array_equal(mod._counts(mod.replay_lrfu_seq_bits, s, caps, tie_pos, 0.5)[0], right[0])


def test_timing_rows_name_the_machine_and_each_rho():
    r = subprocess.run([sys.executable, str(SCRIPT), "--steps", "20", "--pairs", "1", "--rhos", "0.2,0.4"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("machine: ")
    rows = [ln.split() for ln in lines[3:]]
    assert [row[0] for row in rows] == ["0.2", "0.4"] and all(row[-1] == "yes" for row in rows)


def test_a_bad_rho_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, str(SCRIPT), "--rhos", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "cache fractions in [0, 1]" in r.stderr
