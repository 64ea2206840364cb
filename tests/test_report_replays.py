"""``benchmarks/report_replays.py``: the seconds of a report's replays by policy and semantics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from expertcache.trace.synth import SynthConfig, synthesize_trace

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "report_replays.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_rows_cover_both_semantics_and_sum_below_the_wall(tmp_path):
    synthesize_trace(SynthConfig(n_layers=2, n_experts=16, top_k=2, n_requests=8, decode_tokens=12, seed=0,
                                 n_categories=2)).save(tmp_path / "trace")
    r = _run(str(tmp_path / "trace"), "--no-warmup", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {(x["policy"], x["semantics"], x["scope"]): x for x in out["rows"]}
    for policy in ("lru", "lfu", "lrfu", "lfru", "belady"):     # report replays each under both semantics
        assert (policy, "sequential-ascending", "per-layer") in rows
        assert (policy, "event-atomic", "per-layer") in rows
    assert rows[("lfu", "sequential-ascending", "per-layer")]["calls"] == 1
    assert 0 < out["replay_s"] == pytest.approx(sum(x["seconds"] for x in out["rows"]))
    assert out["replay_s"] < out["wall_s"]
    text = _run(str(tmp_path / "trace"), "--no-warmup")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0].startswith("machine: ")
    assert text.stdout.splitlines()[-1].startswith("report: ")


def test_a_directory_without_a_trace_is_refused(tmp_path):
    r = _run(str(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "is not a trace directory" in r.stderr
