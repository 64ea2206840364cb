"""``benchmarks/layout_bounds.py``: bounds of two layouts of the per-layer state, each against the run itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "layout_bounds.py"


def _run(*extra: str, script: Path = SCRIPT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), "--steps", "4", "--pairs", "1", "--processes", "1", *extra],
                          capture_output=True, text=True, timeout=600)


def test_each_rho_gets_a_row_per_kernel_and_lfru_no_layer_sorted_cell():
    r = _run("--rhos", "0.2,0.5")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("machine: ")
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("  rho ")]
    assert [(row[1], row[2]) for row in rows] == [(rho, k) for rho in ("0.2", "0.5") for k in ("lru", "lfru", "lrfu")]
    for row in rows:
        cells = [row[i] for i in range(3, len(row), 3)]
        assert cells == (["in-order"] if row[2] == "lfru" else ["in-order", "by-layer"])
        assert all(float(row[i + 1]) > 0 for i in range(3, len(row), 3))


def test_a_layer_sorted_stream_that_counts_differently_ends_the_run(tmp_path):
    text = SCRIPT.read_text()
    sort = 'order = np.argsort(s.layer, kind="stable")'
    assert text.count(sort) == 1
    (tmp_path / "layout_bounds.py").write_text(text.replace(sort, sort + "[::-1]"))     # each layer's events reversed
    for name in ("_ab.py", "bench_vs_libcachesim.py"):
        (tmp_path / name).write_text((ROOT / "benchmarks" / name).read_text())
    r = _run("--rhos", "0.2", script=tmp_path / "layout_bounds.py")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "the layer-sorted stream counts differently" in r.stderr


def test_bad_rhos_say_what_was_expected():
    for bad in ("0.2,x", "0", "1.5"):
        r = _run("--rhos", bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert "--rhos" in r.stderr or "rho" in r.stderr
