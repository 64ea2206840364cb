"""``benchmarks/lfru_global_fronts.py``: the count groups of sequential global lfru's pool, by a plain loop checked
against the kernel."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from conftest import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "lfru_global_fronts.py"


def _fronts():
    return load_script("benchmarks/lfru_global_fronts.py", "lfru_global_fronts").fronts


def _one_layer(accesses, n_experts, cap):
    n = len(accesses)
    return _fronts()(np.arange(n + 1, dtype=np.int64), np.array(accesses, np.int64), np.zeros(n, np.int64),
                     n_experts, 1, cap, np.arange(n_experts, dtype=np.int64), 1)


def test_groups_of_hand_derived_streams():
    """Pool of 1, accesses 0 1 0 2 at t 0-3 (tie rank = expert id): 1 (key 1) against 0 (count 1, age 2: 1/2), 0
    leaves; 0 (count 2, key 2) against 1 (1/2), 1 leaves; 2 (key 1) against 0 (count 2, age 2: 1): equal keys, 0
    (lower tie rank) leaves. Three evictions, one group each, every leaving count the lowest."""
    out, hits = _one_layer([0, 1, 0, 2], 3, 1)
    assert out.tolist() == [3, 3, 3, 0] and hits.tolist() == [0]
    # pool of 2, accesses 0 0 0 1 2 at t 0-4: 0 fills (count 3, last 2), 1 fills (count 1, last 3); 2 (key 1)
    # against 0 (3 / 3 = 1) and 1 (1 / 2): 1 leaves. Two groups (counts 1 and 3), the lowest count leaving.
    out, _ = _one_layer([0, 0, 0, 1, 2], 3, 2)
    assert out.tolist() == [1, 1, 2, 0]
    # pool of 2, accesses 0 0 1 3 3 3 2 at t 0-6: 0 (count 2, last 1), 1 fills (count 1, last 2); 3 (key 1)
    # against 0 (2 / 3) and 1 (1 / 2): 1 leaves (groups {1, 2}, rank 0); 3 hits twice (count 3, last 5); 2 (key 1)
    # against 0 (2 / 6) and 3 (3 / 2): 0 leaves (groups {2, 3}, rank 0). Three hits.
    out, hits = _one_layer([0, 0, 1, 3, 3, 3, 2], 4, 2)
    assert out.tolist() == [2, 2, 4, 0] and hits.tolist() == [3]


def test_a_leaving_count_above_another_group_ranks_above_it():
    """Pool of 2, accesses 0 0 0 1 1 2 at t 0-5: 0 (count 3, last 2) and 1 (count 2, last 4); 2 (key 1) against
    0 (3 / 4) and 1 (2 / 2): 0 leaves, its count 3 above the other group's 2: rank 1."""
    out, _ = _one_layer([0, 0, 0, 1, 1, 2], 3, 2)
    assert out.tolist() == [1, 1, 2, 1]


def test_the_script_checks_the_kernel_and_prints_its_rows():
    r = subprocess.run([sys.executable, str(SCRIPT), "--steps", "8", "--rhos", "0.1,0.3", "--every", "1", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert [row["rho"] for row in got["rows"]] == [0.1, 0.3]
    for row in got["rows"]:
        assert row["hits_equal"] and 0.0 <= row["evictions_per_access"] <= 1.0
        assert 1.0 <= row["groups"] and 0.0 <= row["leaving_rank"] < row["groups"]


def test_bad_arguments_get_one_line_and_exit_2():
    for args in (["--rhos", "0.1,x"], ["--rhos", "1.5"], ["--steps", "0"], ["--every", "-3"]):
        r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
        assert r.returncode == 2 and "Traceback" not in r.stderr, args
        assert "expected" in r.stderr.strip().splitlines()[-1]
