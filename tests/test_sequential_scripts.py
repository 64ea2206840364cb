"""``benchmarks/lru_ranks_shapes.py``, ``benchmarks/lrfu_ranks_shapes.py`` and ``benchmarks/random_order_costs.py``: they
run, check the hits they time, and refuse bad arguments in one line."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT

from expertcache.replay import _kernels_seq as KQ

SHAPES = ROOT / "benchmarks" / "lru_ranks_shapes.py"
LRFU_SHAPES = ROOT / "benchmarks" / "lrfu_ranks_shapes.py"
COSTS = ROOT / "benchmarks" / "random_order_costs.py"


def _run(script, *args):
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)


def _shapes_rows(script, peer: str, quota_max: int) -> list[dict]:
    """A shapes script's rows at batches 1 and 16, rho 0.1 and 0.5: in that order, hits equal, quotas at most
    ``quota_max``, both loops' times (``ranks`` and ``peer``) and ratios positive in either member order."""
    r = _run(script, "--batches", "1,16", "--rhos", "0.1,0.5", "--accesses", "30000", "--pairs", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["batch"], x["rho"]) for x in rows] == [(1, 0.1), (1, 0.5), (16, 0.1), (16, 0.5)]
    for x in rows:
        assert x["hits_equal"] and x["quota"] <= quota_max
        for order in ("ascending", "shuffled"):
            assert x[order]["ranks_ns"] > 0 and x[order][peer + "_ns"] > 0 and x[order]["ratio"] > 0
    return rows


def test_the_shapes_script_times_both_loops_and_names_the_rule():
    rows = _shapes_rows(SHAPES, "lists", KQ._LRU_RANKS_MAX)
    for x in rows:
        assert x["rule_picks"] == ("ranks" if x["quota"] <= KQ._LRU_RANKS_PER_MEMBER * x["mean_event"] else "lists")
    assert {x["rule_picks"] for x in rows} == {"ranks", "lists"}     # batch 1 at rho 0.5: 64 > 4 x 8


def test_the_lrfu_shapes_script_times_both_loops_and_names_the_rule():
    rows = _shapes_rows(LRFU_SHAPES, "slots", 64)
    for x in rows:
        small = (x["mean_event"] >= KQ._LRFU_RANKS_SMALL_EVENT
                 and x["quota"] <= KQ._LRFU_RANKS_PER_MEMBER * x["mean_event"])
        assert x["rule_picks"] == ("ranks" if x["mean_event"] >= KQ._LRFU_RANKS_MIN_EVENT or small else "slots")
    assert [x["rule_picks"] for x in rows] == ["slots", "slots", "ranks", "ranks"]     # mean events of 8 and ~60


def test_the_random_order_script_splits_the_time_and_checks_the_hits():
    r = _run(COSTS, "--steps", "12", "--rhos", "0.1,0.4", "--policies", "lru,lfu", "--pairs", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["policy"], x["rho"]) for x in rows] == [("lru", 0.1), ("lru", 0.4), ("lfu", 0.1), ("lfu", 0.4)]
    for x in rows:
        assert x["hits_equal"]
        assert set(x["ns_per_access"]) == {"ascending", "pre-shuffled", "random", "shuffle"}
        assert x["random_over_ascending"] == x["ns_per_access"]["random"] / x["ns_per_access"]["ascending"]


def test_the_random_order_script_times_curves_in_one_scope_and_checks_them():
    r = _run(COSTS, "--curves", "--steps", "12", "--rhos", "0.1,0.4", "--policies", "lru,belady", "--pairs", "2",
             "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["policy"], x["rhos"]) for x in rows] == [("lru", [0.1, 0.4]), ("belady", [0.1, 0.4])]
    for x in rows:
        assert x["hits_equal"] and x["curve_ms"] > 0 and x["one_by_one_ms"] > 0 and 0 < x["ratio_min"] <= x["ratio"]


def test_the_random_order_script_times_the_random_side_by_chunk_size():
    r = _run(COSTS, "--chunks", "64,4096", "--steps", "12", "--rhos", "0.1", "--policies", "lru,lfu", "--pairs", "2",
             "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["policy"], x["chunks"]) for x in rows] == [("lru", [64, 4096]), ("lfu", [64, 4096])]
    for x in rows:
        assert x["hits_equal"] and set(x["ns_per_access"]) == {"64", "4096"} and x["ratio_to_first"]["64"] == 1.0
        assert all(v > 0 for v in x["ns_per_access"].values())


def test_bad_arguments_get_one_line_and_exit_2():
    for script, args in ((SHAPES, ["--rhos", "0.6"]), (SHAPES, ["--batches", "0"]), (SHAPES, ["--batches", "x"]),
                         (LRFU_SHAPES, ["--rhos", "0.6"]), (LRFU_SHAPES, ["--batches", "0"]),
                         (COSTS, ["--policies", "belady"]), (COSTS, ["--curves", "--policies", "opt"]),
                         (COSTS, ["--steps", "0"]), (COSTS, ["--rhos", "2"]), (COSTS, ["--chunks", "0"]),
                         (COSTS, ["--chunks", "64", "--curves"])):
        r = _run(script, *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (script.name, args)
        assert "expected" in r.stderr.strip().splitlines()[-1], (script.name, args, r.stderr)
