"""``benchmarks/seq_outcomes.py``: the outcomes of sequential accesses, by a plain loop checked against the kernels."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from conftest import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "seq_outcomes.py"


def _outcomes():
    return load_script("benchmarks/seq_outcomes.py", "seq_outcomes").outcomes


def test_outcomes_of_a_hand_derived_lfu_stream():
    """One layer of 3 experts, quota 1, ties by expert id, accesses 0 1 0 1 2 (lfu, counts kept): 0 fills;
    1 (count 1) ties 0 (count 1) and 0 leaves (lower tie); 0 (count 2) above 1 (count 1): 1 leaves; 1 (count 2)
    ties 0 (count 2): 0 leaves; 2 (count 1) below 1 (count 2): 2 leaves at once. No hits, one leave at once, four
    admissions, one change of outcome."""
    out, hits = _outcomes()(np.arange(6, dtype=np.int64), np.array([0, 1, 0, 1, 2], np.int64), np.zeros(5, np.int64),
                            3, 1, np.array([1], np.int64), np.array([0, 1, 2], np.int64), 0, 0.5)
    assert out.tolist() == [0, 1, 4, 1] and hits.tolist() == [0]
    out, _ = _outcomes()(np.arange(6, dtype=np.int64), np.array([0, 0, 1, 0, 2], np.int64), np.zeros(5, np.int64),
                         3, 1, np.array([2], np.int64), np.array([0, 1, 2], np.int64), 2, 0.5)
    # lfru, quota 2, accesses 0 0 1 0 2 at t 0-4: 0 fills, 0 hits, 1 fills, 0 hits, 2 (count 1, age 1: key 1)
    # against 1 (count 1, last 2: 1 / 3 at t 4) and 0 (count 3, last 3: 3 / 2): 1 leaves; four changes of outcome
    assert out.tolist() == [2, 0, 3, 4]


def test_the_script_prints_shares_that_add_up_and_checks_the_kernels():
    r = subprocess.run([sys.executable, str(SCRIPT), "--steps", "6", "--rhos", "0.1,0.75", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert [(row["policy"], row["rho"]) for row in got["rows"]] == [
        (p, rho) for p in ("lfu", "lrfu", "lfru") for rho in (0.1, 0.75)]
    for row in got["rows"]:
        assert row["hits_equal"]
        assert abs(row["hit"] + row["leave_at_once"] + row["admit"] - 1.0) < 1e-12
        assert 0.0 <= row["outcome_changes"] <= 1.0
    lo, hi = (r for r in got["rows"] if r["policy"] == "lfu")
    assert lo["hit"] < hi["hit"]                     # a larger cache hits more


def test_bad_arguments_get_one_line_and_exit_2():
    for args in (["--rhos", "0.1,x"], ["--rhos", "1.5"], ["--steps", "0"]):
        r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
        assert r.returncode == 2 and "Traceback" not in r.stderr, args
        assert "expected" in r.stderr.strip().splitlines()[-1]
